// src/hopper/shared/softmax.cuh — FlashAttention-4 online softmax on a wgmma accumulator fragment.
//
// Fragment layout (sm_90 wgmma m64nNk16, fp32 accumulators; CuTe shape ((2,2,N/8),1,1)): thread
// t of a warpgroup holds, at flat index v,
//     row = 16*(warp%4) + (lane/4) + 8*((v/2)%2),     col = 8*(v/4) + 2*(lane%4) + (v%2).
// So each thread owns 2 rows (r = (v/2)%2), a row is spread over the 4 lanes of a quad, and the
// 8-column group v/4 is the SAME for every lane: the exp2 emulation share by column group (core/exp2.h) is a
// compile-time property of the register, with no lane divergence.
//
// FA4 techniques (arXiv 2603.05451, Sec. 3):
//   * lazy rescaling: the running max m of a row only moves when the block max exceeds it by more
//     than tau (log2 units). P = 2^(x - m) then stays <= 2^tau (representable in bf16/fp16 P and
//     harmless to the fp32 O/l accumulators), and the O rescale (dv/2 FMULs per thread) is skipped
//     for most blocks. The decision is voted per WARP (__any_sync), so the skip is a uniform branch.
//     The final normalisation divides by the exact l computed with the same stale m, so the result
//     is exact. In the key loop's steady state the test runs on the exponentials themselves
//     (step_from_running_max): no block max sits in front of the exps, and a moved max is read off
//     them (up to the ex2/log2 rounding, which l and O share).
//   * exp2 emulation: entries of 8-column groups picked by Exp2Emulation::uses_emulation (same rule as the
//     CPU) use the FMA-pipe polynomial fa4::exp2_emulated, the rest MUFU ex2.approx; the two pipes
//     run in parallel.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/constants.h"
#include "core/softmax.h"
#include "core/exp2.h"
#include "hopper/arch/arch.cuh"

namespace fa4::hopper {

/// Emulation share known at compile time (the tuning table's default): the branch folds away per
/// register.
template <int kPeriod, int kEmulated>
struct StaticExp2Emulation {
  __device__ __forceinline__ static constexpr bool emulate(int group) {
    return Exp2Emulation{kPeriod, kEmulated}.uses_emulation(group * 8);
  }
};

/// Emulation share given per call (options.exp2_emulation_fraction): a branch per 8-column group
/// whose condition is the same in every thread (uniform, no divergence).
struct RuntimeExp2Emulation {
  Exp2Emulation emulation;
  __device__ __forceinline__ bool emulate(int group) const { return emulation.uses_emulation(group * 8); }
};

/// Period of every emulation share fa4::forward makes from an exp2_emulation_fraction (multiples
/// of 1/16).
constexpr int kRuntimeExp2Period = 16;

using detail::kLn2;
using detail::kLog2e;

using arch::fragment_col;
using arch::fragment_row;

template <int kFragSize>
struct OnlineSoftmax {
  static_assert(kFragSize % 4 == 0, "fragment is ((2,2,N/8))");
  static constexpr float kNegInf = -INFINITY;
  static constexpr float kOverflowP = 0x1p120f;  ///< step_from_running_max: an exponential this large may have saturated
  static constexpr float kMaxEmulatedInput = 127.f;  ///< fa4::exp2_emulated's domain (exp2.h)

  float row_max[2];  ///< running max in RAW score units (before score_scale_log2)
  float row_sum[2];  ///< thread-partial sum of P (quad-reduced at the end)

  __device__ __forceinline__ void init() {
    row_max[0] = row_max[1] = kNegInf;
    row_sum[0] = row_sum[1] = 0.f;
  }

  /// The shift (log2 units) the exponentials of a row with running max m are taken against:
  /// round(m * scale_log2), subtracted inside one fma per score (exp_pass). Every factor that moves
  /// a state from one max to another is 2^(difference of two such shifts), never
  /// 2^((m_old - m_new) * scale_log2): the latter weighs the earlier blocks off by the two shifts'
  /// roundings, up to 2^(one ulp of m * scale_log2), 4% at |m * scale_log2| ~ 1e6. __fmul_rn keeps
  /// the product rounded where the compiler would otherwise contract it into an fma with the
  /// difference.
  __device__ __forceinline__ static float shift(float m, float scale_log2) { return __fmul_rn(m, scale_log2); }

