// tests/accuracy_check.h — the ONE accuracy judgement shared by the CPU test suite and `fa4 check`:
// every output of a forward (+ backward) against the float64 oracle under the rule
//   max|x - ref64| <= 2 * max|naive_same_precision - ref64| + atol + documented first-order slack
// (test_util.h check_accuracy), with elements the oracle does not write required untouched.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/naive_attention.h"
#include "fa4/detail/params.h"
#include "fa4/exp2.h"
#include "test_util.h"

namespace fa4::test {

/// The output tensors of one problem (dsink may be an empty tensor when there is no sink).
struct OutputSet {
  const HostTensor* out;
  const HostTensor* lse;
  const HostTensor* dq;
  const HostTensor* dk;
  const HostTensor* dv;
  const HostTensor* dsink;
};

/// Float64 mirrors of all outputs, filled by the naive maths.
struct NaiveMirrors {
  Mirror o, l, gq, gk, gv, gs;
  explicit NaiveMirrors(const OutputSet& s)
      : o(s.out->numel()), l(s.lse->numel()), gq(s.dq->numel()), gk(s.dk->numel()),
        gv(s.dv->numel()), gs(s.dsink->numel()) {}
  MirrorWriter writer() { return {&o, &l, &gq, &gk, &gv, &gs}; }
};

/// exact: the float64 oracle. Otherwise the same-precision baseline: every intermediate rounded
/// to the dtype; for fp32 with an exp2 split it uses the polynomial for EVERY P (the worst split),
/// so the rule compares against an fp32 naive attention built from the same exp2 primitive (16-bit
/// inputs round P to 2^-9 / 2^-12 anyway, which dominates; their baseline keeps std::exp).
inline NaiveMirrors run_naive(const detail::BwdParams& p, const OutputSet& shapes, bool exact,
                              bool backward, Exp2Split split) {
  NaiveMirrors m(shapes);
  MirrorWriter w = m.writer();
  if (exact) {
    cpu::naive::forward<double>(p, cpu::naive::NoRounding{}, w);
    if (backward) cpu::naive::backward<double>(p, cpu::naive::NoRounding{}, w);
  } else {
    const cpu::naive::RoundToDtype rnd{p.dtype, p.dtype == DType::kFP32 && split.emulated > 0};
    cpu::naive::forward<float>(p, rnd, w);
    if (backward) cpu::naive::backward<float>(p, rnd, w);
  }
  return m;
}

inline double max_abs_written(const Mirror& m) {
  double r = 0;
  for (size_t i = 0; i < m.v.size(); ++i)
    if (m.written[i] && std::isfinite(m.v[i])) r = std::max(r, std::abs(m.v[i]));
  return r;
}

inline double max_abs_finite(const HostTensor& t) {
  double r = 0;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::isfinite(t.get(i))) r = std::max(r, double(std::abs(t.get(i))));
  return r;
}

/// Documented first-order slack, fp32 only (16-bit rounding of P, 2^-9 / 2^-12 relative,
/// dominates both terms by orders of magnitude):
///  * exp2 split: the all-polynomial naive baseline is LUCKY where the softmax is peaked — its row
///    max term is exp(0) = 1 exactly, while FA4's stale (lazy) max puts the dominant term at a
///    non-integer exponent where the polynomial errs by up to eps = Exp2Poly3::max_rel_error.
///    Relative errors <= eps in P shift lse by <= eps (natural log), O by <= 2 eps (max|v| +
///    max|O|), and every gradient by <= 2 eps of its magnitude.
///  * backward: P = exp(s - lse) is rebuilt from the STORED fp32 lse, whose rounding (2^-24 |lse|
///    absolute) is a relative error of that size in every P, so 2 * 2^-24 * max|lse| of each
///    gradient's magnitude; the naive baseline never goes through a stored lse. It matters at
///    large softmax_scale (case C32).
struct FirstOrderSlack {
  double eps = 0, vmax = 0, lse_rel = 0;
  double out(const Mirror& ref) const { return 2 * eps * (vmax + max_abs_written(ref)); }
  double lse() const { return eps; }
  double grad(const Mirror& ref) const { return (2 * eps + lse_rel) * max_abs_written(ref); }
};

inline FirstOrderSlack first_order_slack(DType dtype, Exp2Split split, double vmax,
                                         const Mirror& ref_lse) {
  FirstOrderSlack s;
  if (dtype != DType::kFP32) return s;
  if (split.emulated > 0) {
    s.eps = Exp2Poly3::max_rel_error;
    s.vmax = vmax;
  }
  s.lse_rel = 2.0 * std::ldexp(1.0, -24) * max_abs_written(ref_lse);
  return s;
}

