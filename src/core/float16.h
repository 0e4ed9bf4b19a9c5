// src/core/float16.h — host-side bf16/fp16 <-> float conversions (round to nearest even),
// used by the CPU implementations and the tests. Bit-exact with the CUDA intrinsics
// __float2bfloat16_rn / __float2half_rn, including NaN, Inf and subnormals.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/bit_cast.h"
#include "fa4/tensor.h"

namespace fa4::detail {


inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest even
  return uint16_t(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);       // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);      // >= 65520 rounds to Inf
  if (a < 0x38800000u) {                                      // below 2^-14: subnormal or zero
    // value * 2^24 rounded to nearest even gives the subnormal mantissa directly
    const float scaled = bits_float(a) * 16777216.0f;         // exact (power of two)
    return uint16_t(sign | uint16_t(std::nearbyint(scaled)));
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);                 // round mantissa 23 -> 10 bits
  return uint16_t(sign | uint16_t((r - 0x38000000u) >> 13));  // rebias exponent 127 -> 15
}
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) return bits_float(sign) + (sign ? -1.0f : 1.0f) * float(man) * 5.9604644775390625e-8f;
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

/// Read element i (an element offset) of a buffer of dtype t as float.
inline float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP16: return fp16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFP32: return static_cast<const float*>(base)[i];
    default: return NAN;
  }
}
/// Store f (rounded to nearest even) at element offset i of a buffer of dtype t.
inline void store_from_float(void* base, DType t, int64_t i, float f) {
  switch (t) {
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(f); break;
    case DType::kFP16: static_cast<uint16_t*>(base)[i] = float_to_fp16(f); break;
    case DType::kFP32: static_cast<float*>(base)[i] = f; break;
    default: break;
  }
}
/// Round-trip through dtype t (the value a same-precision implementation would hold).
inline float round_to(DType t, float f) {
  switch (t) {
    case DType::kBF16: return bf16_to_float(float_to_bf16(f));
    case DType::kFP16: return fp16_to_float(float_to_fp16(f));
    default: return f;
  }
}

}  // namespace fa4::detail
