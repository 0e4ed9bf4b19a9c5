// src/hopper/decode/launch_decode.cuh — host side of the decode launch (included by the generated
// instantiation files only).
#pragma once

#include <cuda_runtime.h>

#include "hopper/decode/kernel_decode.cuh"
#include "hopper/decode/launch_decode.h"
#include "hopper/shared/device_state.h"
#include "hopper/shared/launch_common.cuh"

namespace fa4::hopper {

template <int kDType, int kHeadDim, int kHeadDimV>
void run_decode(const detail::KVCacheParams& p, const LaunchContext& ctx) {
  static_assert(kHeadDim == kHeadDimV, "the decode kernel has one head dim for K and V");
  constexpr bool kBF16 = kDType == int(DType::kBF16);
  constexpr detail::HopperDecodeConfig c = detail::hopper_decode_config(kHeadDim, kHeadDimV);
  using Smem = decode::DecodeSmem<kHeadDim, c.block_n, c.stages>;
  using Elem = typename decode::ElemOf<kBF16>::type;
  const char* const kFn = ctx.fn;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.device.stream);

  decode::DecodeArgs a{};
  a.p = p;
  a.async_error = ctx.async_error;
  a.group = p.num_heads / p.num_heads_kv;
  const int64_t rows = int64_t(p.seqlen_q) * a.group;
  a.row_tiles = int32_t((rows + detail::kDecodeRowsPerCta - 1) / detail::kDecodeRowsPerCta);
  a.num_splits = decode_num_splits(p, c, ctx.num_sms);

  // Everything that can fail on the host (scratch, the smem limit) comes before the append, the
  // first write to a caller's tensor.
  LaunchScratch scratch{nullptr, false}, arrivals{nullptr, false};
  if (p.seqlen_q > 0 && a.num_splits > 1) {
    const size_t splits = size_t(a.num_splits), batch = size_t(p.batch);
    const size_t o_bytes = splits * batch * p.seqlen_q * p.num_heads * kHeadDim * sizeof(float);
    const size_t lse_bytes = splits * batch * p.seqlen_q * p.num_heads * sizeof(float);
    const size_t tiles = batch * size_t(p.num_heads_kv) * size_t(a.row_tiles);
    scratch = acquire_scratch(p.device.index, stream, o_bytes + lse_bytes, 0, ScratchKind::kDecode);
    arrivals = acquire_scratch(p.device.index, stream, tiles * sizeof(int32_t), tiles * sizeof(int32_t),
                               ScratchKind::kDecodeArrivals);
    a.o_partial = reinterpret_cast<float*>(scratch.ptr);
    a.lse_partial = reinterpret_cast<float*>(scratch.ptr + o_bytes);
    a.arrivals = reinterpret_cast<int32_t*>(arrivals.ptr);
  }
  auto kernel = decode::decode_kernel<kBF16, kHeadDim, c.block_n, c.stages>;
  check_cuda(raise_smem_limit_once<decode::DecodeKernelKey<kBF16, kHeadDim>>(kernel, Smem::kBytes, p.device.index), kFn,
             "cudaFuncSetAttribute (decode shared memory)");
  if (p.seqlen_new > 0) {  // stream order: the decode below reads the appended rows
    decode::append_kernel<Elem><<<dim3(p.seqlen_new, p.num_heads_kv, p.batch), 64, 0, stream>>>(a);
    check_cuda(cudaGetLastError(), kFn, "append kernel launch");
  }
  if (p.seqlen_q == 0) return;
  const dim3 grid(a.num_splits, p.num_heads_kv * a.row_tiles, p.batch);
  kernel<<<grid, 32 * detail::kDecodeWarps, Smem::kBytes, stream>>>(a);
  check_cuda(cudaGetLastError(), kFn, "decode kernel launch");
  release_scratch(arrivals, stream);
  release_scratch(scratch, stream);
}

}  // namespace fa4::hopper
