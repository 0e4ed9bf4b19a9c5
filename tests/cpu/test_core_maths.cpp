// tests/cpu/test_core_maths.cpp — the kernel-neutral maths of src/core that every implementation
// calls: the mask ranges both ways against the predicate, and the softmax merge weight and final
// normalisation against float64 evaluations of their definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/constants.h"
#include "core/mask.h"
#include "core/softmax.h"

namespace {

using fa4::detail::MaskSpec;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Both ranges are exactly the sets the predicate accepts, for every (i, j) of small problems with
// seqlen_q below, equal to and above seqlen_k, every window kind (causal = (-1, 0)).
TEST(CoreMask, RangesBothWaysMatchThePredicate) {
  const MaskSpec masks[] = {{-1, -1}, {-1, 0}, {3, 0}, {0, 0}, {2, 5}, {-1, 4}, {7, -1}, {0, -1}};
  for (const MaskSpec m : masks)
    for (int64_t sq : {0, 1, 5, 9, 16})
      for (int64_t sk : {0, 1, 4, 9, 23}) {
        for (int64_t i = 0; i < sq; ++i) {
          const auto r = fa4::detail::visible_key_range(i, sq, sk, m);
          for (int64_t j = -2; j < sk + 2; ++j)
            EXPECT_EQ(fa4::detail::key_visible(i, j, sq, sk, m), j >= r.first && j < r.last)
                << "q->k: i " << i << " j " << j << " sq " << sq << " sk " << sk << " win (" << m.window_left
                << ", " << m.window_right << ")";
        }
        for (int64_t j = -2; j < sk + 2; ++j) {
          const auto r = fa4::detail::visible_query_range(j, sq, sk, m);
          for (int64_t i = 0; i < sq; ++i)
            EXPECT_EQ(fa4::detail::key_visible(i, j, sq, sk, m), i >= r.first && i < r.last)
                << "k->q: i " << i << " j " << j << " sq " << sq << " sk " << sk << " win (" << m.window_left
                << ", " << m.window_right << ")";
          EXPECT_GE(r.first, 0);
          EXPECT_LE(r.last, std::max<int64_t>(sq, r.first));
        }
      }
}

float exp2_f(float x) { return std::exp2(x); }

TEST(CoreSoftmax, MergeWeight) {
  EXPECT_EQ(fa4::detail::merge_weight(-kInf, -kInf, 0.5f, exp2_f), 0.f);  // never -inf - -inf
  EXPECT_EQ(fa4::detail::merge_weight(-kInf, 3.f, 0.5f, exp2_f), 0.f);
  EXPECT_EQ(fa4::detail::merge_weight(3.f, 3.f, 0.5f, exp2_f), 1.f);
  EXPECT_FLOAT_EQ(fa4::detail::merge_weight(1.f, 5.f, 0.5f, exp2_f), std::exp2(-2.f));
  EXPECT_TRUE(std::isnan(fa4::detail::merge_weight(std::nanf(""), 1.f, 0.5f, exp2_f)));
}

TEST(CoreSoftmax, FinalizeRow) {
  // No sink: o_scale = 1/l, lse = (m + log2 l) ln 2.
  for (float m : {-30.f, 0.f, 12.5f})
    for (float l : {1.f, 3.75f, 1e6f}) {
      const auto n = fa4::detail::finalize_row(m, l, -kInf);
      EXPECT_FLOAT_EQ(n.o_scale, 1.f / l);
      // The tolerance scales with the expected value, never the tested one (an inf lse would pass).
      const double want = (double(m) + std::log2(double(l))) * std::log(2.0);
      EXPECT_NEAR(n.lse, want, 1e-5 * (1 + std::fabs(want)));
    }
  // A sink joins the denominator only, at any distance from the row max (no overflow either way).
  for (float m : {-200.f, 0.f, 200.f})
    for (float sink : {-100.f, -1.f, 0.f, 2.f, 100.f}) {
      const float l = 2.5f;
      const auto n = fa4::detail::finalize_row(m, l, sink);
      const double sl = double(sink) * 1.4426950408889634;
      const double big = std::max(double(m), sl);
      const double denom = l * std::exp2(m - big) + std::exp2(sl - big);
      // fp32 exponents of magnitude up to ~350 carry ~2e-5 absolute rounding: relative 1e-4. A
      // weight below fp32's range must come out as 0 or a subnormal, never larger.
      const double want = std::exp2(m - big) / denom;
      if (want >= 1e-37)
        EXPECT_NEAR(n.o_scale, want, 1e-4 * want);
      else
        EXPECT_LE(n.o_scale, 1e-37f);
      const double want_lse = (big + std::log2(denom)) * std::log(2.0);
      EXPECT_NEAR(n.lse, want_lse, 1e-4 * (1 + std::fabs(want_lse)));
      EXPECT_TRUE(std::isfinite(n.lse));
    }
  // No visible key: out 0, lse = the sink exactly, or -inf.
  EXPECT_EQ(fa4::detail::finalize_row(-kInf, 0.f, -kInf).o_scale, 0.f);
  EXPECT_EQ(fa4::detail::finalize_row(-kInf, 0.f, -kInf).lse, -kInf);
  EXPECT_EQ(fa4::detail::finalize_row(-kInf, 0.f, 1.25f).lse, 1.25f);
  EXPECT_EQ(fa4::detail::finalize_row(-kInf, 0.f, 1.25f).o_scale, 0.f);
  // NaN from the data propagates.
  EXPECT_TRUE(std::isnan(fa4::detail::finalize_row(1.f, std::nanf(""), -kInf).lse));
  EXPECT_TRUE(std::isnan(fa4::detail::finalize_row(1.f, std::nanf(""), 0.5f).o_scale));
}

}  // namespace
