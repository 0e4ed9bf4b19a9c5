// src/hopper/shared/tile_scheduler.cuh — persistent tile order of the forward kernel, the greedy
// tile claim of both directions (claim_tile), and the ring (TileRing) through which the forward's
// and the backward's producer warp hands each tile to the other roles (the backward's order:
// bwd/schedule_bwd.h, bwd/geometry_bwd.cuh).
//
// The grid has min(num_tiles, num_SMs) CTAs, each running tiles until none is left (which ones:
// "Which CTA runs which tile" below). A tile is (m_block, head, batch): tile_m (128; d64: 192) query rows of one head
// (with the forward's pack-GQA, `head` is a KV head and the rows its group's: core/pack_gqa.h).
// The linear tile index is mapped to coordinates so that
//   * LPT: under causal/window masks the bottom m-blocks see the most keys; handing them out first
//     (longest-processing-time first) keeps the last wave short. Used for masked (causal/window)
//     and varlen problems; dense ones take the plain order (hopper_api.cu; the override "lpt"
//     of src/common/overrides.h forces it for the ablation, as "schedule" forces the claiming).
//   * L2 sections: (batch, head) pairs are processed in sections of `heads_per_section` whose K/V
//     fit in half the L2 together, iterating all m-blocks of a section before the next. Concurrent
//     CTAs then re-read the same K/V from L2 instead of HBM. Query heads of one KV head are
//     adjacent (GQA groups are contiguous), so a section shares K/V across the group too.
//
// Which CTA runs which tile (TileRing below):
//   * static: CTA c takes tiles c, c + grid, c + 2 grid, ... Right for dense problems, where every
//     tile costs the same.
//   * dynamic (causal/window problems with more tiles than CTAs): a CTA takes the next unclaimed
//     tile of the order above from a global atomic counter when it is ready for one, i.e. greedy
//     longest-first list scheduling. A static stride over an LPT-sorted list is badly unbalanced:
//     CTA 0 gets the longest tile of every round (simulated for causal d128 16k: makespan 1.29x the
//     mean CTA load static, 1.00x greedy).
//   * stream-K tail (tiles that all walk every key: no mask, or a masked chunk of one query tile
//     per head; static order; core/stream_k.h): whole tiles as in
//     `static`, then the last, partial round's key blocks spread evenly over the CTAs; a tile cut
//     between CTAs is merged by the CTA holding its first piece (stream_k.cuh). Automatic only with
//     fewer tiles than SMs (split-KV); the override "stream_k" = 1 forces it for any partial round.
// The producer warp claims work items (a tile, or a key-block range of one) and hands each to the
// consumer warpgroups through a two-slot shared-memory ring (mbarriers), so it can claim and
// load the next one while the consumers finish the current one. A tile >= num_tiles ends the CTA.
#pragma once

#include <cstdint>

#include "core/macros.h"
#include "core/stream_k.h"

#if defined(__CUDACC__)
#include <cutlass/pipeline/pipeline.hpp>
#endif

namespace fa4::hopper {

struct TileCoord {
  int32_t m_block;
  int32_t head;
  int32_t batch;
};

template <class Params>
FA4_HD TileCoord tile_coord(const Params& p, int32_t t) {
  const int32_t num_m = p.num_m_blocks;
  if (!p.lpt) {  // plain order: m fastest, then head, then batch
    const int32_t bh = t / num_m;
    return {t % num_m, bh % p.num_heads, bh / p.num_heads};
  }
  const int32_t num_bh = p.num_heads * p.batch;
  const int32_t sec = p.heads_per_section;
  const int32_t section = t / (sec * num_m);
  const int32_t in_section = t - section * sec * num_m;
  const int32_t rest = num_bh - section * sec;
  const int32_t sec_heads = sec < rest ? sec : rest;  // the last section may be short
  const int32_t m_idx = in_section / sec_heads;
  const int32_t bh = section * sec + in_section % sec_heads;
  return {num_m - 1 - m_idx, bh % p.num_heads, bh / p.num_heads};
}

#if defined(__CUDACC__)
/// Greedy claiming, both directions: the tile of the next claim on `counter` (zero when the launch
/// starts). Whole warp: lane 0 sends the atomicAdd, a full-mask shuffle broadcasts it. Claims are
/// numbered 0, 1, ... in claim order and take tiles grid, grid + 1, ... (a CTA's first tile,
/// blockIdx.x, is never claimed). Every CTA claims until it gets no tile (>= num_tiles), exactly
/// once each, so a launch with num_tiles >= grid makes num_tiles claims, numbered 0 .. num_tiles - 1.
/// kResetAtLast (a counter shared by launches, the forward's): the claim numbered num_tiles - 1 is
/// the launch's last and resets the counter to zero, so the next launch needs no memset. The
/// backward's counter is in a workspace other launches overwrite: its preprocess zeroes it.
template <bool kResetAtLast>
__device__ __forceinline__ int32_t claim_tile(int32_t* counter, int32_t num_tiles) {
  int32_t claimed = 0;
  if (threadIdx.x % 32 == 0) {
    claimed = atomicAdd(counter, 1);
    if (kResetAtLast && claimed == num_tiles - 1) atomicExch(counter, 0);
  }
  return __shfl_sync(0xffffffffu, claimed, 0) + int32_t(gridDim.x);
}

/// Work items from the producer warp to the consumers: a 2-slot ring in shared memory.
struct TileRing {
  static constexpr int kSlots = 2;
  using Pipeline = cutlass::PipelineAsync<kSlots>;
  using State = typename Pipeline::PipelineState;
  struct SharedStorage {
    typename Pipeline::SharedStorage barriers;
    detail::WorkItem item[kSlots];
    detail::StreamKCtaItems sk;  // this CTA's stream-K tail (set_up)
  };

