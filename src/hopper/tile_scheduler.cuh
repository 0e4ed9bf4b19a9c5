// src/hopper/tile_scheduler.cuh — persistent tile order of the forward kernel.
//
// The grid has min(num_tiles, num_SMs) CTAs, each running tiles until none is left (which ones:
// "Which CTA runs which tile" below). A tile is (m_block, head, batch): 128 query rows of one head.
// The linear tile index is mapped to coordinates so that
//   * LPT: under causal/window masks the bottom m-blocks see the most keys; handing them out first
//     (longest-processing-time first) keeps the last wave short. Used for masked (causal/window)
//     and varlen problems; dense ones take the plain order (hopper_api.cu; FA4_HOPPER_LPT=0/1
//     forces it for the ablation, as FA4_HOPPER_SCHED=static/dynamic forces the claiming).
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
// The producer warp claims tiles and hands each index to the two consumer warpgroups through a
// two-slot shared-memory ring (mbarriers), so it can claim and load the next tile while the
// consumers finish the current one. An index >= num_tiles ends the CTA.
#pragma once

#include <cstdint>

#include "fa4/detail/macros.h"

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
/// Tile indices from the producer warp to the consumers: a 2-slot ring in shared memory.
struct TileRing {
  static constexpr int kSlots = 2;
  using Pipeline = cutlass::PipelineAsync<kSlots>;
  using State = typename Pipeline::PipelineState;
  struct SharedStorage {
    typename Pipeline::SharedStorage barriers;
    int32_t tile[kSlots];
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

  /// First tile of this CTA.
  __device__ static int32_t first() { return int32_t(blockIdx.x); }

  /// The tile after `t` for this CTA. Called by the whole producer warp right after issuing the
  /// current tile's loads (the atomic's round trip then overlaps the consumers' work on the tiles
  /// already loaded, since the producer runs ahead of them); lane 0 sends the atomicAdd and a
  /// full-mask shuffle broadcasts it. tile_counter == nullptr: the static stride t + grid.
  __device__ static int32_t claim_next(int32_t* tile_counter, int32_t t) {
    if (!tile_counter) return t + int32_t(gridDim.x);
    const int32_t claimed = threadIdx.x % 32 == 0 ? atomicAdd(tile_counter, 1) : 0;
    return __shfl_sync(0xffffffffu, claimed, 0) + int32_t(gridDim.x);
  }

  /// Producer warp: hands `t` to the consumers as the n-th published index (lane 0 writes; the
  /// mbarrier arrive releases it). The ring position is derived from n so the producer, which
  /// runs on 24 registers, keeps one counter live instead of a pipeline state.
  __device__ static void publish(Pipeline& pipe, SharedStorage& ss, uint32_t n, int32_t t) {
    if (threadIdx.x % 32 == 0) {
      const State st(int(n % kSlots), ((n / kSlots) & 1u) ^ 1u, n);  // producer starts at phase 1
      pipe.producer_acquire(st);
      ss.tile[st.index()] = t;
      pipe.producer_commit(st);
    }
  }

  /// Consumer thread: the next tile index of this CTA. Broadcast from lane 0 (every lane read the
  /// same word) so the compiler knows it is warp-uniform: the consumers branch on it per tile.
  __device__ static int32_t receive(Pipeline& pipe, SharedStorage& ss, State& st) {
    pipe.consumer_wait(st);
    const int32_t t = __shfl_sync(0xffffffffu, ss.tile[st.index()], 0);
    pipe.consumer_release(st);
    ++st;
    return t;
  }
};
#endif

}  // namespace fa4::hopper
