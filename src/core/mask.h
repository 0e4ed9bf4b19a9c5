// src/core/mask.h — THE visibility predicate. Every implementation (CPU reference, CPU FA4,
// Hopper kernels), forward and backward, decides "does query i see key j" through this one header,
// so a mask can never differ between passes (fused-attention case C07). Ranges both ways: the keys
// a query sees (forward, query-stationary) and the queries that see a key (key-stationary passes).
#pragma once

#include <cstdint>

#include "core/macros.h"

namespace fa4::detail {

/// Windows after validation: causal is folded into right = 0. -1 means unbounded.
struct MaskSpec {
  int32_t window_left = -1;
  int32_t window_right = -1;

  FA4_HD bool is_local() const { return window_left >= 0 || window_right >= 0; }
};

/// Bottom-right alignment: query i of a sequence with seqlen_q queries and seqlen_k keys sits on
/// diagonal key i + seqlen_k - seqlen_q. Keys past seqlen_k (tile padding) are never visible.
FA4_HD bool key_visible(int64_t i, int64_t j, int64_t seqlen_q, int64_t seqlen_k, MaskSpec m) {
  if (j < 0 || j >= seqlen_k) return false;
  const int64_t diag = i + seqlen_k - seqlen_q;
  if (m.window_left >= 0 && j < diag - m.window_left) return false;
  if (m.window_right >= 0 && j > diag + m.window_right) return false;
  return true;
}

/// Half-open key range [first, last) visible to query i (empty when first >= last). Lets tiled
/// implementations skip whole key tiles; it is exactly the set key_visible() accepts.
struct KeyRange {
  int64_t first;
  int64_t last;
};
FA4_HD KeyRange visible_key_range(int64_t i, int64_t seqlen_q, int64_t seqlen_k, MaskSpec m) {
  const int64_t diag = i + seqlen_k - seqlen_q;
  int64_t first = 0, last = seqlen_k;
  if (m.window_left >= 0 && diag - m.window_left > first) first = diag - m.window_left;
  if (m.window_right >= 0 && diag + m.window_right + 1 < last) last = diag + m.window_right + 1;
  if (last < first) last = first;
  return {first, last};
}

/// Half-open query range [first, last) that sees key j (empty when first >= last): the same
/// predicate walked the other way, for passes that own a key block and visit the query blocks that
/// see it (the backward). Exactly the set of i in [0, seqlen_q) with key_visible(i, j).
struct QueryRange {
  int64_t first;
  int64_t last;
};
FA4_HD QueryRange visible_query_range(int64_t j, int64_t seqlen_q, int64_t seqlen_k, MaskSpec m) {
  if (j < 0 || j >= seqlen_k) return {0, 0};
  // key_visible: j >= i + seqlen_k - seqlen_q - left  <=>  i <= j - seqlen_k + seqlen_q + left, and
  //              j <= i + seqlen_k - seqlen_q + right <=>  i >= j - seqlen_k + seqlen_q - right.
  const int64_t diag_q = j - seqlen_k + seqlen_q;  // the query whose diagonal key is j
  int64_t first = 0, last = seqlen_q;
  if (m.window_right >= 0 && diag_q - m.window_right > first) first = diag_q - m.window_right;
  if (m.window_left >= 0 && diag_q + m.window_left + 1 < last) last = diag_q + m.window_left + 1;
  if (last < first) last = first;
  return {first, last};
}

}  // namespace fa4::detail