  /// Constructed by every thread of the CTA before the __syncthreads that publishes barrier
  /// inits; warp 0 initialises the mbarriers. Producer: lane 0 of the producer warp commits;
  /// consumers: all `num_consumers` threads release.
  __device__ static Pipeline make(SharedStorage& ss, bool producer, uint32_t num_consumers) {
    typename Pipeline::Params pp;
    pp.role = producer ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    pp.producer_arv_count = 1;
    pp.consumer_arv_count = num_consumers;
    return Pipeline(ss.barriers, pp);
  }

  /// Thread 0, before the __syncthreads that publishes the barrier inits (and before the producer
  /// warpgroup gives up its registers): this CTA's stream-K tail, for `item`.
  template <class Params>
  __device__ static void set_up(const Params& p, SharedStorage& ss) {
    ss.sk = detail::stream_k_cta_items(p.sk, int32_t(blockIdx.x));
  }

  /// Item `i` of this CTA (i counts from 0), or, under the dynamic schedule (tile_counter set, zero
  /// at launch), the next claimed tile (claim_tile). Called by the whole producer warp right after
  /// issuing the current item's loads: the atomic's round trip then overlaps the consumers' work on
  /// the tiles already loaded, since the producer runs ahead of them. The first item of a CTA is
  /// never claimed: it is tile blockIdx.x.
  template <class Params>
  __device__ static detail::WorkItem item(const Params& p, const SharedStorage& ss, int32_t i) {
    if (!p.tile_counter || i == 0) return detail::stream_k_item(p.sk, ss.sk, p.num_tiles, int32_t(blockIdx.x), i);
    detail::WorkItem w;
    w.tile = claim_tile</*kResetAtLast=*/true>(p.tile_counter, p.num_tiles);
    return w;
  }

  /// Producer warp: hands `w` to the consumers as the n-th published item (lane 0 writes; the
  /// mbarrier arrive releases it). The ring position is derived from n so the producer, which
  /// runs on 24 registers, keeps one counter live instead of a pipeline state.
  __device__ static void publish(Pipeline& pipe, SharedStorage& ss, uint32_t n, const detail::WorkItem& w) {
    if (threadIdx.x % 32 == 0) {
      const State st(int(n % kSlots), ((n / kSlots) & 1u) ^ 1u, n);  // producer starts at phase 1
      pipe.producer_acquire(st);
      ss.item[st.index()] = w;
      pipe.producer_commit(st);
    }
  }

  /// Consumer thread: the next item of this CTA. Broadcast from lane 0 (every lane read the same
  /// words) so the compiler knows it is warp-uniform: the consumers branch on it per tile.
  __device__ static detail::WorkItem receive(Pipeline& pipe, SharedStorage& ss, State& st) {
    pipe.consumer_wait(st);
    const detail::WorkItem& s = ss.item[st.index()];
    detail::WorkItem w;
    w.tile = __shfl_sync(0xffffffffu, s.tile, 0);
    w.n_lo = __shfl_sync(0xffffffffu, s.n_lo, 0);
    w.n_hi = __shfl_sync(0xffffffffu, s.n_hi, 0);
    w.role = __shfl_sync(0xffffffffu, s.role, 0);
    pipe.consumer_release(st);
    ++st;
    return w;
  }
};
#endif

}  // namespace fa4::hopper
