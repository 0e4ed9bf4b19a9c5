// tests/common/bf16_reference.h — correctly rounded double -> bf16 and bf16 ulp distance, shared
// by the CPU and GPU exp2 tests. Host only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/bit_cast.h"

namespace fa4::test {

constexpr int kBf16MantissaBits = 7;  // stored bits; 8 with the implicit one
constexpr int kBf16MinNormalExp = -126;

/// double -> bf16 bits, round to nearest even, in ONE rounding. Rounding to float first and then to
/// bf16 rounds twice and can be wrong when the float lands exactly on a bf16 tie.
inline uint16_t double_to_bf16_rne(double d) {
  if (std::isnan(d)) return 0x7fc0;
  const uint16_t sign = std::signbit(d) ? 0x8000 : 0;
  const double a = std::fabs(d);
  if (a == 0.0) return sign;
  int e;  // a = m * 2^e with m in [0.5, 1)  ->  a in [2^(e-1), 2^e)
  std::frexp(a, &e);
  // bf16 ulp: 2^(exponent - 7) for normals, 2^(-126 - 7) for subnormals.
  const int exponent = std::max(e - 1, kBf16MinNormalExp);
  const double ulp = std::ldexp(1.0, exponent - kBf16MantissaBits);
  const double rounded = std::nearbyint(a / ulp) * ulp;  // power-of-two scaling is exact; RNE
  constexpr double kBf16Max = 0x1.fep127;
  if (rounded > kBf16Max) return uint16_t(sign | 0x7f80);
  // rounded is a bf16 value, hence exactly a float whose low 16 bits are zero.
  return uint16_t(sign | (fa4::detail::float_bits(float(rounded)) >> 16));
}

/// Signed position on the bf16 number line (+0 and -0 both map to 0).
inline int32_t bf16_ordinal(uint16_t h) {
  return (h & 0x8000) ? -int32_t(h & 0x7fff) : int32_t(h);
}
/// Distance in bf16 ulps between two non-NaN bf16 values (counts subnormal steps; +0 == -0).
inline int32_t bf16_ulp_distance(uint16_t a, uint16_t b) {
  return std::abs(bf16_ordinal(a) - bf16_ordinal(b));
}

}  // namespace fa4::test
