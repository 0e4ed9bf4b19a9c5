// tests/cpu/test_tile_scheduler.cpp — the persistent tile order (fa4/tile_scheduler.h): coverage,
// costs against a brute-force use of the mask predicate, cost-0 tiles last, LPT monotonicity, L2
// sections, GQA adjacency, and LPT vs plain makespans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "fa4/detail/params.h"
#include "fa4/error.h"
#include "fa4/tile_scheduler.h"

namespace {

using fa4::SeqLens;
using fa4::TileOrder;
using fa4::TileProblem;
using fa4::TileSchedule;
using fa4::TileSchedulerConfig;
using fa4::TileWork;
using fa4::detail::MaskSpec;

constexpr MaskSpec kDense{-1, -1};
constexpr MaskSpec kCausal{-1, 0};
constexpr int32_t kHopperSms = 132;  // H100/H200 SXM: one persistent CTA per SM

/// Key tiles visited by a tile, from key_visible() alone (no range algebra): the tiles between
/// the smallest and the largest visible key of any of its rows.
int32_t brute_force_cost(int32_t m_block, const SeqLens& s, const TileSchedulerConfig& cfg,
                         MaskSpec mask) {
  int64_t kmin = INT64_MAX, kmax = -1;
  const int64_t row_end = std::min<int64_t>(int64_t(m_block + 1) * cfg.tile_m, s.seqlen_q);
  for (int64_t i = int64_t(m_block) * cfg.tile_m; i < row_end; ++i) {
    for (int64_t j = 0; j < s.seqlen_k; ++j) {
      if (fa4::detail::key_visible(i, j, s.seqlen_q, s.seqlen_k, mask)) {
        kmin = std::min(kmin, j);
        kmax = std::max(kmax, j);
      }
    }
  }
  if (kmax < 0) return 0;
  return int32_t(kmax / cfg.tile_n + 1 - kmin / cfg.tile_n);
}

/// Every invariant of a schedule. brute_force: also check each cost with brute_force_cost (small
/// problems only: it is O(rows * keys)).
void check_schedule(const TileProblem& pr, const TileSchedulerConfig& cfg, const TileSchedule& s,
                    bool brute_force) {
  const int32_t group = pr.num_heads / pr.num_heads_kv;
  // 1. Every (batch, head, m_block) exactly once; sequences with seqlen_q == 0 have none.
  std::set<std::tuple<int32_t, int32_t, int32_t>> seen;
  for (const TileWork& t : s.tiles) {
    ASSERT_GE(t.batch, 0);
    ASSERT_LT(t.batch, int32_t(pr.seqs.size()));
    ASSERT_GE(t.head, 0);
    ASSERT_LT(t.head, pr.num_heads);
    const int32_t num_m = (pr.seqs[t.batch].seqlen_q + cfg.tile_m - 1) / cfg.tile_m;
    ASSERT_GE(t.m_block, 0);
    ASSERT_LT(t.m_block, num_m);
    ASSERT_TRUE(seen.insert({t.batch, t.head, t.m_block}).second)
        << "duplicate tile " << t.batch << "," << t.head << "," << t.m_block;
  }
  int64_t expected = 0;
  for (const SeqLens& q : pr.seqs) {
    expected += int64_t(pr.num_heads) * ((q.seqlen_q + cfg.tile_m - 1) / cfg.tile_m);
  }
  ASSERT_EQ(int64_t(s.tiles.size()), expected);

  // 2. Costs: the scheduler's n_block_range agrees with the predicate; cost-0 tiles last.
  int64_t total = 0;
  for (size_t i = 0; i < s.tiles.size(); ++i) {
    const TileWork& t = s.tiles[i];
    const SeqLens& q = pr.seqs[t.batch];
    const fa4::NBlockRange r =
        fa4::n_block_range(int64_t(t.m_block) * cfg.tile_m, int64_t(t.m_block + 1) * cfg.tile_m,
                           q.seqlen_q, q.seqlen_k, cfg.tile_n, pr.mask);
    ASSERT_EQ(t.num_n_blocks, r.n_block_max - r.n_block_min);
    if (brute_force) {
      ASSERT_EQ(t.num_n_blocks, brute_force_cost(t.m_block, q, cfg, pr.mask))
          << "b " << t.batch << " m " << t.m_block << " sq " << q.seqlen_q << " sk " << q.seqlen_k
          << " window (" << pr.mask.window_left << ", " << pr.mask.window_right << ")";
    }
    ASSERT_EQ(int64_t(i) < s.num_work_tiles, t.num_n_blocks > 0) << "tile " << i;
    total += t.num_n_blocks;
  }
  ASSERT_EQ(total, s.total_cost);

  // 3. Sections: cover [0, num_work_tiles); one sequence, one aligned block of kv heads that fits
  //    L2 (or a single kv head); cost non-increasing inside under LPT; GQA heads adjacent.
  ASSERT_GE(s.section_offsets.size(), 1u);
  ASSERT_EQ(s.section_offsets.front(), 0);
  ASSERT_EQ(s.section_offsets.back(), s.num_work_tiles);
  int32_t prev_section_max = INT32_MAX;
  for (size_t k = 0; k + 1 < s.section_offsets.size(); ++k) {
    const int64_t lo = s.section_offsets[k], hi = s.section_offsets[k + 1];
    ASSERT_LT(lo, hi) << "empty section " << k;
    const int32_t b = s.tiles[lo].batch;
    const int32_t per = fa4::kv_heads_per_l2_section(pr.seqs[b].seqlen_k, pr.num_heads_kv, cfg);
    const int64_t kv_bytes =
        int64_t(pr.seqs[b].seqlen_k) * (cfg.headdim + cfg.headdim_v) * cfg.element_size;
    ASSERT_TRUE(per == 1 || per * kv_bytes <= cfg.l2_bytes);
    ASSERT_EQ(per & (per - 1), 0) << "not a power of two: " << per;
    const int32_t kv0 = (s.tiles[lo].head / group) / per * per;
    int32_t max_cost = 0;
    std::set<int32_t> run_started;
    for (int64_t i = lo; i < hi; ++i) {
      const TileWork& t = s.tiles[i];
      ASSERT_EQ(t.batch, b);
      ASSERT_GE(t.head / group, kv0);
      ASSERT_LT(t.head / group, kv0 + per);
      max_cost = std::max(max_cost, t.num_n_blocks);
      if (i > lo && s.lpt) {
        ASSERT_LE(t.num_n_blocks, s.tiles[i - 1].num_n_blocks) << "tile " << i;
      }
      // Head varies fastest: the tiles of one m_block form ONE run of consecutive heads, so the
      // query heads of a kv head are adjacent.
      if (i > lo && s.tiles[i - 1].m_block == t.m_block) {
        ASSERT_EQ(t.head, s.tiles[i - 1].head + 1);
      } else {
        ASSERT_TRUE(run_started.insert(t.m_block).second) << "m_block " << t.m_block << " split";
      }
    }
    if (s.lpt) {
      ASSERT_LE(max_cost, prev_section_max) << "sections not in LPT order at " << k;
      prev_section_max = max_cost;
    }
  }
}

TileSchedulerConfig config(int32_t tile_m, int32_t tile_n, int64_t l2 = fa4::kDefaultL2Bytes) {
  TileSchedulerConfig c;
  c.tile_m = tile_m;
  c.tile_n = tile_n;
  c.headdim = 128;
  c.headdim_v = 128;
  c.element_size = 2;
  c.l2_bytes = l2;
  return c;
}

TEST(TileScheduler, DenseUniformIsPlainOrder) {
  const TileProblem pr = TileProblem::batched(2, 300, 500, 4, 2, kDense);
  const TileSchedulerConfig cfg = config(128, 64);
  const TileSchedule s = fa4::make_tile_schedule(pr, cfg);
  check_schedule(pr, cfg, s, true);
  EXPECT_FALSE(s.lpt);
  // Everything fits one section per sequence: order is (b, m ascending, h fastest).
  ASSERT_EQ(s.tiles.size(), 2u * 3u * 4u);
  size_t i = 0;
  for (int32_t b = 0; b < 2; ++b) {
    for (int32_t m = 0; m < 3; ++m) {
      for (int32_t h = 0; h < 4; ++h, ++i) {
        EXPECT_EQ(s.tiles[i].batch, b);
        EXPECT_EQ(s.tiles[i].m_block, m);
        EXPECT_EQ(s.tiles[i].head, h);
        EXPECT_EQ(s.tiles[i].num_n_blocks, 8);  // ceil(500 / 64)
      }
    }
  }
}

TEST(TileScheduler, CausalSquareIsLptWithTriangularCosts) {
  const TileProblem pr = TileProblem::batched(3, 1024, 1024, 8, 8, kCausal);
  const TileSchedulerConfig cfg = config(128, 128);
  const TileSchedule s = fa4::make_tile_schedule(pr, cfg);
  check_schedule(pr, cfg, s, false);
  EXPECT_TRUE(s.lpt);
  for (const TileWork& t : s.tiles) EXPECT_EQ(t.num_n_blocks, t.m_block + 1);
  EXPECT_EQ(s.tiles.front().m_block, 7);
  EXPECT_EQ(s.tiles.back().m_block, 0);
  EXPECT_EQ(s.section_offsets.size(), 3u + 1u);  // one section per sequence (K/V fits L2)
}

TEST(TileScheduler, CausalMoreQueriesThanKeysHasEmptyTilesLast) {
  // Bottom-right causal with seqlen_q > seqlen_k: queries i < 1000 - 300 see no key.
  const TileProblem pr = TileProblem::batched(2, 1000, 300, 4, 1, kCausal);
  const TileSchedulerConfig cfg = config(128, 64);
  const TileSchedule s = fa4::make_tile_schedule(pr, cfg);
  check_schedule(pr, cfg, s, true);
  // m_blocks 0..4 (rows < 640 < 700) are fully masked: 5 per (b, h).
  EXPECT_EQ(int64_t(s.tiles.size()) - s.num_work_tiles, 2 * 4 * 5);
  EXPECT_GT(s.num_work_tiles, 0);
}

TEST(TileScheduler, ZeroLengthSequences) {
  // (q, k): empty q -> no tiles; empty k -> only cost-0 tiles; and normal ones around them.
  const std::vector<int32_t> cu_q = {0, 0, 130, 130, 200, 330};
  const std::vector<int32_t> cu_k = {0, 50, 50, 50, 350, 350};
  for (MaskSpec mask : {kDense, kCausal, MaskSpec{16, 0}}) {
    const TileProblem pr = TileProblem::varlen(5, cu_q.data(), cu_k.data(), nullptr, 6, 3, mask);
    const TileSchedulerConfig cfg = config(64, 32);
    const TileSchedule s = fa4::make_tile_schedule(pr, cfg);
    check_schedule(pr, cfg, s, true);
    for (const TileWork& t : s.tiles) {
      EXPECT_NE(t.batch, 0);  // seqlen_q == 0
      EXPECT_NE(t.batch, 2);
      if (t.batch == 1 || t.batch == 4) {
        EXPECT_EQ(t.num_n_blocks, 0);  // seqlen_k == 0
      }
    }
    // Batch 1 (130 queries, 3 m_blocks) and batch 4 (130 queries) give 2 * 6 * 3 empty tiles.
    EXPECT_EQ(int64_t(s.tiles.size()) - s.num_work_tiles, 36);
  }
  // All empty: no work, only cost-0 tiles, one (empty-range) section list.
  const TileProblem none = TileProblem::batched(2, 100, 0, 2, 2, kDense);
  const TileSchedule s = fa4::make_tile_schedule(none, config(64, 64));
  check_schedule(none, config(64, 64), s, true);
  EXPECT_EQ(s.num_work_tiles, 0);
  EXPECT_EQ(s.tiles.size(), 2u * 2u * 2u);
  const TileProblem no_batch = TileProblem::batched(0, 100, 100, 2, 2, kDense);
  EXPECT_EQ(fa4::make_tile_schedule(no_batch, config(64, 64)).tiles.size(), 0u);
}

TEST(TileScheduler, SequsedKLimitsTheKeys) {
  const std::vector<int32_t> cu_q = {0, 256, 512};
  const std::vector<int32_t> cu_k = {0, 512, 1024};
  const std::vector<int32_t> used = {100, 0};
  const TileProblem pr =
      TileProblem::varlen(2, cu_q.data(), cu_k.data(), used.data(), 2, 2, kDense);
  EXPECT_EQ(pr.seqs[0].seqlen_k, 100);
  EXPECT_EQ(pr.seqs[1].seqlen_k, 0);
  const TileSchedulerConfig cfg = config(128, 64);
  const TileSchedule s = fa4::make_tile_schedule(pr, cfg);
  check_schedule(pr, cfg, s, true);
  for (const TileWork& t : s.tiles) EXPECT_EQ(t.num_n_blocks, t.batch == 0 ? 2 : 0);
}

TEST(TileScheduler, WindowsMatchThePredicate) {
  const std::vector<MaskSpec> masks = {{0, 0},  {-1, 5}, {3, -1}, {100, 0}, {0, 100},
                                       {64, 64}, {1, 1}, {200, 7}, {-1, 0}};
  const std::vector<std::pair<int32_t, int32_t>> lens = {{300, 300}, {300, 77}, {77, 300},
                                                          {1, 500},   {500, 1},  {129, 257}};
  for (const MaskSpec& mask : masks) {
    for (auto [sq, sk] : lens) {
      const TileProblem pr = TileProblem::batched(1, sq, sk, 2, 1, mask);
      for (auto [tm, tn] : {std::pair{64, 64}, {128, 32}, {48, 80}}) {
        const TileSchedulerConfig cfg = config(tm, tn);
        const TileSchedule s = fa4::make_tile_schedule(pr, cfg);
        check_schedule(pr, cfg, s, true);
        EXPECT_TRUE(s.lpt);
      }
    }
  }
}

TEST(TileScheduler, VarlenRandom) {
  std::random_device rd;
  const uint32_t seed = rd();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const int32_t batch = 1 + int32_t(rng() % 6);
    const int32_t hkv = 1 + int32_t(rng() % 4);
    const int32_t heads = hkv * (1 + int32_t(rng() % 3));
    std::vector<int32_t> cu_q{0}, cu_k{0}, used;
    for (int32_t b = 0; b < batch; ++b) {
      const int32_t lq = (rng() % 5 == 0) ? 0 : int32_t(rng() % 400);
      const int32_t lk = (rng() % 5 == 0) ? 0 : int32_t(rng() % 400);
      cu_q.push_back(cu_q.back() + lq);
      cu_k.push_back(cu_k.back() + lk);
      used.push_back(lk == 0 ? 0 : int32_t(rng() % (lk + 1)));
    }
    const int32_t wl = int32_t(rng() % 3 == 0 ? -1 : rng() % 300);
    const int32_t wr = int32_t(rng() % 3 == 0 ? -1 : rng() % 300);
    const MaskSpec mask{wl, wr};
    const bool use_seqused = rng() % 2;
    const TileProblem pr = TileProblem::varlen(
        batch, cu_q.data(), cu_k.data(), use_seqused ? used.data() : nullptr, heads, hkv, mask);
    // Small L2 so that sections split heads.
    const int32_t tile_m = 32 + 16 * int32_t(rng() % 4);
    const int32_t tile_n = 16 + 16 * int32_t(rng() % 4);
    const TileSchedulerConfig cfg = config(tile_m, tile_n, int64_t(1 + rng() % 4) * 100 * 512);
    const TileSchedule s = fa4::make_tile_schedule(pr, cfg);
    EXPECT_TRUE(s.lpt);
    check_schedule(pr, cfg, s, true);
    if (HasFatalFailure()) return;
  }
}

