// src/cpu/flash_fwd.cpp — the FlashAttention-4 forward algorithm on the CPU: float32 scores and
// P; the row sum l and the output accumulator acc in float32 for bf16/fp16 inputs, float64 for
// fp32 inputs. Why float64 there: acc is a running sum over every visible key whose rounding
// (about sqrt(seqlen_k) ulps) is as large as the plain fp32 attention's whole error, so a float32
// acc sits near the accuracy rule (error <= 2x the plain fp32 attention's) and crosses it on rare
// inputs. For bf16/fp16 inputs the rounding of P and out to 16 bits is 2^16 / 2^13 times larger.
//
// Source: FlashAttention-4 (arXiv 2603.05451) Sec. 3 — online softmax in the log2 domain with
//   * LAZY RESCALING: the running row max m is only raised when a tile's max exceeds it by more than
//     tau = p.rescale_threshold (log2 units). While m is stale, P = 2^((s - m)*mult) may reach
//     2^tau, which fp32 (and bf16/fp16 for tau <= 8) hold exactly enough; the row sum l and the
//     output accumulator use the SAME stale m, so the final out = acc / l is exact. tau = 0 gives
//     the classic always-rescale online softmax. When m is raised, acc and l are multiplied by
//     2^((m_old - m_new) * mult).
//   * SOFTWARE exp2: for key column c of a tile (c relative to the tile start), P uses the FMA
//     polynomial fa4::exp2_emulated when Exp2Emulation::uses_emulation(c), otherwise std::exp2 (the
//     "hardware" unit). The emulation share is p.exp2_emulation if the caller gave a fraction, else
//     default_exp2_emulation(dtype) (none for fp32). Key tiles start at multiples of kCpuTileN, as on the GPU.
//
// Per (batch, head, tile of kCpuTileM queries), key tiles of kCpuTileN:
//   s = q.k (fp32; softcap: s = softcap*tanh(scale q.k / softcap)), masked pairs s = -inf
//   x = (s - m)*mult, mult = scale*log2e (log2e with softcap), P = exp2(x)
//   l += sum_j P, acc += round(P) V   (l and acc: see the top of the file)
// ROUNDING OF P: for bf16/fp16 inputs P is rounded to the input dtype before the P.V product, as
// the GPU does when it feeds P to the tensor cores; the row sum l uses the unrounded fp32 P (as the
// GPU's fp32 row sum does). fp32 inputs keep fp32 P.
// Finalisation (core/softmax.h, shared with the GPU): out = acc / l, lse = (m*mult + log2 l) * ln2
// (natural log), the sink joining the denominator only. A row with no visible key (l == 0): out 0,
// lse -inf (or the sink).
// Key tiles wholly outside the rows' visible_key_range are skipped; within a tile the per-element
// key_visible predicate decides (core/mask.h).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_attention.h"
#include "core/softmax.h"
#include "cpu/flash_tile.h"
#include "core/exp2.h"

