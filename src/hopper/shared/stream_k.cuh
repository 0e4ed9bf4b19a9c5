// src/hopper/shared/stream_k.cuh — the stream-K tail's partials: a contributor piece stores its
// un-normalised O and row statistics, the combiner merges them into its own before the epilogue.
// Plan and item order: core/stream_k.h.
//
// Workspace (launch scratch, device_state.h; flags zero at launch and left zero): a slot per (tail CTA, consumer warpgroup) in the
// accumulator's own register order, float4 k of thread t at [slot][k][t]: each thread writes and
// later reads back exactly its own registers, so no layout conversion or shared memory is involved
// and every access is a coalesced 16-byte vector (128 threads x 16 B per k). The last float4 holds
// the row statistics (row_max[0..1] in raw score units, thread-partial row_sum[0..1]).
//
// Merge (exact, FA2 split-KV algebra, core/softmax.h merge_weight): with M = max(m_a, m_b),
//     O = O_a 2^((m_a - M) s) + O_b 2^((m_b - M) s),   l = l_a 2^((m_a - M) s) + l_b 2^((m_b - M) s),
// s = score_scale_log2, each exponent taken as the difference of the rounded shifts round(m s) the
// pieces' exponentials were computed against (OnlineSoftmax::move_factor). O_a, l_a share the
// (possibly stale, lazily rescaled) max m_a they were accumulated against, so the merge is exact
// whatever the pieces' rescaling history; the final normalisation (softmax.finalize) then divides
// by the merged l.
#pragma once

#include <cuda/atomic>
#include <cutlass/cutlass.h>

#include "core/softmax.h"
#include "hopper/arch/arch.cuh"
#include "hopper/shared/softmax.cuh"

namespace fa4::hopper {

template <class Kt>
struct StreamK {
  static constexpr int kOFloats = Kt::kHeadDimV / 2;  // O floats per thread (64 rows x dv / 128)
  static constexpr int kSlotVec4 = kOFloats / 4 + 1;  // + one float4 of row statistics
  static_assert(kOFloats % 4 == 0, "O fragment in float4s");

  /// Bytes of partial storage the launch allocates for `tail_ctas` CTAs (one slot per consumer
  /// warpgroup).
  static constexpr int64_t workspace_bytes(int32_t tail_ctas) {
    return int64_t(tail_ctas) * Kt::kNumMmaWarpGroups * kSlotVec4 * 128 * int64_t(sizeof(float4));
  }
  /// Flags for `tail_ctas` CTAs, one per (CTA, consumer warpgroup): zero at launch, set by the
  /// contributor, cleared by the combiner.
  static constexpr int64_t num_flags(int32_t tail_ctas) { return int64_t(tail_ctas) * Kt::kNumMmaWarpGroups; }

  __device__ __forceinline__ static float4* slot(const typename Kt::Params& p, int32_t cta, int wg, int lane128) {
    return reinterpret_cast<float4*>(p.sk_partial) + (int64_t(cta) * Kt::kNumMmaWarpGroups + wg) * kSlotVec4 * 128 + lane128;
  }

  /// Contributor: store this warpgroup's partial in the CTA's slot and publish it (release).
  template <int kFragS, class FragO>
  __device__ __forceinline__ static void store_partial(const typename Kt::Params& p, int tid, const FragO& tOrO,
                                                       const OnlineSoftmax<kFragS>& softmax) {
    const int wg = tid / 128;
    float4* dst = slot(p, int32_t(blockIdx.x), wg, tid % 128);
#pragma unroll
    for (int k = 0; k < kOFloats / 4; ++k)
      dst[k * 128] = make_float4(tOrO(4 * k), tOrO(4 * k + 1), tOrO(4 * k + 2), tOrO(4 * k + 3));
    dst[(kSlotVec4 - 1) * 128] = make_float4(softmax.row_max[0], softmax.row_max[1], softmax.row_sum[0],
                                             softmax.row_sum[1]);
    // Every thread's writes are ordered before the warpgroup barrier; the flag's release store
    // (after the barrier) then publishes all of them to the combiner's acquire load.
    __threadfence();
    arch::named_barrier_sync(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::local(wg), cutlass::NumThreadsPerWarpGroup);
    if (tid % 128 == 0) {
      cuda::atomic_ref<int32_t, cuda::thread_scope_device> flag(p.sk_flags[blockIdx.x * Kt::kNumMmaWarpGroups + wg]);
      flag.store(1, cuda::memory_order_release);
    }
  }