TEST(TileScheduler, L2SectionsGroupWholeGqaGroups) {
  // 8 kv heads x 2 query heads; seqlen_k 1024, d = dv = 128, bf16: 512 KiB of K+V per kv head.
  const TileProblem pr = TileProblem::batched(2, 512, 1024, 16, 8, kCausal);
  const int64_t per_head = 1024 * 256 * 2;
  struct Case { int64_t l2; int32_t per; };
  for (const Case c : {Case{per_head - 1, 1}, Case{per_head, 1}, Case{4 * per_head, 4},
                       Case{7 * per_head, 4}, Case{8 * per_head, 8}, Case{int64_t(1) << 40, 8}}) {
    const TileSchedulerConfig cfg = config(128, 128, c.l2);
    EXPECT_EQ(fa4::kv_heads_per_l2_section(1024, 8, cfg), c.per) << c.l2;
    for (TileOrder order : {TileOrder::kLpt, TileOrder::kPlain}) {
      TileSchedulerConfig oc = cfg;
      oc.order = order;
      const TileSchedule s = fa4::make_tile_schedule(pr, oc);
      check_schedule(pr, oc, s, false);
      EXPECT_EQ(s.section_offsets.size() - 1, size_t(2 * 8 / c.per));
      // Each section holds all query heads of its kv heads: c.per * 2 heads x 4 m_blocks.
      for (size_t k = 0; k + 1 < s.section_offsets.size(); ++k) {
        EXPECT_EQ(s.section_offsets[k + 1] - s.section_offsets[k], c.per * 2 * 4);
      }
    }
  }
  // num_heads_kv not a power of two: 6 kv heads, 4 per section -> sections of 4 and 2.
  const TileProblem six = TileProblem::batched(1, 256, 1024, 6, 6, kDense);
  const TileSchedulerConfig cfg = config(128, 128, 4 * per_head);
  const TileSchedule s = fa4::make_tile_schedule(six, cfg);
  check_schedule(six, cfg, s, false);
  ASSERT_EQ(s.section_offsets, (std::vector<int64_t>{0, 8, 12}));
}

