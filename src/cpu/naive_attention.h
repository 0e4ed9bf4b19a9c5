// src/cpu/naive_attention.h — the naive attention maths, forward and backward, written ONCE and
// instantiated twice:
//   * Real = double, Round = identity: the float64 oracle (reference_forward / reference_backward
//     in reference.cpp, and the tests' "ref64");
//   * Real = float,  Round = round to the input dtype: the "plain same-precision implementation"
//     the tests' tolerance rule is measured against (max|out - ref64| <= 2 x max|naive - ref64| +
//     atol). It models an eager framework: fp32-accumulated matmuls whose results, and every other
//     intermediate (S, P, O, dP, dS, D), are rounded to the input dtype.
// Sharing the code guarantees both see exactly the same options (masks, varlen, GQA, softcap, sink).
//
// Per (batch, kv head) the keys/values are loaded once; per query row the whole score row S and
// probability row P are materialised (no tiling, no online softmax).
//
// Results go to a Writer W with  out(off, x), lse(off, x), dq(off, x), dk(off, x), dv(off, x),
// dsink(h, x): `off` is the element offset of the documented layout (params strides), so a writer
// can store into the real tensors or into a float64 mirror of them. Only elements that belong to a
// sequence are passed to the writer: everything else is left untouched (case C12).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/constants.h"
#include "core/float16.h"
#include "core/params.h"
#include "core/exp2.h"

