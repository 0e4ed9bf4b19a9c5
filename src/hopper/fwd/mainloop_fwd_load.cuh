// src/hopper/fwd/mainloop_fwd_load.cuh — the producer warp: TMA loads of Q, K, V into shared memory.
//
// One warp of the producer warpgroup claims this CTA's tiles (TileRing, tile_scheduler.cuh) and
// hands each index to the consumers; lane 0 issues every TMA (one thread is enough: a TMA moves a
// whole box asynchronously and signals an mbarrier with the byte count).
// K and V go through separate stage rings (cutlass::PipelineTmaAsync: a "full" mbarrier per stage
// completed by TMA bytes, an "empty" mbarrier completed by every consumer thread). V of block j
// is issued after K of block j-1 because the consumers use them in that order (S_{j-1} = Q K^T is
// issued before O += P_j V_j: intra-warpgroup overlap), so neither ring waits on the other (in
// d64's local kernel a varlen tile's consumers hold the first K stage until its V lands: two
// stages, kernel_traits_fwd.cuh).
// Key blocks are walked from the highest down: the masked diagonal/tail block comes first.
#pragma once

#include <cute/tensor.hpp>

#include "hopper/arch/arch.cuh"
#include "hopper/shared/tile_info.cuh"

namespace fa4::hopper {

template <class Kt>
struct MainloopLoad {
  using Params = typename Kt::Params;
  using Pipeline = typename Kt::MainloopPipeline;
  using PipelineState = typename Kt::PipelineState;
  using PipelineQ = typename Kt::PipelineQ;
  using PipelineStateQ = typename Kt::PipelineStateQ;
  static constexpr int kBlockM = Kt::kBlockM;
  static constexpr int kBlockN = Kt::kBlockN;

  /// Runs on the whole producer warp 0 (TileRing::item shuffles over the full warp); only
  /// lane 0 issues TMAs and touches the barriers.
  template <class SharedStorage>
  __device__ __forceinline__ static void run(const Params& p, SharedStorage& ss, Pipeline& pipe_k, Pipeline& pipe_v,
                                             PipelineQ& pipe_q, TileRing::Pipeline& pipe_t) {
    using namespace cute;
    const bool leader = threadIdx.x % 32 == 0;
    if (leader) {
      cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    }
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Kt::SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Kt::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Kt::SmemLayoutVt{});
    auto cta_q = p.tma_q.get_slice(_0{});
    auto cta_k = p.tma_k.get_slice(_0{});
    auto cta_v = p.tma_v.get_slice(_0{});
    Tensor tQsQ = group_modes<0, 3>(cta_q.partition_D(sQ));   // (TMA, q stage)
    Tensor tKsK = group_modes<0, 3>(cta_k.partition_D(sK));   // (TMA, stage)
    Tensor tVsV = group_modes<0, 3>(cta_v.partition_D(sVt));  // (TMA, stage)
    Tensor mQ_all = p.tma_q.get_tma_tensor(p.shape_q);
    Tensor mK_all = p.tma_k.get_tma_tensor(p.shape_k);
    Tensor mVt_all = p.tma_v.get_tma_tensor(p.shape_vt);

    PipelineState wr = cutlass::make_producer_start_state<Pipeline>();
    PipelineStateQ wq = cutlass::make_producer_start_state<PipelineQ>();
    uint32_t published = 0;
    int32_t i = 0;
    detail::WorkItem w = TileRing::item(p, ss.tiles, i);
    while (w.tile < p.num_tiles) {
      // Tiles past the end of their sequence (varlen: most m-blocks of the short sequences) need
      // nobody: they are not handed to the consumers, and claiming the next one overlaps the
      // consumers' current work instead of costing them a handoff each.
      TileInfo ti = make_tile_info<kBlockM, kBlockN, true>(p, w.tile);
      if (ti.has_rows) {
        TileRing::publish(pipe_t, ss.tiles, published++, w);
        // After the publish: the piece's key range is not live across it (the 24-register
        // producer spilled more with it computed before).
        restrict_keys(ti, w);
        if (ti.has_keys()) load_tile(p, pipe_k, pipe_v, pipe_q, ti, wr, wq, tQsQ, tKsK, tVsV, mQ_all, mK_all, mVt_all);
      }
      w = TileRing::item(p, ss.tiles, ++i);
    }
    TileRing::publish(pipe_t, ss.tiles, published, w);  // a tile >= num_tiles stops the consumers
    if (leader) {
      // Wait until the consumers released every stage: no TMA load may still target this CTA's
      // smem. (A TMA store still reading staged O is waited for by its issuing consumer thread,
      // before it releases a Q buffer or, with an O buffer, before the kernel exits.)
      pipe_k.producer_tail(wr);
      pipe_v.producer_tail(wr);
      pipe_q.producer_tail(wq);
    }
  }

