// src/hopper/bwd/pre_post_bwd.cuh — the small memory-bound passes around the main backward kernel:
//   preprocess   per query block: D = rowsum(dO * O) in fp32 (O and dO with their own strides),
//                lse in log2 units (+inf where lse = -inf: P = 2^(s - inf) = 0, never NaN), the
//                block's fp32 dQ accumulator zeroed, its deterministic-mode semaphore reset;
//   postprocess  per query block: dQ = softmax_scale * accumulator, in the input dtype, from the
//                staging's fragment order (schedule_bwd.h dq_chunk_index) through smem to rows;
//   dsink        per head, in a fixed order (deterministic): dsink_h = -sum_i exp(sink_h - lse_i) D_i
//                (src/cpu/naive_attention.h derives it).
// Each CTA handles one (query block, head, sequence); blocks past a varlen sequence return at once.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/constants.h"
#include "core/mask.h"
#include "hopper/arch/arch.cuh"
#include "hopper/bwd/geometry_bwd.cuh"
#include "hopper/shared/mma.cuh"

namespace fa4::hopper {

/// Arguments of the three passes (plain pointers; no TMA).
struct BwdAuxParams {
  const void* out{};
  const void* dout{};
  const float* lse{};
  void* dq{};
  const float* sink{};
  float* dsink{};
  int64_t out_batch_stride{}, out_row_stride{}, out_head_stride{};
  int64_t dout_batch_stride{}, dout_row_stride{}, dout_head_stride{};
  int64_t dq_batch_stride{}, dq_row_stride{}, dq_head_stride{};
  int64_t lse_batch_stride{}, lse_head_stride{}, lse_row_stride{};
  bool dq_aligned_pairs{};
  bool dq_vec8{};   // dq rows store 8 elements (16 bytes) at a time
  bool rows_vec8{};  // out and dout rows load 8 elements (16 bytes) at a time

  int32_t batch{}, num_heads{}, headdim{}, headdim_v{};
  int32_t seqlen_q{}, seqlen_k{};
  bool is_varlen{};
  const int32_t* cu_seqlens_q{};
  const int32_t* cu_seqlens_k{};
  const int32_t* seqused_k{};
  int32_t total_q{}, total_k{};
  uint8_t* async_error{};
  float softmax_scale{};

