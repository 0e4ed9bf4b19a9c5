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
// The gathering kernel (Kt::kGather: a paged cache whose pages are not whole key blocks) loads
// K/V with warps 1-3 instead (gather, below): TMA boxes of a few page rows each measured 1.2-1.8x
// slower than the decode kernel, so the rows are copied 16 bytes at a time through cp.async, as
// FlashAttention-3 does for paged KV without TMA.
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
  /// lane 0 issues TMAs and touches the barriers. A paged cache (p.page_table) runs a loop of its
  /// own: the producer has 24 registers, and the page-table reads in the dense loop made ptxas
  /// spill its state there too.
  template <class SharedStorage>
  __device__ __forceinline__ static void run(const Params& p, SharedStorage& ss, Pipeline& pipe_k, Pipeline& pipe_v,
                                             PipelineQ& pipe_q, TileRing::Pipeline& pipe_t) {
    if (Kt::kGather || p.page_table) run_tiles<true>(p, ss, pipe_k, pipe_v, pipe_q, pipe_t);
    else run_tiles<false>(p, ss, pipe_k, pipe_v, pipe_q, pipe_t);
  }

  template <bool kPaged, class SharedStorage>
  __device__ __forceinline__ static void run_tiles(const Params& p, SharedStorage& ss, Pipeline& pipe_k,
                                                   Pipeline& pipe_v, PipelineQ& pipe_q, TileRing::Pipeline& pipe_t) {
    using namespace cute;
    const bool leader = threadIdx.x % 32 == 0;
    if (leader) {
      cute::prefetch_tma_descriptor(&p.tma_q);
      if constexpr (!Kt::kGather) {
        cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
        cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
      }
    }
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Kt::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Kt::SmemLayoutVt{});
    auto cta_k = p.tma_k.get_slice(_0{});
    auto cta_v = p.tma_v.get_slice(_0{});
    Tensor tKsK = group_modes<0, 3>(cta_k.partition_D(sK));   // (TMA, stage)
    Tensor tVsV = group_modes<0, 3>(cta_v.partition_D(sVt));  // (TMA, stage)
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
      // (A paged cache's page-table check: tuning_fwd.h kHopperPageCheckLoads.)
      TileInfo ti = make_tile_info<kBlockM, kBlockN, true, kPaged ? Kt::kPageCheckLoads : 0>(p, w.tile);
      if (ti.has_rows) {
        TileRing::publish(pipe_t, ss.tiles, published++, w);
        // After the publish: the piece's key range is not live across it (the 24-register
        // producer spilled more with it computed before).
        restrict_keys(ti, w);
        if constexpr (Kt::kGather) {  // (K/V: the gathering warps)
          if (ti.has_keys()) {
            prefetch_q(p, ti);  // (load_q waits for the previous tile's Q K^T)
            load_q(p, pipe_q, wq, ti, ss.smem_q.data());
          }
        } else if (ti.has_keys()) {
          load_tile<kPaged>(p, ss, pipe_k, pipe_v, pipe_q, ti, wr, wq, tKsK, tVsV, mK_all, mVt_all);
        }
      }
      w = TileRing::item(p, ss.tiles, ++i);
    }
    TileRing::publish(pipe_t, ss.tiles, published, w);  // a tile >= num_tiles stops the consumers
    if (leader) {
      // Wait until the consumers released every stage: no TMA load may still target this CTA's
      // smem. (A TMA store still reading staged O is waited for by its issuing consumer thread,
      // before it releases a Q buffer or, with an O buffer, before the kernel exits.)
      if constexpr (!Kt::kGather) {
        pipe_k.producer_tail(wr);
        pipe_v.producer_tail(wr);
      }
      pipe_q.producer_tail(wq);
    }
  }

  /// Key block n of a paged cache, rows [row, row + kBlockN) of page `page` (page_size is a multiple
  /// of kBlockN), into stage `stage` of the K ring (kV false) or the V ring, signalling `bar`
  /// (lane 0 issues).
  template <bool kV>
  __device__ __forceinline__ static void load_paged_block(const Params& p, typename Kt::Element* ring, int stage,
                                                       uint64_t* bar, int32_t h_kv, int32_t n, int32_t page) {
    using namespace cute;
    if (threadIdx.x % 32 != 0) return;
    const int32_t row = (n * kBlockN) % p.page_size;  // a multiple of kBlockN
    if constexpr (kV) {
      Tensor sVt = make_tensor(make_smem_ptr(ring), typename Kt::SmemLayoutVt{});
      Tensor g = local_tile(p.tma_v.get_tma_tensor(p.shape_vt)(_, _, h_kv, page),
                            Shape<Int<Kt::kHeadDimV>, Int<kBlockN>>{}, make_coord(_0{}, row / kBlockN));
      auto cta = p.tma_v.get_slice(_0{});
      copy(p.tma_v.with(*bar, 0, TMA::CacheHintSm90::EVICT_LAST), group_modes<0, 3>(cta.partition_S(g)),
           group_modes<0, 3>(cta.partition_D(sVt))(_, stage));
    } else {
      Tensor sK = make_tensor(make_smem_ptr(ring), typename Kt::SmemLayoutK{});
      Tensor g = local_tile(p.tma_k.get_tma_tensor(p.shape_k)(_, _, h_kv, page),
                            Shape<Int<kBlockN>, Int<Kt::kHeadDim>>{}, make_coord(row / kBlockN, _0{}));
      auto cta = p.tma_k.get_slice(_0{});
      copy(p.tma_k.with(*bar, 0, TMA::CacheHintSm90::EVICT_LAST), group_modes<0, 3>(cta.partition_S(g)),
           group_modes<0, 3>(cta.partition_D(sK))(_, stage));
    }
  }

  /// Q is read once per tile, so it comes from HBM. With one Q buffer its TMA load (load_q) waits
  /// until the previous tile's key loop (with an O buffer) or its epilogue's store of O from that
  /// buffer, and then pays the full HBM latency before the first Q K^T: pull Q into L2 while the
  /// previous tile still runs (measured at d128: seqlen 512-1024 +3..10%, >= 4k within +-1.5%;
  /// bench/results/history.md). With two Q buffers the load itself is issued that early; a
  /// prefetch would only fetch Q twice.
  __device__ __forceinline__ static void prefetch_q(const Params& p, const TileInfo& ti) {
    if constexpr (Kt::kQStages == 1) {
      if (threadIdx.x % 32 != 0) return;
      const QBox q = q_box(p, ti);
#pragma unroll
      for (int c = 0; c < Kt::kQChunks; ++c)
        cute::SM90_TMA_LOAD_4D::PREFETCH::copy(&p.tma_q, c * Kt::kQChunkCols, q.head, q.row, q.batch);
    }
  }

  /// The first query head and row of tile ti's Q box (tma_q's coordinates): the tile's head and
  /// first token, or with pack-GQA its KV head's first query head.
  struct QBox {
    int32_t head, row, batch;
  };
  __device__ __forceinline__ static QBox q_box(const Params& p, const TileInfo& ti) {
    return {p.packed() ? ti.c.head * p.group_size : ti.c.head, ti.q_row0 + ti.c.m_block * p.queries_per_tile(),
            p.is_varlen ? 0 : ti.c.batch};
  }

  /// Issues Q into the next Q buffer, once the consumers freed it (lane 0): one box per W-column
  /// chunk of the buffer (kernel_traits_fwd.cuh kQChunks), out-of-bounds rows and columns
  /// zero-filled and counted.
  __device__ __forceinline__ static void load_q(const Params& p, PipelineQ& pipe_q, PipelineStateQ& wq,
                                                const TileInfo& ti, typename Kt::Element* smem_q) {
    using namespace cute;
    if (threadIdx.x % 32 == 0) {
      pipe_q.producer_acquire(wq);
      uint64_t* bar = pipe_q.producer_get_barrier(wq);
      const QBox q = q_box(p, ti);
      typename Kt::Element* stage = smem_q + wq.index() * Kt::kQStageElems;
#pragma unroll
      for (int c = 0; c < Kt::kQChunks; ++c)
        SM90_TMA_LOAD_4D::copy(&p.tma_q, bar, uint64_t(TMA::CacheHintSm90::EVICT_FIRST),
                               stage + c * kBlockM * Kt::kQChunkCols, c * Kt::kQChunkCols, q.head, q.row, q.batch);
    }
    ++wq;
  }

  /// Issues Q (into the next Q buffer, once the consumers freed it) and every K/V block of tile ti
  /// (which has rows and keys).
  template <bool kPaged, class SharedStorage, class TK, class TV, class MK, class MV>
  __device__ __forceinline__ static void load_tile(const Params& p, SharedStorage& ss, Pipeline& pipe_k, Pipeline& pipe_v,
                                                   PipelineQ& pipe_q, const TileInfo& ti, PipelineState& wr,
                                                   PipelineStateQ& wq, TK& tKsK, TV& tVsV, const MK& mK_all,
                                                   const MV& mVt_all) {
    using namespace cute;
    const bool leader = threadIdx.x % 32 == 0;
    auto cta_k = p.tma_k.get_slice(_0{});
    auto cta_v = p.tma_v.get_slice(_0{});
    const int32_t b = p.is_varlen ? 0 : ti.c.batch;
    const int32_t h_kv = tile_kv_head(p, ti);
    Tensor gK = local_tile(domain_offset(make_coord(ti.k_row0, _0{}), mK_all(_, _, h_kv, b)),
                           Shape<Int<kBlockN>, Int<Kt::kHeadDim>>{}, make_coord(_, _0{}));
    Tensor gVt = local_tile(domain_offset(make_coord(_0{}, ti.k_row0), mVt_all(_, _, h_kv, b)),
                            Shape<Int<Kt::kHeadDimV>, Int<kBlockN>>{}, make_coord(_0{}, _));
    Tensor tKgK = group_modes<0, 3>(cta_k.partition_S(gK));   // (TMA, n_block)
    Tensor tVgV = group_modes<0, 3>(cta_v.partition_S(gVt));  // (TMA, n_block)

    // Paged cache: block n's page (every lane reads the same entry; lane 0 issues). K's blocks go
    // from the last down, one at a time, so the next one's entry is read while this one is issued
    // (a page-table read before each block's TMA put an L2 round trip between the producer's
    // blocks); V of a block follows K of the next lower one, so its entry is kept one block
    // longer. seq_bounds checked every entry of the sequence's keys (a visited block starts inside
    // them); a block outside the tile's, or an entry outside the pool, gets page num_pages:
    // outside the TMA view, so zero-filled, never read.
    auto block_page = [&](int32_t n) {
      int32_t page = p.num_pages;
      if (n >= ti.keys.n_block_min) {
        page = __ldg(p.page_table + int64_t(ti.c.batch) * p.page_table_batch_stride + n * kBlockN / p.page_size);
        if (!detail::page_in_pool(page, p.num_pages)) page = p.num_pages;
      }
      return page;
    };
    int32_t page_next = 0, page_last = 0, page_before_last = 0, last_k = 0;
    if constexpr (kPaged) page_next = block_page(ti.keys.n_block_max - 1);
    auto load_k = [&](int32_t n, PipelineState st) {
      if constexpr (kPaged) {  // (n is the block below the last one's: page_next holds it)
        page_before_last = page_last;
        page_last = page_next;
        last_k = n;
        page_next = block_page(n - 1);
        if (leader) pipe_k.producer_acquire(st);
        load_paged_block<false>(p, ss.smem_k.data(), st.index(), pipe_k.producer_get_barrier(st), h_kv, n, page_last);
        return;
      }
      if (leader) {
        pipe_k.producer_acquire(st);
        copy(p.tma_k.with(*pipe_k.producer_get_barrier(st), 0, TMA::CacheHintSm90::EVICT_LAST),
             tKgK(_, n), tKsK(_, st.index()));
      }
    };
    auto load_v = [&](int32_t n, PipelineState st) {
      if constexpr (kPaged) {  // (n is the last K block or the one before it)
        const int32_t page = n == last_k ? page_last : page_before_last;
        if (leader) pipe_v.producer_acquire(st);
        load_paged_block<true>(p, ss.smem_v.data(), st.index(), pipe_v.producer_get_barrier(st), h_kv, n, page);
        return;
      }
      if (leader) {
        pipe_v.producer_acquire(st);
        copy(p.tma_v.with(*pipe_v.producer_get_barrier(st), 0, TMA::CacheHintSm90::EVICT_LAST),
             tVgV(_, n), tVsV(_, st.index()));
      }
    };

    // The producer gets here when it has issued the previous tile's last K/V block, i.e. about
    // `stages` key blocks before that tile ends (fewer if it had fewer).
    prefetch_q(p, ti);
    int32_t n = ti.keys.n_block_max - 1;
    load_k(n, wr);
    // A Q buffer is free once the consumers finished the Q K^T products of the tile that used it
    // (and, without an O buffer, the TMA store of its O, which the epilogue stages there).
    load_q(p, pipe_q, wq, ti, ss.smem_q.data());
    for (--n; n >= ti.keys.n_block_min; --n) {
      PipelineState wr_v = wr;
      ++wr;
      load_k(n, wr);
      load_v(n + 1, wr_v);
    }
    load_v(ti.keys.n_block_min, wr);
    ++wr;
  }

  /// The gathering kernel's producer warps 1-3 (Kt::kGather): they follow the tile ring as the
  /// consumers do and copy every key block of each tile into the K and V rings, in the order the
  /// TMA producer issues them (K of block n, then V of block n + 1). Each of their 96 threads
  /// waits for the stage to be free, issues its copies and arrives on the stage's full barrier
  /// once they have landed (noinc: the barrier expects the 96 arrivals, kernel_fwd.cuh).
  /// A block's page-table entries are read once for its K and V, one block ahead of their first
  /// use: the read's latency passes while the thread waits for a free stage and issues the
  /// previous block's copies, not between that wait and the copies that need it.
  template <class SharedStorage>
  __device__ static void gather(const Params& p, SharedStorage& ss, Pipeline& pipe_k, Pipeline& pipe_v,
                                TileRing::Pipeline& pipe_t) {
    const int lane = int(threadIdx.x % 32);
    const int warp = int(threadIdx.x / 32) - 1;
    // This thread's first pieces (stage 0), for each ring: GatherSmem's offsets, once.
    const GatherThread tk = gather_thread<false>(p, ss.smem_k.data(), warp, lane);
    const GatherThread tv = gather_thread<true>(p, ss.smem_v.data(), warp, lane);
    PipelineState wr = cutlass::make_producer_start_state<Pipeline>();
    TileRing::State ts;
    for (detail::WorkItem w = TileRing::receive(pipe_t, ss.tiles, ts); w.tile < p.num_tiles;
         w = TileRing::receive(pipe_t, ss.tiles, ts)) {
      const TileInfo ti = make_tile_info<kBlockM, kBlockN>(p, w);  // (the consumers' key range)
      if (!ti.has_keys()) continue;
      const int32_t h_kv = tile_kv_head(p, ti);
      int32_t n = ti.keys.n_block_max - 1;
      int32_t entry = page_entry(p, ti, n);
      int32_t entry_next = page_entry(p, ti, n - 1);
      gather_block<false>(p, tk, pipe_k, wr, ti, h_kv, n, entry);
      for (--n; n >= ti.keys.n_block_min; --n) {
        const int32_t entry_v = entry;
        entry = entry_next;
        entry_next = page_entry(p, ti, n - 1);
        PipelineState wr_v = wr;
        ++wr;
        gather_block<false>(p, tk, pipe_k, wr, ti, h_kv, n, entry);
        gather_block<true>(p, tv, pipe_v, wr_v, ti, h_kv, n + 1, entry_v);
      }
      gather_block<true>(p, tv, pipe_v, wr, ti, h_kv, ti.keys.n_block_min, entry);
      ++wr;
    }
    arch::cp_async_wait_all();  // nothing of this thread's still in flight when it exits
  }

  /// What a copying thread keeps of one ring across blocks: the shared-memory address of its
  /// first group's pieces 0 and 1 in stage 0, and its row's offset in a group (key lane / 4 of the
  /// group, columns from 8 (lane % 4)).
  struct GatherThread {
    uint32_t smem0, smem1;
    int64_t lane_offset;
  };

  template <bool kV>
  __device__ __forceinline__ static GatherThread gather_thread(const Params& p, typename Kt::Element* ring, int warp,
                                                               int lane) {
    using Smem = GatherSmem<Kt, kV>;
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
    const detail::RowStrides& stride = kV ? p.v_pool_stride : p.k_pool_stride;
    constexpr uint32_t kBytes = sizeof(typename Kt::Element);
    return {base + kBytes * uint32_t(Smem::first(warp, lane, 0)), base + kBytes * uint32_t(Smem::first(warp, lane, 1)),
            int64_t(Smem::key_in_group(lane)) * stride.row + Smem::column(lane)};
  }

  /// Lane g's page-table entry for key block n of tile ti: that of the block's g-th group of 8 keys
  /// (0 past the block's groups, past seqlen_k and below the tile's key range; seq_bounds checked
  /// every entry of the sequence's keys).
  __device__ __forceinline__ static int32_t page_entry(const Params& p, const TileInfo& ti, int32_t n) {
    const int lane = int(threadIdx.x % 32);
    const int32_t key = n * kBlockN + 8 * lane;
    if (n < ti.keys.n_block_min || lane >= kBlockN / 8 || key >= ti.seqlen_k) return 0;
    return __ldg(p.page_table + int64_t(ti.c.batch) * p.page_table_batch_stride + (key >> p.page_shift));
  }

  /// Key block n of tile ti (KV head h_kv) into stage st of the K ring (kV false) or the V ring. The
  /// block goes in groups of 8 keys (8 divides both the block's first key and the page size: a group
  /// lies in one page); warp w (0-2) takes groups w, w + 3, ..., lane l key l / 4 of the group and
  /// the 16-byte pieces l % 4 + 4 i of its row, so a warp instruction reads 64 contiguous bytes of
  /// each of 8 rows. Lane g holds group g's page-table entry (`entry`, page_entry); the groups take
  /// it by shuffle. Keys from seqlen_k on and an entry outside the pool are zero-filled (src-size
  /// 0: nothing read); so is head-dim padding, which only an input narrower than the bucket has
  /// (copy_groups<false>: where every row is the bucket's width, no piece needs a test of its own).
  /// The smem addresses are GatherSmem's: the layout's, swizzle included, where TMA would have written.
  template <bool kV>
  __device__ __forceinline__ static void gather_block(const Params& p, const GatherThread& t, Pipeline& pipe,
                                                      PipelineState st, const TileInfo& ti, int32_t h_kv,
                                                      int32_t n, int32_t entry) {
    using Smem = GatherSmem<Kt, kV>;
    pipe.producer_acquire(st);  // (lane 0 of warp 0 is the leader, never here: no expect-tx)
    const int32_t width = kV ? p.headdim_v : cute::get<1>(p.shape_k);  // real d (a multiple of 8)
    if (width == Smem::kWidth) copy_groups<kV, true>(p, t, st.index(), ti, h_kv, n, entry, width);
    else copy_groups<kV, false>(p, t, st.index(), ti, h_kv, n, entry, width);
    cutlass::arch::cpasync_barrier_arrive_noinc(pipe.producer_get_barrier(st));
  }

  template <bool kV, bool kFullWidth>
  __device__ __forceinline__ static void copy_groups(const Params& p, const GatherThread& t, int stage,
                                                     const TileInfo& ti, int32_t h_kv, int32_t n, int32_t entry,
                                                     int32_t width) {
    using Element = typename Kt::Element;
    using Smem = GatherSmem<Kt, kV>;
    constexpr uint32_t kBytes = sizeof(Element);
    const int lane = int(threadIdx.x % 32);
    const int warp = int(threadIdx.x / 32) - 1;
    const Element* pool = kV ? p.v_pool : p.k_pool;
    const detail::RowStrides& stride = kV ? p.v_pool_stride : p.k_pool_stride;
    const int32_t key0 = n * kBlockN;
    // Lane g: the byte offset of group g's first row in the pool (its page's row (key0 + 8 g) %
    // page_size), or -1 where its entry is outside the pool (an offset is never negative: the
    // pool's strides are positive wherever its extent is above 1, hopper_api.cu check_tma_tensor);
    // the groups take it by shuffle.
    const int64_t group_offset =
        detail::page_in_pool(entry, p.num_pages)
            ? int64_t(kBytes) * (int64_t(uint32_t(entry)) * stride.batch +
                                 int64_t(uint32_t((key0 + 8 * lane) & (p.page_size - 1))) * stride.row)
            : int64_t(-1);
    const char* head = reinterpret_cast<const char*>(pool + int64_t(h_kv) * stride.head + t.lane_offset);
    const int32_t row_key = key0 + Smem::key_in_group(lane);  // this thread's key in group 0
    const int c0 = Smem::column(lane);
#pragma unroll 1
    for (int g = warp, j = 0; g < Smem::kGroups; g += 3, ++j) {
      const int64_t offset = __shfl_sync(0xffffffffu, group_offset, g);
      const bool row_ok = offset >= 0 && row_key + 8 * g < ti.seqlen_k;
      const Element* src = row_ok ? reinterpret_cast<const Element*>(head + offset) : pool;
#pragma unroll
      for (int i = 0; i < Smem::kPieces; ++i) {
        const uint32_t dst = (i % 2 ? t.smem1 : t.smem0) + kBytes * uint32_t(Smem::step(stage, j, i));
        if constexpr (kFullWidth) {
          arch::cp_async_16(dst, src + 32 * i, row_ok);
        } else {  // (pieces past the row's width zero-filled; their address need not be in the row)
          const bool ok = row_ok && c0 + 32 * i < width;
          arch::cp_async_16(dst, ok ? src + 32 * i : pool, ok);
        }
      }
    }
  }
};

}  // namespace fa4::hopper