  /// Issues Q (into the next Q buffer, once the consumers freed it) and every K/V block of tile ti
  /// (which has rows and keys).
  template <class TQ, class TK, class TV, class MQ, class MK, class MV>
  __device__ __forceinline__ static void load_tile(const Params& p, Pipeline& pipe_k, Pipeline& pipe_v,
                                                   PipelineQ& pipe_q, const TileInfo& ti, PipelineState& wr,
                                                   PipelineStateQ& wq, TQ& tQsQ, TK& tKsK, TV& tVsV,
                                                   const MQ& mQ_all, const MK& mK_all, const MV& mVt_all) {
    using namespace cute;
    const bool leader = threadIdx.x % 32 == 0;
    auto cta_q = p.tma_q.get_slice(_0{});
    auto cta_k = p.tma_k.get_slice(_0{});
    auto cta_v = p.tma_v.get_slice(_0{});
    const int32_t b = p.is_varlen ? 0 : ti.c.batch;
    const int32_t h_kv = ti.c.head / p.group_size;
    Tensor gQ = local_tile(domain_offset(make_coord(ti.q_row0, _0{}), mQ_all(_, _, ti.c.head, b)),
                           Shape<Int<kBlockM>, Int<Kt::kHeadDim>>{}, make_coord(ti.c.m_block, _0{}));
    Tensor gK = local_tile(domain_offset(make_coord(ti.k_row0, _0{}), mK_all(_, _, h_kv, b)),
                           Shape<Int<kBlockN>, Int<Kt::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gVt = local_tile(domain_offset(make_coord(_0{}, ti.k_row0), mVt_all(_, _, h_kv, b)),
                            Shape<Int<Kt::kHeadDimV>, Int<kBlockN>>{}, make_coord(_0{}, _));
    Tensor tQgQ = group_modes<0, 3>(cta_q.partition_S(gQ));
    Tensor tKgK = group_modes<0, 3>(cta_k.partition_S(gK));   // (TMA, n_block)
    Tensor tVgV = group_modes<0, 3>(cta_v.partition_S(gVt));  // (TMA, n_block)

    auto load_k = [&](int32_t n, PipelineState st) {
      if (leader) {
        pipe_k.producer_acquire(st);
        copy(p.tma_k.with(*pipe_k.producer_get_barrier(st), 0, TMA::CacheHintSm90::EVICT_LAST),
             tKgK(_, n), tKsK(_, st.index()));
      }
    };
    auto load_v = [&](int32_t n, PipelineState st) {
      if (leader) {
        pipe_v.producer_acquire(st);
        copy(p.tma_v.with(*pipe_v.producer_get_barrier(st), 0, TMA::CacheHintSm90::EVICT_LAST),
             tVgV(_, n), tVsV(_, st.index()));
      }
    };

    // Q is read once per tile, so it comes from HBM. With one Q buffer its TMA load below waits
    // until the previous tile's key loop (with an O buffer) or its epilogue's store of O from
    // that buffer, and then pays the full HBM latency before the first Q K^T. The producer gets
    // here when it has issued the previous tile's last K/V block, i.e. about `stages` key blocks
    // before that tile ends (fewer if it had fewer): pull Q into L2 now (measured at d128:
    // seqlen 512-1024 +3..10%, >= 4k within +-1.5%; bench/results/history.md). With two Q buffers the load itself is issued
    // this early; a prefetch would only fetch Q twice.
    if constexpr (Kt::kQStages == 1) {
      if (leader) cute::prefetch(p.tma_q, tQgQ);
    }
    int32_t n = ti.keys.n_block_max - 1;
    load_k(n, wr);
    // A Q buffer is free once the consumers finished the Q K^T products of the tile that used it
    // (and, without an O buffer, the TMA store of its O, which the epilogue stages there).
    if (leader) {
      pipe_q.producer_acquire(wq);
      copy(p.tma_q.with(*pipe_q.producer_get_barrier(wq), 0, TMA::CacheHintSm90::EVICT_FIRST),
           tQgQ, tQsQ(_, wq.index()));
    }
    ++wq;
    for (--n; n >= ti.keys.n_block_min; --n) {
      PipelineState wr_v = wr;
      ++wr;
      load_k(n, wr);
      load_v(n + 1, wr_v);
    }
    load_v(ti.keys.n_block_min, wr);
    ++wr;
  }
};

}  // namespace fa4::hopper
