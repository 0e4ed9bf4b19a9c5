// src/cpu/flash_bwd.cpp — FlashAttention-style tiled backward on the CPU, float32 throughout.
//
// Source: FlashAttention-2 backward (Dao 2023, Alg. 2) as used by FA3/FA4 (arXiv 2603.05451):
//   preprocess   D_i = rowsum(dO_i * O_i)          (O = the forward's out, as given)
//   recompute    P_ij = exp2(s_ij*mult - lse_i*log2e)  through the SAME score/mask code as the
//                forward (flash_tile.h; case C07). P <= 1 must hold; a larger P means lse does not
//                belong to these inputs/mask and is reported as fa4::Error (kInternal).
//   dV_j += P_ij dO_i;   dP_ij = dO_i . V_j;   dS_ij = P_ij (dP_ij - D_i) [* (1 - tanh^2), softcap]
//   dQ_i += scale dS_ij K_j;   dK_j += scale dS_ij Q_i
//   dsink_h = -sum_i exp(sink_h - lse_i) D_i  (derivation in naive_attention.h)
// Unlike the forward, P and dS are NOT rounded to the input dtype: every product is fp32.
//
// Threading, deterministic by construction (no atomics, every sum in a fixed order), so
// p.deterministic needs no special path:
//   pass 1: parallel over (batch, kv head, key tile): dK/dV of that tile, summed over the query
//           heads of the kv head and the query tiles in ascending order;
//   pass 2: parallel over (batch, head, query tile): dQ of that tile, plus the tile's dsink
//           partial; the partials are reduced afterwards in work order.
// Rows with lse = -inf (no visible key) get P = 0, hence zero gradients.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

#include "cpu/cpu_attention.h"
#include "cpu/flash_tile.h"
#include "fa4/error.h"

namespace fa4::cpu {
namespace {

using tile::kNegInf;

/// Recomputed P may exceed 1 only by rounding: the exp2 polynomial's error (of order 1e-4) and the
/// fp32 lse's own (half an ulp of lse, a relative 2^-24 of it in the exponent, with the score's
/// and the scale's roundings a few ulps: huge for logits of 1e5 and more). So a row's P, divided
/// by its allowance 2^(|lse_log2| kLseRelativeRounding), may exceed 1 by this slack; anything
/// beyond means a mask or input mismatch.
constexpr float kMaxRecomputedP = 1.01f;
constexpr float kLseRelativeRounding = 0x1p-21f;

/// Per-row data of the backward: lse in log2 units and D, laid out [head][packed row].
struct RowStats {
  int64_t rows_total = 0;             // batched: batch * seqlen_q; varlen: total_q
  std::vector<float> lse_log2, D;

