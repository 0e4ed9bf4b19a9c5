// src/hopper/bwd/mainloop_bwd_mma.cuh — a consumer warpgroup of the backward: its 64 keys of the CTA's
// key block against every query block that sees them (kernel_traits_bwd.cuh lists the products).
//
// Per step (one query block of one query head), in issue order:
//   S^T = K Q^T, dP^T = V dO^T                     (SS, issued together)
//   P^T = exp2(S^T scale_log2 - lse_log2)          on MUFU while dP^T's product runs; masked pairs
//                                                  exactly 0 (never exp of -inf - lse)
//   dS^T = P^T (dP^T - D) [* (1 - tanh^2): softcap]
//   dS^T -> smem (stmatrix); dV += P^T dO          (RS: P^T straight from registers)
//   both warpgroups meet (dS complete); dQ = dS K for half of d each; dK += dS^T Q (RS)
//   dQ staged in smem for a dQ writer warp's bulk reduce-add (mainloop_bwd_load.cuh) while
//   dK's product runs
// With shared keys (kernel_traits_bwd.cuh, above d128) each warpgroup holds half the queries of
// S^T and dP^T and half the columns of dK, dV, dQ: P^T goes to smem as well, and the step is
//   S^T, dP^T; P^T -> smem; both warpgroups meet (P complete); dV += P^T dO (SS); dS^T while dV
//   runs; dS^T -> smem; both meet; dQ part 0 and dK issued; dQ part 0 staged under dK, dQ part 1
//   issued into the same registers and staged (once the writer has read part 0, if the staging
//   holds one part: tuning_bwd.h dq_staged_parts; a part of padding columns only is skipped:
//   kernel_traits_bwd.cuh dq_part_real, and warpgroup 1's dK / dV products cover only its real
//   columns: dkv_part). With one part per warpgroup (tuning_bwd.h dq_parts 1: 192 x 128) each
//   warpgroup's dQ is one product staged under dK, warpgroup 1's narrowed to its 64 real columns
//   (dq_narrow)
// With dO in a ring of its own (tuning_bwd.h do_stages < q_stages) S^T is issued before the
// wait for dO, and dO is released once dQ part 0 is done (dV, issued before it, has read dO).
// The elementwise code comes in three versions: dense (a step whose pairs are all visible, as
// most are, selects nothing), masked, and softcap (which always selects).
// dK and dV stay in registers over the whole walk (all query heads of the KV head's group: no dK/dV
// atomics or buffers for GQA), then leave (dK scaled by softmax_scale) through smem and TMA stores
// where dk / dv are TMA-aligned (store_dkdv_tma; not with shared keys, nor for a varlen sequence's
// partial last key block), else through direct stores.
#pragma once

#include <cute/tensor.hpp>

#include "core/mask.h"
#include "hopper/arch/arch.cuh"
#include "hopper/bwd/geometry_bwd.cuh"
#include "hopper/shared/mma.cuh"

namespace fa4::hopper {

template <class Kt>
struct BwdMma {
  using Params = typename Kt::Params;
  using Element = typename Kt::Element;
  static constexpr int kBlockM = Kt::kBlockM;
  static constexpr int kBlockN = Kt::kBlockN;
  static constexpr bool kSharedKeys = Kt::kSharedKeys;
  using Barriers = arch::NamedBarriers<Kt::kNumMmaWarpGroups>;
  static constexpr uint32_t kStageThreads = cutlass::NumThreadsPerWarpGroup + 32;

  /// `tid`: index among the consumer threads (0..255).
  template <class SharedStorage, class Ring>
  __device__ __forceinline__ static void run(const Params& p, SharedStorage& ss, typename Kt::PipelineQ& pipe_q,
                                             typename Kt::PipelinedO& pipe_do, typename Kt::PipelineKV& pipe_kv,
                                             Ring& ring, int tid) {
    using namespace cute;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    Tensor sQ = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Kt::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(ss.smem_q.data()), typename Kt::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Kt::SmemLayoutdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(ss.smem_do.data()), typename Kt::SmemLayoutdOt{});
    Tensor sK = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Kt::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(ss.smem_k.data()), typename Kt::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(ss.smem_v.data()), typename Kt::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Kt::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(ss.smem_ds.data()), typename Kt::SmemLayoutdSt{});