TEST(TileScheduler, SimulateMakespan) {
  auto tiles = [](std::vector<int32_t> costs) {
    std::vector<TileWork> v;
    for (int32_t c : costs) v.push_back({0, 0, 0, c});
    return v;
  };
  EXPECT_DOUBLE_EQ(fa4::simulate_makespan(tiles({1, 1, 1, 1, 4}), 2), 6.0);
  EXPECT_DOUBLE_EQ(fa4::simulate_makespan(tiles({4, 1, 1, 1, 1}), 2), 4.0);
  // Overhead 0.5: worker 0 runs 4.5; worker 1 runs three 1.5s (4.5); the last tile ties -> 6.
  EXPECT_DOUBLE_EQ(fa4::simulate_makespan(tiles({4, 1, 1, 1, 1}), 2, 0.5), 6.0);
  EXPECT_DOUBLE_EQ(fa4::simulate_makespan(tiles({3, 3, 3}), 8), 3.0);
  EXPECT_DOUBLE_EQ(fa4::simulate_makespan(tiles({}), 8), 0.0);
  EXPECT_THROW(fa4::simulate_makespan(tiles({1}), 0), fa4::Error);
}

TEST(TileScheduler, LptBeatsPlainOnCausal) {
  struct Case { int32_t batch, heads, heads_kv, seqlen; int32_t workers; };
  const Case cases[] = {{1, 16, 16, 8192, kHopperSms}, {4, 32, 8, 2048, kHopperSms},
                        {2, 8, 8, 4096, kHopperSms},  {8, 16, 2, 1024, kHopperSms},
                        {1, 4, 4, 16384, 64},         {3, 12, 4, 3000, 16}};
  for (const Case& c : cases) {
    const TileProblem pr =
        TileProblem::batched(c.batch, c.seqlen, c.seqlen, c.heads, c.heads_kv, kCausal);
    TileSchedulerConfig cfg = config(128, 128);
    cfg.order = TileOrder::kLpt;
    const TileSchedule lpt = fa4::make_tile_schedule(pr, cfg);
    cfg.order = TileOrder::kPlain;
    const TileSchedule plain = fa4::make_tile_schedule(pr, cfg);
    check_schedule(pr, cfg, lpt, false);
    check_schedule(pr, cfg, plain, false);
    int32_t max_cost = 0;
    for (const TileWork& t : lpt.tiles) max_cost = std::max(max_cost, t.num_n_blocks);
    for (double overhead : {0.0, 1.0}) {
      const double a = fa4::simulate_makespan(lpt.tiles, c.workers, overhead);
      const double b = fa4::simulate_makespan(plain.tiles, c.workers, overhead);
      const double work = double(lpt.total_cost) + overhead * double(lpt.tiles.size());
      const double lower = std::max(work / c.workers, max_cost + overhead);
      std::printf("[sched] b%d h%d/%d s%d w%d ovh %.0f: LPT %.0f plain %.0f bound %.1f\n", c.batch,
                  c.heads, c.heads_kv, c.seqlen, c.workers, overhead, a, b, lower);
      EXPECT_LE(a, b);
      EXPECT_GE(a, lower);
      // Graham's list-scheduling bound holds for any order; LPT is expected to be much closer.
      EXPECT_LE(a, lower + max_cost + overhead);
    }
  }
}