namespace fa4::cpu {
namespace {

using tile::kNegInf;

/// Per-thread scratch for one query tile: float32 tiles; the row sum l and the output accumulator
/// in Acc (float64 for fp32 inputs, float32 otherwise: the top of the file says why).
template <class Acc>
struct FwdScratch {
  std::vector<float> q, kt, v, s;
  std::vector<Acc> acc;
  std::vector<float> m;
  std::vector<Acc> l;
  std::vector<uint8_t> vis;
  explicit FwdScratch(const detail::FwdParams& p)
      : q(size_t(kCpuTileM) * p.headdim),
        kt(size_t(p.headdim) * kCpuTileN),
        v(size_t(kCpuTileN) * p.headdim_v),
        s(size_t(kCpuTileM) * kCpuTileN),
        acc(size_t(kCpuTileM) * p.headdim_v),
        m(kCpuTileM),
        l(kCpuTileM),
        vis(size_t(kCpuTileM) * kCpuTileN) {}
};

/// One score tile folded into the running (m, l, acc) of each row.
template <class Acc>
void accumulate_tile(const detail::FwdParams& p, Exp2Emulation emulation, int64_t rows, int64_t cols,
                     FwdScratch<Acc>& t) {
  const int64_t dv = p.headdim_v;
  const float mult = tile::score_mult(p);
  const bool round_p = p.dtype != DType::kFP32;
  for (int64_t i = 0; i < rows; ++i) {
    const float* srow = t.s.data() + i * kCpuTileN;
    const uint8_t* vrow = t.vis.data() + i * kCpuTileN;
    Acc* acc = t.acc.data() + i * dv;
    // Tile max over the visible scores (-inf for masked ones; a NaN is skipped by the comparison
    // here but still reaches P below, so data NaN propagates — case C03b).
    float mt = kNegInf;
    for (int64_t j = 0; j < cols; ++j) mt = srow[j] > mt ? srow[j] : mt;
    float& m = t.m[i];
    // Lazy rescaling: raise m only if the new max exceeds it by more than tau (log2 units).
    if (mt > m && (m == kNegInf || (mt - m) * mult > p.rescale_threshold)) {
      if (m != kNegInf) {
        const float f = detail::merge_weight(m, mt, mult, [](float x) { return std::exp2(x); });
        t.l[i] *= f;
        for (int64_t e = 0; e < dv; ++e) acc[e] *= f;
      }
      m = mt;
    }
    // m still -inf: every visible score so far is NaN or -inf; subtracting 0 keeps NaN as NaN and
    // -inf as P = 0, never inf - inf.
    const float m_sub = m == kNegInf ? 0.0f : m;
    Acc rowsum = 0;
    for (int64_t j = 0; j < cols; ++j) {
      if (!vrow[j]) continue;  // masked: P is exactly 0 and the V row is not read
      // x = (s - m) * mult: the difference first, as merge_weight takes (m_old - m_new) * mult,
      // so every tile's P is against the same exact shift m * mult. (The Hopper kernels use one
      // fma, s * mult - round(m * mult), and move a state by the difference of the two rounded
      // shifts instead: hopper/shared/softmax.cuh, OnlineSoftmax::move_factor.)
      const float x = (srow[j] - m_sub) * mult;
      const float pj = emulation.uses_emulation(int32_t(j)) ? exp2_emulated(x) : std::exp2(x);
      rowsum += pj;
      const float pv = round_p ? detail::round_to(p.dtype, pj) : pj;
      const float* vj = t.v.data() + j * dv;
      for (int64_t e = 0; e < dv; ++e) acc[e] += Acc(pv) * Acc(vj[e]);
    }
    t.l[i] += rowsum;
  }
}

/// Normalises each row and stores out (rounded to the out dtype) and lse.
template <class Acc>
void finalize_tile(const detail::FwdParams& p, const detail::SeqInfo& si, const tile::Work& w,
                   int64_t rows, FwdScratch<Acc>& t) {
  const int64_t dv = p.headdim_v;
  const float mult = tile::score_mult(p);
  const bool has_sink = p.sink != nullptr;
  const float sink = has_sink ? p.sink[w.h] : kNegInf;
  for (int64_t i = 0; i < rows; ++i) {
    const Acc* acc = t.acc.data() + i * dv;
    const Acc l = t.l[i];
    const int64_t row = si.q_row0 + w.row0 + i;
    const int64_t oo = tile::row_offset(p, p.out_stride, w.b, row, w.h);
    const float ml = t.m[i] == kNegInf ? kNegInf : t.m[i] * mult;  // log2 units
    const detail::RowNorm n = detail::finalize_row(ml, float(l), sink);
    for (int64_t e = 0; e < dv; ++e) {
      // No sink: an exact division (l == 0 only with acc == 0, whose row is then 0 as documented).
      const float o = l == 0 ? 0.0f : has_sink ? float(acc[e] * Acc(n.o_scale)) : float(acc[e] / l);
      detail::store_from_float(p.out, p.dtype, oo + e, o);
    }
    p.lse[tile::lse_offset(p, w.b, row, w.h)] = n.lse;
  }
}

template <class Acc>
void forward_tile(const detail::FwdParams& p, Exp2Emulation emulation, const tile::Work& w,
                  FwdScratch<Acc>& t) {
  const detail::SeqInfo si = detail::seq_info_host(p, w.b);
  const int64_t rows = std::min<int64_t>(kCpuTileM, si.seqlen_q - w.row0);
  const int32_t kvh = p.kv_head(w.h);
  const int64_t d = p.headdim, dv = p.headdim_v;
  tile::load_rows(p, p.q, p.q_stride, w.b, si.q_row0 + w.row0, w.h, rows, d, t.q.data());
  std::fill(t.m.begin(), t.m.end(), kNegInf);
  std::fill(t.l.begin(), t.l.end(), Acc(0));
  std::fill(t.acc.begin(), t.acc.end(), Acc(0));

  const detail::KeyRange kr = tile::tile_key_range(p, si, w.row0, rows);
  for (int64_t n0 = kr.first / kCpuTileN * kCpuTileN; n0 < kr.last; n0 += kCpuTileN) {
    const int64_t cols = std::min<int64_t>(kCpuTileN, si.seqlen_k - n0);
    tile::load_rows_t(p, p.k, p.k_stride, w.b, si.k_row0 + n0, kvh, cols, d, kCpuTileN, t.kt.data());
    tile::load_rows(p, p.v, p.v_stride, w.b, si.k_row0 + n0, kvh, cols, dv, t.v.data());
    tile::score_tile(p, si, w.row0, n0, rows, cols, t.q.data(), t.kt.data(), t.s.data(),
                     t.vis.data(), nullptr);
    accumulate_tile(p, emulation, rows, cols, t);
  }
  finalize_tile(p, si, w, rows, t);
}

template <class Acc>
void run_tiles(const detail::FwdParams& p, Exp2Emulation emulation, const std::vector<tile::Work>& work) {
#pragma omp parallel
  {
    FwdScratch<Acc> t(p);
#pragma omp for schedule(dynamic)
    for (size_t wi = 0; wi < work.size(); ++wi) forward_tile(p, emulation, work[wi], t);
  }
}

}  // namespace

void flash_forward(const detail::FwdParams& p) {
  if (p.batch == 0 || p.total_q == 0 || p.num_heads == 0) return;
  const Exp2Emulation emulation = p.exp2_fraction_given ? p.exp2_emulation : default_exp2_emulation(p.dtype);
  const std::vector<tile::Work> work =
      tile::make_work(p, p.num_heads, kCpuTileM, [](const detail::SeqInfo& si) { return si.seqlen_q; });
  if (p.dtype == DType::kFP32)
    run_tiles<double>(p, emulation, work);
  else
    run_tiles<float>(p, emulation, work);
}

}  // namespace fa4::cpu
