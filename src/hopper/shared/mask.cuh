// src/hopper/shared/mask.cuh — which key blocks a query tile visits, which of them need per-element
// masking, and the per-element mask itself. Semantics come from core/mask.h (the one
// predicate every implementation uses): visible_key_range(i) is exactly the set key_visible(i, .)
// accepts, and it already bounds keys by seqlen_k, so tile-tail keys (TMA zero-filled or another
// sequence's rows) are masked to -inf BEFORE the exponential, never scored as 0.
#pragma once

#include <cstdint>

#include "core/macros.h"
#include "core/mask.h"

namespace fa4::hopper {

/// Key-block range and masking bounds of one query tile [row_lo, row_hi] (real rows only).
struct TileKeyRange {
  int32_t n_block_min = 0;
  int32_t n_block_max = 0;     // exclusive; empty when <= n_block_min
  int32_t full_first = 0;      // blocks inside [full_first, full_last) need no element mask
  int32_t full_last = 0;

  /// Visible keys are monotone in the row (both ends non-decreasing), so the union over the tile
  /// is [first(row_lo), last(row_hi)) and the keys visible to EVERY row are
  /// [first(row_hi), last(row_lo)).
  FA4_HD static TileKeyRange make(int32_t row_lo, int32_t row_hi, int32_t seqlen_q,
                                                      int32_t seqlen_k, detail::MaskSpec m, int32_t block_n) {
    TileKeyRange r;
    const detail::KeyRange lo = detail::visible_key_range(row_lo, seqlen_q, seqlen_k, m);
    const detail::KeyRange hi = detail::visible_key_range(row_hi, seqlen_q, seqlen_k, m);
    const int64_t first = lo.first, last = hi.last;
    if (last <= first) return r;  // no row of the tile sees any key
    r.n_block_min = int32_t(first / block_n);
    r.n_block_max = int32_t((last + block_n - 1) / block_n);
    r.full_first = int32_t(hi.first);
    r.full_last = int32_t(lo.last);
    return r;
  }

  /// True if some element of block n may be invisible to some real row: uniform for the CTA.
  FA4_HD bool needs_mask(int32_t n_block, int32_t block_n) const {
    const int32_t k0 = n_block * block_n;
    return !(k0 >= full_first && k0 + block_n <= full_last);
  }
};

}  // namespace fa4::hopper