  /// Combiner: merge the partials of CTAs blockIdx.x + 1 .. blockIdx.x + count into this
  /// warpgroup's O and row statistics. The contributors ran those pieces first thing (the item
  /// order of stream_k.h), so the flags are normally set long before; all CTAs are co-resident
  /// (cooperative launch), so the wait cannot deadlock.
  template <int kFragS, class FragO>
  __device__ __forceinline__ static void combine(const typename Kt::Params& p, int tid, int32_t count, FragO& tOrO,
                                                 OnlineSoftmax<kFragS>& softmax) {
    const int wg = tid / 128;
    const float s = p.score_scale_log2;
    for (int32_t j = 1; j <= count; ++j) {
      const int32_t cta = int32_t(blockIdx.x) + j;
      cuda::atomic_ref<int32_t, cuda::thread_scope_device> flag(p.sk_flags[cta * Kt::kNumMmaWarpGroups + wg]);
      // The exit is voted over the warp so the trip count is warp-uniform: a loop whose exit may
      // diverge, on a path back into the key loop, makes ptxas move the key loop's wgmma
      // descriptors out of uniform registers (R2UR before every wgmma; src/hopper/README.md).
      while (!__all_sync(0xffffffffu, flag.load(cuda::memory_order_acquire) != 0)) __nanosleep(64);
      const float4* src = slot(p, cta, wg, tid % 128);
      const float4 st = __ldcg(src + (kSlotVec4 - 1) * 128);  // L2: written by another SM
      const float m_o[2] = {st.x, st.y}, l_o[2] = {st.z, st.w};
      // Weight of each piece in the merged row (core/softmax.h): a piece whose row saw only masked
      // keys (max -inf) has O = 0 and l = 0 and weighs 0, with no -inf - -inf.
      // (In log2 units of the shifts the pieces' exponentials were taken against: move_factor.)
      using Softmax = OnlineSoftmax<kFragS>;
      float f_self[2], f_o[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m = fmaxf(softmax.row_max[r], m_o[r]);
        f_self[r] = Softmax::move_factor(softmax.row_max[r], m, s);
        f_o[r] = Softmax::move_factor(m_o[r], m, s);
        softmax.row_max[r] = m;
        softmax.row_sum[r] = softmax.row_sum[r] * f_self[r] + l_o[r] * f_o[r];
      }
#pragma unroll
      for (int k = 0; k < kOFloats / 4; ++k) {
        const float4 v = __ldcg(src + k * 128);
        // Fragment order ((2,2,dv/8)): registers 4k, 4k+1 are row 0, 4k+2, 4k+3 row 1.
        tOrO(4 * k) = tOrO(4 * k) * f_self[0] + v.x * f_o[0];
        tOrO(4 * k + 1) = tOrO(4 * k + 1) * f_self[0] + v.y * f_o[0];
        tOrO(4 * k + 2) = tOrO(4 * k + 2) * f_self[1] + v.z * f_o[1];
        tOrO(4 * k + 3) = tOrO(4 * k + 3) * f_self[1] + v.w * f_o[1];
      }
    }
    // Each flag has one reader, this warpgroup: once all its threads have seen them set, it
    // clears them for the next launch (the scratch is zeroed only when allocated).
    arch::named_barrier_sync(arch::NamedBarriers<Kt::kNumMmaWarpGroups>::local(wg), cutlass::NumThreadsPerWarpGroup);
    if (tid % 128 == 0)
      for (int32_t j = 1; j <= count; ++j) p.sk_flags[(int32_t(blockIdx.x) + j) * Kt::kNumMmaWarpGroups + wg] = 0;
  }
};

}  // namespace fa4::hopper
