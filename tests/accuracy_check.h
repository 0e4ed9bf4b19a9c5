// tests/accuracy_check.h — the ONE accuracy judgement shared by the CPU test suite and `fa4 check`:
// every output of a forward (+ backward) against the float64 oracle under the rule
//   max|x - ref64| <= 2 * max|naive_same_precision - ref64| + atol + documented first-order slack
// (test_util.h check_accuracy), with elements the oracle does not write required untouched.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/naive_attention.h"
#include "core/params.h"
#include "core/exp2.h"
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
/// to the dtype; for fp32 with an exp2 emulation share it uses the polynomial for EVERY P (the worst share),
/// so the rule compares against an fp32 naive attention built from the same exp2 primitive (16-bit
/// inputs round P to 2^-9 / 2^-12 anyway, which dominates; their baseline keeps std::exp).
/// d_from_stored_out (exact only): the oracle's backward takes D from the stored out (see
/// stored_out_slack).
inline NaiveMirrors run_naive(const detail::BwdParams& p, const OutputSet& shapes, bool exact,
                              bool backward, Exp2Emulation emulation, bool d_from_stored_out = false) {
  NaiveMirrors m(shapes);
  MirrorWriter w = m.writer();
  if (exact) {
    cpu::naive::forward<double>(p, cpu::naive::NoRounding{}, w);
    if (backward) cpu::naive::backward<double>(p, cpu::naive::NoRounding{}, w, d_from_stored_out);
  } else {
    const cpu::naive::RoundToDtype rnd{p.dtype, p.dtype == DType::kFP32 && emulation.emulated > 0};
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
///  * exp2 emulation share: the all-polynomial naive baseline is LUCKY where the softmax is peaked — its row
///    max term is exp(0) = 1 exactly, while FA4's stale (lazy) max puts the dominant term at a
///    non-integer exponent where the polynomial errs by up to eps = Exp2Poly3::max_rel_error.
///    Relative errors <= eps in P shift lse by <= eps (natural log), O by <= 2 eps (max|v| +
///    max|O|), and every gradient by <= 2 eps of its magnitude.
///  * backward: P = exp(s - lse) is rebuilt from the STORED fp32 lse, whose rounding (2^-24 |lse|
///    absolute) is a relative error of that size in every P, so 2 * 2^-24 * max|lse| of each
///    gradient's magnitude; the naive baseline never goes through a stored lse. It matters at
///    large softmax_scale (case C32).
///  * lse: FA4 finalizes in log2 units, lse = (m_log2 + log2 l) * ln2 (core/softmax.h
///    finalize_row): the row max and the sum are rounded at 1/ln2 = 1.44x the magnitude of lse,
///    log2f adds its own, and the ln2 multiply rounds once more, about 3 ulps of |lse| in all,
///    where the naive baseline takes one natural log and can be within half an ulp on every row
///    of a small problem (an fp32 KV-cache case of 24 rows failed by 1% with seed 2472692567:
///    2.8 ulps against 2 x 0.9 + 1). So 3 * 2^-24 * max|lse| joins the lse bound.
struct FirstOrderSlack {
  double eps = 0, vmax = 0;
  double lse_ulp = 0;  ///< fp32: 2^-24 * max|lse|, the stored lse's rounding
  double out(const Mirror& ref) const { return 2 * eps * (vmax + max_abs_written(ref)); }
  double lse() const { return eps + 3 * lse_ulp; }
  double grad(const Mirror& ref) const { return (2 * eps + 2 * lse_ulp) * max_abs_written(ref); }
};

inline FirstOrderSlack first_order_slack(DType dtype, Exp2Emulation emulation, double vmax,
                                         const Mirror& ref_lse) {
  FirstOrderSlack s;
  if (dtype != DType::kFP32) return s;
  if (emulation.emulated > 0) {
    s.eps = Exp2Poly3::max_rel_error;
    s.vmax = vmax;
  }
  s.lse_ulp = std::ldexp(1.0, -24) * max_abs_written(ref_lse);
  return s;
}

/// dsink = -sum_i P_i D_i with P_i = exp(sink - lse_i) and D_i = dO_i . O_i, where the backward
/// reads O and lse as the forward STORED them. Their errors (each checked on its own above)
/// propagate into dsink to first order as
///   delta dsink = -sum_i P_i (dO_i . delta O_i) + sum_i P_i D_i delta lse_i,
/// delta = stored - float64 oracle. The naive baseline derives D from its OWN O, so "2x naive"
/// does not cover this term: for 16-bit it is the rounding of the stored O (2^-8 / 2^-11, which
/// made one scalar per head fail by chance, about 1 run in 20), for fp32 the forward's own
/// accumulated error (far above 2^-24: an earlier 6-sigma rounding-only allowance failed fp32 about
/// 1 run in 75). This is the term itself, evaluated with the actual deltas, per head:
/// |first sum| + |second sum|; the max over heads joins dsink's bound.
inline double dsink_propagated_slack(const detail::BwdParams& p, const Mirror& ref_o, const Mirror& ref_l) {
  if (!p.sink || p.dout == nullptr) return 0.0;
  std::vector<double> via_o(size_t(p.num_heads), 0.0), via_lse(size_t(p.num_heads), 0.0);
  for (int32_t b = 0; b < p.batch; ++b) {
    const detail::SeqInfo si = detail::seq_info_host(p, b);
    for (int32_t h = 0; h < p.num_heads; ++h) {
      for (int64_t i = 0; i < si.seqlen_q; ++i) {
        const int64_t row = si.q_row0 + i;
        const int64_t lse_off = (p.is_varlen ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride +
                                row * p.lse_row_stride;
        const double lse = double(p.lse[lse_off]);
        const double p_sink = std::exp(double(p.sink[h]) - lse);
        if (!std::isfinite(p_sink) || !ref_l.written[size_t(lse_off)]) continue;
        const int64_t o = (p.is_varlen ? 0 : b * p.out_stride.batch) + row * p.out_stride.row + h * p.out_stride.head;
        const int64_t g = (p.is_varlen ? 0 : b * p.dout_stride.batch) + row * p.dout_stride.row + h * p.dout_stride.head;
        double d_err = 0.0, d = 0.0;  // dO . delta O, dO . O
        for (int32_t e = 0; e < p.headdim_v; ++e) {
          const double go = double(detail::load_as_float(p.dout, p.dtype, g + e));
          const double ov = double(detail::load_as_float(p.out, p.dtype, o + e));
          d += go * ov;
          d_err += go * (ov - ref_o.v[size_t(o + e)]);
        }
        via_o[size_t(h)] += p_sink * d_err;
        if (std::isfinite(ref_l.v[size_t(lse_off)])) via_lse[size_t(h)] += p_sink * d * (lse - ref_l.v[size_t(lse_off)]);
      }
    }
  }
  double worst = 0.0;
  for (int32_t h = 0; h < p.num_heads; ++h)
    worst = std::max(worst, std::abs(via_o[size_t(h)]) + std::abs(via_lse[size_t(h)]));
  return std::isfinite(worst) ? worst : 0.0;
}

/// A FlashAttention backward reads O as the forward STORED it (D_i = dO_i . O_i), and that O's
/// error (checked on its own) propagates into dq and dk through dS = P (dP - D). The naive
/// baseline derives D from its OWN O, so "2x naive" does not cover this term: on small problems
/// (few terms per gradient) the two independent errors made the rule fail by chance (case C06,
/// fp16: about 1 run in 140). This is the term itself: max |oracle with D from the stored O -
/// oracle| over the elements of `got` vs `exact` (both float64 oracles).
inline double stored_out_slack(const Mirror& got, const Mirror& exact) {
  double r = 0;
  for (size_t i = 0; i < got.v.size(); ++i)
    if (got.written[i] && exact.written[i] && std::isfinite(got.v[i]) && std::isfinite(exact.v[i]))
      r = std::max(r, std::abs(got.v[i] - exact.v[i]));
  return r;
}

/// Query and key rows the call writes, over all sequences, from the shapes and the host-readable
/// cu_seqlens / seqused_k directly (not core/params.h's seq_info_host, which the oracle uses): a
/// query row gets out, lse and dq whether or not it sees a key; a key row inside its sequence
/// (below seqused_k) gets dk and dv, zero where no query sees it.
struct WrittenRows {
  int64_t q = 0, k = 0;
};
inline WrittenRows written_rows(const detail::BwdParams& p) {
  WrittenRows r;
  if (!p.is_varlen) return {int64_t(p.batch) * p.seqlen_q, int64_t(p.batch) * p.seqlen_k};
  for (int32_t b = 0; b < p.batch; ++b) {
    r.q += p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    r.k += p.seqused_k ? p.seqused_k[b] : p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  }
  return r;
}

/// Checks out and lse (and dq, dk, dv, dsink with `backward`) of `tested` against the oracle;
/// `poisoned` holds the outputs as they were before the run (for the untouched check). p: the
/// validated params of the problem (host pointers, inputs only are read); emulation: the exp2 emulation share
/// the tested implementation used; vmax: max|v| over the value tensor.
inline std::vector<Accuracy> check_outputs(const detail::BwdParams& p, const OutputSet& tested,
                                           const OutputSet& poisoned, bool backward, bool sink,
                                           Exp2Emulation emulation, double vmax) {
  const NaiveMirrors ref = run_naive(p, tested, true, backward, emulation);
  const NaiveMirrors nv = run_naive(p, tested, false, backward, emulation);
  const FirstOrderSlack sl = first_order_slack(p.dtype, emulation, vmax, ref.l);
  const DType dt = p.dtype;
  std::vector<Accuracy> acc;
  const WrittenRows rows = written_rows(p);
  // The forward writes nothing when there is no query row; the backward then still zeroes dk / dv
  // (and dsink).
  const int64_t heads = p.num_heads, heads_kv = p.num_heads_kv;
  acc.push_back(check_accuracy("out", *tested.out, *poisoned.out, ref.o, nv.o, dt, sl.out(ref.o),
                               rows.q * heads * p.headdim_v));
  acc.push_back(check_accuracy("lse", *tested.lse, *poisoned.lse, ref.l, nv.l, DType::kFP32, sl.lse(), rows.q * heads));
  if (backward) {
    const NaiveMirrors ref_stored_o = run_naive(p, tested, true, backward, emulation, /*d_from_stored_out=*/true);
    acc.push_back(check_accuracy("dq", *tested.dq, *poisoned.dq, ref.gq, nv.gq, dt,
                                 sl.grad(ref.gq) + stored_out_slack(ref_stored_o.gq, ref.gq), rows.q * heads * p.headdim));
    acc.push_back(check_accuracy("dk", *tested.dk, *poisoned.dk, ref.gk, nv.gk, dt,
                                 sl.grad(ref.gk) + stored_out_slack(ref_stored_o.gk, ref.gk),
                                 rows.k * heads_kv * p.headdim));
    acc.push_back(check_accuracy("dv", *tested.dv, *poisoned.dv, ref.gv, nv.gv, dt, sl.grad(ref.gv),
                                 rows.k * heads_kv * p.headdim_v));
    if (sink)
      acc.push_back(check_accuracy("dsink", *tested.dsink, *poisoned.dsink, ref.gs, nv.gs,
                                   DType::kFP32, sl.grad(ref.gs) + dsink_propagated_slack(p, ref.o, ref.l), heads));
  }
  return acc;
}

}  // namespace fa4::test
