// src/core/bit_cast.h — float <-> uint32 bit casts for host and device code (nvcc device code
// has no std::bit_cast). Used by the software exp2 (core/exp2.h) and the host bf16/fp16
// conversions (src/core/float16.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/macros.h"

namespace fa4::detail {

FA4_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

FA4_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

}  // namespace fa4::detail
