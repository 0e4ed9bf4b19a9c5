// tests/cpu/test_exp2.cpp — the software exp2 (core/exp2.h exp2_emulated) against a correctly
// rounded reference, its special values, and the Exp2Emulation column pattern.
//
// Main check: EVERY float32 x in [-127, 0] (1.12e9 values; ~10-20 s on 2 cores in Release with
// OpenMP). exp2_emulated(x) rounded to bf16 (what the kernels store P as) is compared with the
// correctly rounded bf16 of 2^x: std::exp2 in double rounded DIRECTLY to bf16 (going through float
// first would round twice). Asserted: >= 99% within 1 bf16 ulp over all of [-127, 0]; 100% within
// 2 ulps over [-126, 0]; in (-127, -126), where 2^x is subnormal and the exponent bit-add cannot
// form it (see exp2.h), |error| <= 2^-127 instead.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "common/bf16_reference.h"
#include "core/float16.h"
#include "core/exp2.h"

namespace {

using fa4::exp2_emulated;
using fa4::detail::bits_float;
using fa4::detail::float_bits;
using fa4::detail::float_to_bf16;
using fa4::test::bf16_ulp_distance;
using fa4::test::double_to_bf16_rne;

constexpr int kMinNormalExp = -126;                 // smallest normal exponent (fp32 and bf16)
constexpr double kSubnormalBand = 0x1p-127;         // bound on |error| where 2^x is subnormal
constexpr uint32_t kSignBit = 0x80000000u;

TEST(Exp2Helpers, DoubleToBf16Rne) {
  EXPECT_EQ(double_to_bf16_rne(1.0), 0x3f80);
  EXPECT_EQ(double_to_bf16_rne(-2.0), 0xc000);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even -> 1. Slightly above -> up.
  EXPECT_EQ(double_to_bf16_rne(1.0 + 0x1p-8), 0x3f80);
  EXPECT_EQ(double_to_bf16_rne(1.0 + 0x1p-8 + 0x1p-40), 0x3f81);
  EXPECT_EQ(double_to_bf16_rne(1.0 + 3 * 0x1p-8), 0x3f82);  // tie between 0x3f81 and 0x3f82: even
  // The double-rounding hazard: 1 + 2^-8 + 2^-30 goes to float as 1 + 2^-8 (a tie) and then to
  // bf16 as 1.0; the direct rounding must give 0x3f81.
  EXPECT_EQ(float_to_bf16(float(1.0 + 0x1p-8 + 0x1p-30)), 0x3f80);
  EXPECT_EQ(double_to_bf16_rne(1.0 + 0x1p-8 + 0x1p-30), 0x3f81);
  // Subnormals: ulp 2^-133.
  EXPECT_EQ(double_to_bf16_rne(0x1p-133), 0x0001);
  EXPECT_EQ(double_to_bf16_rne(0x1p-134), 0x0000);            // tie -> even (0)
  EXPECT_EQ(double_to_bf16_rne(0x1.8p-133), 0x0002);          // tie -> even (2)
  EXPECT_EQ(double_to_bf16_rne(0x1p-127), 0x0040);
  EXPECT_EQ(double_to_bf16_rne(0x1.ffp-127), 0x0080);         // rounds up into the normals
  EXPECT_EQ(double_to_bf16_rne(0.0), 0x0000);
  EXPECT_EQ(double_to_bf16_rne(-0.0), 0x8000);
  EXPECT_EQ(double_to_bf16_rne(1e300), 0x7f80);
  // Agrees with the float path wherever the input is a float (one rounding either way).
  for (uint32_t u = 0x00000001u; u < 0x7f800000u; u += 0x00012345u) {
    const float f = bits_float(u);
    ASSERT_EQ(double_to_bf16_rne(double(f)), float_to_bf16(f)) << f;
  }
  EXPECT_EQ(bf16_ulp_distance(0x0000, 0x8000), 0);
  EXPECT_EQ(bf16_ulp_distance(0x0001, 0x8001), 2);
  EXPECT_EQ(bf16_ulp_distance(0x3f80, 0x3f7f), 1);
}

struct SweepStats {
  uint64_t count = 0;
  uint64_t dist[3] = {0, 0, 0};  // ulp distance 0, 1, 2
  uint64_t dist_more = 0;
  uint64_t normal_count = 0;     // x >= -126
  uint64_t normal_dist_more_than_2 = 0;
  uint64_t band_violations = 0;  // x in (-127, -126): |error| > 2^-127
  double max_rel_err_normal = 0.0;
  float worst_x = 0.0f;
};

TEST(Exp2Emulated, EveryFloatInMinus127To0MatchesCorrectlyRoundedBf16) {
  // Bit patterns of -0.0 .. -127.0 are kSignBit | [0, bits(127.0f)], increasing in magnitude.
  const uint32_t last = float_bits(127.0f);
  SweepStats total;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel
  {
    SweepStats s;
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i <= int64_t(last); ++i) {
      const float x = bits_float(uint32_t(i) | kSignBit);
      const float r = exp2_emulated(x);
      const double e = std::exp2(double(x));
      const int32_t d = bf16_ulp_distance(float_to_bf16(r), double_to_bf16_rne(e));
      ++s.count;
      if (d <= 2) ++s.dist[d]; else ++s.dist_more;
      if (x >= float(kMinNormalExp)) {
        ++s.normal_count;
        s.normal_dist_more_than_2 += d > 2;
        const double rel = std::fabs(double(r) - e) / e;
        if (!(rel <= s.max_rel_err_normal)) { s.max_rel_err_normal = rel; s.worst_x = x; }
      } else {
        s.band_violations += !(std::fabs(double(r) - e) <= kSubnormalBand);
      }
    }
#pragma omp critical
    {
      total.count += s.count;
      for (int k = 0; k < 3; ++k) total.dist[k] += s.dist[k];
      total.dist_more += s.dist_more;
      total.normal_count += s.normal_count;
      total.normal_dist_more_than_2 += s.normal_dist_more_than_2;
      total.band_violations += s.band_violations;
      if (!(s.max_rel_err_normal <= total.max_rel_err_normal)) {
        total.max_rel_err_normal = s.max_rel_err_normal;
        total.worst_x = s.worst_x;
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double n = double(total.count);
  const double within0 = total.dist[0] / n;
  const double within1 = (total.dist[0] + total.dist[1]) / n;
  const double within2 = (total.dist[0] + total.dist[1] + total.dist[2]) / n;
  std::printf("[exp2] %llu inputs in [-127, 0] (%.1f s, %d threads)\n",
              (unsigned long long)total.count, secs, omp_get_max_threads());
  std::printf("[exp2] bf16 vs correctly rounded: exact %.6f%%, <=1 ulp %.6f%%, <=2 ulp %.6f%%, "
              ">2 ulp %llu (all in the subnormal band)\n",
              100 * within0, 100 * within1, 100 * within2, (unsigned long long)total.dist_more);
  std::printf("[exp2] <=2 ulp over [-126, 0]: %.6f%% of %llu; fp32 max relative error over "
              "[-126, 0]: %.4e at x = %.9g\n",
              100.0 * (total.normal_count - total.normal_dist_more_than_2) / total.normal_count,
              (unsigned long long)total.normal_count, total.max_rel_err_normal,
              double(total.worst_x));

  EXPECT_EQ(total.count, uint64_t(last) + 1);
  EXPECT_GE(within1, 0.99);
  // Where 2^x is a normal float every result is within 2 bf16 ulps.
  EXPECT_EQ(total.normal_dist_more_than_2, 0u);
  // Where 2^x is subnormal (x in (-127, -126)) the exponent bit-add cannot form it (documented in
  // exp2.h); the result is still within 2^-127 of the truth.
  EXPECT_EQ(total.band_violations, 0u);
  // The polynomial's own bound (fit script) plus the final rounding of p to float32.
  EXPECT_LE(total.max_rel_err_normal, fa4::Exp2Poly3::max_rel_error * 1.01);
  EXPECT_GT(total.max_rel_err_normal, 0.0);  // a too-good-to-be-true result means a broken sweep
}

TEST(Exp2Emulated, SpecialValues) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // NaN comes back as the input NaN itself (any payload, either sign).
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7fc00001u, 0x7f800001u, 0x7fffffffu}) {
    const float r = exp2_emulated(bits_float(bits));
    EXPECT_TRUE(std::isnan(r)) << std::hex << bits;
    EXPECT_EQ(float_bits(r), bits);
  }
  EXPECT_TRUE(std::isnan(exp2_emulated(qnan)));
  EXPECT_EQ(float_bits(exp2_emulated(-inf)), 0u);  // exactly +0
  EXPECT_EQ(float_bits(exp2_emulated(-127.0f)), 0u);
  EXPECT_EQ(float_bits(exp2_emulated(-1000.0f)), 0u);
  EXPECT_EQ(float_bits(exp2_emulated(-std::numeric_limits<float>::max())), 0u);
  EXPECT_EQ(exp2_emulated(0.0f), 1.0f);
  EXPECT_EQ(exp2_emulated(-0.0f), 1.0f);
  // Tiny magnitudes on both sides of 0 (the f = RN(1 - |x|) path for tiny negatives).
  for (float x : {1e-30f, -1e-30f, 1e-40f, -1e-40f, 0x1p-24f, -0x1p-24f, -0x1p-25f}) {
    EXPECT_NEAR(exp2_emulated(x), 1.0f, 2e-4f) << x;
  }
}

