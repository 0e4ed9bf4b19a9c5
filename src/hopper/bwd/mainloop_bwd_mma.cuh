// src/hopper/bwd/mainloop_bwd_mma.cuh — a consumer warpgroup of the backward: its 64 keys of the CTA's
// key block against every query block that sees them (kernel_traits_bwd.cuh lists the products).
//
// Per step (one query block of one query head):
//   S^T = K Q^T, dP^T = V dO^T                     (SS, issued together)
//   P^T = exp2(S^T scale_log2 - lse_log2)          masked pairs exactly 0 (never exp of -inf - lse)
//   dS^T = P^T (dP^T - D) [* (1 - tanh^2): softcap]
//   dV += P^T dO, dK += dS^T Q                     (RS: P^T, dS^T straight from registers)
//   dS^T -> smem (bf16/fp16); both warpgroups meet (dS complete); dQ = dS K for half of d each
//   dQ staged in smem for the dQ writer warp's bulk reduce-add (mainloop_bwd_load.cuh)
// dK and dV stay in registers over the whole walk (all query heads of the KV head's group: no dK/dV
// atomics or buffers for GQA), then leave through direct stores (dK scaled by softmax_scale).
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
  using Barriers = arch::NamedBarriers<Kt::kNumMmaWarpGroups>;
  static constexpr uint32_t kStageThreads = cutlass::NumThreadsPerWarpGroup + 32;

  /// `tid`: index among the consumer threads (0..255).
  template <class SharedStorage>
  __device__ __forceinline__ static void run(const Params& p, SharedStorage& ss, typename Kt::PipelineQ& pipe_q,
                                             typename Kt::PipelineKV& pipe_kv, int tid) {
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
    auto wg_dq = mma_dq.get_slice(wg * 128);
    Tensor tSrK = wg_s.partition_fragment_A(sK);         // (MMA, MMA_M, MMA_K)
    Tensor tSrQ = wg_s.partition_fragment_B(sQ);         // (MMA, MMA_N, MMA_K, stage)
    Tensor tdPrV = wg_dp.partition_fragment_A(sV);
    Tensor tdPrdO = wg_dp.partition_fragment_B(sdO);     // (.., stage)
    Tensor tdVrdOt = wg_dv.partition_fragment_B(sdOt);   // (.., stage)
    Tensor tdKrQt = wg_dk.partition_fragment_B(sQt);     // (.., stage)
    Tensor tdQrdS = wg_dq.partition_fragment_A(sdS);     // (.., dS buffer)
    Tensor tdQrKt = wg_dq.partition_fragment_B(sKt);

    Tensor tSrS = partition_fragment_C(mma_s, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tdPrdP = partition_fragment_C(mma_dp, Shape<Int<kBlockN>, Int<kBlockM>>{});
    Tensor tdVrdV = partition_fragment_C(mma_dv, Shape<Int<kBlockN>, Int<Kt::kHeadDimV>>{});
    Tensor tdKrdK = partition_fragment_C(mma_dk, Shape<Int<kBlockN>, Int<Kt::kHeadDim>>{});
    Tensor tdQrdQ = partition_fragment_C(mma_dq, Shape<Int<kBlockM>, Int<Kt::kHeadDim>>{});
    constexpr int kFragS = decltype(size(tSrS))::value;
    static_assert(kFragS == kBlockN * kBlockM / Kt::kNumMmaThreads);
    static_assert(decltype(size(tdQrdQ))::value == Kt::kHeadDim / 4, "dQ fragment: 64 x d/2 per warpgroup");
    // P^T and dS^T as the RS A operands of dV and dK (same registers, A order), and dS^T in the
    // accumulator order for its smem copy.
    Tensor tdVrP = make_tensor<Element>(acc_to_a_layout(tSrS.layout()));
    Tensor tdKrdS = make_tensor<Element>(acc_to_a_layout(tdPrdP.layout()));
    Tensor tdSrdS = make_tensor(tdKrdS.data(), tdPrdP.layout());
    // dS^T leaves the registers through stmatrix.trans: each 8x8 block of the (key, query)
    // accumulator lands as 8 query rows of 8 contiguous keys, i.e. straight in dS's (query, key)
    // layout: 4 instructions per thread instead of 32 scattered 16-bit stores.
    auto r2s_ds = make_tiled_copy_C(Copy_Atom<SM90_U16x8_STSM_T, Element>{}, mma_s);
    auto r2s_ds_thr = r2s_ds.get_thread_slice(tid);
    Tensor tdSsdS = r2s_ds_thr.partition_D(as_position_independent_swizzle_tensor(sdSt));  // (.., dS buffer)
    Tensor tdSadS = r2s_ds_thr.retile_S(tdSrdS);
    Tensor tdVrP32 = recast<uint32_t>(tdVrP);
    Tensor tdKrdS32 = recast<uint32_t>(tdKrdS);

    const int col_lane = arch::fragment_col(tid);
    const int t128 = tid % 128;
    auto consumer_wait = [](auto& pipe, auto st) {
      auto token = pipe.consumer_try_wait(st);
      pipe.consumer_wait(st, token);
    };
    typename Kt::PipelineStateQ rq;
    typename Kt::PipelineStateKV rkv;
    int ds_buf = 0;

    for (int32_t i = 0, t = bwd_tile_index(p, 0); t < p.num_tiles; t = bwd_tile_index(p, ++i)) {
      const BwdTile ti = make_bwd_tile<kBlockM, kBlockN, true>(p, t);
      if (!ti.has_keys) continue;  // no dK/dV rows
      clear(tdVrdV);
      clear(tdKrdK);
      if (ti.has_steps()) {
        // The queries each of this thread's two key rows sees (core/mask.h; empty past seqlen_k).
        int32_t vis_first[2], vis_last[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int32_t j = ti.n_block * kBlockN + arch::fragment_row(tid) + 8 * r;
          const detail::QueryRange q = detail::visible_query_range(j, ti.s.seqlen_q, ti.s.seqlen_k, p.mask);
          vis_first[r] = int32_t(q.first);
          vis_last[r] = int32_t(q.last);
        }
        consumer_wait(pipe_kv, rkv);
        for (int32_t g = 0; g < p.group_size; ++g) {
          for (int32_t m = ti.m.m_lo; m < ti.m.m_hi; ++m) {
            const int st = rq.index();
            consumer_wait(pipe_q, rq);
            wgmma</*zero_init=*/true, -1>(mma_s, tSrK, tSrQ(_, _, _, st), tSrS);
            wgmma<true, -1>(mma_dp, tdPrV, tdPrdO(_, _, _, st), tdPrdP);
            const float* lse = ss.smem_lse.data() + st * kBlockM;
            const float* dsum = ss.smem_d.data() + st * kBlockM;
            const int32_t q0 = m * kBlockM;
            // Fragment entry v: key row r = (v / 2) % 2, query column c of the block.
            auto column = [&](int v) { return (v >> 2) * 8 + col_lane + (v & 1); };
            auto seen = [&](int v) {
              const int32_t query = q0 + column(v);
              const int r = (v >> 1) & 1;
              return query >= vis_first[r] && query < vis_last[r];
            };
            if constexpr (Kt::kConfig.softmax_under_mma) {
              // P^T while dP^T's product runs; dV's product issued at once; dS^T while it runs.
              warpgroup_wait<1>();  // S^T
#pragma unroll
              for (int k = 0; k < kFragS / 2; ++k) {
                float pv[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int v = 2 * k + e;
                  float x = tSrS(v);
                  if (p.has_softcap) x = tanhf(x * p.softcap_inv_scale);
                  pv[e] = seen(v) ? arch::ex2_approx(fmaf(x, p.score_scale_log2, -lse[column(v)])) : 0.f;
                  // What dS^T needs of P^T: P, times tanh's derivative under softcap.
                  tSrS(v) = p.has_softcap ? pv[e] * (1.f - x * x) : pv[e];
                }
                tdVrP32(k) = pack2<Element>(pv[0], pv[1]);
              }
              wgmma<false, -1>(mma_dv, tdVrP, tdVrdOt(_, _, _, st), tdVrdV);
              warpgroup_wait<1>();  // dP^T (dV may still run)
#pragma unroll
              for (int k = 0; k < kFragS / 2; ++k) {
                float ds[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int v = 2 * k + e;
                  // A masked pair's dP^T may be anything (another row's dO): select, never multiply.
                  ds[e] = seen(v) ? tSrS(v) * (tdPrdP(v) - dsum[column(v)]) : 0.f;
                }
                tdKrdS32(k) = pack2<Element>(ds[0], ds[1]);
              }
              copy(r2s_ds, tdSadS, tdSsdS(_, _, _, ds_buf));
              wgmma<false, -1>(mma_dk, tdKrdS, tdKrQt(_, _, _, st), tdKrdK);
            } else {
              warpgroup_wait<0>();
              // Two adjacent columns at a time, packed at once, so the fp32 S^T and dP^T registers
              // die as P^T and dS^T (16-bit) are born.
#pragma unroll
              for (int k = 0; k < kFragS / 2; ++k) {
                float pv[2], ds[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  const int v = 2 * k + e;
                  float x = tSrS(v);
                  if (p.has_softcap) x = tanhf(x * p.softcap_inv_scale);
                  const bool vis = seen(v);
                  pv[e] = vis ? arch::ex2_approx(fmaf(x, p.score_scale_log2, -lse[column(v)])) : 0.f;
                  float d = pv[e] * (tdPrdP(v) - dsum[column(v)]);
                  if (p.has_softcap) d *= 1.f - x * x;
                  ds[e] = vis ? d : 0.f;  // dP^T of a masked pair may be anything (other rows' dO)
                }
                tdVrP32(k) = pack2<Element>(pv[0], pv[1]);
                tdKrdS32(k) = pack2<Element>(ds[0], ds[1]);
              }
              copy(r2s_ds, tdSadS, tdSsdS(_, _, _, ds_buf));
              wgmma<false, -1>(mma_dv, tdVrP, tdVrdOt(_, _, _, st), tdVrdV);
              wgmma<false, -1>(mma_dk, tdKrdS, tdKrQt(_, _, _, st), tdKrdK);
            }
            // dS^T of both warpgroups is in smem (generic stores, read next by the async proxy).
            cutlass::arch::fence_view_async_shared();
            arch::named_barrier_sync(Barriers::consumers(), Kt::kNumMmaThreads);
            wgmma<true, 0>(mma_dq, tdQrdS(_, _, _, ds_buf), tdQrKt, tdQrdQ);  // waits for dV, dK too
            pipe_q.consumer_release(rq);
            ++rq;
            ds_buf ^= 1;
            // Stage dQ for the writer warp once it has read the previous step's.
            arch::named_barrier_sync(Barriers::dq_empty(wg), kStageThreads);
            float4* stage = reinterpret_cast<float4*>(ss.smem_dq.data());
#pragma unroll
            for (int gq = 0; gq < Kt::kHeadDim / 16; ++gq)
              stage[dq_chunk_index<Kt::kHeadDim>(wg, gq, t128) / 4] =
                  make_float4(tdQrdQ(4 * gq), tdQrdQ(4 * gq + 1), tdQrdQ(4 * gq + 2), tdQrdQ(4 * gq + 3));
            cutlass::arch::fence_view_async_shared();
            arch::named_barrier_arrive(Barriers::dq_full(wg), kStageThreads);
          }
        }
        pipe_kv.consumer_release(rkv);
        ++rkv;
      }
      store_dkdv(p, ti, tid, tdKrdK, tdVrdV);
    }
    // The writer's last dq_empty arrival (or its first, if this CTA had no step) is consumed here.
    arch::named_barrier_sync(Barriers::dq_empty(wg), kStageThreads);
  }

  /// dK (x softmax_scale) and dV from registers: rows < seqlen_k, columns < the real head dims.
  template <class FragK, class FragV>
  __device__ __forceinline__ static void store_dkdv(const Params& p, const BwdTile& ti, int tid, FragK& dk, FragV& dv) {
    const int32_t bt = p.is_varlen ? 0 : ti.b;
    store_rows<Kt::kHeadDim>(static_cast<Element*>(p.dk), int64_t(bt) * p.dk_batch_stride + int64_t(ti.h_kv) * p.dk_head_stride,
                             p.dk_row_stride, p.headdim, p.dk_aligned_pairs, p.softmax_scale, ti, tid, dk);
    store_rows<Kt::kHeadDimV>(static_cast<Element*>(p.dv), int64_t(bt) * p.dv_batch_stride + int64_t(ti.h_kv) * p.dv_head_stride,
                              p.dv_row_stride, p.headdim_v, p.dv_aligned_pairs, 1.f, ti, tid, dv);
  }

  template <int kCols, class Frag>
  __device__ __forceinline__ static void store_rows(Element* base, int64_t offset, int64_t row_stride, int32_t cols,
                                                    bool aligned_pairs, float scale, const BwdTile& ti, int tid, Frag& acc) {
    const int col_lane = arch::fragment_col(tid);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int32_t j = ti.n_block * kBlockN + arch::fragment_row(tid) + 8 * r;
      if (j >= ti.s.seqlen_k) continue;
      Element* row = base + offset + (int64_t(ti.s.k_row0) + j) * row_stride;
#pragma unroll
      for (int g = 0; g < kCols / 8; ++g) {
        const int col = g * 8 + col_lane;
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