    typename Kt::TiledMmaS mma_s;
    typename Kt::TiledMmadP mma_dp;
    typename Kt::TiledMmadV mma_dv;
    typename Kt::TiledMmadK mma_dk;
    typename Kt::TiledMmadQ mma_dq;
    // One smem descriptor per warpgroup: slice by its thread 0.
    auto wg_s = mma_s.get_slice(wg * 128);
    auto wg_dp = mma_dp.get_slice(wg * 128);
    auto wg_dv = mma_dv.get_slice(wg * 128);
    auto wg_dk = mma_dk.get_slice(wg * 128);
    auto wg_dq = mma_dq.get_slice(kSharedKeys ? 0 : wg * 128);  // shared keys: one warpgroup's atom
    Tensor tSrQ = wg_s.partition_fragment_B(sQ);         // (MMA, MMA_N, MMA_K, stage)
    Tensor tdPrdO = wg_dp.partition_fragment_B(sdO);     // (.., dO stage)
    Tensor tdVrdOt = wg_dv.partition_fragment_B(sdOt);   // (.., dO stage)
    Tensor tdKrQt = wg_dk.partition_fragment_B(sQt);     // (.., stage)
    Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);     // (.., dS buffer)
    Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);     // (the warpgroup's half of d; not with shared keys)
    // Shared keys: dV's and dK's A operands are P^T and dS^T in smem (the transposed dS views),
    // and dQ's B operand a part of K^T's columns; their descriptors are built in the step from an
    // opaque base (arch::opaque), as K's and V's.
    auto smem_ds_step = [&] {
      return make_tensor(make_smem_ptr(arch::opaque(ss.smem_ds.data())), typename Kt::SmemLayoutdSt{});
    };
    // dQ's B operand for a part: K^T's columns of this warpgroup's half of d (shared keys: part
    // `part` of its kDqParts parts of kDqCols columns).
    auto dq_operand_b = [&](int part) __attribute__((always_inline)) {
      if constexpr (kSharedKeys) {
        Tensor sKt_step = make_tensor(make_smem_ptr(arch::opaque(ss.smem_k.data())), typename Kt::SmemLayoutKt{});
        Tensor sKt_part =
            local_tile(sKt_step, Shape<Int<Kt::kDqCols>, Int<kBlockN>>{}, make_coord(wg * Kt::kDqParts + part, _0{}));
        return wg_dq.partition_fragment_B(sKt_part);
      } else {
        return tdQrKt;
      }
    };

    Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tdPrdP = partition_fragment_C(mma_dp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tdVrdV = partition_fragment_C(mma_dv, Shape<Int<kBlockN>, Int<Kt::kHeadDimV>>{});
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<Int<kBlockN>, Int<Kt::kHeadDim>>{});
    Tensor tdQrdQ = partition_fragment_C(mma_dq, typename Kt::DqTile{});
    constexpr int kFragS = decltype(size(tSrS))::value;
    static_assert(kFragS == kBlockN * kBlockM / Kt::kNumMmaThreads);
    static_assert(decltype(size(tdQrdQ))::value == Kt::kDqCols / 2, "dQ fragment: 64 x kDqCols per warpgroup");
    // dQ part `part` = dS (buffer buf) K: the narrow part (kernel_traits_bwd.cuh kDqNarrowCols)
    // as a narrower product over the bucket's columns only.
    auto dq_product = [&](int part, int buf) __attribute__((always_inline)) {
      if constexpr (Kt::kDqNarrowCols > 0) {
        if (wg == Kt::kDqNarrowWg && part == Kt::kDqNarrowPart) {
          dq_narrow(sdS(_, _, buf), make_tensor(make_smem_ptr(arch::opaque(ss.smem_k.data())), typename Kt::SmemLayoutKt{}),
                    tdQrdQ);
          return;
        }
      }
      wgmma<true, -1>(mma_dq, tdQrdS(_, _, _, buf), dq_operand_b(part), tdQrdQ);
    };
    // P^T and dS^T as the RS A operands of dV and dK (same registers, A order), and dS^T in the
    // accumulator order for its smem copy (shared keys: both only for the smem copies, then the
    // A operands of dV and dK are their smem views).
    Tensor tdVrP = make_tensor<Element>(acc_to_a_layout(tSrS.layout()));
    Tensor tdKrdS = make_tensor<Element>(acc_to_a_layout(tdPrdP.layout()));
    Tensor tdSrdS = make_tensor(tdKrdS.data(), tdPrdP.layout());
    Tensor tPrP = make_tensor(tdVrP.data(), tSrS.layout());
    // dS^T leaves the registers through stmatrix.trans: each 8x8 block of the (key, query)
    // accumulator lands as 8 query rows of 8 contiguous keys, i.e. straight in dS's (query, key)
    // layout: 4 instructions per thread instead of 32 scattered 16-bit stores.
    auto r2s_ds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_s);
    auto r2s_ds_thr = r2s_ds.get_thread_slice(tid);
    Tensor tdSsdS = r2s_ds_thr.partition_D(as_position_independent_swizzle_tensor(sdSt));  // (.., dS buffer)
    Tensor tdSadS = r2s_ds_thr.retile_S(tdSrdS);
    Tensor tPaP = r2s_ds_thr.retile_S(tPrP);
    Tensor tdVrP32 = recast<uint32_t>(tdVrP);
    Tensor tdKrdS32 = recast<uint32_t>(tdKrdS);

    const int t128 = tid % 128;
    // The query column (of the block) of the thread's first value pair: with shared keys the
    // warpgroup's S^T covers queries [32 wg, 32 wg + 32).
    const int col_lane = arch::fragment_col(tid) + (kSharedKeys ? wg * Kt::kSdPCols : 0);
    auto consumer_wait = [](auto& pipe, auto st) {
      auto token = pipe.consumer_try_wait(st);
      pipe.consumer_wait(st, token);
    };
    typename Kt::PipelineStateQ rq;
    typename Kt::PipelineStatedO rdo;  // kSplitdO
    typename Kt::PipelineStateKV rkv;
    int ds_buf = 0;

    // One step of the walk (the query block ea_in.q0 of the stage rq holds), in the issue order of
    // the header comment; kSoftcap / kMasked pick the elementwise version.
    auto step = [&](const ElemArgs& ea_in, const BwdTile& ti, auto softcap_c, auto masked_c) __attribute__((always_inline)) {
      constexpr bool kSoftcap = decltype(softcap_c)::value;
      constexpr bool kMasked = decltype(masked_c)::value;
      // Softcap with 64 accumulators of S^T (tile_m = 128): its P^T is packed for dV beside
      // P^T (1 - tanh^2) in S^T's registers, and with dP^T's 64 also in flight that is more than
      // the consumers' registers hold: ptxas would then serialise every wgmma of the kernel
      // (C7512). So this version runs S^T, P^T, dV and then dP^T one after another.
      constexpr bool kSoftcapSerial = kSoftcap && !kSharedKeys && kFragS > 32;
      const int st = rq.index();
      const int st_do = Kt::kSplitdO ? rdo.index() : st;  // dO's and D's stage
      ElemArgs ea = ea_in;
      if constexpr (kMasked) {
        // The queries each of this thread's two key rows sees (core/mask.h; empty past
        // seqlen_k), here rather than once per tile: the masked steps are few, and the dense
        // ones then carry four fewer registers.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int32_t j = ti.n_block * kBlockN + key_row(tid) + 8 * r;
          const detail::QueryRange q = detail::visible_query_range(j, ti.s.seqlen_q, ti.s.seqlen_k, p.mask);
          ea.vis_first[r] = int32_t(q.first);
          ea.vis_last[r] = int32_t(q.last);
        }
      }
      consumer_wait(pipe_q, rq);
      if constexpr (kMasked) {  // a sequence's last query block is never dense
        if (p.is_varlen && ea_in.q_rows < kBlockM) {
          // Rows past the sequence are the next sequence's, not TMA zero fill; dK += dS^T Q and
          // dV += P^T dO multiply them by an exact 0, but 0 * NaN = NaN.
          if constexpr (Kt::kSplitdO) consumer_wait(pipe_do, rdo);
          zero_rows<kBlockM, Kt::kHeadDim>(sQ(_, _, st), ea_in.q_rows, tid);
          zero_rows<kBlockM, Kt::kHeadDimV>(sdO(_, _, st_do), ea_in.q_rows, tid);
          cutlass::arch::fence_view_async_shared();
          arch::named_barrier_sync(Barriers::consumers(), Kt::kNumMmaThreads);
        }
      }
      {
        // K's and V's descriptors from an opaque base (arch::opaque): a few adds per step instead
        // of 16 spilled 64-bit descriptors reloaded before each wgmma.
        Tensor sK_step = make_tensor(make_smem_ptr(arch::opaque(ss.smem_k.data())), typename Kt::SmemLayoutK{});
        Tensor sV_step = make_tensor(make_smem_ptr(arch::opaque(ss.smem_v.data())), typename Kt::SmemLayoutV{});
        if constexpr (kSharedKeys) {
          // (at d256 Q's and dO's 16 descriptors each spill as well)
          Tensor sQ_step = make_tensor(make_smem_ptr(arch::opaque(ss.smem_q.data())), typename Kt::SmemLayoutQ{});
          Tensor sdO_step = make_tensor(make_smem_ptr(arch::opaque(ss.smem_do.data())), typename Kt::SmemLayoutdO{});
          wgmma<true, -1, Kt::kSKSteps>(mma_s, wg_s.partition_fragment_A(sK_step), wg_s.partition_fragment_B(sQ_step(_, _, st)),
                                        tSrS);
          // (kSplitdO) dO may still be loading: S^T runs meanwhile.
          if constexpr (Kt::kSplitdO) consumer_wait(pipe_do, rdo);
          wgmma<true, -1, Kt::kdPKSteps>(mma_dp, wg_dp.partition_fragment_A(sV_step),
                                         wg_dp.partition_fragment_B(sdO_step(_, _, st_do)), tdPrdP);
        } else {
          wgmma</*zero_init=*/true, -1>(mma_s, wg_s.partition_fragment_A(sK_step), tSrQ(_, _, _, st), tSrS);
          if constexpr (Kt::kSplitdO) consumer_wait(pipe_do, rdo);
          if constexpr (!kSoftcapSerial)
            wgmma<true, -1>(mma_dp, wg_dp.partition_fragment_A(sV_step), tdPrdO(_, _, _, st_do), tdPrdP);
        }
      }
      ea.lse = ss.smem_lse.data() + st * kBlockM;
      ea.dsum = ss.smem_d.data() + st_do * kBlockM;
      // The thread's first lse_log2 pairs (tuning_bwd.h lse_early_pairs), read while S^T's product
      // runs: read after the wait, their shared-memory loads queue behind dP^T's operand reads and
      // the exponentials wait for them.
      const LsePairs lse = load_lse(ea);
      // P^T on the exp unit while the dP^T product runs on the tensor cores.
      warpgroup_wait<kSoftcapSerial ? 0 : 1>();
      warpgroup_fence_operand(tSrS);
      probs<kSoftcap, kMasked>(p, ea, lse, tSrS, tdVrP32);
      if constexpr (kSoftcapSerial) {
        // dV takes the packed P^T before dP^T's accumulators are needed (see kSoftcapSerial).
        wgmma<false, -1>(mma_dv, tdVrP, tdVrdOt(_, _, _, st_do), tdVrdV);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdVrdV);
        Tensor sV_step = make_tensor(make_smem_ptr(arch::opaque(ss.smem_v.data())), typename Kt::SmemLayoutV{});
        wgmma<true, -1>(mma_dp, wg_dp.partition_fragment_A(sV_step), tdPrdO(_, _, _, st_do), tdPrdP);
        warpgroup_wait<0>();
      } else if constexpr (kSharedKeys) {
        // dV reads both warpgroups' P^T: through smem, then dV's product runs under dS^T.
        copy(r2s_ds, tPaP, tdSsdS(_, _, _, Kt::kPBuffer0 + ds_buf));
        cutlass::arch::fence_view_async_shared();
        arch::named_barrier_sync(Barriers::consumers(), Kt::kNumMmaThreads);
        Tensor sPt = smem_ds_step()(_, _, Kt::kPBuffer0 + ds_buf);
        if constexpr (Kt::kDvRealCols1 < Kt::kHeadDimV / 2) {
          if (wg == 1) dkv_part<Kt::kDvRealCols1, Kt::kHeadDimV>(sPt, sdOt(_, _, st_do), tdVrdV);
          else wgmma<false, -1>(mma_dv, wg_dv.partition_fragment_A(sPt), tdVrdOt(_, _, _, st_do), tdVrdV);
        } else {
          wgmma<false, -1>(mma_dv, wg_dv.partition_fragment_A(sPt), tdVrdOt(_, _, _, st_do), tdVrdV);
        }
        warpgroup_wait<1>();  // dP^T (dV still runs)
      } else {
        warpgroup_wait<0>();
      }
      warpgroup_fence_operand(tdPrdP);
      dscores<kSoftcap, kMasked>(ea, tSrS, tdPrdP, tdVrP32, tdKrdS32);
      copy(r2s_ds, tdSadS, tdSsdS(_, _, _, ds_buf));
      if constexpr (!kSharedKeys && !kSoftcapSerial) wgmma<false, -1>(mma_dv, tdVrP, tdVrdOt(_, _, _, st_do), tdVrdV);
      // dS^T of both warpgroups is in smem (generic stores, read next by the async proxy).
      cutlass::arch::fence_view_async_shared();
      arch::named_barrier_sync(Barriers::consumers(), Kt::kNumMmaThreads);
      // dQ (part 0) and dK; dQ staged for this step's writer warp (once the previous step's
      // writer has read the staging) while dK's product runs, and with shared keys the further
      // parts after it.
      dq_product(0, ds_buf);
      if constexpr (kSharedKeys) {
        Tensor sdSt_buf = smem_ds_step()(_, _, ds_buf);
        if constexpr (Kt::kDkRealCols1 < Kt::kHeadDim / 2) {
          if (wg == 1) dkv_part<Kt::kDkRealCols1, Kt::kHeadDim>(sdSt_buf, sQt(_, _, st), tdKrdK);
          else wgmma<false, -1>(mma_dk, wg_dk.partition_fragment_A(sdSt_buf), tdKrQt(_, _, _, st), tdKrdK);
        } else {
          wgmma<false, -1>(mma_dk, wg_dk.partition_fragment_A(sdSt_buf), tdKrQt(_, _, _, st), tdKrdK);
        }
      } else {
        wgmma<false, -1>(mma_dk, tdKrdS, tdKrQt(_, _, _, st), tdKrdK);
      }
      warpgroup_wait<1>();  // dQ (part 0) done, dK runs on
      warpgroup_fence_operand(tdQrdQ);
      if constexpr (Kt::kSplitdO) {  // dV, issued before dQ, is done with dO and D
        pipe_do.consumer_release(rdo);
        ++rdo;
      }
      ds_buf ^= 1;
      // ds_buf flips once per step, so it is now the parity of the next step: the staging is
      // free once the previous step's writer (parity ds_buf) has read it, and this step's
      // (parity ds_buf ^ 1) takes it (mainloop_bwd_load.cuh BwdDqWriter).
      arch::named_barrier_sync(Barriers::dq_empty(wg, ds_buf), kStageThreads);
      stage_dq(ss, 0, t128, wg, tdQrdQ);