TEST(TileScheduler, FromParamsMatchesFactories) {
  fa4::detail::FwdParams p;
  p.batch = 3;
  p.num_heads = 4;
  p.num_heads_kv = 2;
  p.seqlen_q = 100;
  p.seqlen_k = 200;
  p.mask = kCausal;
  TileProblem a = TileProblem::from_params(p);
  ASSERT_EQ(a.seqs.size(), 3u);
  EXPECT_FALSE(a.is_varlen);
  for (const SeqLens& s : a.seqs) EXPECT_EQ(std::pair(s.seqlen_q, s.seqlen_k), std::pair(100, 200));

  const std::vector<int32_t> cu_q = {0, 10, 10, 40}, cu_k = {0, 5, 25, 25}, used = {3, 20, 0};
  p.is_varlen = true;
  p.cu_seqlens_q = cu_q.data();
  p.cu_seqlens_k = cu_k.data();
  p.seqused_k = used.data();
  a = TileProblem::from_params(p);
  const TileProblem b =
      TileProblem::varlen(3, cu_q.data(), cu_k.data(), used.data(), 4, 2, kCausal);
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  EXPECT_TRUE(a.is_varlen);
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    EXPECT_EQ(a.seqs[i].seqlen_q, b.seqs[i].seqlen_q);
    EXPECT_EQ(a.seqs[i].seqlen_k, b.seqs[i].seqlen_k);
  }
}

