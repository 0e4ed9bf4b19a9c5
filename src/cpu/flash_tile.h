// src/cpu/flash_tile.h — pieces shared by the tiled CPU forward (flash_fwd.cpp) and backward
// (flash_bwd.cpp): tile loads into float32 scratch, the masked/soft-capped score tile, and the
// score units of the log2-domain softmax. Keeping them here means the forward and the backward
// score and mask a tile through the same code (case C07).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu/cpu_attention.h"
#include "cpu/naive_attention.h"
#include "core/constants.h"
#include "core/float16.h"
#include "core/params.h"

namespace fa4::cpu::tile {

using detail::kLog2e;
using detail::kLn2;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tensor addressing: the same helpers the oracle uses.
using naive::lse_offset;
using naive::row_offset;

/// Loads `count` rows (row0, row0+1, ...) of head h, `dim` channels each, as float32 into dst
/// (row-major, leading dimension `dim`). Only rows inside the sequence are ever read: tile padding
/// past seqlen is never touched in memory (case C13).
inline void load_rows(const detail::FwdParams& p, const void* base, const detail::RowStrides& s,
                      int32_t b, int64_t row0, int32_t h, int64_t count, int64_t dim, float* dst) {
  for (int64_t r = 0; r < count; ++r) {
    const int64_t o = row_offset(p, s, b, row0 + r, h);
    for (int64_t e = 0; e < dim; ++e) dst[r * dim + e] = detail::load_as_float(base, p.dtype, o + e);
  }
}
/// Same, transposed: dst[e * ld + r] (ld >= count), so products over the row index vectorise.
inline void load_rows_t(const detail::FwdParams& p, const void* base, const detail::RowStrides& s,
                        int32_t b, int64_t row0, int32_t h, int64_t count, int64_t dim, int64_t ld,
                        float* dst) {
  for (int64_t r = 0; r < count; ++r) {
    const int64_t o = row_offset(p, s, b, row0 + r, h);
    for (int64_t e = 0; e < dim; ++e) dst[e * ld + r] = detail::load_as_float(base, p.dtype, o + e);
  }
}

/// Units of the online softmax. The score tile holds, per visible pair,
///   no softcap:  s = q.k                               (the raw dot product)
///   softcap:     s = softcap * tanh(scale * q.k / softcap)
/// and the log2-domain exponent of a pair is s * mult, with mult = scale*log2(e) resp. log2(e)
/// (the softcapped score already carries the scale). The row max m is kept in the units of s.
inline float score_mult(const detail::FwdParams& p) {
  return p.softcap > 0.0f ? kLog2e : p.softmax_scale_log2;
}

/// s = Q K^T for a rows x cols tile, then the mask and softcap:
///   q   (rows, d) row-major;  kt (d, kCpuTileN) = K tile transposed;
///   s   (rows, kCpuTileN) output; vis (rows, kCpuTileN) key_visible flags;
///   tanh_out (optional, rows x kCpuTileN): tanh values for the softcap chain rule.
/// Masked pairs get s = -inf by SELECTION (never by adding a bias), so a NaN in a masked key's
/// channels cannot leak (case C03a). i0/j0: the tile's first query/key index in the sequence.
inline void score_tile(const detail::FwdParams& p, const detail::SeqInfo& si, int64_t i0,
                       int64_t j0, int64_t rows, int64_t cols, const float* q, const float* kt,
                       float* s, uint8_t* vis, float* tanh_out) {
  constexpr int64_t ld = kCpuTileN;
  const int64_t d = p.headdim;
  const float scale_over_cap = p.softcap > 0.0f ? p.softmax_scale / p.softcap : 0.0f;
  for (int64_t i = 0; i < rows; ++i) {
    float* srow = s + i * ld;
    for (int64_t j = 0; j < cols; ++j) srow[j] = 0.0f;
    for (int64_t e = 0; e < d; ++e) {
      const float qe = q[i * d + e];
      const float* krow = kt + e * ld;
      for (int64_t j = 0; j < cols; ++j) srow[j] += qe * krow[j];
    }
    uint8_t* vrow = vis + i * ld;
    for (int64_t j = 0; j < cols; ++j) {
      const bool visible = detail::key_visible(i0 + i, j0 + j, si.seqlen_q, si.seqlen_k, p.mask);
      vrow[j] = visible;
      if (!visible) {
        srow[j] = kNegInf;
      } else if (p.softcap > 0.0f) {
        const float t = std::tanh(srow[j] * scale_over_cap);
        if (tanh_out) tanh_out[i * ld + j] = t;
        srow[j] = p.softcap * t;
      }
    }
    for (int64_t j = cols; j < ld; ++j) {  // tile padding past seqlen_k: masked, never scored
      vrow[j] = 0;
      srow[j] = kNegInf;
    }
  }
}

/// Half-open key range [first, last) that a query tile [i0, i0 + rows) can see. visible_key_range
/// is monotone in the query index, so the union is spanned by the first and last row's ranges.
inline detail::KeyRange tile_key_range(const detail::FwdParams& p, const detail::SeqInfo& si,
                                       int64_t i0, int64_t rows) {
  const detail::KeyRange a = detail::visible_key_range(i0, si.seqlen_q, si.seqlen_k, p.mask);
  const detail::KeyRange z = detail::visible_key_range(i0 + rows - 1, si.seqlen_q, si.seqlen_k, p.mask);
  return {a.first, z.last > a.first ? z.last : a.first};
}

/// One unit of parallel work: (batch, head, first row of a tile).
struct Work {
  int32_t b;
  int32_t h;
  int64_t row0;
};

/// All (b, h, tile) units in a fixed order (b, then h, then tile); `rows_of(si)` is the sequence
/// length tiled by `tile`, and `heads` the number of heads iterated.
template <class RowsOf>
std::vector<Work> make_work(const detail::FwdParams& p, int32_t heads, int64_t tile, RowsOf rows_of) {
  std::vector<Work> w;
  for (int32_t b = 0; b < p.batch; ++b) {
    const detail::SeqInfo si = detail::seq_info_host(p, b);
    const int64_t n = rows_of(si);
    for (int32_t h = 0; h < heads; ++h)
      for (int64_t r0 = 0; r0 < n; r0 += tile) w.push_back({b, h, r0});
  }
  return w;
}

}  // namespace fa4::cpu::tile