  /// Factor 2^(shift(m_old) - shift(m_new)) for O and l of a row whose max moves from m_old to
  /// m_new >= m_old (core/softmax.h merge_weight in log2 units): 0 from m_old = -inf.
  __device__ __forceinline__ static float move_factor(float m_old, float m_new, float scale_log2) {
    return detail::merge_weight(m_old == kNegInf ? kNegInf : shift(m_old, scale_log2), shift(m_new, scale_log2), 1.f,
                                [](float x) { return arch::ex2_approx(x); });
  }

  /// Exponentials of one block: S -> P = 2^(s * scale_log2 + neg_m_scaled[r]) in place; this
  /// thread's sums of its P per row go to `sum` (the caller adds them to row_sum). The emulation rule is
  /// a compile-time property of each register for StaticExp2Emulation, a uniform branch for
  /// RuntimeExp2Emulation.
  /// kUnbounded: x may exceed 127 (step_from_running_max), where fa4::exp2_emulated's exponent
  /// bit-add would wrap into garbage; its input is then capped at 127 (p = 2^127 flags the block
  /// as overflowed; a NaN passes the comparison unchanged). MUFU saturates to +inf by itself.
  template <bool kUnbounded = false, class Frag, class Emulation>
  __device__ __forceinline__ static void exp_pass(Frag& s, float scale_log2, const float (&neg_m_scaled)[2],
                                                  const Emulation& emulation, float (&sum)[2]) {
    // Accumulated in locals, written out once: accumulating through the reference kept the sums in
    // local memory (a store per exponential) in the per-call emulation branch.
    float acc0 = 0.f, acc1 = 0.f;
#pragma unroll
    for (int v = 0; v < kFragSize; ++v) {
      float x = fmaf(s(v), scale_log2, neg_m_scaled[(v >> 1) & 1]);
      if (kUnbounded && emulation.emulate(v >> 2)) x = x > kMaxEmulatedInput ? kMaxEmulatedInput : x;
      const float p = emulation.emulate(v >> 2) ? fa4::exp2_emulated(x) : arch::ex2_approx(x);
      s(v) = p;
      if ((v >> 1) & 1) acc1 += p; else acc0 += p;
    }
    sum[0] = acc0;
    sum[1] = acc1;
  }

  /// exp_pass with the emulation share in force: the config table's (kPeriod, kEmulated), or
  /// `emulation` when runtime_emulation (a per-call exp2 fraction). The shares the benchmark
  /// ablates (0, 1/8, 1/4, 1/2 of a 16-group period) get compile-time per-register choices too: a
  /// per-register runtime branch breaks the MUFU/FMA interleaving the emulation exists for
  /// (measured 2.5-6x slower). Other shares take the uniform runtime branch.
  template <int kPeriod, int kEmulated, bool kUnbounded = false, class Frag>
  __device__ __forceinline__ static void exp_pass_dispatch(Frag& s, float scale_log2, const float (&neg_m_scaled)[2],
                                                           bool runtime_emulation, Exp2Emulation emulation,
                                                           float (&sum)[2]) {
    if (!runtime_emulation) {
      exp_pass<kUnbounded>(s, scale_log2, neg_m_scaled, StaticExp2Emulation<kPeriod, kEmulated>{}, sum);
    } else if (emulation.period == kRuntimeExp2Period) {
      switch (emulation.emulated) {
        case 0: exp_pass<kUnbounded>(s, scale_log2, neg_m_scaled, StaticExp2Emulation<kRuntimeExp2Period, 0>{}, sum); break;
        case 2: exp_pass<kUnbounded>(s, scale_log2, neg_m_scaled, StaticExp2Emulation<kRuntimeExp2Period, 2>{}, sum); break;
        case 4: exp_pass<kUnbounded>(s, scale_log2, neg_m_scaled, StaticExp2Emulation<kRuntimeExp2Period, 4>{}, sum); break;
        case 8: exp_pass<kUnbounded>(s, scale_log2, neg_m_scaled, StaticExp2Emulation<kRuntimeExp2Period, 8>{}, sum); break;
        default: exp_pass<kUnbounded>(s, scale_log2, neg_m_scaled, RuntimeExp2Emulation{emulation}, sum); break;
      }
    } else {
      exp_pass<kUnbounded>(s, scale_log2, neg_m_scaled, RuntimeExp2Emulation{emulation}, sum);
    }
  }

