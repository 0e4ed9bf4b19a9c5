// tests/cpu/test_hopper_host.cpp — host-side checks of the Hopper kernel's tile logic (no GPU
// needed, so these run in CI): the persistent tile order visits every tile exactly once, and the
// per-tile key-block range / "needs element mask" decision agree with core/mask.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

#include "core/mask.h"
#include "hopper/shared/mask.cuh"
#include "hopper/shared/tile_scheduler.cuh"

namespace {

struct SchedParams {
  int32_t num_m_blocks, num_heads, batch, heads_per_section;
  bool lpt;
};

TEST(HopperHost, TileOrderIsAPermutation) {
  for (bool lpt : {false, true})
    for (int m : {1, 3, 17})
      for (int h : {1, 5, 32})
        for (int b : {1, 3})
          for (int sec : {1, 2, 7, 1000}) {
            SchedParams p{m, h, b, std::min(sec, h * b), lpt};
            std::set<std::tuple<int, int, int>> seen;
            const int n = m * h * b;
            for (int t = 0; t < n; ++t) {
              const fa4::hopper::TileCoord c = fa4::hopper::tile_coord(p, t);
              ASSERT_GE(c.m_block, 0); ASSERT_LT(c.m_block, m);
              ASSERT_GE(c.head, 0); ASSERT_LT(c.head, h);
              ASSERT_GE(c.batch, 0); ASSERT_LT(c.batch, b);
              seen.insert({c.m_block, c.head, c.batch});
            }
            EXPECT_EQ(int(seen.size()), n) << "lpt " << lpt << " m " << m << " h " << h << " b " << b;
            if (lpt) {  // longest first: the first tile handed out is the last m-block
              EXPECT_EQ(fa4::hopper::tile_coord(p, 0).m_block, m - 1);
            }
          }
}

TEST(HopperHost, KeyRangeAndMaskDecisionMatchThePredicate) {
  using fa4::detail::MaskSpec;
  const int block_m = 128, block_n = 112;
  const MaskSpec masks[] = {{-1, -1}, {-1, 0}, {0, 0}, {5, 3}, {200, -1}, {-1, 40}, {0, -1}};
  for (const MaskSpec& mk : masks)
    for (int sq : {1, 70, 129, 300})
      for (int sk : {0, 1, 111, 113, 400}) {
        for (int m0 = 0; m0 < sq; m0 += block_m) {
          const int row_hi = std::min(m0 + block_m, sq) - 1;
          const auto kr = fa4::hopper::TileKeyRange::make(m0, row_hi, sq, sk, mk, block_n);
          const int n_blocks = (sk + block_n - 1) / block_n;
          for (int n = 0; n < n_blocks; ++n) {
            bool any = false, all = true;
            for (int i = m0; i <= row_hi; ++i)
              for (int j = n * block_n; j < (n + 1) * block_n; ++j) {
                const bool v = fa4::detail::key_visible(i, j, sq, sk, mk);
                any |= v;
                all &= v;
              }
            const bool in_range = n >= kr.n_block_min && n < kr.n_block_max;
            // Every block some row sees is visited; a block skipped by the range is invisible.
            if (any) EXPECT_TRUE(in_range) << "block " << n << " sq " << sq << " sk " << sk;
            // A block visited without element masking must be fully visible to every real row.
            if (in_range && !kr.needs_mask(n, block_n)) EXPECT_TRUE(all) << "block " << n;
          }
        }
      }
}

}  // namespace
