// src/core/constants.h — the log2/ln conversion constants every implementation uses (the softmax
// runs in log2 units for exp2; lse is reported in natural log). Host and device.
#pragma once

namespace fa4::detail {

inline constexpr double kLog2eF64 = 1.4426950408889634074;  ///< log2(e), for host-side folding
inline constexpr float kLog2e = 1.44269504088896341f;       ///< log2(e)
inline constexpr float kLn2 = 0.693147180559945309f;        ///< ln(2)

}  // namespace fa4::detail
