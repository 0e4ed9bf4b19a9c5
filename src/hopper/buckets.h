// src/hopper/buckets.h — THE list of Hopper head-dim buckets (headdim, headdim_v). Read by
//   * CMake (src/hopper/hopper.cmake): FA4_HOPPER_HEADDIMS, the instantiation files and the
//     FA4_HOPPER_HAS_<d>_<dv> definitions of the compiled subset;
//   * scripts/generate_kernels.py: one instantiation file per (direction, dtype, bucket);
//   * the selector and dispatcher (src/hopper/hopper_api.cu);
//   * the tuning table (src/hopper/fwd/tuning_fwd.h), which must have exactly one row per bucket
//     (checked at compile time).
// One line per bucket, in the form the two parsers expect: "  X(<headdim>, <headdim_v>)".
#pragma once

#include <cstddef>
#include <cstdint>

namespace fa4::detail {

/// The row of a tuning table (rows with headdim / headdim_v members) for exactly the bucket
/// (headdim, headdim_v); nullptr if the table has none.
template <class Row, size_t N>
constexpr const Row* find_bucket_row(const Row (&table)[N], int32_t headdim, int32_t headdim_v) {
  for (size_t i = 0; i < N; ++i)
    if (table[i].headdim == headdim && table[i].headdim_v == headdim_v) return &table[i];
  return nullptr;
}

/// The row an input (d, dv) runs on: the smallest with headdim >= d and headdim_v >= dv (smaller
/// headdim first, then smaller headdim_v); nullptr if none fits.
template <class Row, size_t N>
constexpr const Row* smallest_fitting_row(const Row (&table)[N], int32_t d, int32_t dv) {
  const Row* best = nullptr;
  for (size_t i = 0; i < N; ++i) {
    const Row& c = table[i];
    if (c.headdim < d || c.headdim_v < dv) continue;
    if (!best || c.headdim < best->headdim || (c.headdim == best->headdim && c.headdim_v < best->headdim_v))
      best = &c;
  }
  return best;
}

}  // namespace fa4::detail

#define FA4_HOPPER_BUCKETS(X) \
  X(64, 64)                   \
  X(96, 96)                   \
  X(128, 128)                 \
  X(192, 128)                 \
  X(192, 192)                 \
  X(256, 256)