TEST(TileScheduler, RejectsBadInput) {
  auto expect_invalid = [](auto&& fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning " << needle;
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), fa4::ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const TileProblem ok = TileProblem::batched(1, 10, 10, 4, 2, kDense);
  const TileSchedulerConfig cfg = config(64, 64);
  for (auto [field, name] : {std::pair{&TileSchedulerConfig::tile_m, "cfg.tile_m"},
                             {&TileSchedulerConfig::tile_n, "cfg.tile_n"},
                             {&TileSchedulerConfig::headdim, "cfg.headdim"},
                             {&TileSchedulerConfig::headdim_v, "cfg.headdim_v"},
                             {&TileSchedulerConfig::element_size, "cfg.element_size"}}) {
    TileSchedulerConfig bad = cfg;
    bad.*field = 0;
    expect_invalid([&] { fa4::make_tile_schedule(ok, bad); }, name);
  }
  TileSchedulerConfig bad_l2 = cfg;
  bad_l2.l2_bytes = 0;
  expect_invalid([&] { fa4::make_tile_schedule(ok, bad_l2); }, "cfg.l2_bytes");
  auto schedule = [&](int32_t sq, int32_t h, int32_t hkv) {
    fa4::make_tile_schedule(TileProblem::batched(1, sq, 10, h, hkv, kDense), cfg);
  };
  expect_invalid([&] { schedule(10, 4, 3); }, "multiple of problem.num_heads_kv");
  expect_invalid([&] { schedule(10, 4, 0); }, "problem.num_heads_kv");
  expect_invalid([&] { schedule(10, 0, 2); }, "problem.num_heads");
  expect_invalid([&] { schedule(-1, 4, 2); }, "non-negative");
  expect_invalid([&] { TileProblem::batched(-1, 10, 10, 4, 2, kDense); }, "batch");
  const std::vector<int32_t> cu_q = {0, 10, 5}, cu_k = {0, 10, 20}, used = {11, 0};
  expect_invalid([&] { TileProblem::varlen(2, cu_q.data(), cu_k.data(), nullptr, 4, 2, kDense); },
                 "cu_seqlens_q must be non-decreasing");
  expect_invalid(
      [&] { TileProblem::varlen(2, cu_k.data(), cu_k.data(), used.data(), 4, 2, kDense); },
      "seqused_k[0] = 11");
  expect_invalid([&] { TileProblem::varlen(2, nullptr, cu_k.data(), nullptr, 4, 2, kDense); },
                 "cu_seqlens_q");
}

}  // namespace