namespace fa4::cpu::naive {

/// Element offset of (row `row` of sequence b, head h) in a (batch, row, head, dim) tensor.
inline int64_t row_offset(const detail::FwdParams& p, const detail::RowStrides& s, int32_t b,
                          int64_t row, int32_t h) {
  return (p.is_varlen ? 0 : int64_t(b) * s.batch) + row * s.row + int64_t(h) * s.head;
}
/// Element offset of lse(b, h, row) (row = packed row for varlen).
inline int64_t lse_offset(const detail::FwdParams& p, int32_t b, int64_t row, int32_t h) {
  return (p.is_varlen ? 0 : int64_t(b) * p.lse_batch_stride) + int64_t(h) * p.lse_head_stride +
         row * p.lse_row_stride;
}

/// Precision policies: operator() rounds an intermediate, exp() is the exponential used for P.
struct NoRounding {
  double operator()(double x) const { return x; }
  double exp(double x) const { return std::exp(x); }
};
struct RoundToDtype {
  DType dtype;
  /// true: every P uses the FMA-pipe polynomial (fa4::exp2_emulated), the worst case of an FA4
  /// exp2 emulation share — the fair same-precision baseline for fp32 inputs, whose rounding is far below
  /// the polynomial's error.
  bool emulated_exp = false;
  float operator()(float x) const { return detail::round_to(dtype, x); }
  float exp(float x) const {
    return emulated_exp ? exp2_emulated(x * detail::kLog2e) : std::exp(x);
  }
};

/// Keys and values of one (batch, kv head), converted once to Real, row-major.
template <class Real>
struct KvBlock {
  std::vector<Real> k, v;  // (seqlen_k, headdim), (seqlen_k, headdim_v)
  void load(const detail::FwdParams& p, const detail::SeqInfo& si, int32_t b, int32_t kvh) {
    const int64_t d = p.headdim, dv = p.headdim_v;
    k.assign(size_t(si.seqlen_k) * d, Real(0));
    v.assign(size_t(si.seqlen_k) * dv, Real(0));
    for (int64_t j = 0; j < si.seqlen_k; ++j) {
      const int64_t ko = row_offset(p, p.k_stride, b, si.k_row0 + j, kvh);
      const int64_t vo = row_offset(p, p.v_stride, b, si.k_row0 + j, kvh);
      for (int64_t e = 0; e < d; ++e) k[j * d + e] = Real(detail::load_as_float(p.k, p.dtype, ko + e));
      for (int64_t e = 0; e < dv; ++e) v[j * dv + e] = Real(detail::load_as_float(p.v, p.dtype, vo + e));
    }
  }
};

/// Softmax of one query row, with everything the backward needs.
template <class Real>
struct Row {
  std::vector<Real> q;        // (headdim)
  std::vector<Real> tanh_s;   // softcap: tanh(scale*qk/softcap) per key (chain rule)
  std::vector<Real> P;        // (seqlen_k), 0 where masked
  std::vector<uint8_t> vis;   // key_visible per key
  std::vector<Real> o;        // (headdim_v)
  Real lse = 0;
  Real p_sink = 0;            // exp(sink - lse): the sink's share of the denominator
};

/// Computes S, P, lse and O of query i (0-based within its sequence) of head h.
template <class Real, class Round>
void row_forward(const detail::FwdParams& p, const detail::SeqInfo& si, int32_t b, int32_t h,
                 int64_t i, const KvBlock<Real>& kv, const Round& rnd, Row<Real>& r) {
  constexpr Real kInf = std::numeric_limits<Real>::infinity();
  const int64_t d = p.headdim, dv = p.headdim_v, sk = si.seqlen_k;
  const int64_t qo = row_offset(p, p.q_stride, b, si.q_row0 + i, h);
  r.q.resize(d);
  for (int64_t e = 0; e < d; ++e) r.q[e] = Real(detail::load_as_float(p.q, p.dtype, qo + e));
  r.tanh_s.assign(sk, Real(0));
  r.P.assign(sk, Real(0));
  r.vis.assign(sk, 0);
  r.o.assign(dv, Real(0));

  const bool has_sink = p.sink != nullptr;
  const Real sink = has_sink ? Real(p.sink[h]) : -kInf;
  const Real scale = Real(p.softmax_scale), softcap = Real(p.softcap);
  std::vector<Real>& s = r.P;  // scores first, probabilities after
  Real m = -kInf;
  bool any_visible = false, any_nan = false;
  for (int64_t j = 0; j < sk; ++j) {
    // Masked pairs are never scored: their logit is -inf by selection, so NaN/garbage there
    // cannot leak (case C03a).
    if (!detail::key_visible(i, j, si.seqlen_q, sk, p.mask)) continue;
    r.vis[j] = 1;
    any_visible = true;
    Real dot = 0;
    for (int64_t e = 0; e < d; ++e) dot += r.q[e] * kv.k[j * d + e];
    Real x = rnd(rnd(dot) * scale);
    if (softcap > 0) {
      r.tanh_s[j] = rnd(std::tanh(x / softcap));
      x = rnd(softcap * r.tanh_s[j]);
    }
    s[j] = x;
    if (std::isnan(x)) any_nan = true;
    else if (x > m) m = x;
  }
  if (!any_visible) {  // documented edge: out 0, lse -inf (or sink), P 0
    r.lse = sink;
    r.p_sink = has_sink ? Real(1) : Real(0);
    return;
  }
  if (has_sink && sink > m) m = sink;
  if (any_nan) m = std::numeric_limits<Real>::quiet_NaN();  // data NaN propagates (case C03b)
  Real sum = has_sink ? rnd.exp(sink - m) : Real(0);
  for (int64_t j = 0; j < sk; ++j)
    if (r.vis[j]) sum += rnd.exp(s[j] - m);
  r.lse = m + std::log(sum);
  r.p_sink = has_sink ? rnd.exp(sink - m) / sum : Real(0);
  for (int64_t j = 0; j < sk; ++j) s[j] = r.vis[j] ? rnd(rnd.exp(s[j] - m) / sum) : Real(0);
  for (int64_t j = 0; j < sk; ++j) {
    if (!r.vis[j]) continue;  // a masked key's value row is never read either
    for (int64_t e = 0; e < dv; ++e) r.o[e] += s[j] * kv.v[j * dv + e];
  }
  for (int64_t e = 0; e < dv; ++e) r.o[e] = rnd(r.o[e]);
}

/// (batch, kv head) pairs, the unit of parallel work (outputs of different pairs are disjoint).
inline int64_t num_pairs(const detail::FwdParams& p) { return int64_t(p.batch) * p.num_heads_kv; }

template <class Real, class Round, class W>
void forward(const detail::FwdParams& p, const Round& rnd, W& w) {
  if (p.batch == 0 || p.total_q == 0 || p.num_heads == 0) return;
  const int32_t group = p.num_heads / p.num_heads_kv;
#pragma omp parallel for schedule(dynamic)
  for (int64_t pair = 0; pair < num_pairs(p); ++pair) {
    const int32_t b = int32_t(pair / p.num_heads_kv), kvh = int32_t(pair % p.num_heads_kv);
    const detail::SeqInfo si = detail::seq_info_host(p, b);
    if (si.seqlen_q == 0) continue;
    KvBlock<Real> kv;
    kv.load(p, si, b, kvh);
    Row<Real> r;
    for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int64_t i = 0; i < si.seqlen_q; ++i) {
        row_forward(p, si, b, h, i, kv, rnd, r);
        const int64_t oo = row_offset(p, p.out_stride, b, si.q_row0 + i, h);
        for (int64_t e = 0; e < p.headdim_v; ++e) w.out(oo + e, r.o[e]);
        w.lse(lse_offset(p, b, si.q_row0 + i, h), r.lse);
      }
    }
  }
}