  int64_t index(const detail::FwdParams& p, int32_t b, int64_t i_in_seq, const detail::SeqInfo& si,
                int32_t h) const {
    const int64_t r = p.is_varlen ? si.q_row0 + i_in_seq : int64_t(b) * p.seqlen_q + i_in_seq;
    return int64_t(h) * rows_total + r;
  }
};

/// Per-thread scratch.
struct BwdScratch {
  std::vector<float> q, dout, k, kt, vt, s, tanh_s, P, dS, lse_log2, D, acc_a, acc_b;
  std::vector<uint8_t> vis;
  explicit BwdScratch(const detail::FwdParams& p)
      : q(size_t(kCpuTileM) * p.headdim),
        dout(size_t(kCpuTileM) * p.headdim_v),
        k(size_t(kCpuTileN) * p.headdim),
        kt(size_t(p.headdim) * kCpuTileN),
        vt(size_t(p.headdim_v) * kCpuTileN),
        s(size_t(kCpuTileM) * kCpuTileN),
        tanh_s(size_t(kCpuTileM) * kCpuTileN),
        P(size_t(kCpuTileM) * kCpuTileN),
        dS(size_t(kCpuTileM) * kCpuTileN),
        lse_log2(kCpuTileM),
        D(kCpuTileM),
        acc_a(size_t(std::max(kCpuTileM, kCpuTileN)) * std::max(p.headdim, p.headdim_v)),
        acc_b(size_t(kCpuTileN) * p.headdim_v),
        vis(size_t(kCpuTileM) * kCpuTileN) {}
};

void compute_row_stats(const detail::BwdParams& p, RowStats& st) {
  st.rows_total = p.is_varlen ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  st.lse_log2.assign(size_t(p.num_heads) * st.rows_total, 0.0f);
  st.D.assign(size_t(p.num_heads) * st.rows_total, 0.0f);
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < int64_t(p.batch) * p.num_heads; ++bh) {
    const int32_t b = int32_t(bh / p.num_heads), h = int32_t(bh % p.num_heads);
    const detail::SeqInfo si = detail::seq_info_host(p, b);
    for (int64_t i = 0; i < si.seqlen_q; ++i) {
      const int64_t row = si.q_row0 + i;
      const int64_t oo = tile::row_offset(p, p.out_stride, b, row, h);
      const int64_t go = tile::row_offset(p, p.dout_stride, b, row, h);
      float D = 0.0f;
      for (int64_t e = 0; e < p.headdim_v; ++e)
        D += detail::load_as_float(p.dout, p.dtype, go + e) * detail::load_as_float(p.out, p.dtype, oo + e);
      const float lse = p.lse[tile::lse_offset(p, b, row, h)];
      const int64_t idx = st.index(p, b, i, si, h);
      st.D[idx] = D;
      // lse = -inf marks a row with no visible key: +inf makes every recomputed P exactly 0.
      // (In double: one rounding, where lse * kLog2e adds kLog2e's, 2^-25 of a large lse.)
      st.lse_log2[idx] = lse == kNegInf ? std::numeric_limits<float>::infinity()
                                        : float(double(lse) * detail::kLog2eF64);
    }
  }
}

/// Loads the per-row tile inputs shared by both passes: Q, dO, lse_log2, D of rows [i0, i0+rows).
void load_query_tile(const detail::BwdParams& p, const RowStats& st, const detail::SeqInfo& si,
                     int32_t b, int32_t h, int64_t i0, int64_t rows, BwdScratch& t) {
  tile::load_rows(p, p.q, p.q_stride, b, si.q_row0 + i0, h, rows, p.headdim, t.q.data());
  tile::load_rows(p, p.dout, p.dout_stride, b, si.q_row0 + i0, h, rows, p.headdim_v, t.dout.data());
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t idx = st.index(p, b, i0 + i, si, h);
    t.lse_log2[i] = st.lse_log2[idx];
    t.D[i] = st.D[idx];
  }
}

/// Given the score tile in t.s/t.vis (and t.tanh_s), the Q/dO/lse/D rows and V^T in t.vt, computes
/// P and dS for the tile. Returns the largest recomputed P (for the P <= 1 check).
float probs_and_ds(const detail::BwdParams& p, int64_t rows, int64_t cols, BwdScratch& t) {
  constexpr int64_t ld = kCpuTileN;
  const float mult = tile::score_mult(p);
  const int64_t dv = p.headdim_v;
  float p_max = 0.0f;
  for (int64_t i = 0; i < rows; ++i) {
    const float* srow = t.s.data() + i * ld;
    const uint8_t* vrow = t.vis.data() + i * ld;
    float* prow = t.P.data() + i * ld;
    float* dsrow = t.dS.data() + i * ld;
    float row_max = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      prow[j] = vrow[j] ? std::exp2(std::fma(srow[j], mult, -t.lse_log2[i])) : 0.0f;
      row_max = prow[j] > row_max ? prow[j] : row_max;
    }
    // (A row without keys has lse_log2 = +inf: P = 0 and the allowance inf.)
    p_max = std::max(p_max, row_max / std::exp2(std::fabs(t.lse_log2[i]) * kLseRelativeRounding));
    // dP = dO V^T, vectorised over the key index.
    for (int64_t j = 0; j < cols; ++j) dsrow[j] = 0.0f;
    for (int64_t e = 0; e < dv; ++e) {
      const float g = t.dout[i * dv + e];
      const float* vrow_t = t.vt.data() + e * ld;
      for (int64_t j = 0; j < cols; ++j) dsrow[j] += g * vrow_t[j];
    }
    for (int64_t j = 0; j < cols; ++j) {
      if (!vrow[j]) {
        dsrow[j] = 0.0f;
        continue;
      }
      float ds = prow[j] * (dsrow[j] - t.D[i]);
      if (p.softcap > 0.0f) {
        const float th = t.tanh_s[i * ld + j];
        ds *= 1.0f - th * th;
      }
      dsrow[j] = ds;
    }
  }
  return p_max;
}

