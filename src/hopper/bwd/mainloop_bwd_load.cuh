// src/hopper/bwd/mainloop_bwd_load.cuh — the backward's producer warpgroup: the TMA warp that loads a
// CTA's K and V and, query block by query block, Q, dO, lse_log2 and D; and the two dQ writer warps
// that reduce-add each staged dQ part into the fp32 accumulator.
//
// Every role takes the CTA's tiles from geometry_bwd.cuh bwd_tiles: the static order
// (schedule_bwd.h bwd_tile_index), or with tile claims as the TMA warp takes them (claimed
// greedily: bwd_next_tile) and hands them out through a TileRing; inside a tile every role walks
// the group's query heads in order, each over the query blocks that see the key block, with the
// same checked sequence bounds (geometry_bwd.cuh make_bwd_tile), so all roles agree step for step.
#pragma once

#include <cute/tensor.hpp>

#include "hopper/arch/arch.cuh"
#include "hopper/bwd/geometry_bwd.cuh"

namespace fa4::hopper {

template <class Kt>
struct BwdLoad {
  using Params = typename Kt::Params;
  static constexpr int kBlockM = Kt::kBlockM;
  static constexpr int kBlockN = Kt::kBlockN;

  /// Runs on the whole warp 0 (seq_bounds broadcasts over it); lane 0 issues every copy.
  template <class SharedStorage, class Ring>
  __device__ __forceinline__ static void run(const Params& p, SharedStorage& ss, typename Kt::PipelineQ& pipe_q,
                                             typename Kt::PipelinedO& pipe_do, typename Kt::PipelineKV& pipe_kv,
                                             Ring& ring) {
    using namespace cute;
    const bool leader = threadIdx.x % 32 == 0;
    if (leader) {
      cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_do.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    }
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Kt::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Kt::SmemLayoutdO{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Kt::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Kt::SmemLayoutV{});
    auto cta_q = p.tma_q.get_slice(_0{});
    auto cta_do = p.tma_do.get_slice(_0{});
    auto cta_k = p.tma_k.get_slice(_0{});
    auto cta_v = p.tma_v.get_slice(_0{});
    Tensor tQsQ = group_modes<0, 3>(cta_q.partition_D(sQ));     // (TMA, stage)
    Tensor tdOsdO = group_modes<0, 3>(cta_do.partition_D(sdO));  // (TMA, dO stage)
    Tensor tKsK = cta_k.partition_D(sK);
    Tensor tVsV = cta_v.partition_D(sV);
    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
    Tensor mdO = p.tma_do.get_tma_tensor(p.shape_do);
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
    Tensor mV = p.tma_v.get_tma_tensor(p.shape_v);

    auto wq = cutlass::make_producer_start_state<typename Kt::PipelineQ>();
    auto wdo = cutlass::make_producer_start_state<typename Kt::PipelinedO>();  // kSplitdO
    auto wkv = cutlass::make_producer_start_state<typename Kt::PipelineKV>();
    // (With claims the next tile is taken once this one's loads are issued.)
    auto tiles = bwd_tiles<Kt::kTileClaims, true>(ring, ss.tile_ring);
    for (int32_t t = tiles.first(p); t < p.num_tiles; t = tiles.next(p)) {
      const BwdTile ti = make_bwd_tile<kBlockM, kBlockN, true>(p, t);
      if (!ti.has_steps()) continue;  // the consumers write zero dK/dV (or nothing) without K/V
      const int32_t bt = p.is_varlen ? 0 : ti.b;
      if (leader) {
        Tensor gK = local_tile(domain_offset(make_coord(ti.s.k_row0, _0{}), mK(_, _, ti.h_kv, bt)),
                               Shape<Int<kBlockN>, Int<Kt::kHeadDim>>{}, make_coord(ti.n_block, _0{}));
        Tensor gV = local_tile(domain_offset(make_coord(ti.s.k_row0, _0{}), mV(_, _, ti.h_kv, bt)),
                               Shape<Int<kBlockN>, Int<Kt::kHeadDimV>>{}, make_coord(ti.n_block, _0{}));
        pipe_kv.producer_acquire(wkv);
        copy(p.tma_k.with(*pipe_kv.producer_get_barrier(wkv), 0, TMA::CacheHintSm90::EVICT_FIRST),
             cta_k.partition_S(gK), tKsK);
        copy(p.tma_v.with(*pipe_kv.producer_get_barrier(wkv), 0, TMA::CacheHintSm90::EVICT_FIRST),
             cta_v.partition_S(gV), tVsV);
      }
      ++wkv;
      for (int32_t g = 0; g < p.group_size; ++g) {
        const int32_t h = ti.h_kv * p.group_size + g;
        Tensor gQ = local_tile(domain_offset(make_coord(ti.s.q_row0, _0{}), mQ(_, _, h, bt)),
                               Shape<Int<kBlockM>, Int<Kt::kHeadDim>>{}, make_coord(_, _0{}));
        Tensor gdO = local_tile(domain_offset(make_coord(ti.s.q_row0, _0{}), mdO(_, _, h, bt)),
                                Shape<Int<kBlockM>, Int<Kt::kHeadDimV>>{}, make_coord(_, _0{}));
        Tensor tQgQ = group_modes<0, 3>(cta_q.partition_S(gQ));      // (TMA, m_block)
        Tensor tdOgdO = group_modes<0, 3>(cta_do.partition_S(gdO));  // (TMA, m_block)
        for (int32_t i_step = 0; i_step < ti.num_steps(); ++i_step) {
          const int32_t m = ti.step_block(i_step);
          if (leader) {
            pipe_q.producer_acquire(wq);
            uint64_t* bar = pipe_q.producer_get_barrier(wq);
            // Q and dO are re-read by every key block of the head: keep them in L2.
            copy(p.tma_q.with(*bar, 0, TMA::CacheHintSm90::EVICT_LAST), tQgQ(_, m), tQsQ(_, wq.index()));
            const int64_t row = (int64_t(h) * p.chunks + ti.chunk0 + m) * kBlockM;
            SM90_BULK_COPY_G2S::copy(p.lse_log2 + row, bar, ss.smem_lse.data() + wq.index() * kBlockM, Kt::kRowStatBytes);
            // dO and D: in Q's stage, or (kSplitdO) in a stage of their own ring, which the
            // consumers free mid-step.
            int do_stage = wq.index();
            if constexpr (Kt::kSplitdO) {
              pipe_do.producer_acquire(wdo);
              bar = pipe_do.producer_get_barrier(wdo);
              do_stage = wdo.index();
            }
            copy(p.tma_do.with(*bar, 0, TMA::CacheHintSm90::EVICT_LAST), tdOgdO(_, m), tdOsdO(_, do_stage));
            SM90_BULK_COPY_G2S::copy(p.dpsum + row, bar, ss.smem_d.data() + do_stage * kBlockM, Kt::kRowStatBytes);
          }
          ++wq;
          if constexpr (Kt::kSplitdO) ++wdo;
        }
      }
    }
    if (leader) {  // no load may still target this CTA's smem when it exits
      pipe_q.producer_tail(wq);
      if constexpr (Kt::kSplitdO) pipe_do.producer_tail(wdo);
      pipe_kv.producer_tail(wkv);
    }
  }
};

/// Warps 1 and 2 of the producer warpgroup: writer w takes the CTA's steps of parity w (counted
/// over all its tiles and query heads, as the consumers count them). For each, it waits until a
/// warpgroup's dQ (or a round of its parts) is staged (dq_full(wg, w)), reduce-adds it into
/// dq_accum with one bulk operation, and frees the staging once the bulk operation has read it
/// (dq_empty(wg, w)).
/// Deterministic mode: the key blocks of a head add into a chunk in ascending order (a per-chunk
/// semaphore counts the blocks done), so the fp32 sums, and dQ, are bitwise reproducible: a
/// writer waits for its turn, adds, waits until its adds are performed and releases the chunk.
/// That wait (the reduction's round trip through L2, then the release) takes longer than a step,
/// so with one writer it set the pace of every CTA; with two, one writer's wait overlaps the
/// other's step.
template <class Kt>
struct BwdDqWriter {
  using Params = typename Kt::Params;
  static constexpr int kBlockM = Kt::kBlockM;
  static constexpr int kBlockN = Kt::kBlockN;
  using Barriers = arch::NamedBarriers<Kt::kNumMmaWarpGroups>;
  static constexpr uint32_t kStageThreads = cutlass::NumThreadsPerWarpGroup + 32;

