// src/hopper/fwd/mainloop_fwd_mma.cuh — a consumer warpgroup's main loop over the key blocks of one tile.
//
// Per warpgroup (64 query rows), FA3-style intra-warpgroup overlap:
//     S_last = Q K_last^T ; softmax -> P
//     for each further block j (descending):
//         issue S_j = Q K_j^T          (async wgmma, SS: both operands in smem)
//         issue O += P V_{j+1}         (async wgmma, RS: P straight from registers)
//         wait for S_j only            -> softmax of S_j runs while the PV wgmma computes
//         wait for PV ; rescale O if the warp's maxima moved (lazy, FA4) ; P = convert(S_j)
//     O += P V_first
// Ping-pong: the consumer warpgroups (two, or three at tile_m 192) take turns issuing their wgmmas
// (named barriers, round robin), so while one warpgroup's tensor-core work runs, the others do
// their softmax — MUFU/FMA and tensor cores stay busy together.
// With kWarpgroupKeyRanges a warpgroup passes through the blocks above those its own rows see
// (waits for and releases their stages, takes their turns empty); its first computed block then
// takes a turn like every block after the tile's first.
#pragma once

#include <cute/tensor.hpp>

#include "hopper/arch/arch.cuh"
#include "hopper/shared/mma.cuh"
#include "hopper/shared/softmax.cuh"
#include "hopper/shared/tile_info.cuh"

namespace fa4::hopper {

template <class Kt>
struct MainloopMma {
  using Params = typename Kt::Params;
  using Pipeline = typename Kt::MainloopPipeline;
  using PipelineState = typename Kt::PipelineState;
  using PipelineQ = typename Kt::PipelineQ;
  using PipelineStateQ = typename Kt::PipelineStateQ;
  using Element = typename Kt::Element;
  static constexpr int kBlockM = Kt::kBlockM;
  static constexpr int kBlockN = Kt::kBlockN;
  static constexpr int kFragS = kBlockN / 2;  // fp32 S values per thread (64 rows x N / 128)

  /// A turn's barrier counts this warpgroup's 128 threads (sync) and the previous one's (arrive).
  static constexpr uint32_t kTurnThreads = 2 * cutlass::NumThreadsPerWarpGroup;
  __device__ __forceinline__ static void pingpong_wait(int wg) {
    if constexpr (Kt::kPingPong)
      arch::named_barrier_sync(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::turn(wg), kTurnThreads);
  }
  /// Hands the turn to the next warpgroup (round robin over the two or three consumer warpgroups).
  __device__ __forceinline__ static void pingpong_pass(int wg) {
    if constexpr (Kt::kPingPong) {
      // (1 - wg for two warpgroups keeps their code exactly as it was before tile_m 192 existed.)
      const int next = Kt::kNumMmaWarpGroups == 2 ? 1 - wg : (wg + 1) % Kt::kNumMmaWarpGroups;
      arch::named_barrier_arrive(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::turn(next), kTurnThreads);
    }
  }
  /// Warpgroup 0 takes the first turn.
  __device__ __forceinline__ static void pingpong_init(int wg) {
    if constexpr (Kt::kPingPong) {
      if (wg == 0) arch::named_barrier_arrive(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::turn(0), kTurnThreads);
    }
  }

