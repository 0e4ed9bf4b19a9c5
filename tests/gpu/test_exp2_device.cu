// tests/gpu/test_exp2_device.cu — the device path of fa4::exp2_emulated (__fadd_rd, intrinsic bit
// casts) must be BITWISE identical to the host path (the CPU FA4 implementation relies on it), and
// close to the hardware ex2.approx.f32 (MUFU) it replaces for a share of the softmax.
//
// Inputs: every 16th float32 in [-127, 0] plus EVERY float in a few exponent bands ([-1, -0.5),
// [-8, -4), (-127, -126] and (-2^-20, -2^-21]), ~95M values, evaluated on the device in chunks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/bf16_reference.h"
#include "core/float16.h"
#include "core/exp2.h"

namespace {

using fa4::detail::bits_float;
using fa4::detail::float_bits;
using fa4::detail::float_to_bf16;
using fa4::test::bf16_ulp_distance;
using fa4::test::double_to_bf16_rne;

constexpr uint32_t kSignBit = 0x80000000u;
constexpr int kThreads = 256;

#define FA4_CUDA_CHECK(expr)                                                              \
  do {                                                                                    \
    const cudaError_t err_ = (expr);                                                      \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_);            \
  } while (0)

__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/// Input i of a chunk is the negative float whose magnitude bits are first + i * stride.
__global__ void exp2_kernel(uint32_t first, uint32_t stride, int64_t n, float* emulated,
                            float* hardware) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __uint_as_float((first + uint32_t(i) * stride) | kSignBit);
  emulated[i] = fa4::exp2_emulated(x);
  hardware[i] = ex2_approx(x);
}

bool have_device(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    *why = std::string("no CUDA device (cudaGetDeviceCount: ") +
           (err == cudaSuccess ? "0 devices" : cudaGetErrorString(err)) + ")";
    (void)cudaGetLastError();  // clear the sticky error for later tests
    return false;
  }
  return true;
}

/// One sweep of magnitudes [lo, hi] (bit patterns) with the given stride.
struct Band {
  const char* name;
  uint32_t lo;
  uint32_t hi;
  uint32_t stride;
};

struct Stats {
  uint64_t count = 0;
  uint64_t bit_mismatch = 0;
  uint64_t hw_within1 = 0;        // emulated vs hardware, bf16
  uint64_t hw_within2_normal = 0, normal = 0;
  uint64_t ref_within1 = 0;       // emulated vs correctly rounded
  uint64_t hwref_within1 = 0;     // hardware vs correctly rounded (context)
  float first_mismatch_x = 0.0f;
};