  float* dq_accum{};
  float* lse_log2{};
  float* dpsum{};
  int32_t* dq_semaphore{};  // nullptr unless deterministic
  int32_t* tile_counter{};  // the main kernel's claim counter (dynamic schedule), zeroed here; else nullptr
  int32_t chunks{};
  int32_t num_m_blocks{};
};

inline constexpr int kBwdAuxThreads = 256;

template <class Element>
__device__ __forceinline__ float load_f(const void* base, int64_t i) {
  return float(static_cast<const Element*>(base)[i]);
}

/// kChunkRows: the main kernel's tile_m (a chunk is one of its query blocks).
template <class Element, int kHeadDim, int kChunkRows>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_preprocess_kernel(const BwdAuxParams p) {
  const int32_t m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (p.tile_counter && m == 0 && h == 0 && b == 0 && threadIdx.x == 0) *p.tile_counter = 0;
  const SeqBounds s = seq_bounds<true>(p, b);
  if (m * kChunkRows >= s.seqlen_q) return;
  const int64_t chunk = int64_t(h) * p.chunks + chunk_base<kChunkRows>(p, b, s) + m;
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + chunk * (kChunkRows * kHeadDim));
  for (int i = threadIdx.x; i < kChunkRows * kHeadDim / 4; i += kBwdAuxThreads) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (p.dq_semaphore && threadIdx.x == 0) p.dq_semaphore[chunk] = 0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t bt = p.is_varlen ? 0 : b;
  // Query row i's O and dO offsets, and its D and lse_log2 into the chunk's row r (+inf past the
  // sequence or where lse = -inf).
  auto out_offset = [&](int32_t i) {
    return bt * p.out_batch_stride + (int64_t(s.q_row0) + i) * p.out_row_stride + int64_t(h) * p.out_head_stride;
  };
  auto dout_offset = [&](int32_t i) {
    return bt * p.dout_batch_stride + (int64_t(s.q_row0) + i) * p.dout_row_stride + int64_t(h) * p.dout_head_stride;
  };
  auto store_stats = [&](int r, int32_t i, float d) {
    float l = INFINITY;
    if (i < s.seqlen_q) {
      const float lse = p.lse[bt * p.lse_batch_stride + int64_t(h) * p.lse_head_stride +
                              (int64_t(s.q_row0) + i) * p.lse_row_stride];
      l = lse == -INFINITY ? INFINITY : lse * detail::kLog2e;
    }
    p.dpsum[chunk * kChunkRows + r] = d;
    p.lse_log2[chunk * kChunkRows + r] = l;
  };
  if (p.rows_vec8) {
    // kHeadDim / 8 lanes per row, 16 bytes of O and of dO each: a warp covers 32 / (kHeadDim / 8)
    // rows per pass and every pass's loads are in flight together (the loop is unrolled).
    constexpr int kLanesPerRow = kHeadDim / 8;
    constexpr int kRowsPerPass = 32 / kLanesPerRow;
    static_assert(32 % kLanesPerRow == 0 && kChunkRows % (kRowsPerPass * (kBwdAuxThreads / 32)) == 0);
    const int sub = lane % kLanesPerRow;
#pragma unroll
    for (int r0 = warp * kRowsPerPass; r0 < kChunkRows; r0 += kRowsPerPass * (kBwdAuxThreads / 32)) {
      const int r = r0 + lane / kLanesPerRow;
      const int32_t i = m * kChunkRows + r;
      float d = 0.f;
      if (i < s.seqlen_q && 8 * sub < p.headdim_v) {
        const uint4 ov = *reinterpret_cast<const uint4*>(static_cast<const Element*>(p.out) + out_offset(i) + 8 * sub);
        const uint4 gv = *reinterpret_cast<const uint4*>(static_cast<const Element*>(p.dout) + dout_offset(i) + 8 * sub);
        const Element* oe = reinterpret_cast<const Element*>(&ov);
        const Element* ge = reinterpret_cast<const Element*>(&gv);
#pragma unroll
        for (int e = 0; e < 8; ++e) d += float(oe[e]) * float(ge[e]);
      }
#pragma unroll
      for (int o = kLanesPerRow / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      if (sub == 0) store_stats(r, i, d);
    }
    return;
  }
  for (int r = warp; r < kChunkRows; r += kBwdAuxThreads / 32) {
    const int32_t i = m * kChunkRows + r;
    float d = 0.f;
    if (i < s.seqlen_q) {
      const int64_t o0 = out_offset(i), g0 = dout_offset(i);
      for (int c = lane; c < p.headdim_v; c += 32) d += load_f<Element>(p.out, o0 + c) * load_f<Element>(p.dout, g0 + c);
      for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    }
    if (lane == 0) store_stats(r, i, d);
  }
}

template <class Element, int kHeadDim, int kChunkRows>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_postprocess_kernel(const BwdAuxParams p) {
  // Launched as the main kernel's programmatic dependent: the dQ accumulator is complete only once
  // that kernel is (every CTA waits, so this grid's completion implies the main kernel's).
  arch::wait_on_prerequisites();
  const int32_t m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds s = seq_bounds<true>(p, b);
  if (m * kChunkRows >= s.seqlen_q) return;
  const int64_t chunk = int64_t(h) * p.chunks + chunk_base<kChunkRows>(p, b, s) + m;
  const float* acc = p.dq_accum + chunk * (kChunkRows * kHeadDim);
  // The chunk goes through smem as (row, column) in the dtype: read in its fragment order (a
  // float4 per thread, coalesced), written out a row piece of 16 bytes per thread, so a warp
  // stores whole 128-byte lines. Straight from the fragment order a warp's store covers eight rows
  // of 16 bytes each, and the postprocess ran at a third of the bandwidth. The 8-element pad puts
  // the eight rows of a fragment store in different banks.
  constexpr int kPitch = kHeadDim + 8;
  __shared__ alignas(16) Element tile[kChunkRows * kPitch];
  {
    const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
    const DqPartOrigin o = dq_part_origin<kChunkRows, kHeadDim>(wg);
    const int r0 = o.row + arch::fragment_row(t);
#pragma unroll
    for (int g = 0; g < kDqGroupsPerPart<kChunkRows, kHeadDim>; ++g) {
      const int col = o.col + 8 * g + arch::fragment_col(t);
      const float4 x = *reinterpret_cast<const float4*>(acc + dq_chunk_index<kChunkRows, kHeadDim>(wg, g, t));
      *reinterpret_cast<uint32_t*>(tile + r0 * kPitch + col) = pack2<Element>(x.x * p.softmax_scale, x.y * p.softmax_scale);
      *reinterpret_cast<uint32_t*>(tile + (r0 + 8) * kPitch + col) =
          pack2<Element>(x.z * p.softmax_scale, x.w * p.softmax_scale);
    }
  }
  __syncthreads();
  const int64_t bt = p.is_varlen ? 0 : b;
  Element* dq = static_cast<Element*>(p.dq) + bt * p.dq_batch_stride + int64_t(h) * p.dq_head_stride;
  const int32_t rows = min(kChunkRows, s.seqlen_q - m * kChunkRows);
  constexpr int kPieces = kHeadDim / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < kChunkRows * kPieces; i += kBwdAuxThreads) {
    const int r = i / kPieces, col = (i % kPieces) * 8;
    if (r >= rows || col >= p.headdim) continue;  // real dims are multiples of 8
    const Element* src = tile + r * kPitch + col;
    Element* row = dq + (int64_t(s.q_row0) + m * kChunkRows + r) * p.dq_row_stride + col;
    if (p.dq_vec8) {
      *reinterpret_cast<uint4*>(row) = *reinterpret_cast<const uint4*>(src);
    } else if (p.dq_aligned_pairs) {
#pragma unroll
      for (int e = 0; e < 8; e += 2) *reinterpret_cast<uint32_t*>(row + e) = *reinterpret_cast<const uint32_t*>(src + e);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) row[e] = src[e];
    }
  }
}

