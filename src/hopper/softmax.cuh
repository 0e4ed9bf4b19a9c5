// src/hopper/softmax.cuh — FlashAttention-4 online softmax on a wgmma accumulator fragment.
//
// Fragment layout (sm_90 wgmma m64nNk16, fp32 accumulators; CuTe shape ((2,2,N/8),1,1)): thread
// t of a warpgroup holds, at flat index v,
//     row = 16*(warp%4) + (lane/4) + 8*((v/2)%2),     col = 8*(v/4) + 2*(lane%4) + (v%2).
// So each thread owns 2 rows (r = (v/2)%2), a row is spread over the 4 lanes of a quad, and the
// 8-column group v/4 is the SAME for every lane: the exp2 split by column group (fa4/exp2.h) is a
// compile-time property of the register, with no lane divergence.
//
// FA4 techniques (arXiv 2603.05451, Sec. 3):
//   * lazy rescaling: the running max m of a row only moves when the block max exceeds it by more
//     than tau (log2 units). P = 2^(x - m) then stays <= 2^tau (representable in bf16/fp16 P and
//     harmless to the fp32 O/l accumulators), and the O rescale (dv/2 FMULs per thread) is skipped
//     for most blocks. The decision is voted per WARP (__any_sync), so the skip is a uniform branch;
//     when any row of the warp moves, every row of the warp moves to its exact max. The final
//     normalisation divides by the exact l computed with the same stale m, so the result is exact.
//   * split exp2: entries of 8-column groups picked by Exp2Split::uses_emulation (same rule as the
//     CPU) use the FMA-pipe polynomial fa4::exp2_emulated, the rest MUFU ex2.approx; the two pipes
//     run in parallel.
#pragma once

#include <cmath>
#include <cstdint>

#include "fa4/exp2.h"
#include "fa4/detail/constants.h"
#include "hopper/arch.cuh"

namespace fa4::hopper {

/// Split known at compile time (the config table's default): the branch folds away per register.
template <int kPeriod, int kEmulated>
struct StaticExp2Split {
  __device__ __forceinline__ static constexpr bool emulate(int group) {
    return Exp2Split{kPeriod, kEmulated}.uses_emulation(group * 8);
  }
};

/// Split given per call (options.exp2_emulation_fraction): a branch per 8-column group whose
/// condition is the same in every thread (uniform, no divergence).
struct RuntimeExp2Split {
  Exp2Split split;
  __device__ __forceinline__ bool emulate(int group) const { return split.uses_emulation(group * 8); }
};

/// Period of every split fa4::forward makes from an exp2_emulation_fraction (multiples of 1/16).
constexpr int kRuntimeSplitPeriod = 16;

using detail::kLn2;
using detail::kLog2e;

/// Tile row (0..tile_m-1) of fragment row r = 0 of consumer thread `tid` (warpgroup tid / 128, 64
/// rows each); its row r = 1 is 8 below (layout above).
__device__ __forceinline__ int fragment_row(int tid) {
  return (tid / 128) * 64 + ((tid % 128) / 32) * 16 + (tid % 32) / 4;
}
/// Column, within each 8-column group, of the first of consumer thread `tid`'s value pair.
__device__ __forceinline__ int fragment_col(int tid) { return 2 * (tid % 4); }

template <int kFragSize>
struct OnlineSoftmax {
  static_assert(kFragSize % 4 == 0, "fragment is ((2,2,N/8))");
  static constexpr float kNegInf = -INFINITY;

  float row_max[2];  ///< running max in RAW score units (before softmax_scale_log2)
  float row_sum[2];  ///< thread-partial sum of P (quad-reduced at the end)

  __device__ __forceinline__ void init() {
    row_max[0] = row_max[1] = kNegInf;
    row_sum[0] = row_sum[1] = 0.f;
  }

  /// Processes one score block in place (S -> P, fp32). Returns true if the warp moved its maxima;
  /// then o_scale[r] is the factor to apply to O row r (1 for rows that did not move).
  /// Exponentials of one block: S -> P in place, row sums added. The split rule is a compile-time
  /// property of each register for StaticExp2Split, a uniform branch for RuntimeExp2Split.
  template <class Frag, class Split>
  __device__ __forceinline__ void exp_pass(Frag& s, float scale_log2, const float (&neg_m_scaled)[2],
                                           const Split& split) {
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int v = 0; v < kFragSize; ++v) {
      const int r = (v >> 1) & 1;
      const float x = fmaf(s(v), scale_log2, neg_m_scaled[r]);
      const float p = split.emulate(v >> 2) ? fa4::exp2_emulated(x) : arch::ex2_approx(x);
      s(v) = p;
      sum[r] += p;
    }
    row_sum[0] += sum[0];
    row_sum[1] += sum[1];
  }

