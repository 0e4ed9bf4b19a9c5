// fa4/exp2.h — software exp2 on the FMA pipe and the rule that picks which softmax entries use it.
// Host and device (nvcc) code include this one header, so the CPU implementation and the GPU
// kernels make the same choice for the same (column, split).
//
// Source: FlashAttention-4 (arXiv 2603.05451), Sec. 3 "software-emulated exponential": on GPUs
// whose exponential unit (MUFU, 16 ops/clk/SM on Hopper) is slower than the matrix units, a share
// of 2^x is computed by Cody-Waite range reduction + a degree-3 polynomial on the FMA units.
#pragma once

#include <cstdint>
#include <cstring>

#include "fa4/detail/macros.h"

namespace fa4 {

/// Which key columns use the software exp2. Columns are grouped in 8s (an 8-column group maps to
/// the same accumulator registers in every lane of a Hopper/Ampere MMA fragment, so the choice is
/// lane-uniform and compile-time per register). Within a key tile, column c (0-based, relative to
/// the tile start) is emulated iff  (c / 8) % period >= period - emulated.
/// The emulated share is emulated / period.
struct Exp2Split {
  int32_t period = 16;   ///< in 8-column groups
  int32_t emulated = 0;  ///< 0 <= emulated <= period

  FA4_HD constexpr bool uses_emulation(int32_t col_in_tile) const {
    return emulated > 0 && ((col_in_tile >> 3) % period) >= period - emulated;
  }
  constexpr double fraction() const { return period > 0 ? double(emulated) / period : 0.0; }
};

}  // namespace fa4