#pragma unroll
      for (int part = 1; part < Kt::kDqParts; ++part) {
        if (!Kt::dq_part_real(wg, part)) break;  // (the writer skips it too)
        warpgroup_fence_operand(tdQrdQ);
        dq_product(part, ds_buf ^ 1);
        warpgroup_wait<0>();
        warpgroup_fence_operand(tdQrdQ);
        if (part % Kt::kDqStagedParts == 0) {
          // The staging is full: hand this round to the writer, and stage the next once it has
          // read it (its bulk read overlaps this part's product; in deterministic mode the
          // writer reads only once its turn on the chunk has come).
          cutlass::arch::fence_view_async_shared();
          arch::named_barrier_arrive(Barriers::dq_full(wg, ds_buf ^ 1), kStageThreads);
          arch::named_barrier_sync(Barriers::dq_empty(wg, ds_buf ^ 1), kStageThreads);
        }
        stage_dq(ss, part, t128, wg, tdQrdQ);
      }
      cutlass::arch::fence_view_async_shared();
      arch::named_barrier_arrive(Barriers::dq_full(wg, ds_buf ^ 1), kStageThreads);
      warpgroup_wait<0>();  // dK has read dS^T (registers, or smem with shared keys) and Q^T (the stage)
      warpgroup_fence_operand(tdKrdK);  // complete: the next step's dK, or the tile's store, reads it
      warpgroup_fence_operand(tdVrdV);
      pipe_q.consumer_release(rq);
      ++rq;
    };

    auto tiles = bwd_tiles<Kt::kTileClaims, false>(ring, ss.tile_ring);
    for (int32_t t = tiles.first(p); t < p.num_tiles; t = tiles.next(p)) {
      const BwdTile ti = make_bwd_tile<kBlockM, kBlockN, true, false>(p, t);
      if (!ti.has_keys) continue;  // no dK/dV rows
      clear(tdVrdV);
      clear(tdKrdK);
      if (ti.has_steps()) {
        // The query blocks that all kBlockN keys of the tile see whole (schedule_bwd.h): one
        // version per step for the whole CTA. A warpgroup's four warps must issue the same wgmma
        // instructions (.aligned), and both warpgroups must wait on the dS barrier from the same
        // bar.sync (aligned too: every waiting thread at one instruction), so the version can be
        // chosen neither per warp nor per warpgroup.
        const QueryBlocks dense =
            dense_query_blocks<kBlockM, kBlockN>(ti.n_block * kBlockN, ti.s.seqlen_q, ti.s.seqlen_k, p.mask);
        consumer_wait(pipe_kv, rkv);
        // The previous tile's dK / dV store may still read its staging in the dS buffers, which
        // this tile's first step writes; it has had the K / V load's latency to do so.
        if constexpr (!kSharedKeys)
          if (p.dkv_tma) drain_dkdv_store(tid);
        const int32_t k_rows = ti.s.seqlen_k - ti.n_block * kBlockN;  // >= 1 (has_keys)
        if (p.is_varlen && k_rows < kBlockN) {
          // As for Q above: dQ = dS K multiplies these rows (another sequence's, or past
          // seqused_k) by an exact 0. V's need nothing: dP^T's masked pairs are dropped by
          // selection.
          zero_rows<kBlockN, Kt::kHeadDim>(sK, k_rows, tid);
          cutlass::arch::fence_view_async_shared();
          arch::named_barrier_sync(Barriers::consumers(), Kt::kNumMmaThreads);
        }
        for (int32_t g = 0; g < p.group_size; ++g) {
          for (int32_t i_step = 0; i_step < ti.num_steps(); ++i_step) {
            const int32_t m = ti.step_block(i_step);
            const int32_t q0 = m * kBlockM;
            // Chosen before the step's products are issued: a branch with wgmma accumulators in
            // flight makes ptxas serialise the products.
            const bool masked = m < dense.m_lo || m >= dense.m_hi;
            const ElemArgs ea{nullptr, nullptr, q0, ti.s.seqlen_q - q0, col_lane, {}, {}};
            if (p.has_softcap) step(ea, ti, std::true_type{}, std::true_type{});  // softcap: always the selecting version
            else if (masked) step(ea, ti, std::false_type{}, std::true_type{});
            else step(ea, ti, std::false_type{}, std::false_type{});
          }
        }
        pipe_kv.consumer_release(rkv);
        ++rkv;
      }
      if constexpr (!kSharedKeys) {
        // Varlen: a TMA box is clipped only at the packed tensor's end, so a sequence's last,
        // partial key block (it would write the next sequence's rows) takes the direct stores.
        if (p.dkv_tma && (!p.is_varlen || (ti.n_block + 1) * kBlockN <= ti.s.seqlen_k)) {
          store_dkdv_tma(p, ss, ti, tid, tdKrdK, tdVrdV);
          continue;
        }
      }
      store_dkdv(p, ti, tid, tdKrdK, tdVrdV);
    }
    // The last step's writer's dq_empty arrival (or writer 1's first, if this CTA had no step) is
    // consumed here: ds_buf is the parity of the step after the last.
    arch::named_barrier_sync(Barriers::dq_empty(wg, ds_buf ^ 1), kStageThreads);
    if constexpr (!kSharedKeys)
      if (tid == 0) tma_store_wait<0>();  // the last dK / dV store's staging read, before the CTA exits
  }

  /// A product narrowed to the bucket's columns (shared keys, warpgroup 1): the first registers
  /// of acc (one warpgroup's atom of 64 x kAccCols) = (kZeroInit) or += A B over the kReal
  /// columns of B_t (columns, k) from column kFirst, with Mma, the same product kReal columns wide.
  template <class Mma, bool kZeroInit, int kReal, int kFirst, int kAccCols, class TA, class TB, class TC>
  __device__ __forceinline__ static void narrow_product(const TA& a, const TB& b_t, TC& acc) {
    using namespace cute;
    static_assert(kFirst % kReal == 0, "the columns start at a multiple of their width");
    Mma mma;
    auto thr = mma.get_slice(0);
    Tensor b_real = local_tile(b_t, Shape<Int<kReal>, Int<decltype(size<1>(b_t))::value>>{},
                               make_coord(Int<kFirst / kReal>{}, _0{}));
    Tensor acc_real = make_tensor(acc.data(), partition_fragment_C(mma, Shape<_64, Int<kReal>>{}).layout());
    static_assert(rank(typename TC::layout_type{}) == 3 && decltype(size<1>(acc))::value == 1 && decltype(size<2>(acc))::value == 1 &&
                      decltype(size(acc_real))::value * kAccCols == decltype(size(acc))::value * kReal,
                  "the narrower product's accumulators are the first of the warpgroup's one atom");
    wgmma<kZeroInit, -1>(mma, thr.partition_fragment_A(a), thr.partition_fragment_B(b_real), acc_real);
  }

  /// Warpgroup 1's dK or dV: acc += A B over the kReal of its kCols / 2 columns that are the
  /// bucket's (kernel_traits_bwd.cuh kDkRealCols1): A the (keys, queries) smem view of dS^T or
  /// P^T, B_t the stage's (columns, queries) view of Q^T or dO^T, acc its dK or dV accumulator.
  template <int kReal, int kCols, class TA, class TB, class TC>
  __device__ __forceinline__ static void dkv_part(const TA& a, const TB& b_t, TC& acc) {
    narrow_product<typename Kt::template MmaDkvPart<kReal>, false, kReal, kCols / 2, kCols / 2>(a, b_t, acc);
  }

  /// The narrow dQ part (kernel_traits_bwd.cuh kDqNarrowCols): acc's first registers = dS K over
  /// the bucket's last kDqNarrowCols columns (the rest of acc is not staged). ds: the step's
  /// (query, key) dS buffer; kt: K^T (d, key).
  template <class TA, class TB, class TC>
  __device__ __forceinline__ static void dq_narrow(const TA& ds, const TB& kt, TC& acc) {
    narrow_product<typename Kt::template MmaDqPart<Kt::kDqNarrowCols>, true, Kt::kDqNarrowCols, Kt::kDqNarrowFirst,
                   Kt::kDqCols>(ds, kt, acc);
  }

  /// What the elementwise steps read besides the accumulators: the query block's lse_log2 and D
  /// rows in smem, and the thread's key rows' visible query ranges (for masked steps).
  struct ElemArgs {
    const float* lse;
    const float* dsum;
    int32_t q0;      // first query of the block
    int32_t q_rows;  // the block's rows inside the sequence (< kBlockM only in its last block)
    int col_lane;
    int32_t vis_first[2], vis_last[2];  // masked steps: set by the step itself
  };

  /// Sets rows [first, kRows) of the (kRows, kCols) smem tile t to 0, all consumer threads
  /// together. The trip count is the same in every thread (the store is predicated instead): a
  /// loop exit that may diverge makes the compiler move the loop's pipeline states from uniform
  /// to per-thread registers.
  template <int kRows, int kCols, class Tile>
  __device__ __forceinline__ static void zero_rows(Tile&& t, int32_t first, int tid) {
    const int32_t count = (kRows - first) * kCols;
    for (int32_t base = 0; base < count; base += Kt::kNumMmaThreads) {
      const int32_t e = base + tid;
      if (e < count) t(first + e / kCols, e % kCols) = Element(0.f);
    }
  }

  // Fragment entry v of S^T / dP^T (64 keys x the warpgroup's queries): key row (v / 2) % 2
  // (0: key_row, 1: 8 below), query column (v / 4) * 8 + col_lane + v % 2 of the block (col_lane
  // includes the warpgroup's first query with shared keys).
  __device__ __forceinline__ static int frag_column(int v, int col_lane) { return (v >> 2) * 8 + col_lane + (v & 1); }

  /// The lse_log2 of the thread's query columns of S^T, a pair per 8-column group (col_lane is
  /// even: one 8-byte load gives both columns).
  static constexpr int kLsePairs = kBlockN * kBlockM / Kt::kNumMmaThreads / 4;  // S^T's fragment / 4
  /// Pairs read early (load_lse, tuning_bwd.h lse_early_pairs); probs reads the others where it
  /// uses them.
  static constexpr int kLseEarly = Kt::kConfig.lse_early_pairs;
  static_assert(kLseEarly >= 0 && kLseEarly <= kLsePairs, "lse_early_pairs: at most one pair per 8-column group");
  struct LsePairs {
    float2 v[kLsePairs];  // the first kLseEarly set by load_lse; the others never read
  };
  __device__ __forceinline__ static float2 lse_pair(const ElemArgs& ea, int g) {
    return *reinterpret_cast<const float2*>(ea.lse + g * 8 + ea.col_lane);
  }
  __device__ __forceinline__ static LsePairs load_lse(const ElemArgs& ea) {
    LsePairs l;
#pragma unroll
    for (int g = 0; g < kLseEarly; ++g) l.v[g] = lse_pair(ea, g);
    return l;
  }

  /// P^T = exp2(s * scale_log2 - lse_log2) in place (s = tanh(raw * softcap_inv_scale) under
  /// softcap), the row's share (tuning_bwd.h exp2_emulation) on the FMA pipe, the rest on MUFU.
  /// kMasked: pairs outside a key row's visible queries get exactly 0 by selection (never exp2 of
  /// -inf - lse, never a value from another sequence's rows). kSoftcap: P^T goes to its dV
  /// operand here and the accumulator keeps P^T (1 - tanh^2), the factor dS^T needs; without
  /// softcap, dscores packs P^T once it is done with it (shared keys: here, for its smem copy
  /// before dS^T).
  template <bool kSoftcap, bool kMasked, class FragS, class FragP32>
  __device__ __forceinline__ static void probs(const Params& p, const ElemArgs& ea, const LsePairs& lse, FragS& s,
                                               FragP32& p32) {
    constexpr int kFrag = decltype(cute::size(s))::value;
    static_assert(kFrag == 4 * kLsePairs, "S^T's fragment");
    constexpr Exp2Emulation kExp2 = Kt::kConfig.exp2_emulation;
#pragma unroll
    for (int k = 0; k < kFrag / 2; ++k) {
      const float2 l = (k >> 1) < kLseEarly ? lse.v[k >> 1] : lse_pair(ea, k >> 1);
      float pv[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int v = 2 * k + e;
        float x = s(v);
        if constexpr (kSoftcap) x = tanhf(x * p.softcap_inv_scale);
        const float arg = fmaf(x, p.score_scale_log2, -(e ? l.y : l.x));
        // The FMA pipe's share: v's 8-column group is the same in every lane, so once the loop is
        // unrolled the choice is a constant per register. The argument is <= 0 up to rounding
        // for the forward's lse; the cap keeps exp2_emulated inside its domain (<= 127) for any
        // other lse.
        pv[e] = kExp2.uses_emulation((v >> 2) * 8) ? fa4::exp2_emulated(fminf(arg, 127.f)) : arch::ex2_approx(arg);
        if constexpr (kMasked) {
          const int32_t query = ea.q0 + frag_column(v, ea.col_lane);
          const int r = (v >> 1) & 1;
          const bool vis = query >= ea.vis_first[r] && query < ea.vis_last[r];
          pv[e] = vis ? pv[e] : 0.f;
          // A masked pair's softcap factor is 1 by selection: tanh of a NaN score (rows past the
          // sequence) would make 0 * (1 - x^2) NaN, and dscores keys on the product being 0.
          if constexpr (kSoftcap) x = vis ? x : 0.f;
        }
        s(v) = kSoftcap ? pv[e] * (1.f - x * x) : pv[e];
      }
      if constexpr (kSoftcap || kSharedKeys) p32(k) = pack2<Element>(pv[0], pv[1]);
    }
  }

  /// dS^T = P^T (dP^T - D) [x (1 - tanh^2), folded into s by probs], packed to 16 bits for the dK
  /// operand and the smem copy; P^T packed for dV (no softcap). kMasked: where P^T is 0 (outside
  /// the mask) dS^T is 0 by selection: that pair's dP^T may be anything (another row's dO).
  template <bool kSoftcap, bool kMasked, class FragS, class FragdP, class FragP32, class FragdS32>
  __device__ __forceinline__ static void dscores(const ElemArgs& ea, FragS& s, FragdP& dp, FragP32& p32, FragdS32& ds32) {
    constexpr int kFrag = decltype(cute::size(s))::value;
#pragma unroll
    for (int k = 0; k < kFrag / 2; ++k) {
      const float2 d = *reinterpret_cast<const float2*>(ea.dsum + (k >> 1) * 8 + ea.col_lane);
      float ds[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int v = 2 * k + e;
        ds[e] = s(v) * (dp(v) - (e ? d.y : d.x));
        if constexpr (kMasked) ds[e] = s(v) == 0.f ? 0.f : ds[e];
      }
      if constexpr (!kSoftcap && !kSharedKeys) p32(k) = pack2<Element>(s(2 * k), s(2 * k + 1));
      ds32(k) = pack2<Element>(ds[0], ds[1]);
    }
  }

  /// Tile row (key, 0..kBlockN-1) of the thread's first accumulator row (the second is 8 below).
  __device__ __forceinline__ static int key_row(int tid) {
    return kSharedKeys ? arch::fragment_row(tid % 128) : arch::fragment_row(tid);
  }

  /// Stages dQ part `part` of warpgroup wg (its columns part * kDqCols.. of the warpgroup's share
  /// of the chunk) in fragment order (schedule_bwd.h dq_chunk_index): a float4 per 8-column group,
  /// at the part's place in the round the warpgroup's staging holds (kDqStagedParts parts).
  template <class SharedStorage, class FragdQ>
  __device__ __forceinline__ static void stage_dq(SharedStorage& ss, int part, int t128, int wg, FragdQ& dq) {
    float4* stage = reinterpret_cast<float4*>(ss.smem_dq.data() + wg * Kt::kDqStageFloats);
    constexpr int kGroups = Kt::kDqCols / 8;
    const int slot = part % Kt::kDqStagedParts;
    const int real_groups = Kt::dq_part_cols(wg, part) / 8;  // (the narrow part: its first groups)
#pragma unroll
    for (int gq = 0; gq < kGroups; ++gq)
      if (gq < real_groups)
        stage[dq_chunk_index<kBlockM, Kt::kHeadDim>(0, slot * kGroups + gq, t128) / 4] =
            make_float4(dq(4 * gq), dq(4 * gq + 1), dq(4 * gq + 2), dq(4 * gq + 3));
  }

  /// dK (x softmax_scale) and dV from registers: rows < seqlen_k, columns < the real head dims
  /// (shared keys: the warpgroup's half of the columns).
  template <class FragK, class FragV>
  __device__ __forceinline__ static void store_dkdv(const Params& p, const BwdTile& ti, int tid, FragK& dk, FragV& dv) {
    const int32_t bt = p.is_varlen ? 0 : ti.b;
    const int wg = tid / 128;
    constexpr int kColsK = Kt::kHeadDim / Kt::kDkvSplit, kColsV = Kt::kHeadDimV / Kt::kDkvSplit;
    store_rows<kColsK>(static_cast<Element*>(p.dk), int64_t(bt) * p.dk_batch_stride + int64_t(ti.h_kv) * p.dk_head_stride,
                       p.dk_row_stride, kSharedKeys ? wg * kColsK : 0, p.headdim, p.dk_aligned_pairs, p.softmax_scale, ti,
                       tid, dk);
    store_rows<kColsV>(static_cast<Element*>(p.dv), int64_t(bt) * p.dv_batch_stride + int64_t(ti.h_kv) * p.dv_head_stride,
                       p.dv_row_stride, kSharedKeys ? wg * kColsV : 0, p.headdim_v, p.dv_aligned_pairs, 1.f, ti, tid, dv);
  }

  /// dK (x softmax_scale) and dV through smem and one TMA store each (dk and dv obey the TMA rule,
  /// launch_bwd.cuh dkv_tma; not with shared keys; varlen: whole key blocks only), staged with
  /// stmatrix in the dS buffers (free at a tile's end) in K's and V's layouts and stored by
  /// thread 0. TMA clips the rows past a batched seqlen_k and the columns past the real head dims.
  /// Instead of d / 4 scattered 4-byte stores per thread and tensor, the consumers meet: before
  /// the staging (drain_dkdv_store: the other warpgroup's last dQ product may still read the dS
  /// buffer in use, and the previous tile's store its staging), and after each write (the tile
  /// complete for the TMA engine). Where both fit the dS buffers together (d64) they are staged
  /// at once and leave as two stores; else dV's staging waits for dK's store to read its own. The
  /// last store's read is waited for only before the dS buffers are written next
  /// (drain_dkdv_store), so the next tile's K / V wait and first products run under it.
  /// Inlined: as a call, ptxas serialises every wgmma of the kernel (C7514: the call reads wgmma
  /// accumulators inside a pipeline stage).
  template <class SharedStorage, class FragK, class FragV>
  __device__ __forceinline__ static void store_dkdv_tma(const Params& p, SharedStorage& ss, const BwdTile& ti, int tid,
                                                        FragK& dk, FragV& dv) {
    using namespace cute;
    const int32_t bt = p.is_varlen ? 0 : ti.b;
    Element* base = reinterpret_cast<Element*>(ss.smem_ds.data());
    constexpr int kOffsetV = kDkvTogether ? int(cosize_v<typename Kt::SmemLayoutK>) : 0;
    drain_dkdv_store(tid);
    stage<typename Kt::SmemLayoutK, typename Kt::TiledMmadK>(base, tid, dk, p.softmax_scale);
    if constexpr (!kDkvTogether) {
      publish_staging();
      if (tid == 0) issue_store<typename Kt::SmemLayoutK, Kt::kHeadDim>(p.tma_dk, p.shape_k, bt, base, ti);
      drain_dkdv_store(tid);
    }
    stage<typename Kt::SmemLayoutV, typename Kt::TiledMmadV>(base + kOffsetV, tid, dv, 1.f);
    publish_staging();
    if (tid == 0) {
      if constexpr (kDkvTogether) issue_store<typename Kt::SmemLayoutK, Kt::kHeadDim>(p.tma_dk, p.shape_k, bt, base, ti);
      issue_store<typename Kt::SmemLayoutV, Kt::kHeadDimV>(p.tma_dv, p.shape_v, bt, base + kOffsetV, ti);
    }
  }

  /// dK and dV staged together where both fit the dS buffers (d64: 2 x 16 KB of 32 KB).
  static constexpr bool kDkvTogether =
      !kSharedKeys && cute::cosize_v<typename Kt::SmemLayoutK> + cute::cosize_v<typename Kt::SmemLayoutV> <=
                          cute::cosize_v<typename Kt::SmemLayoutdS>;

  /// Before the consumers write the dS buffers: thread 0 waits until its dK / dV stores (if any)
  /// have read their staging, and the consumers meet (the other warpgroup's last dQ product may
  /// still read a dS buffer too).
  __device__ __forceinline__ static void drain_dkdv_store(int tid) {
    if (tid == 0) tma_store_wait<0>();  // the staging read (the global writes complete on their own)
    arch::named_barrier_sync(Barriers::consumers(), Kt::kNumMmaThreads);
  }

  /// The (kBlockN x kCols) accumulator acc x scale into the smem tile at `base`, in SmemLayout.
  template <class SmemLayout, class TiledMma, class Frag>
  __device__ __forceinline__ static void stage(Element* base, int tid, Frag& acc, float scale) {
    using namespace cute;
    stage_accumulator<Element, typename Kt::SmemCopyAtomdKV, TiledMma>(
        tid, acc, make_tensor(make_smem_ptr(base), SmemLayout{}), [scale](int) { return scale; });
  }

  /// The staging complete for the TMA engine: stmatrix writes are generic-proxy, the engine reads
  /// through the async proxy; the consumers meet (every thread's writes done).
  __device__ __forceinline__ static void publish_staging() {
    cutlass::arch::fence_view_async_shared();
    arch::named_barrier_sync(Barriers::consumers(), Kt::kNumMmaThreads);
  }

  /// Thread 0: the staged tile at `base` to the tile's key block of `tma`'s tensor, as one bulk
  /// group (its read of the staging is waited for by drain_dkdv_store).
  template <class SmemLayout, int kCols, class Tma>
  __device__ __forceinline__ static void issue_store(const Tma& tma, const typename Kt::ShapeQKV& shape, int32_t bt,
                                                     Element* base, const BwdTile& ti) {
    using namespace cute;
    Tensor s = make_tensor(make_smem_ptr(base), SmemLayout{});  // (kBlockN, kCols)
    Tensor m = tma.get_tma_tensor(shape);
    Tensor g = local_tile(domain_offset(make_coord(ti.s.k_row0, _0{}), m(_, _, ti.h_kv, bt)),
                          Shape<Int<kBlockN>, Int<kCols>>{}, make_coord(ti.n_block, _0{}));
    auto cta = tma.get_slice(_0{});
    cute::copy(tma, cta.partition_S(s), cta.partition_D(g));
    tma_store_arrive();
  }

  /// kCols accumulator columns of the thread's two key rows, at columns col0 + (0..kCols-1).
  template <int kCols, class Frag>
  __device__ __forceinline__ static void store_rows(Element* base, int64_t offset, int64_t row_stride, int col0, int32_t cols,
                                                    bool aligned_pairs, float scale, const BwdTile& ti, int tid, Frag& acc) {
    const int col_lane = arch::fragment_col(tid);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int32_t j = ti.n_block * kBlockN + key_row(tid) + 8 * r;
      if (j >= ti.s.seqlen_k) continue;
      Element* row = base + offset + (int64_t(ti.s.k_row0) + j) * row_stride;
#pragma unroll
      for (int g = 0; g < kCols / 8; ++g) {
        const int col = col0 + g * 8 + col_lane;
        if (col >= cols) continue;  // real dims are multiples of 8: the pair is all in or all out
        const float a = acc(g * 4 + 2 * r) * scale;
        const float b = acc(g * 4 + 2 * r + 1) * scale;
        if (aligned_pairs) {
          *reinterpret_cast<uint32_t*>(row + col) = pack2<Element>(a, b);
        } else {
          row[col] = Element(a);
          row[col + 1] = Element(b);
        }
      }
    }
  }
};

}  // namespace fa4::hopper