  /// Key blocks before n_block (of this sequence and mask) that see query block m: they add first.
  __device__ __forceinline__ static int32_t blocks_before(const Params& p, const BwdTile& ti, int32_t m) {
    int32_t count = 0;
    for (int32_t n0 = 0; n0 < ti.n_block; n0 += 32) {
      const int32_t n = n0 + int32_t(threadIdx.x % 32);
      bool sees = false;
      if (n < ti.n_block) {
        const QueryBlocks qb = query_blocks<kBlockM, kBlockN>(n, ti.s.seqlen_q, ti.s.seqlen_k, p.mask);
        sees = qb.m_lo <= m && m < qb.m_hi;
      }
      count += __popc(__ballot_sync(0xffffffffu, sees));
    }
    return count;
  }

  template <class SharedStorage, class Ring>
  __device__ __forceinline__ static void run(const Params& p, SharedStorage& ss, Ring& ring, int w) {
    const bool leader = threadIdx.x % 32 == 0;
    // The consumers' first step waits for the staging as a step of parity 1 would have left it.
    if (w == 1)
#pragma unroll
      for (int wg = 0; wg < Kt::kNumMmaWarpGroups; ++wg)
        arch::named_barrier_arrive(Barriers::dq_empty(wg, 1), kStageThreads);
    int32_t steps = 0;  // the CTA's steps so far
    auto tiles = bwd_tiles<Kt::kTileClaims, false>(ring, ss.tile_ring);
    for (int32_t t = tiles.first(p); t < p.num_tiles; t = tiles.next(p)) {
      const BwdTile ti = make_bwd_tile<kBlockM, kBlockN, true, false>(p, t);
      for (int32_t g = 0; g < p.group_size && ti.has_steps(); ++g) {
        const int32_t h = ti.h_kv * p.group_size + g;
        for (int32_t i_step = 0; i_step < ti.num_steps(); ++i_step) {
          if ((steps++ & 1) != w) continue;
          const int32_t m = ti.step_block(i_step);
          const int64_t chunk = int64_t(h) * p.chunks + ti.chunk0 + m;
          float* dst = p.dq_accum + chunk * (kBlockM * Kt::kHeadDim);
          if (p.deterministic) {
            const int32_t before = blocks_before(p, ti, m);
            // At least `before` adds, not exactly: with valid indices only the key block whose
            // turn it is can pass either way, but sequences whose cu_seqlens_q overlap (flagged
            // as bad, kBadCuSeqlensQ) share a chunk and its count, which then never returns to a
            // value another sequence's block waits for; with `>=` every chain still finishes
            // (its blocks before this one have lower tile indices and are done) and the error
            // is reported instead of the kernel hanging.
            if (leader) {
              while (arch::load_acquire(p.dq_semaphore + chunk) < before) {
              }
            }
            __syncwarp();
          }
          // A warpgroup's staging holds kDqStagedParts of its kDqParts parts: one bulk operation
          // per round, the rounds of both warpgroups in turn (each warpgroup stages its next
          // round once this one's is read).
#pragma unroll
          for (int round = 0; round < Kt::kDqParts / Kt::kDqStagedParts; ++round) {
#pragma unroll
            for (int wg = 0; wg < Kt::kNumMmaWarpGroups; ++wg) {
              if (!Kt::dq_part_real(wg, round * Kt::kDqStagedParts)) continue;  // padding only
              arch::named_barrier_sync(Barriers::dq_full(wg, w), kStageThreads);
              if (leader) {
                arch::bulk_reduce_add_f32(dst + wg * Kt::kDqChunkFloats + round * Kt::kDqStageFloats,
                                          ss.smem_dq.data() + wg * Kt::kDqStageFloats, Kt::dq_round_bytes(wg, round));
                arch::bulk_commit();
                arch::bulk_wait_read<0>();
              }
              __syncwarp();
              arch::named_barrier_arrive(Barriers::dq_empty(wg, w), kStageThreads);
            }
          }
          if (p.deterministic && leader) {
            arch::bulk_wait<0>();  // the adds are performed, then the next key block may add
            __threadfence();
            arch::add_release(p.dq_semaphore + chunk, 1);
          }
        }
      }
    }
    if (leader) arch::bulk_wait<0>();
  }
};

}  // namespace fa4::hopper
