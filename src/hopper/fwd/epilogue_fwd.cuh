// src/hopper/fwd/epilogue_fwd.cuh — normalise O, write O (dtype of q) and LSE (fp32, natural log).
//
// Two ways out for O:
//   * TMA (p.out_tma: batched layout, TMA-aligned out, the tile ran its key loop): each warpgroup
//     writes its 64 x dv slice with stmatrix into smem — its rows of the O buffer where the config
//     has one (o_buffer: d64-d128), else the smem of its own Q rows (dead after its last softmax) —
//     and one thread TMA-stores it. The consumers go on to the next tile at once instead of
//     issuing dv/4 scattered 4-byte stores per thread (measured on H200: the direct store cost 3-6%
//     of the d128 forward). TMA clips rows past seqlen_q and columns past the real headdim_v.
//   * direct (varlen — a TMA box would spill into the next sequence's rows —, misaligned out,
//     pack-GQA — a tile's rows belong to several heads —, tiles without keys): straight from
//     registers, each quad of lanes writing 8 contiguous columns of a row as 4-byte pairs. Rows
//     past seqlen_q and columns past headdim_v are never written (C12, C14).
#pragma once

#include <cute/tensor.hpp>

#include "hopper/arch/arch.cuh"
#include "hopper/fwd/mainloop_fwd_mma.cuh"
#include "hopper/shared/softmax.cuh"
#include "hopper/shared/tile_info.cuh"

namespace fa4::hopper {

template <class Kt>
struct Epilogue {
  using Params = typename Kt::Params;
  using Element = typename Kt::Element;

  /// Row offset (in elements) of a warpgroup's 64 Q rows inside one Q buffer: whole swizzle atoms,
  /// so the swizzled layout restricted to those rows is SmemLayoutOSlice from that offset.
  /// Swizzle atoms are tiled down the rows first (tile_to_shape's order), so warpgroup wg's rows
  /// start at wg * kSliceOffset (asserted for the last warpgroup).
  static constexpr int kSliceOffset = int(cute::get_nonswizzle_portion(typename Kt::SmemLayoutQStage{})(64, 0));
  static_assert(kSliceOffset * sizeof(Element) % 1024 == 0, "warpgroup rows must start a swizzle atom");
  static_assert(int(cute::get_nonswizzle_portion(typename Kt::SmemLayoutQStage{})(64 * (Kt::kNumMmaWarpGroups - 1), 0)) ==
                    (Kt::kNumMmaWarpGroups - 1) * kSliceOffset,
                "the last warpgroup's rows are not at a whole multiple of one warpgroup's offset");

  /// LSE of this thread's two rows (one lane per quad writes).
  __device__ __forceinline__ static void store_lse(const Params& p, const TileInfo& ti, int tid, const float (&lse)[2]) {
    if (tid % 4 != 0) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const RowCoord rc = fragment_row_coord<Kt::kBlockM>(p, ti, tid, r);
      if (rc.query >= ti.seqlen_q) continue;
      const int64_t li = (p.is_varlen ? 0 : int64_t(ti.c.batch) * p.lse_batch_stride) +
                         int64_t(rc.head) * p.lse_head_stride + (int64_t(ti.q_row0) + rc.query) * p.lse_row_stride;
      p.lse[li] = lse[r];
    }
  }

  /// Direct store of O from registers. Fully masked rows arrive with o_scale = 0 and O = 0.
  template <class FragO>
  __device__ __forceinline__ static void store_direct(const Params& p, const TileInfo& ti, int tid, FragO& tOrO,
                                                      const float (&o_scale)[2]) {
    const int col_lane = fragment_col(tid);
    Element* out = static_cast<Element*>(p.out);
    const int64_t base = p.is_varlen ? 0 : int64_t(ti.c.batch) * p.out_batch_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const RowCoord rc = fragment_row_coord<Kt::kBlockM>(p, ti, tid, r);
      if (rc.query >= ti.seqlen_q) continue;
      Element* orow = out + base + int64_t(rc.head) * p.out_head_stride + (int64_t(ti.q_row0) + rc.query) * p.out_row_stride;
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
    }
  }

  /// TMA store of O staged in smem. With an O buffer (Kt::kOBuffer) the mainloop has released Q
  /// already; the issuing thread waits for the PREVIOUS tile's store to have read the buffer before
  /// the warpgroup overwrites it (the kernel waits for the last one before it exits). Without one,
  /// O goes to this tile's Q buffer `rq`, released here (the issuing thread only after the TMA
  /// engine has read the smem). Correct because, without a
  /// cluster (the kernel's pipelines are built for cluster shape 1x1x1), PipelineTmaAsync's empty
  /// barrier counts an arrival from EVERY consumer thread, the issuing one included; with
  /// clusters only one thread per warpgroup would signal and this would need its own barrier.
  template <class SharedStorage, class PipelineQ, class StateQ, class FragO>
  __device__ __forceinline__ static void store_tma(const Params& p, SharedStorage& ss, PipelineQ& pipe_q, StateQ rq,
                                                   const TileInfo& ti, int tid, FragO& tOrO,
                                                   const float (&o_scale)[2]) {
    using namespace cute;
    const int wg = tid / 128;
    Element* stage = Kt::kOBuffer ? ss.smem_o.data() : ss.smem_q.data() + rq.index() * Kt::kQStageElems;
    Element* slice = stage + wg * kSliceOffset;
    if constexpr (Kt::kOBuffer) {
      if (tid % 128 == 0) tma_store_wait<0>();
      arch::named_barrier_sync(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::local(wg), cutlass::NumThreadsPerWarpGroup);
    }
    Tensor sO = make_tensor(make_smem_ptr(slice), typename Kt::SmemLayoutOSlice{});  // (64, dv)

    // Normalised: value pairs alternate rows r = 0, 1 (fragment ((2,2,dv/8))).
    stage_accumulator<Element, typename Kt::SmemCopyAtomO, typename Kt::TiledMmaPVWG>(
        tid % 128, tOrO, sO, [&](int i) { return o_scale[i & 1]; });
    // stmatrix writes are generic-proxy; the TMA engine reads through the async proxy.
    cutlass::arch::fence_view_async_shared();
    arch::named_barrier_sync(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::local(wg), cutlass::NumThreadsPerWarpGroup);
    if (tid % 128 == 0) {
      Tensor mO = p.tma_o.get_tma_tensor(p.shape_o);
      Tensor gO = local_tile(mO(_, _, ti.c.head, ti.c.batch), Shape<_64, Int<Kt::kHeadDimV>>{},
                             make_coord(ti.c.m_block * (Kt::kBlockM / 64) + wg, _0{}));
      auto cta = p.tma_o.get_slice(_0{});
      cute::copy(p.tma_o, cta.partition_S(sO), cta.partition_D(gO));
      tma_store_arrive();
      if constexpr (!Kt::kOBuffer) tma_store_wait<0>();  // smem read done (global writes complete on their own)
    }
    if constexpr (!Kt::kOBuffer) pipe_q.consumer_release(rq);
  }
};

}  // namespace fa4::hopper