TEST(Exp2Emulated, IntegersAreExactPowersOfTwo) {
  for (int j = -126; j <= 127; ++j) {
    EXPECT_EQ(exp2_emulated(float(j)), std::ldexp(1.0f, j)) << j;
  }
}

TEST(Exp2Emulated, PositiveArgumentsUpTo127) {
  // Not used by the softmax (its arguments are <= rescale_threshold = 8) but inside the documented
  // domain: every k-th float in (0, 127].
  const uint32_t last = float_bits(127.0f);
  const uint32_t stride = 997;  // prime, so the sample walks through every mantissa pattern
  double worst = 0.0;
  for (uint32_t u = 1; u <= last; u += stride) {
    const float x = bits_float(u);
    const double e = std::exp2(double(x));
    worst = std::max(worst, std::fabs(double(exp2_emulated(x)) - e) / e);
  }
  EXPECT_LE(worst, fa4::Exp2Poly3::max_rel_error * 1.01);
  EXPECT_GT(worst, 0.0);
}

TEST(Exp2Emulated, MonotoneWithinTheErrorBound) {
  // p is increasing on [0, 1] (positive coefficients), so results can only step down by rounding or
  // at an integer boundary (p(1-) vs exactly 2), i.e. by at most ~2x the relative error bound.
  const double tol = 2.0 * fa4::Exp2Poly3::max_rel_error + 0x1p-23;
  int decreases = 0;
  float prev = exp2_emulated(-127.0f);
  for (float x = -127.0f; x <= 8.0f; x += 0x1p-9f) {
    const float r = exp2_emulated(x);
    if (r < prev) {
      ++decreases;
      ASSERT_GE(r, prev * (1.0 - tol)) << "x = " << x;
    }
    prev = r;
  }
  std::printf("[exp2] local decreases on a 2^-9 grid over [-127, 8]: %d\n", decreases);
  // And strictly across integers: 2^x doubles every unit.
  for (int j = -120; j < 8; ++j) {
    EXPECT_LT(exp2_emulated(j + 0.25f), exp2_emulated(j + 0.75f));
    EXPECT_LT(exp2_emulated(j + 0.75f), exp2_emulated(j + 1.25f));
  }
}