  /// kPeriod/kEmulated: the config table's default split. runtime_split: use `split` instead (a
  /// per-call exp2 fraction); only this exp loop is instantiated twice, not the main loop.
  template <int kPeriod, int kEmulated, class Frag>
  __device__ __forceinline__ bool step(Frag& s, float scale_log2, float tau, float (&o_scale)[2],
                                       bool runtime_split, Exp2Split split) {
    // Block max in 4 independent FMNMX chains per row (by v&1 and the parity of v>>2), joined at
    // the end: one chain per row was a kFragSize/2-deep dependent sequence on the softmax's
    // critical path (ncu: FMNMX 16% of the d128 main loop's stall samples, mostly fixed-latency
    // waits). fmax is exact and associative, so the result is bitwise the same.
    float m4[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) m4[r][c] = kNegInf;
#pragma unroll
    for (int v = 0; v < kFragSize; ++v) {
      const int r = (v >> 1) & 1, c = (v & 1) | (((v >> 2) & 1) << 1);
      m4[r][c] = fmaxf(m4[r][c], s(v));
    }
    float blk_max[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) blk_max[r] = fmaxf(fmaxf(m4[r][0], m4[r][1]), fmaxf(m4[r][2], m4[r][3]));
    bool need = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      blk_max[r] = arch::quad_max(blk_max[r]);
      // -inf - -inf = NaN compares false: an all-masked row never asks for a rescale.
      need |= (blk_max[r] - row_max[r]) * scale_log2 > tau;
    }
    const bool rescale = __any_sync(0xffffffffu, need);
    o_scale[0] = o_scale[1] = 1.f;
    if (rescale) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(row_max[r], blk_max[r]);
        // A row still at -inf keeps factor 1 (its O and l are 0 anyway): avoids -inf - -inf.
        o_scale[r] = m_new == kNegInf ? 1.f : arch::ex2_approx((row_max[r] - m_new) * scale_log2);
        row_max[r] = m_new;
        row_sum[r] *= o_scale[r];
      }
    }
    float neg_m_scaled[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_m_scaled[r] = row_max[r] == kNegInf ? 0.f : -row_max[r] * scale_log2;
    if (!runtime_split) {
      exp_pass(s, scale_log2, neg_m_scaled, StaticExp2Split<kPeriod, kEmulated>{});
    } else if (split.period == kRuntimeSplitPeriod) {
      // The shares the benchmark ablates (0, 1/8, 1/4, 1/2) get compile-time per-register
      // choices too: a per-register runtime branch breaks the MUFU/FMA interleaving the split
      // exists for (measured 2.5-6x slower). Other shares take the uniform runtime branch.
      switch (split.emulated) {
        case 0: exp_pass(s, scale_log2, neg_m_scaled, StaticExp2Split<kRuntimeSplitPeriod, 0>{}); break;
        case 2: exp_pass(s, scale_log2, neg_m_scaled, StaticExp2Split<kRuntimeSplitPeriod, 2>{}); break;
        case 4: exp_pass(s, scale_log2, neg_m_scaled, StaticExp2Split<kRuntimeSplitPeriod, 4>{}); break;
        case 8: exp_pass(s, scale_log2, neg_m_scaled, StaticExp2Split<kRuntimeSplitPeriod, 8>{}); break;
        default: exp_pass(s, scale_log2, neg_m_scaled, RuntimeExp2Split{split}); break;
      }
    } else {
      exp_pass(s, scale_log2, neg_m_scaled, RuntimeExp2Split{split});
    }
    return rescale;
  }

  /// Final normalisation. o_scale[r] multiplies O row r; lse[r] is the natural-log LSE.
  /// sink_log2: the sink logit in log2 units, or -inf when there is none.
  /// Fully masked row (l == 0): O = 0, lse = -inf, or lse = sink with a sink. NaN from the data
  /// (l is NaN) still propagates to O and lse.
  __device__ __forceinline__ void finalize(float scale_log2, float sink_log2, float (&o_scale)[2],
                                           float (&lse)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = arch::quad_sum(row_sum[r]);
      const float m = row_max[r] == kNegInf ? kNegInf : row_max[r] * scale_log2;  // log2 units
      if (sink_log2 != kNegInf) {
        const float mm = fmaxf(m, sink_log2);  // finite: the sink is finite
        const float l_all = l * exp2f(m - mm) + exp2f(sink_log2 - mm);
        o_scale[r] = exp2f(m - mm) / l_all;
        lse[r] = (mm + log2f(l_all)) * kLn2;
      } else if (l == 0.f) {
        o_scale[r] = 0.f;
        lse[r] = kNegInf;
      } else {
        o_scale[r] = 1.f / l;
        lse[r] = (m + log2f(l)) * kLn2;
      }
    }
  }
};

}  // namespace fa4::hopper