  /// True if both of this thread's rows have a finite running max (some key seen), the condition
  /// for step_from_running_max.
  __device__ __forceinline__ bool has_finite_max() const {
    return row_max[0] != kNegInf && row_max[1] != kNegInf;
  }

  /// Processes one score block in place (S -> P, fp32), block max first. Returns true if the warp
  /// moved its maxima; then o_scale[r] is the factor to apply to O row r (1 for rows that did not
  /// move).
  template <int kPeriod, int kEmulated, class Frag>
  __device__ __forceinline__ bool step(Frag& s, float scale_log2, float tau, float (&o_scale)[2],
                                       bool runtime_emulation, Exp2Emulation emulation) {
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
        o_scale[r] = m_new == kNegInf ? 1.f : move_factor(row_max[r], m_new, scale_log2);
        row_max[r] = m_new;
        row_sum[r] *= o_scale[r];
      }
    }
    float neg_m_scaled[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_m_scaled[r] = row_max[r] == kNegInf ? 0.f : -shift(row_max[r], scale_log2);
    float sum[2];
    exp_pass_dispatch<kPeriod, kEmulated>(s, scale_log2, neg_m_scaled, runtime_emulation, emulation, sum);
    row_sum[0] += sum[0];
    row_sum[1] += sum[1];
    return rescale;
  }

