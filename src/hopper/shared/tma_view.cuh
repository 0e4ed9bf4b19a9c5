// src/hopper/shared/tma_view.cuh — the CuTe strides of the (rows, d, heads, batch) TMA view of a
// caller's tensor, shared by the forward and backward launches (fwd/, bwd/).
#pragma once

#include <algorithm>
#include <cstdint>

#include <cute/tensor.hpp>

#include "core/params.h"

namespace fa4::hopper {

/// TMA ignores the stride of an extent-1 dimension but still requires a positive multiple of 16
/// bytes; user strides of size-1 dims may be anything (case C20). Replace such a stride by the
/// span of the dimensions before it (what a contiguous tensor would have): a valid stride. (The
/// forward's Q descriptor takes these strides in (head, row, batch) order: TMA needs no order.)
inline int64_t tma_stride(int64_t extent, int64_t stride, int64_t span_before) {
  return extent <= 1 ? span_before : stride;
}

/// CuTe strides (row, 1, head, batch) of the TMA view of a tensor with `rows` rows, `heads` heads
/// and `batch` batch entries (1 for varlen, whose batch stride is then unused), its rows
/// kRowSpan elements wide (the padded bucket width, a multiple of 8).
template <int64_t kRowSpan>
inline auto tma_view_stride(const detail::RowStrides& s, int64_t rows, int64_t heads, int64_t batch, bool varlen) {
  const int64_t row = tma_stride(rows, s.row, kRowSpan);
  const int64_t head = tma_stride(heads, s.head, std::max<int64_t>(kRowSpan, rows * row));
  const int64_t bat = tma_stride(batch, varlen ? 0 : s.batch, std::max({kRowSpan, rows * row, heads * head}));
  return cute::make_stride(row, cute::_1{}, head, bat);
}

}  // namespace fa4::hopper