TEST(Exp2Device, MatchesHostBitwiseAndHardwareEx2) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << why;

  const uint32_t m127 = float_bits(127.0f);
  const Band bands[] = {
      {"every 16th float in [-127, 0]", 0u, m127, 16u},
      {"all of [-1, -0.5)", float_bits(0.5f), float_bits(1.0f) - 1, 1u},
      {"all of [-8, -4)", float_bits(4.0f), float_bits(8.0f) - 1, 1u},
      {"all of (-127, -126]", float_bits(126.0f), m127 - 1, 1u},
      {"all of (-2^-20, -2^-21]", float_bits(0x1p-21f), float_bits(0x1p-20f) - 1, 1u},
  };
  constexpr int64_t kChunk = int64_t(1) << 24;
  float *d_emu = nullptr, *d_hw = nullptr;
  FA4_CUDA_CHECK(cudaMalloc(&d_emu, kChunk * sizeof(float)));
  FA4_CUDA_CHECK(cudaMalloc(&d_hw, kChunk * sizeof(float)));
  std::vector<float> emu(kChunk), hw(kChunk);

  Stats st;
  for (const Band& band : bands) {
    const int64_t total = (int64_t(band.hi) - band.lo) / band.stride + 1;
    for (int64_t done = 0; done < total; done += kChunk) {
      const int64_t n = std::min(kChunk, total - done);
      const uint32_t first = band.lo + uint32_t(done) * band.stride;
      const int blocks = int((n + kThreads - 1) / kThreads);
      exp2_kernel<<<blocks, kThreads>>>(first, band.stride, n, d_emu, d_hw);
      FA4_CUDA_CHECK(cudaGetLastError());
      FA4_CUDA_CHECK(cudaMemcpy(emu.data(), d_emu, n * sizeof(float), cudaMemcpyDeviceToHost));
      FA4_CUDA_CHECK(cudaMemcpy(hw.data(), d_hw, n * sizeof(float), cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < n; ++i) {
        const float x = bits_float((first + uint32_t(i) * band.stride) | kSignBit);
        const float host = fa4::exp2_emulated(x);
        ++st.count;
        if (float_bits(host) != float_bits(emu[i])) {
          if (st.bit_mismatch++ == 0) st.first_mismatch_x = x;
        }
        const uint16_t e16 = float_to_bf16(emu[i]), h16 = float_to_bf16(hw[i]);
        const uint16_t ref16 = double_to_bf16_rne(std::exp2(double(x)));
        const int32_t d_hw = bf16_ulp_distance(e16, h16);
        st.hw_within1 += d_hw <= 1;
        if (x >= -126.0f) {
          ++st.normal;
          st.hw_within2_normal += d_hw <= 2;
        }
        st.ref_within1 += bf16_ulp_distance(e16, ref16) <= 1;
        st.hwref_within1 += bf16_ulp_distance(h16, ref16) <= 1;
      }
    }
    std::printf("[exp2-device] swept %s\n", band.name);
  }
  FA4_CUDA_CHECK(cudaFree(d_emu));
  FA4_CUDA_CHECK(cudaFree(d_hw));

  const double n = double(st.count);
  std::printf("[exp2-device] %llu inputs: host/device bit mismatches %llu; emulated vs ex2.approx "
              "<=1 bf16 ulp %.5f%%; emulated vs exact <=1 ulp %.5f%%; ex2.approx vs exact <=1 ulp "
              "%.5f%%\n",
              (unsigned long long)st.count, (unsigned long long)st.bit_mismatch,
              100 * st.hw_within1 / n, 100 * st.ref_within1 / n, 100 * st.hwref_within1 / n);
  EXPECT_EQ(st.bit_mismatch, 0u) << "first at x = " << st.first_mismatch_x;
  EXPECT_GE(st.hw_within1 / n, 0.99);
  EXPECT_EQ(st.hw_within2_normal, st.normal);
  EXPECT_GE(st.ref_within1 / n, 0.99);
}

__global__ void special_kernel(const float* x, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = fa4::exp2_emulated(x[i]);
}

TEST(Exp2Device, SpecialValuesMatchHost) {
  std::string why;
  if (!have_device(&why)) GTEST_SKIP() << why;
  const float inf = INFINITY;
  const std::vector<float> xs = {bits_float(0x7fc00000u), bits_float(0xffc00001u), -inf, -127.0f,
                                 -1000.0f, 0.0f, -0.0f, 1e-40f, -1e-40f, -0x1p-25f, -126.5f,
                                 -126.0f, 8.0f, 127.0f, 3.25f, -0.5f};
  const int n = int(xs.size());
  float *d_x = nullptr, *d_out = nullptr;
  FA4_CUDA_CHECK(cudaMalloc(&d_x, n * sizeof(float)));
  FA4_CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(float)));
  FA4_CUDA_CHECK(cudaMemcpy(d_x, xs.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  special_kernel<<<1, kThreads>>>(d_x, d_out, n);
  FA4_CUDA_CHECK(cudaGetLastError());
  std::vector<float> out(n);
  FA4_CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
  FA4_CUDA_CHECK(cudaFree(d_x));
  FA4_CUDA_CHECK(cudaFree(d_out));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(float_bits(out[i]), float_bits(fa4::exp2_emulated(xs[i]))) << "x = " << xs[i];
  }
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(float_bits(out[2]), 0u);  // -inf -> +0
  EXPECT_EQ(out[5], 1.0f);
}

}  // namespace