/// Pass 1: dK/dV of one key tile of one (batch, kv head).
float dkdv_tile(const detail::BwdParams& p, const RowStats& st, const tile::Work& w, BwdScratch& t) {
  constexpr int64_t ld = kCpuTileN;
  const detail::SeqInfo si = detail::seq_info_host(p, w.b);
  const int64_t n0 = w.row0, cols = std::min<int64_t>(kCpuTileN, si.seqlen_k - n0);
  const int64_t d = p.headdim, dv = p.headdim_v;
  const int32_t kvh = w.h, group = p.num_heads / p.num_heads_kv;
  tile::load_rows_t(p, p.k, p.k_stride, w.b, si.k_row0 + n0, kvh, cols, d, ld, t.kt.data());
  tile::load_rows_t(p, p.v, p.v_stride, w.b, si.k_row0 + n0, kvh, cols, dv, ld, t.vt.data());
  float* dk = t.acc_a.data();  // (cols, d)
  float* dvv = t.acc_b.data(); // (cols, dv)
  std::fill(dk, dk + cols * d, 0.0f);
  std::fill(dvv, dvv + cols * dv, 0.0f);
  float p_max = 0.0f;
  for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < si.seqlen_q; i0 += kCpuTileM) {
      const int64_t rows = std::min<int64_t>(kCpuTileM, si.seqlen_q - i0);
      const detail::KeyRange kr = tile::tile_key_range(p, si, i0, rows);
      if (kr.last <= n0 || kr.first >= n0 + cols) continue;  // no pair of this block is visible
      load_query_tile(p, st, si, w.b, h, i0, rows, t);
      tile::score_tile(p, si, i0, n0, rows, cols, t.q.data(), t.kt.data(), t.s.data(),
                       t.vis.data(), t.tanh_s.data());
      p_max = std::max(p_max, probs_and_ds(p, rows, cols, t));
      for (int64_t i = 0; i < rows; ++i) {
        const float* prow = t.P.data() + i * ld;
        const float* dsrow = t.dS.data() + i * ld;
        const uint8_t* vrow = t.vis.data() + i * ld;
        const float* g = t.dout.data() + i * dv;
        const float* qi = t.q.data() + i * d;
        for (int64_t j = 0; j < cols; ++j) {
          if (!vrow[j]) continue;  // masked pairs add nothing, not even 0 * NaN
          const float pij = prow[j], dsij = dsrow[j];
          for (int64_t e = 0; e < dv; ++e) dvv[j * dv + e] += pij * g[e];
          for (int64_t e = 0; e < d; ++e) dk[j * d + e] += dsij * qi[e];
        }
      }
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t ko = tile::row_offset(p, p.dk_stride, w.b, si.k_row0 + n0 + j, kvh);
    const int64_t vo = tile::row_offset(p, p.dv_stride, w.b, si.k_row0 + n0 + j, kvh);
    for (int64_t e = 0; e < d; ++e)
      detail::store_from_float(p.dk, p.dtype, ko + e, dk[j * d + e] * p.softmax_scale);
    for (int64_t e = 0; e < dv; ++e) detail::store_from_float(p.dv, p.dtype, vo + e, dvv[j * dv + e]);
  }
  return p_max;
}

