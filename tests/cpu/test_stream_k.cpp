// tests/cpu/test_stream_k.cpp — the stream-K tail plan (core/stream_k.h) that the Hopper
// kernel enumerates on the device: every (tile, key block) is run by exactly one CTA, every cut tile
// has exactly one combiner whose contributor list is exactly the CTAs holding the tile's other
// pieces, contributors run first and combiners last, and the automatic choice splits only few,
// long tiles.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "core/stream_k.h"

namespace {

using fa4::detail::plan_stream_k;
using fa4::detail::stream_k_item;
using fa4::detail::StreamKPlan;
using fa4::detail::WorkItem;

struct Piece {
  int32_t cta, n_lo, n_hi, role, position;
};

/// Enumerates every CTA's items as the kernel does and checks all invariants.
void check_plan(int64_t num_tiles, int32_t num_sms, int32_t nb, int mode) {
  SCOPED_TRACE("tiles=" + std::to_string(num_tiles) + " sms=" + std::to_string(num_sms) +
               " nb=" + std::to_string(nb) + " mode=" + std::to_string(mode));
  const StreamKPlan s = plan_stream_k(num_tiles, num_sms, nb, mode);
  ASSERT_GE(s.grid, 1);
  ASSERT_LE(s.grid, num_sms);
  ASSERT_LE(s.tail_ctas, s.grid);
  std::map<int32_t, std::vector<Piece>> by_tile;
  std::vector<int64_t> load(size_t(s.grid), 0);
  for (int32_t c = 0; c < s.grid; ++c) {
    bool seen_whole_or_combiner = false;
    const fa4::detail::StreamKCtaItems r = fa4::detail::stream_k_cta_items(s, c);
    for (int32_t i = 0;; ++i) {
      ASSERT_LT(i, num_tiles + 4) << "CTA " << c << " never ends";
      const WorkItem w = stream_k_item(s, r, int32_t(num_tiles), c, i);
      if (w.tile >= num_tiles) break;
      ASSERT_GE(w.tile, 0);
      const bool whole = w.n_lo == w.n_hi;
      if (whole) {
        EXPECT_EQ(w.role, 0);
      } else {
        EXPECT_GE(w.n_lo, 0);
        EXPECT_LE(w.n_hi, nb);
        EXPECT_LT(w.n_lo, w.n_hi);
        EXPECT_NE(w.role, 0) << "a piece is a contributor or a combiner";
      }
      if (w.role < 0) {
        EXPECT_EQ(i, 0) << "a contributor runs first";
        EXPECT_FALSE(seen_whole_or_combiner);
      } else {
        seen_whole_or_combiner = true;
      }
      if (w.role > 0) {  // a combiner runs last (its contributors have long finished by then)
        const WorkItem after = stream_k_item(s, r, int32_t(num_tiles), c, i + 1);
        EXPECT_GE(after.tile, num_tiles) << "CTA " << c << " item " << i;
      }
      const int32_t lo = whole ? 0 : w.n_lo, hi = whole ? nb : w.n_hi;
      load[size_t(c)] += hi - lo;
      by_tile[w.tile].push_back({c, lo, hi, w.role, i});
    }
  }
  ASSERT_EQ(int64_t(by_tile.size()), num_tiles) << "every tile runs";
  for (const auto& [tile, pieces] : by_tile) {
    // Key blocks covered exactly once.
    std::vector<int> cover(size_t(nb), 0);
    for (const Piece& p : pieces)
      for (int32_t n = p.n_lo; n < p.n_hi; ++n) ++cover[size_t(n)];
    for (int32_t n = 0; n < nb; ++n) EXPECT_EQ(cover[size_t(n)], 1) << "tile " << tile << " block " << n;
    if (pieces.size() == 1) {
      EXPECT_EQ(pieces[0].role, 0) << "tile " << tile;
      continue;
    }
    // One combiner, holding the highest block (processed first in the tile's order); its list is
    // exactly the other pieces' CTAs, which are contributors.
    int combiners = 0;
    for (const Piece& p : pieces) {
      if (p.role <= 0) continue;
      ++combiners;
      EXPECT_EQ(p.n_hi, nb);
      std::set<int32_t> listed, others;
      for (int32_t j = 1; j <= p.role; ++j) listed.insert(p.cta + j);
      for (const Piece& q : pieces)
        if (&q != &p) {
          others.insert(q.cta);
          EXPECT_EQ(q.role, -1) << "tile " << tile;
        }
      EXPECT_EQ(listed, others) << "tile " << tile;
    }
    EXPECT_EQ(combiners, 1) << "tile " << tile;
  }
  if (s.tail_ctas > 0) {
    // Balanced: CTAs differ by at most one key block of tail plus the whole-tile rounds.
    int64_t lo = INT64_MAX, hi = 0;
    for (int32_t c = 0; c < s.tail_ctas; ++c) {
      lo = std::min(lo, load[size_t(c)]);
      hi = std::max(hi, load[size_t(c)]);
    }
    EXPECT_LE(hi - lo, 1);
  }
}

TEST(StreamK, CoverageAndCombinersOnManyShapes) {
  const int32_t sms[] = {1, 7, 132};
  const int64_t tiles[] = {1, 2, 5, 68, 131, 132, 133, 200, 1024, 2048, 4096};
  const int32_t nbs[] = {1, 3, 8, 32, 52, 256};
  for (int32_t g : sms)
    for (int64_t t : tiles)
      for (int32_t nb : nbs)
        for (int mode : {-1, 0, 1}) check_plan(t, g, nb, mode);
}

TEST(StreamK, OffModesRunWholeTilesInTheStaticStride) {
  for (int mode : {0, -1}) {
    // 264 tiles on 132 SMs: full rounds, nothing to split even when asked.
    const StreamKPlan s = plan_stream_k(264, 132, 32, mode == 0 ? 0 : 1);
    EXPECT_EQ(s.tail_ctas, 0);
    EXPECT_EQ(s.grid, 132);
    for (int32_t i = 0; i < 3; ++i) {
      const WorkItem w = stream_k_item(s, fa4::detail::stream_k_cta_items(s, 5), 264, 5, i);
      EXPECT_EQ(w.tile, i < 2 ? 5 + 132 * i : 264);
      EXPECT_EQ(w.role, 0);
      EXPECT_EQ(w.n_lo, w.n_hi);
    }
  }
  EXPECT_EQ(plan_stream_k(2048, 132, 32, 0).tail_ctas, 0);
}

// The automatic choice: split-KV where there are fewer tiles than SMs and a tile has enough key
// blocks to pay for a piece's fixed cost; never the last partial round of a longer schedule (measured
// no gain on H200), which the override "stream_k" = 1 (mode 1) still forces for the ablation.
TEST(StreamK, CostModelSplitsFewLongTilesOnly) {
  // d128 benchmark shapes: 2048 tiles of seqlen/128 blocks, 15.5 rounds: not split automatically.
  for (int32_t nb : {4, 8, 32, 128}) EXPECT_EQ(plan_stream_k(2048, 132, nb, -1).tail_ctas, 0) << nb;
  const StreamKPlan forced = plan_stream_k(2048, 132, 32, 1);
  EXPECT_EQ(forced.tail_ctas, 132);
  EXPECT_EQ(forced.dp_rounds, 15);
  EXPECT_EQ(forced.tail_tile0, 15 * 132);
  EXPECT_EQ(forced.tail_blocks, 68 * 32);
  // Fewer tiles than SMs (a small batch, long keys): spread over (about) every SM.
  const StreamKPlan small = plan_stream_k(16, 132, 256, -1);
  EXPECT_EQ(small.dp_rounds, 0);
  EXPECT_EQ(small.grid, 128);
  EXPECT_EQ(small.tail_ctas, 128);
  // ... but not when a tile has too few key blocks to pay for the pieces.
  EXPECT_EQ(plan_stream_k(16, 132, 3, -1).tail_ctas, 0);
  // Predicted gains below 25% are not taken (the launch costs the model leaves out ate them):
  EXPECT_EQ(plan_stream_k(8, 132, 7, -1).tail_ctas, 0);      // 8.5 -> 1 + 3 + 3 blocks (56 CTAs of 1)
  EXPECT_EQ(plan_stream_k(128, 132, 128, -1).tail_ctas, 0);  // measured 4.7% slower split
  EXPECT_EQ(plan_stream_k(16, 132, 12, -1).tail_ctas, 64);   // 13.5 -> 3 + 3 + 1.5 blocks
  // A least share (override stream_k_min_share) bounds the CTAs, forced or not.
  EXPECT_EQ(plan_stream_k(16, 132, 12, 1, 8).tail_ctas, 24);  // 192 blocks, 24 CTAs of 8
  EXPECT_EQ(plan_stream_k(16, 132, 12, -1, 8).tail_ctas, 0);  // 13.5 -> 8 + 4.5 + 0.5 (shares straddle tiles)
  EXPECT_EQ(plan_stream_k(8, 132, 16, -1, 8).tail_ctas, 16);  // halves: 17.5 -> 8 + 3 + 0.5
  // A tail too long for the device's 32-bit walk is never split.
  EXPECT_EQ(plan_stream_k(100, 132, INT32_MAX / 64, 1).tail_ctas, 0);
}

// More CTAs shorten each one's share but cut every tile into more pieces, whose partials its
// combiner merges one after another: the plan takes the count with the shortest predicted tail.
// H100, causal chunks of 128 queries, kernel us by pieces per tile (bench/results/history.md):
// 8 tiles of 8 blocks (d64) 2 / 4 / 8 pieces 13.24 / 12.47 / 13.04; of 32 blocks 4 / 8 / 16 pieces
// 19.01 / 17.12 / 18.99; 32 tiles of 8 blocks (d128) 2 / 4 pieces 15.27 / 14.99 (132 CTAs: 15.13).
TEST(StreamK, CostModelWeighsEachTilesMerge) {
  struct Case {
    int64_t tiles;
    int32_t nb, ctas, share;
  };
  // (Shares that cut every tile into equal pieces save a piece's fixed cost: 16 tiles of 256 blocks
  // take 128 CTAs of 32 blocks, not 132 of 31-32 that start and end inside tiles.)
  for (const Case& c : {Case{8, 8, 32, 2}, Case{8, 32, 64, 4}, Case{32, 8, 128, 2}, Case{8, 16, 32, 4},
                        Case{16, 256, 128, 32}, Case{48, 32, 132, 11}}) {
    const StreamKPlan s = plan_stream_k(c.tiles, 132, c.nb, -1);
    EXPECT_EQ(s.tail_ctas, c.ctas) << c.tiles << " tiles of " << c.nb;
    EXPECT_EQ(s.grid, c.ctas) << c.tiles << " tiles of " << c.nb;
    EXPECT_EQ(s.share, c.share) << c.tiles << " tiles of " << c.nb;
  }
  // The forced split takes the same count.
  EXPECT_EQ(plan_stream_k(8, 132, 8, 1).tail_ctas, 32);
}

// The coarse split (the decision the small-query route was measured against): as many CTAs as fit
// with shares of at least 8 blocks, a flat merge cost; with fewer tiles than SMs it splits tiles of
// 14 key blocks and more, where the cost-model plan also splits tiles of 7-13.
TEST(StreamK, CoarseSplitSplitsTilesOfFourteenBlocksAndMore) {
  using fa4::detail::stream_k_splits_coarsely;
  for (int64_t tiles : {8, 16, 32}) {
    EXPECT_FALSE(stream_k_splits_coarsely(tiles, 132, 8, -1)) << tiles;
    EXPECT_FALSE(stream_k_splits_coarsely(tiles, 132, 13, -1)) << tiles;
    EXPECT_TRUE(stream_k_splits_coarsely(tiles, 132, 14, -1)) << tiles;
    EXPECT_TRUE(stream_k_splits_coarsely(tiles, 132, 256, -1)) << tiles;
    EXPECT_GT(plan_stream_k(tiles, 132, 13, -1).tail_ctas, 0) << tiles;
  }
  // Few tiles: shares of 8 leave too few CTAs (2 tiles of 14 blocks: 3 CTAs of 10; 1 of 15: one).
  EXPECT_FALSE(stream_k_splits_coarsely(2, 132, 14, -1));
  EXPECT_FALSE(stream_k_splits_coarsely(1, 132, 15, -1));
  EXPECT_TRUE(stream_k_splits_coarsely(1, 132, 16, -1));
  EXPECT_FALSE(stream_k_splits_coarsely(2048, 132, 32, -1));  // the last partial round
  EXPECT_TRUE(stream_k_splits_coarsely(2048, 132, 32, 1));    // ... forced
  EXPECT_FALSE(stream_k_splits_coarsely(264, 132, 32, 1));    // full rounds
  EXPECT_FALSE(stream_k_splits_coarsely(8, 132, 256, 0));
  EXPECT_FALSE(stream_k_splits_coarsely(100, 132, INT32_MAX / 64, 1));
}

}  // namespace