  /// Runs the key loop of one tile (which has keys; a stream-K piece: the blocks of ti.keys), reading
  /// Q from buffer rq. On return tOrO holds the unnormalised O and softmax the row statistics. The Q
  /// buffer is released here if release_q (else the epilogue stages O in it and releases it).
  /// `tid` is the thread index among the consumer threads (0..kNumMmaThreads-1).
  template <class SharedStorage, class FragO>
  __device__ __forceinline__ static void run(const Params& p, SharedStorage& ss, Pipeline& pipe_k, Pipeline& pipe_v,
                             PipelineQ& pipe_q, PipelineState& rd, PipelineStateQ rq, const TileInfo& ti,
                             int tid, bool release_q, FragO& tOrO, OnlineSoftmax<kFragS>& softmax) {
    using namespace cute;
    // Broadcast from lane 0: the compiler then knows wg is warp-uniform and keeps the wgmma
    // descriptors derived from it in uniform registers.
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Kt::SmemLayoutQ{})(_, _, rq.index());
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Kt::SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Kt::SmemLayoutVt{});
    typename Kt::TiledMmaQK mma_qk;
    typename Kt::TiledMmaPV mma_pv;
    // All 128 threads of a warpgroup share one smem descriptor: slice by the warpgroup's thread 0.
    auto wg_qk = mma_qk.get_slice(wg * 128);
    auto wg_pv = mma_pv.get_slice(wg * 128);
    Tensor tSrQ = wg_qk.partition_fragment_A(sQ);   // descriptors (MMA, MMA_M, MMA_K)
    Tensor tSrK = wg_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K, stage)
    Tensor tOrV = wg_pv.partition_fragment_B(sVt);  // (MMA, MMA_N, MMA_K, stage)
    Tensor tSrS = partition_fragment_C(mma_qk, Shape<Int<kBlockM>, Int<kBlockN>>{});
    static_assert(decltype(size(tSrS))::value == kFragS);
    Tensor tOrP = make_tensor<Element>(acc_to_a_layout(tSrS.layout()));
    Tensor tOrP32 = recast<uint32_t>(tOrP);

    // Rows/cols of this thread (arch/arch.cuh's fragment maps).
    const int col_lane = fragment_col(tid);
    detail::KeyRange vis[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      vis[r] = detail::visible_key_range(fragment_row_coord<kBlockM>(p, ti, tid, r).query, ti.seqlen_q, ti.seqlen_k, p.mask);

    // The stages come in the tile's order, blocks n_hi - 1 down to n_lo. With kWarpgroupKeyRanges
    // this warpgroup computes only blocks [n_lo, w_hi), below the last its own 64 rows see (a
    // causal tile's diagonal blocks above them, all blocks for a partial last tile's warpgroup
    // past seqlen_q: a score block of -inf costs the same products and exponentials). It passes
    // through the others: waits for each stage (a release before the stage is full would complete
    // the wrong phase), releases it, and takes its ping-pong turn empty, so the turns stay round
    // robin.
    const int32_t n_hi = ti.keys.n_block_max, n_lo = ti.keys.n_block_min;
    static_assert(kBlockM == 64 * Kt::kNumMmaWarpGroups, "64 query rows per consumer warpgroup");
    TileKeyRange wk{};
    int32_t w_hi = n_hi;
    if constexpr (Kt::kWarpgroupKeyRanges) {
      // The warpgroup's first and last rows' query tokens (the local kernel never packs GQA groups).
      const int32_t wq_lo = tile_row<kBlockM>(p, ti, wg * 64).query;
      const int32_t wq_hi = min(tile_row<kBlockM>(p, ti, wg * 64 + 63).query, ti.seqlen_q - 1);
      wk = wq_lo < ti.seqlen_q ? TileKeyRange::make(wq_lo, wq_hi, ti.seqlen_q, ti.seqlen_k, p.mask, kBlockN)
                               : TileKeyRange{};
      // Blocks below the warpgroup's first visible one (a left window) stay computed, masked: a
      // second pass-through loop after the key loop cost the key loop's Q K^T its wgmma
      // descriptors in uniform registers (ptxas recomputed them before each k-step).
      w_hi = min(wk.n_block_max, n_hi);
      if (w_hi <= max(wk.n_block_min, n_lo)) w_hi = n_lo;  // no block: pass through all of them
    }
    // (The element mask, too, is this warpgroup's: wk.needs_mask skips the blocks all 64 rows see whole.)
    // Scores -> logits in place: softcap (before the mask, so -inf stays -inf), then the mask.
    auto score_mod = [&](int32_t n_block) {
      if (p.has_softcap) {
#pragma unroll
        for (int v = 0; v < kFragS; ++v) tSrS(v) = tanhf(tSrS(v) * p.softcap_inv_scale);
      }
      if ((Kt::kWarpgroupKeyRanges ? wk : ti.keys).needs_mask(n_block, kBlockN)) {
        const int32_t k0 = n_block * kBlockN + col_lane;
#pragma unroll
        for (int v = 0; v < kFragS; ++v) {
          const int r = (v >> 1) & 1;
          const int32_t j = k0 + (v >> 2) * 8 + (v & 1);
          if (j < vis[r].first || j >= vis[r].last) tSrS(v) = -INFINITY;
        }
      }
    };
    auto convert_p = [&]() {
#pragma unroll
      for (int i = 0; i < kFragS / 2; ++i) tOrP32(i) = pack2<Element>(tSrS(2 * i), tSrS(2 * i + 1));
    };
    auto rescale_o = [&](const float (&o_scale)[2]) {
#pragma unroll
      for (int v = 0; v < size(tOrO); ++v) tOrO(v) *= o_scale[(v >> 1) & 1];
    };
    // The raw score (softcap applied, no mask) of this thread's fragment entry v of the key block
    // in K stage `k_stage`, again, from the Q and K tiles still in smem (a scalar fp32 dot
    // product: warp-local, where a wgmma would need all four warps). Only for the exponentials
    // that overflowed in step_from_running_max (softmax.cuh).
    auto score_at = [&](int k_stage, int v) {
      const int m = fragment_row(tid) + 8 * ((v >> 1) & 1);
      const int j = (v >> 2) * 8 + col_lane + (v & 1);
      float acc = 0.f;
#pragma unroll 1
      for (int k = 0; k < Kt::kHeadDim; ++k) acc = fmaf(float(sQ(m, k)), float(sK(j, k, k_stage)), acc);
      return p.has_softcap ? tanhf(acc * p.softcap_inv_scale) : acc;
    };
    auto consumer_wait = [](auto& pipe, auto st) {
      auto token = pipe.consumer_try_wait(st);
      pipe.consumer_wait(st, token);
      // Gathered K/V were written by cp.async (the generic proxy); the wgmmas read through the
      // async proxy: order them after the wait.
      if constexpr (Kt::kGather) cutlass::arch::fence_view_async_shared();
    };

    clear(tOrO);
    softmax.init();
    float o_scale[2];
    // Varlen, or a KV cache (seqused_k = cache_seqlens): rows of the last key block past seqlen_k
    // are another sequence's, unused seqused_k or stale cache rows, not TMA zero fill. Their P is
    // exactly 0, but 0 * NaN = NaN in the PV wgmma, so zero those V rows in smem once, every
    // consumer warpgroup at one barrier instruction (bar.sync is .aligned): with per-warpgroup key
    // ranges before any warpgroup's first block (a warpgroup may pass that block through), else
    // after the first block's softmax (the V load lands under it).
    const int32_t valid_in_last = ti.seqlen_k - (n_hi - 1) * kBlockN;
    auto zero_v_tail = [&]() {
      // (Gathered rows past seqlen_k are zero fill already.)
      if (Kt::kGather || (!p.is_varlen && !p.seqused_k) || valid_in_last >= kBlockN) return;
      consumer_wait(pipe_v, rd);
      // A trip count the same in every thread (the store is predicated instead): a loop exit that
      // may diverge here made the compiler keep the loop's pipeline states in per-thread
      // registers instead of uniform ones (an R2UR move before every wgmma).
      const int32_t count = (kBlockN - valid_in_last) * Kt::kHeadDimV;
      for (int base = 0; base < count; base += Kt::kNumMmaThreads) {
        const int e = base + tid;
        if (e < count) sVt(e % Kt::kHeadDimV, valid_in_last + e / Kt::kHeadDimV, rd.index()) = Element(0.f);
      }
      cutlass::arch::fence_view_async_shared();
      arch::named_barrier_sync(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::consumers(), Kt::kNumMmaThreads);
    };
    consumer_wait(pipe_q, rq);
    if constexpr (Kt::kWarpgroupKeyRanges) zero_v_tail();
    // Every block after the tile's first takes a ping-pong turn (the first none).
    // (Giving the tile's first Q K^T a turn too, as FA3 does, measured 0-1.3% slower here.)
    int32_t n = n_hi - 1;
#pragma unroll 1
    for (; Kt::kWarpgroupKeyRanges && n >= w_hi; --n) {  // blocks above this warpgroup's rows: passed through
      if (n != n_hi - 1) {
        pingpong_wait(wg);
        pingpong_pass(wg);
      }
      consumer_wait(pipe_k, rd);
      pipe_k.consumer_release(rd);
      consumer_wait(pipe_v, rd);
      pipe_v.consumer_release(rd);
      ++rd;
    }
    if (!Kt::kWarpgroupKeyRanges || w_hi > n_lo) {  // (without the ranges every block is computed)
      consumer_wait(pipe_k, rd);
      if constexpr (Kt::kWarpgroupKeyRanges) {  // one call site, in a turn after the tile's first block
        const bool turn = n != n_hi - 1;
        if (turn) pingpong_wait(wg);
        wgmma</*zero_init=*/true, -1>(mma_qk, tSrQ, tSrK(_, _, _, rd.index()), tSrS);
        if (turn) pingpong_pass(wg);
        warpgroup_wait<0>();
      } else {
        wgmma</*zero_init=*/true, /*wait=*/0>(mma_qk, tSrQ, tSrK(_, _, _, rd.index()), tSrS);
      }
      pipe_k.consumer_release(rd);
      score_mod(n);
      softmax.template step<Kt::kExp2Period, Kt::kExp2Emulated>(tSrS, p.score_scale_log2, p.rescale_threshold, o_scale,
                                                                 p.exp2_runtime, p.exp2_emulation);  // O is 0: no rescale needed
      convert_p();
      if constexpr (!Kt::kWarpgroupKeyRanges) zero_v_tail();
#pragma unroll 1
      for (--n; n >= n_lo; --n) {
        PipelineState rd_v = rd;
        ++rd;
        consumer_wait(pipe_k, rd);
        pingpong_wait(wg);
        wgmma<true, -1>(mma_qk, tSrQ, tSrK(_, _, _, rd.index()), tSrS);
        consumer_wait(pipe_v, rd_v);
        wgmma<false, -1>(mma_pv, tOrP, tOrV(_, _, _, rd_v.index()), tOrO);
        pingpong_pass(wg);
        // Rows that have seen a key can start their exponentials from the running max (no block max
        // in front; softmax.cuh). A row still at -inf (masked so far) needs the block max first.
        bool from_running_max = false;
        if constexpr (Kt::kExpFromRunningMax) from_running_max = __all_sync(0xffffffffu, softmax.has_finite_max());
        warpgroup_wait<1>();  // S_j ready; the PV wgmma keeps running under the softmax
        if constexpr (!Kt::kExpFromRunningMax) pipe_k.consumer_release(rd);
        score_mod(n);
        bool rescale = false;
        if constexpr (Kt::kExpFromRunningMax) {
          if (from_running_max) {
            const int k_stage = rd.index();
            softmax.template step_from_running_max<Kt::kExp2Period, Kt::kExp2Emulated>(
                tSrS, p.score_scale_log2, p.rescale_sum_limit, o_scale, p.exp2_runtime, p.exp2_emulation, rescale,
                [&](int v) { return score_at(k_stage, v); });
          }
        }
        if (!from_running_max) {
          rescale = softmax.template step<Kt::kExp2Period, Kt::kExp2Emulated>(tSrS, p.score_scale_log2, p.rescale_threshold, o_scale,
                                                                                p.exp2_runtime, p.exp2_emulation);
        }
        if constexpr (Kt::kExpFromRunningMax) pipe_k.consumer_release(rd);  // (score_at may read this K)
        warpgroup_wait<0>();
        pipe_v.consumer_release(rd_v);
        if (rescale) rescale_o(o_scale);  // warp-uniform branch: skipped for most blocks (lazy)
        convert_p();
      }
      // Every Q K^T and softmax of this warpgroup is done (score_at reads Q): once the others'
      // are too, the producer may load another Q into this buffer.
      if (release_q) pipe_q.consumer_release(rq);
      consumer_wait(pipe_v, rd);
      wgmma<false, 0>(mma_pv, tOrP, tOrV(_, _, _, rd.index()), tOrO);
      pipe_v.consumer_release(rd);
      ++rd;
    } else if (release_q) {
      pipe_q.consumer_release(rq);
    }
  }
};

}  // namespace fa4::hopper