/// Pass 2: dQ of one query tile of one (batch, head); returns its P max, and its dsink partial
/// sum_i exp(sink - lse_i) D_i in *dsink_part.
float dq_tile(const detail::BwdParams& p, const RowStats& st, const tile::Work& w, BwdScratch& t,
              float* dsink_part) {
  constexpr int64_t ld = kCpuTileN;
  const detail::SeqInfo si = detail::seq_info_host(p, w.b);
  const int64_t i0 = w.row0, rows = std::min<int64_t>(kCpuTileM, si.seqlen_q - i0);
  const int64_t d = p.headdim, dv = p.headdim_v;
  const int32_t kvh = p.kv_head(w.h);
  load_query_tile(p, st, si, w.b, w.h, i0, rows, t);
  float* dq = t.acc_a.data();  // (rows, d)
  std::fill(dq, dq + rows * d, 0.0f);
  float p_max = 0.0f;
  const detail::KeyRange kr = tile::tile_key_range(p, si, i0, rows);
  for (int64_t n0 = kr.first / kCpuTileN * kCpuTileN; n0 < kr.last; n0 += kCpuTileN) {
    const int64_t cols = std::min<int64_t>(kCpuTileN, si.seqlen_k - n0);
    tile::load_rows(p, p.k, p.k_stride, w.b, si.k_row0 + n0, kvh, cols, d, t.k.data());
    tile::load_rows_t(p, p.k, p.k_stride, w.b, si.k_row0 + n0, kvh, cols, d, ld, t.kt.data());
    tile::load_rows_t(p, p.v, p.v_stride, w.b, si.k_row0 + n0, kvh, cols, dv, ld, t.vt.data());
    tile::score_tile(p, si, i0, n0, rows, cols, t.q.data(), t.kt.data(), t.s.data(), t.vis.data(),
                     t.tanh_s.data());
    p_max = std::max(p_max, probs_and_ds(p, rows, cols, t));
    for (int64_t i = 0; i < rows; ++i) {
      const float* dsrow = t.dS.data() + i * ld;
      const uint8_t* vrow = t.vis.data() + i * ld;
      float* dqi = dq + i * d;
      for (int64_t j = 0; j < cols; ++j) {
        if (!vrow[j]) continue;
        const float dsij = dsrow[j];
        const float* kj = t.k.data() + j * d;
        for (int64_t e = 0; e < d; ++e) dqi[e] += dsij * kj[e];
      }
    }
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t qo = tile::row_offset(p, p.dq_stride, w.b, si.q_row0 + i0 + i, w.h);
    for (int64_t e = 0; e < d; ++e)
      detail::store_from_float(p.dq, p.dtype, qo + e, dq[i * d + e] * p.softmax_scale);
  }
  float part = 0.0f;
  if (p.sink) {
    const float sink_log2 = p.sink[w.h] * tile::kLog2e;
    for (int64_t i = 0; i < rows; ++i) part += std::exp2(sink_log2 - t.lse_log2[i]) * t.D[i];
  }
  *dsink_part = part;
  return p_max;
}

[[noreturn]] void throw_p_exceeds_one(float p_max) {
  std::ostringstream s;
  s << "fa4::backward (cpu): recomputed P = exp(s - lse) reaches " << p_max << " times the "
    << "rounding allowance of its row's fp32 lse (> 1): lse does not belong to these q/k and "
    << "options (mask or inputs differ from the forward's)";
  throw Error(ErrorCode::kInternal, s.str());
}

}  // namespace

void flash_backward(const detail::BwdParams& p) {
  // total_q == 0 still runs pass 1: with no queries dK/dV are exactly 0 and are written.
  if (p.batch == 0 || p.num_heads == 0) return;
  RowStats st;
  compute_row_stats(p, st);

  // Pass 1: dK, dV.
  const std::vector<tile::Work> kv_work =
      tile::make_work(p, p.num_heads_kv, kCpuTileN, [](const detail::SeqInfo& si) { return si.seqlen_k; });
  // Pass 2: dQ (+ dsink partials).
  const std::vector<tile::Work> q_work =
      tile::make_work(p, p.num_heads, kCpuTileM, [](const detail::SeqInfo& si) { return si.seqlen_q; });
  std::vector<float> dsink_part(q_work.size(), 0.0f);
  float p_max = 0.0f;
#pragma omp parallel reduction(max : p_max)
  {
    BwdScratch t(p);
#pragma omp for schedule(dynamic)
    for (size_t wi = 0; wi < kv_work.size(); ++wi) p_max = std::max(p_max, dkdv_tile(p, st, kv_work[wi], t));
#pragma omp for schedule(dynamic)
    for (size_t wi = 0; wi < q_work.size(); ++wi)
      p_max = std::max(p_max, dq_tile(p, st, q_work[wi], t, &dsink_part[wi]));
  }
  if (p.sink && p.dsink) {
    std::vector<float> dsink(p.num_heads, 0.0f);
    for (size_t wi = 0; wi < q_work.size(); ++wi) dsink[q_work[wi].h] -= dsink_part[wi];  // fixed order
    std::copy(dsink.begin(), dsink.end(), p.dsink);
  }
  if (p_max > kMaxRecomputedP) throw_p_exceeds_one(p_max);
}

}  // namespace fa4::cpu