/// Backward maths (derivation, per query row i with P_ij = exp(s_ij - lse_i), O_i = sum_j P_ij v_j):
///   dv_j   += P_ij dO_i
///   dP_ij   = dO_i . v_j
///   D_i     = sum_j P_ij dP_ij = dO_i . O_i                       (sink has no value row)
///   dS_ij   = P_ij (dP_ij - D_i)                                  (softmax Jacobian)
///   softcap: s = c tanh(x / c), x = scale q.k  =>  dS_ij *= (1 - tanh^2)
///   dq_i    = scale sum_j dS_ij k_j,   dk_j += scale dS_ij q_i
///   dsink_h = sum_i dP_i,sink ... : the sink is a logit with a zero value row, so its "dP" is 0 and
///             its dS is P_i,sink (0 - D_i):  dsink_h = -sum_i P_i,sink D_i,
///             P_i,sink = exp(sink_h - lse_i)   (sum over every query row of head h, all batches).
/// The oracle recomputes O and lse itself (p.out / p.lse are not read), so it is the exact
/// gradient of the exact forward. d_from_stored_out = true takes D_i = dO_i . O_i from the STORED
/// out (p.out) instead, as a FlashAttention backward does: the tests use that variant to measure how
/// the stored O's own error propagates into dq, dk and dsink (tests/accuracy_check.h).
template <class Real, class Round, class W>
void backward(const detail::BwdParams& p, const Round& rnd, W& w, bool d_from_stored_out = false) {
  // total_q == 0 still runs: with no queries dK/dV (and dsink) are exactly 0 and are written.
  if (p.batch == 0 || p.num_heads == 0) {
    if (p.dsink)  // no sequence: the sink's gradient is exactly 0 (fa4::backward writes it)
      for (int32_t h = 0; h < p.num_heads; ++h) w.dsink(h, Real(0));
    return;
  }
  const int32_t group = p.num_heads / p.num_heads_kv;
  const int64_t d = p.headdim, dv = p.headdim_v;
  // dsink partials per (batch, head), reduced in a fixed order afterwards (deterministic).
  std::vector<Real> dsink_part(size_t(p.batch) * p.num_heads, Real(0));
#pragma omp parallel for schedule(dynamic)
  for (int64_t pair = 0; pair < num_pairs(p); ++pair) {
    const int32_t b = int32_t(pair / p.num_heads_kv), kvh = int32_t(pair % p.num_heads_kv);
    const detail::SeqInfo si = detail::seq_info_host(p, b);
    const int64_t sk = si.seqlen_k;
    KvBlock<Real> kv;
    kv.load(p, si, b, kvh);
    std::vector<Real> dk(size_t(sk) * d, Real(0)), dvv(size_t(sk) * dv, Real(0));
    std::vector<Real> dout(dv), dq(d);
    Row<Real> r;
    for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
      for (int64_t i = 0; i < si.seqlen_q; ++i) {
        row_forward(p, si, b, h, i, kv, rnd, r);
        const int64_t go = row_offset(p, p.dout_stride, b, si.q_row0 + i, h);
        for (int64_t e = 0; e < dv; ++e) dout[e] = Real(detail::load_as_float(p.dout, p.dtype, go + e));
        Real D = 0;
        if (d_from_stored_out) {
          const int64_t oo = row_offset(p, p.out_stride, b, si.q_row0 + i, h);
          for (int64_t e = 0; e < dv; ++e) D += dout[e] * Real(detail::load_as_float(p.out, p.dtype, oo + e));
        } else {
          for (int64_t e = 0; e < dv; ++e) D += dout[e] * r.o[e];
        }
        D = rnd(D);
        std::fill(dq.begin(), dq.end(), Real(0));
        for (int64_t j = 0; j < sk; ++j) {
          if (!r.vis[j]) continue;  // masked pairs contribute nothing, not even 0 * NaN
          Real dp = 0;
          for (int64_t e = 0; e < dv; ++e) dp += dout[e] * kv.v[j * dv + e];
          Real ds = rnd(r.P[j] * (rnd(dp) - D));
          if (p.softcap > 0) ds = rnd(ds * (Real(1) - r.tanh_s[j] * r.tanh_s[j]));
          for (int64_t e = 0; e < d; ++e) dq[e] += ds * kv.k[j * d + e];
          for (int64_t e = 0; e < d; ++e) dk[j * d + e] += ds * r.q[e];
          for (int64_t e = 0; e < dv; ++e) dvv[j * dv + e] += r.P[j] * dout[e];
        }
        const int64_t qo = row_offset(p, p.dq_stride, b, si.q_row0 + i, h);
        for (int64_t e = 0; e < d; ++e) w.dq(qo + e, rnd(dq[e] * Real(p.softmax_scale)));
        if (p.sink) dsink_part[size_t(b) * p.num_heads + h] -= r.p_sink * D;
      }
    }
    for (int64_t j = 0; j < sk; ++j) {
      const int64_t ko = row_offset(p, p.dk_stride, b, si.k_row0 + j, kvh);
      const int64_t vo = row_offset(p, p.dv_stride, b, si.k_row0 + j, kvh);
      for (int64_t e = 0; e < d; ++e) w.dk(ko + e, rnd(dk[j * d + e] * Real(p.softmax_scale)));
      for (int64_t e = 0; e < dv; ++e) w.dv(vo + e, rnd(dvv[j * dv + e]));
    }
  }
  if (p.sink) {
    for (int32_t h = 0; h < p.num_heads; ++h) {
      Real acc = 0;
      for (int32_t b = 0; b < p.batch; ++b) acc += dsink_part[size_t(b) * p.num_heads + h];
      w.dsink(h, acc);
    }
  }
}

}  // namespace fa4::cpu::naive