  /// The same block without a block max first (the steady state of the key loop): the
  /// exponentials start from the running max m as it stands, so they begin as soon as S is ready
  /// and no max reduction (two FMNMX per score, quad shuffles, a vote) sits in front of them.
  /// The lazy-rescaling test then runs on the exponentials: a max grew by more than tau iff some
  /// p > 2^tau, and a thread's sum of its p in a row bounds each of them, so
  ///     every sum <= sum_limit (= 2^tau) in the warp  ->  no rescale (the common case).
  /// Otherwise the block maxima are read off the exponentials (max p = 2^(block max - m)); if none
  /// passes 2^tau (the sum was large, no single p) nothing moves either, so the trigger is exactly
  /// FA4's. If one does, the rows whose max grew move to it and P, l and O are multiplied by one
  /// factor: P <= 2^tau holds and out = acc / l stays exact. An exponential at or past 2^120 may
  /// have saturated (MUFU gives +inf from 2^128, exp_pass caps the emulated ones at 2^127): those
  /// entries' scores are computed again by score_at(v) (the raw score of fragment entry v after
  /// softcap, from the tiles in smem) and the block is rescaled from log2 units
  /// (rescale_after_overflow). Needs a finite running max in every row of the warp
  /// (has_finite_max).
  /// Measured on H200 (bench/results/history.md): with the block max in front, the d128 forward
  /// ran 4-9% slower and d64 8-11%; computing that max in parallel with the exponentials instead
  /// recovered only 0-3%. Per bucket: the tuning table's exp_from_running_max
  /// (src/hopper/fwd/tuning_fwd.h).
  template <int kPeriod, int kEmulated, class Frag, class ScoreAt>
  __device__ __forceinline__ void step_from_running_max(Frag& s, float scale_log2, float sum_limit,
                                                        float (&o_scale)[2], bool runtime_emulation,
                                                        Exp2Emulation emulation, bool& rescale,
                                                        const ScoreAt& score_at) {
    float neg_m_scaled[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) neg_m_scaled[r] = -shift(row_max[r], scale_log2);
    float sum[2];
    exp_pass_dispatch<kPeriod, kEmulated, /*kUnbounded=*/true>(s, scale_log2, neg_m_scaled, runtime_emulation,
                                                               emulation, sum);
    o_scale[0] = o_scale[1] = 1.f;
    rescale = false;
    // (A NaN sum compares false: NaN scores propagate to O and l as in step().)
    if (__any_sync(0xffffffffu, sum[0] > sum_limit || sum[1] > sum_limit)) {
      // Rare: max p per row = 2^(block max - m).
      float pmax[2] = {0.f, 0.f};
#pragma unroll
      for (int v = 0; v < kFragSize; ++v) pmax[(v >> 1) & 1] = fmaxf(pmax[(v >> 1) & 1], s(v));
#pragma unroll
      for (int r = 0; r < 2; ++r) pmax[r] = arch::quad_max(pmax[r]);
      if (__any_sync(0xffffffffu, !(pmax[0] < kOverflowP) || !(pmax[1] < kOverflowP))) {
        rescale_after_overflow(s, scale_log2, neg_m_scaled, o_scale, score_at);
        rescale = true;
        return;
      }
      rescale = __any_sync(0xffffffffu, pmax[0] > sum_limit || pmax[1] > sum_limit);
      if (rescale) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (pmax[r] > 1.f) {
            const float m_new = row_max[r] + log2f(pmax[r]) / scale_log2;
            o_scale[r] = move_factor(row_max[r], m_new, scale_log2);
            row_max[r] = m_new;
          }
          sum[r] *= o_scale[r];
          row_sum[r] *= o_scale[r];
        }
#pragma unroll
        for (int v = 0; v < kFragSize; ++v) s(v) *= o_scale[(v >> 1) & 1];
      }
    }
    row_sum[0] += sum[0];
    row_sum[1] += sum[1];
  }

  /// step_from_running_max's block after an exponential reached 2^120: every entry back to log2
  /// units relative to m (x = log2 p, or, where p may have saturated, from score_at), the rows'
  /// maxima from those, and P recomputed against them (MUFU only). Rarer still than a rescale: a
  /// score jump of >= 120 log2 units since the last one. Runs through a local array with
  /// non-unrolled loops (unrolled, the 64 inlined score_at loops cost the hot loop spills; an index
  /// into the register fragment itself would put the fragment in local memory for the whole loop).
  template <class Frag, class ScoreAt>
  __device__ __forceinline__ void rescale_after_overflow(Frag& s, float scale_log2, const float (&neg_m_scaled)[2],
                                                      float (&o_scale)[2], const ScoreAt& score_at) {
    float x[kFragSize];
#pragma unroll
    for (int v = 0; v < kFragSize; ++v) x[v] = s(v);
    float xmax[2] = {kNegInf, kNegInf};
#pragma unroll 1
    for (int v = 0; v < kFragSize; ++v) {
      const int r = (v >> 1) & 1;
      // (A NaN p takes the score_at branch and stays NaN.)
      x[v] = x[v] < kOverflowP ? log2f(x[v]) : fmaf(score_at(v), scale_log2, neg_m_scaled[r]);
      xmax[r] = fmaxf(xmax[r], x[v]);
    }
    float shift_by[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      xmax[r] = arch::quad_max(xmax[r]);
      shift_by[r] = 0.f;
      if (xmax[r] > 0.f) {  // the row's max grew: move it (never down)
        const float m_new = row_max[r] + xmax[r] / scale_log2;
        shift_by[r] = shift(m_new, scale_log2) + neg_m_scaled[r];  // shift(m_new) - shift(m_old)
        o_scale[r] = arch::ex2_approx(-shift_by[r]);
        row_max[r] = m_new;
      }
    }
#pragma unroll 1
    for (int v = 0; v < kFragSize; ++v) {
      const int r = (v >> 1) & 1;
      x[v] = arch::ex2_approx(x[v] - shift_by[r]);
      sum[r] += x[v];
    }
#pragma unroll
    for (int v = 0; v < kFragSize; ++v) s(v) = x[v];
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * o_scale[r] + sum[r];
  }

  /// Final normalisation (core/softmax.h). o_scale[r] multiplies O row r; lse[r] is the
  /// natural-log LSE. sink[r]: row r's head's sink logit (natural-log units), or -inf when there is
  /// none (with pack-GQA the two rows may be different heads').
  /// Fully masked row (l == 0): O = 0, lse = -inf, or lse = sink with a sink. NaN from the data
  /// (l is NaN) still propagates to O and lse.
  __device__ __forceinline__ void finalize(float scale_log2, const float (&sink)[2], float (&o_scale)[2],
                                          float (&lse)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m = row_max[r] == kNegInf ? kNegInf : shift(row_max[r], scale_log2);  // log2 units
      const detail::RowNorm n = detail::finalize_row(m, arch::quad_sum(row_sum[r]), sink[r]);
      o_scale[r] = n.o_scale;
      lse[r] = n.lse;
    }
  }
};

}  // namespace fa4::hopper