/// dsink = -sum_i P_sink,i D_i with D_i = dO_i . O_i, and the backward reads O from the STORED
/// out, rounded to the dtype (unit roundoff u: 2^-8 bf16, 2^-11 fp16, 2^-24 fp32). The naive
/// baseline rounds its own O at other places, so for this ONE scalar per head the two errors are
/// independent draws of the same size and "2x naive" alone fails by chance (seen about once in 20
/// runs). Each rounding is an independent error uniform in +-u/2 relative (standard deviation
/// u/sqrt(12)), so the dsink error has standard deviation
///   sigma_h = u/sqrt(12) * sqrt(sum_i P_sink,i^2 sum_d (dO_id O_id)^2);
/// 6 sigma_h joins dsink's bound (a false failure below 1e-8). Returns its max over heads.
inline double dsink_rounding_slack(const detail::BwdParams& p) {
  if (!p.sink || p.dout == nullptr) return 0.0;
  const double u = p.dtype == DType::kBF16 ? std::ldexp(1.0, -8)
                   : p.dtype == DType::kFP16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
  std::vector<double> per_head(size_t(p.num_heads), 0.0);
  for (int32_t b = 0; b < p.batch; ++b) {
    const detail::SeqInfo si = detail::seq_info_host(p, b);
    for (int32_t h = 0; h < p.num_heads; ++h) {
      for (int64_t i = 0; i < si.seqlen_q; ++i) {
        const int64_t row = si.q_row0 + i;
        const int64_t lse_off = (p.is_varlen ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride +
                                row * p.lse_row_stride;
        const double p_sink = std::exp(double(p.sink[h]) - double(p.lse[lse_off]));
        if (!std::isfinite(p_sink)) continue;
        const int64_t o = (p.is_varlen ? 0 : b * p.out_stride.batch) + row * p.out_stride.row + h * p.out_stride.head;
        const int64_t g = (p.is_varlen ? 0 : b * p.dout_stride.batch) + row * p.dout_stride.row + h * p.dout_stride.head;
        double sq = 0.0;  // sum_d (dO_id O_id)^2
        for (int32_t e = 0; e < p.headdim_v; ++e) {
          const double t = double(detail::load_as_float(p.dout, p.dtype, g + e)) *
                           double(detail::load_as_float(p.out, p.dtype, o + e));
          sq += t * t;
        }
        per_head[size_t(h)] += p_sink * p_sink * sq;
      }
    }
  }
  constexpr double kSigmas = 6.0;
  double worst = 0.0;
  for (double x : per_head) worst = std::max(worst, kSigmas * u / std::sqrt(12.0) * std::sqrt(x));
  return worst;
}

/// Checks out and lse (and dq, dk, dv, dsink with `backward`) of `tested` against the oracle;
/// `poisoned` holds the outputs as they were before the run (for the untouched check). p: the
/// validated params of the problem (host pointers, inputs only are read); split: the exp2 split
/// the tested implementation used; vmax: max|v| over the value tensor.
inline std::vector<Accuracy> check_outputs(const detail::BwdParams& p, const OutputSet& tested,
                                           const OutputSet& poisoned, bool backward, bool sink,
                                           Exp2Split split, double vmax) {
  const NaiveMirrors ref = run_naive(p, tested, true, backward, split);
  const NaiveMirrors nv = run_naive(p, tested, false, backward, split);
  const FirstOrderSlack sl = first_order_slack(p.dtype, split, vmax, ref.l);
  const DType dt = p.dtype;
  std::vector<Accuracy> acc;
  acc.push_back(check_accuracy("out", *tested.out, *poisoned.out, ref.o, nv.o, dt, sl.out(ref.o)));
  acc.push_back(check_accuracy("lse", *tested.lse, *poisoned.lse, ref.l, nv.l, DType::kFP32, sl.lse()));
  if (backward) {
    acc.push_back(check_accuracy("dq", *tested.dq, *poisoned.dq, ref.gq, nv.gq, dt, sl.grad(ref.gq)));
    acc.push_back(check_accuracy("dk", *tested.dk, *poisoned.dk, ref.gk, nv.gk, dt, sl.grad(ref.gk)));
    acc.push_back(check_accuracy("dv", *tested.dv, *poisoned.dv, ref.gv, nv.gv, dt, sl.grad(ref.gv)));
    if (sink)
      acc.push_back(check_accuracy("dsink", *tested.dsink, *poisoned.dsink, ref.gs, nv.gs,
                                   DType::kFP32, sl.grad(ref.gs) + dsink_rounding_slack(p)));
  }
  return acc;
}

}  // namespace fa4::test
