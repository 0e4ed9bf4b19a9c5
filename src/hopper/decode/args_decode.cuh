// src/hopper/decode/args_decode.cuh — what a decode launch passes to its kernels, and the element
// type helpers the decode kernels share.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/params.h"

namespace fa4::hopper::decode {

/// Everything a decode launch passes to its kernels (by value, __grid_constant__).
struct DecodeArgs {
  detail::KVCacheParams p;
  uint8_t* async_error;   ///< mapped error record (device_state.h)
  float* o_partial;       ///< num_partials > 1: (partial, batch, seqlen_q, num_heads, kD) fp32, normalised rows
  float* lse_partial;     ///< num_partials > 1: (partial, cluster rank, batch, num_heads, seqlen_q), log2 units, -inf if empty
  int32_t* arrivals;      ///< num_partials > 1: (batch, kv head x row tile, cluster rank) counters, zero between launches
  int32_t num_splits;
  int32_t cluster;        ///< CTAs (splits) per thread-block cluster, merged in DSMEM; divides num_splits
  int32_t num_partials;   ///< num_splits / cluster: the partials of a tile that meet in global scratch
  int32_t group;          ///< num_heads / num_heads_kv
  int32_t row_tiles;      ///< ceil(seqlen_q * group / the tile's rows)
  int32_t after_append;   ///< 1: launched as the append kernel's programmatic dependent (its wait: decode_kernel)
  uint32_t append_delay_ns;  ///< append kernel: nanoseconds each CTA waits before its writes (a test's override)
};

/// The element type of the call's tensors (bf16, else fp16), and two floats rounded to a pair of it.
template <bool kBF16>
struct ElemOf { using type = __nv_bfloat16; };
template <>
struct ElemOf<false> { using type = __half; };

template <bool kBF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kBF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

}  // namespace fa4::hopper::decode