TEST(Exp2Emulation, PatternIsPeriodicAndLaneUniform) {
  constexpr int kTileN = 128;
  constexpr int kGroup = 8;  // columns that share accumulator registers across MMA lanes
  for (int emulated = 0; emulated <= 16; ++emulated) {
    const fa4::Exp2Emulation share{16, emulated};
    EXPECT_DOUBLE_EQ(share.fraction(), emulated / 16.0);
    // Same share in every 128-column tile of a wider key block (col_in_tile up to 512).
    for (int tile = 0; tile < 4; ++tile) {
      int count = 0;
      for (int c = 0; c < kTileN; ++c) count += share.uses_emulation(tile * kTileN + c);
      EXPECT_EQ(count, emulated * kTileN / 16) << "emulated " << emulated << " tile " << tile;
    }
    for (int c = 0; c < 4 * kTileN; ++c) {
      ASSERT_EQ(share.uses_emulation(c), share.uses_emulation(c - c % kGroup)) << c;
    }
  }
  // The emulated groups are the LAST ones of each period (the pattern the doc comment states).
  const fa4::Exp2Emulation share{16, 2};
  for (int c = 0; c < kTileN; ++c) EXPECT_EQ(share.uses_emulation(c), c >= 112) << c;
  // Another period: 8 groups, 3 emulated -> 3/8 of the columns.
  const fa4::Exp2Emulation share8{8, 3};
  int count = 0;
  for (int c = 0; c < kTileN; ++c) count += share8.uses_emulation(c);
  EXPECT_EQ(count, 3 * kTileN / 8);
}

}  // namespace
