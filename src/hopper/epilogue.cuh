// src/hopper/epilogue.cuh — normalise O, write O (dtype of q) and LSE (fp32, natural log).
//
// Straight from registers: each quad of lanes owns 8 contiguous output columns of a row, written as
// 4-byte pairs. Rows past seqlen_q (tile padding, or another varlen sequence's rows) and columns
// past the real headdim_v (padded buckets) are never written (cases C12, C14).
#pragma once

#include <cute/tensor.hpp>

#include "hopper/mainloop_mma.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_info.cuh"

namespace fa4::hopper {

template <class Kt>
struct Epilogue {
  using Params = typename Kt::Params;
  using Element = typename Kt::Element;

  /// o_scale/lse per thread row (r = 0, 1). Fully masked rows arrive with o_scale = 0 and O = 0.
  template <class FragO>
  __device__ __forceinline__ static void store(const Params& p, const TileInfo& ti, int tid, FragO& tOrO,
                               const float (&o_scale)[2], const float (&lse)[2]) {
    const int lane = tid % 32;
    const int wg = tid / 128;
    const int row_in_tile = wg * 64 + ((tid % 128) / 32) * 16 + lane / 4;
    const int col_lane = 2 * (lane % 4);
    Element* out = static_cast<Element*>(p.out);
    const int64_t base = (p.is_varlen ? 0 : int64_t(ti.c.batch) * p.out_batch_stride) +
                         int64_t(ti.c.head) * p.out_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int32_t i = ti.c.m_block * Kt::kBlockM + row_in_tile + 8 * r;
      if (i >= ti.seqlen_q) continue;
      Element* orow = out + base + (int64_t(ti.q_row0) + i) * p.out_row_stride;
#pragma unroll
      for (int g = 0; g < Kt::kHeadDimV / 8; ++g) {
        const int col = g * 8 + col_lane;
        if (col >= p.headdim_v) continue;  // headdim_v is a multiple of 8: the pair is all in/out
        const float a = tOrO(g * 4 + 2 * r) * o_scale[r];
        const float b = tOrO(g * 4 + 2 * r + 1) * o_scale[r];
        if (p.out_aligned_pairs) {
          *reinterpret_cast<uint32_t*>(orow + col) = pack2<Element>(a, b);
        } else {
          orow[col] = Element(a);
          orow[col + 1] = Element(b);
        }
      }
      if (lane % 4 == 0) {
        const int64_t li = (p.is_varlen ? 0 : int64_t(ti.c.batch) * p.lse_batch_stride) +
                           int64_t(ti.c.head) * p.lse_head_stride + (int64_t(ti.q_row0) + i) * p.lse_row_stride;
        p.lse[li] = lse[r];
      }
    }
  }
};

}  // namespace fa4::hopper