/// One CTA per head; every sum in a fixed order. (A template so that every instantiation file
/// may hold one: instances are merged at link time.)
template <class Element, int kChunkRows>
__global__ void __launch_bounds__(kBwdAuxThreads) bwd_dsink_kernel(const BwdAuxParams p) {
  const int32_t h = blockIdx.x;
  const float sink_log2 = p.sink[h] * detail::kLog2e;
  float part = 0.f;
  for (int32_t b = 0; b < p.batch; ++b) {
    const SeqBounds s = seq_bounds<true>(p, b);
    const int64_t chunk0 = int64_t(h) * p.chunks + chunk_base<kChunkRows>(p, b, s);
    for (int32_t i = threadIdx.x; i < s.seqlen_q; i += kBwdAuxThreads) {
      const int64_t row = chunk0 * kChunkRows + i;  // chunk i / kChunkRows, its row i % kChunkRows
      part += exp2f(sink_log2 - p.lse_log2[row]) * p.dpsum[row];
    }
  }
  __shared__ float warp_sums[kBwdAuxThreads / 32];
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = part;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kBwdAuxThreads / 32; ++w) sum += warp_sums[w];
    p.dsink[h] = sum == 0.f ? 0.f : -sum;  // no rows (or all without keys): +0, not -0
  }
}

}  // namespace fa4::hopper
