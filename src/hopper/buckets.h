// src/hopper/buckets.h — THE list of Hopper head-dim buckets (headdim, headdim_v). Read by
//   * CMake (src/hopper/hopper.cmake): FA4_HOPPER_HEADDIMS, the instantiation files and the
//     FA4_HOPPER_HAS_<d>_<dv> definitions of the compiled subset;
//   * scripts/generate_kernels.py: one instantiation file per (direction, dtype, bucket);
//   * the selector and dispatcher (src/hopper/hopper_api.cu);
//   * the tuning table (src/hopper/fwd/tuning_fwd.h), which must have exactly one row per bucket
//     (checked at compile time).
// One line per bucket, in the form the two parsers expect: "  X(<headdim>, <headdim_v>)".
#pragma once

#define FA4_HOPPER_BUCKETS(X) \
  X(64, 64)                   \
  X(96, 96)                   \
  X(128, 128)                 \
  X(192, 128)                 \
  X(192, 192)                 \
  X(256, 256)
