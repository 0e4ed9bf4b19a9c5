// tests/cpu/test_hopper_host.cpp — host-side checks of the Hopper kernels' tile logic (no GPU
// needed, so these run in CI): the persistent tile orders visit every tile exactly once, the
// per-tile key-block range / "needs element mask" decision and the backward's query-block range
// agree with core/mask.h, the backward's workspace chunks never overlap, and its dQ staging order
// is a bijection that the postprocess reads back as the wgmma fragment map. The decode kernel's
// launch rules: test_hopper_host_decode.cpp.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <algorithm>
#include <random>

#include "common/overrides.h"
#include "core/mask.h"
#include "core/pack_gqa.h"
#include "fa4/error.h"
#include "hopper/bwd/schedule_bwd.h"
#include "hopper/bwd/tuning_bwd.h"
#include "hopper/fwd/launch_fwd.h"
#include "hopper/shared/launch_context.h"
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

// Backward: every tile once over all CTAs, each CTA's tiles increasing and a head's key blocks in
// increasing tile order (the deterministic mode's no-deadlock argument), the coordinates a
// permutation of (key block, kv head, sequence), and under lpt band after band (the longest,
// first key blocks first).
TEST(HopperHost, BackwardTileOrderIsAPermutation) {
  for (bool lpt : {false, true})
    for (int band : {1, 2, 3, 8, 16, 100})
    for (int n : {1, 3, 64})
      for (int hkv : {1, 8})
        for (int b : {1, 3})
          for (int grid : {1, 7, 132}) {
            if (!lpt && band > 1) continue;  // the band only shapes the lpt order
            if (lpt) {  // in tile order, the bands' indices never decrease
              int prev_band = 0;
              for (int t = 0; t < n * hkv * b; ++t) {
                const int k = fa4::hopper::bwd_tile_coord(t, n, hkv, b, true, band).n_block / band;
                EXPECT_GE(k, prev_band) << "tile " << t << " band " << band << " n " << n;
                prev_band = k;
              }
            }
            const int tiles = n * hkv * b;
            std::vector<int> hits(tiles, 0);
            std::set<std::tuple<int, int, int>> coords;
            std::vector<int> index_of(tiles, -1);  // by (b, h_kv, n_block)
            for (int cta = 0; cta < std::min(grid, tiles); ++cta) {
              int prev = -1;
              for (int i = 0;; ++i) {
                const int t = fa4::hopper::bwd_tile_index(i, cta, std::min(grid, tiles), lpt);
                if (t >= tiles) break;
                ASSERT_GT(t, prev);
                prev = t;
                ++hits[t];
                const auto c = fa4::hopper::bwd_tile_coord(t, n, hkv, b, lpt, band);
                ASSERT_TRUE(c.n_block >= 0 && c.n_block < n && c.h_kv >= 0 && c.h_kv < hkv && c.b >= 0 && c.b < b);
                coords.insert({c.n_block, c.h_kv, c.b});
                index_of[(c.b * hkv + c.h_kv) * n + c.n_block] = t;
              }
            }
            for (int t = 0; t < tiles; ++t) EXPECT_EQ(hits[t], 1) << "tile " << t << " lpt " << lpt << " grid " << grid;
            EXPECT_EQ(int(coords.size()), tiles);
            for (int bh = 0; bh < hkv * b; ++bh)
              for (int k = 1; k < n; ++k) {
                EXPECT_LT(index_of[bh * n + k - 1], index_of[bh * n + k]) << "band " << band << " head " << bh;
                // lpt: a band's key blocks of one head are consecutive tiles (handed out together)
                if (lpt && k % band != 0) EXPECT_EQ(index_of[bh * n + k], index_of[bh * n + k - 1] + 1);
              }
          }
}

// Every value of `bad` for the integer override `name` is refused with kInvalidArgument, the error
// naming the knob and its range (1..64 unless `range` says otherwise), and leaves the knob's value
// (get()) as it was.
template <class Get>
void expect_int_override_refused(const char* name, std::initializer_list<const char*> bad, Get get,
                                 const char* range = "1..64") {
  const int32_t before = get();
  for (const char* value : bad) {
    try {
      fa4::detail::set_kernel_override(name, value);
      ADD_FAILURE() << name << " accepted '" << value << "'";
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), fa4::ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(range), std::string::npos) << e.what();
    }
    EXPECT_EQ(get(), before) << name << " = '" << value << "'";
  }
}

// The backward's order overrides: bwd_lpt_band 1..64 or auto (0: the selector's), bwd_walk asc,
// desc or auto; anything else is a clear error naming the rule, and leaves the value as it was.
TEST(HopperHost, BackwardOrderOverrides) {
  using fa4::detail::kernel_overrides;
  using fa4::detail::set_kernel_override;
  set_kernel_override("bwd_lpt_band", "4");
  EXPECT_EQ(kernel_overrides().bwd_lpt_band, 4);
  expect_int_override_refused("bwd_lpt_band", {"0", "65", "-1", "4x", "", "x"},
                              [] { return kernel_overrides().bwd_lpt_band; });
  EXPECT_EQ(kernel_overrides().bwd_lpt_band, 4);
  set_kernel_override("bwd_lpt_band", "64");
  EXPECT_EQ(kernel_overrides().bwd_lpt_band, 64);
  set_kernel_override("bwd_lpt_band", "auto");
  EXPECT_EQ(kernel_overrides().bwd_lpt_band, 0);

  set_kernel_override("bwd_walk", "desc");
  EXPECT_EQ(kernel_overrides().bwd_descending, 1);
  set_kernel_override("bwd_walk", "asc");
  EXPECT_EQ(kernel_overrides().bwd_descending, 0);
  for (const char* bad : {"1", "down", ""}) {
    EXPECT_THROW(set_kernel_override("bwd_walk", bad), fa4::Error) << bad;
    EXPECT_EQ(kernel_overrides().bwd_descending, 0) << bad;
  }
  set_kernel_override("bwd_walk", "auto");
  EXPECT_EQ(kernel_overrides().bwd_descending, -1);
}

// stream_k_min_share: 1..64 or auto (0: the cost model alone), with bwd_lpt_band's errors.
TEST(HopperHost, StreamKMinShareOverride) {
  using fa4::detail::kernel_overrides;
  using fa4::detail::set_kernel_override;
  set_kernel_override("stream_k_min_share", "2");
  EXPECT_EQ(kernel_overrides().stream_k_min_share, 2);
  expect_int_override_refused("stream_k_min_share", {"0", "65", "-2", "2.5", ""},
                              [] { return kernel_overrides().stream_k_min_share; });
  EXPECT_EQ(kernel_overrides().stream_k_min_share, 2);
  set_kernel_override("stream_k_min_share", "auto");
  EXPECT_EQ(kernel_overrides().stream_k_min_share, 0);
}

// decode_append_delay_us: 1..1000 microseconds or auto (0: no delay), with the integer knobs' errors.
TEST(HopperHost, DecodeAppendDelayOverride) {
  using fa4::detail::kernel_overrides;
  using fa4::detail::set_kernel_override;
  EXPECT_EQ(kernel_overrides().decode_append_delay_us, 0);
  set_kernel_override("decode_append_delay_us", "1000");
  EXPECT_EQ(kernel_overrides().decode_append_delay_us, 1000);
  expect_int_override_refused("decode_append_delay_us", {"0", "1001", "-5", "1e3", ""},
                              [] { return kernel_overrides().decode_append_delay_us; }, "1..1000");
  EXPECT_EQ(kernel_overrides().decode_append_delay_us, 1000);
  set_kernel_override("decode_append_delay_us", "auto");
  EXPECT_EQ(kernel_overrides().decode_append_delay_us, 0);
}

// The backward's order: masked / varlen problems and deterministic mode longest first in the
// row's bands and walk; other dense problems key block fastest, ascending; each override wins.
TEST(HopperHost, BackwardOrderChoice) {
  using fa4::detail::bwd_order;
  using fa4::detail::KernelOverrides;
  const fa4::detail::HopperBwdConfig row{128, 128, 64, 128, 2, 2, 1, 1, 8, {16, 0}, 232, 40, 16, 8, true, false, true};
  const KernelOverrides none;
  for (bool masked : {false, true})
    for (bool varlen : {false, true})
      for (bool det : {false, true}) {
        const bool lpt = masked || varlen || det;
        const auto r = bwd_order(row, masked, varlen, det, none);
        EXPECT_EQ(r.lpt, lpt);
        EXPECT_EQ(r.band, det ? 8 : 16);  // deterministic mode: the row's shorter chains
        EXPECT_EQ(r.descending, lpt);  // dense problems walk up (all key blocks together either way)
        EXPECT_EQ(r.dynamic, masked && !varlen);  // greedy claims where tiles differ, not varlen's empty ones
      }
  // The shipped rows: bands of 16, descending, for every bucket; deterministic bands of 8.
  for (const fa4::detail::HopperBwdConfig& c : fa4::detail::kHopperBwdConfigs) {
    const auto r = bwd_order(c, true, false, false, none);
    EXPECT_TRUE(r.lpt && r.descending && r.band == 16) << c.headdim << "x" << c.headdim_v;
    const auto rd = bwd_order(c, false, false, true, none);
    EXPECT_TRUE(rd.lpt && rd.descending && rd.band == 8) << c.headdim << "x" << c.headdim_v;
  }
  fa4::detail::HopperBwdConfig asc_row = row;
  asc_row.walk_descending = false;
  asc_row.lpt_band = 3;
  EXPECT_FALSE(bwd_order(asc_row, true, false, false, none).descending);
  EXPECT_EQ(bwd_order(asc_row, true, false, false, none).band, 3);
  KernelOverrides o;
  o.bwd_lpt_band = 5;
  o.bwd_descending = 1;
  o.lpt = 0;
  for (bool det : {false, true}) {
    const auto r = bwd_order(row, true, false, det, o);
    EXPECT_FALSE(r.lpt);
    EXPECT_EQ(r.band, 5);
    EXPECT_TRUE(r.descending);
  }
  o.bwd_descending = 0;
  EXPECT_FALSE(bwd_order(row, true, false, false, o).descending);
  o.dynamic_schedule = 0;
  EXPECT_FALSE(bwd_order(row, true, false, false, o).dynamic);
  o.dynamic_schedule = 1;
  EXPECT_TRUE(bwd_order(row, false, true, false, o).dynamic);
  // A row without tile claims has no claiming code: static, whatever the override says.
  fa4::detail::HopperBwdConfig no_claims = row;
  no_claims.tile_claims = false;
  EXPECT_FALSE(bwd_order(no_claims, false, true, false, o).dynamic);
  EXPECT_FALSE(bwd_order(no_claims, true, false, false, none).dynamic);
  // The shipped rows: claims everywhere but 192 x 128 (slower with the ring).
  for (const fa4::detail::HopperBwdConfig& c : fa4::detail::kHopperBwdConfigs)
    EXPECT_EQ(c.tile_claims, !(c.headdim == 192 && c.headdim_v == 128)) << c.headdim << "x" << c.headdim_v;
}

// The backward's buckets: an input runs on the smallest row that holds both head dims (padded);
// above 128 those are the 192 x 128, d192 and d256 rows, whose warpgroups share the keys
// (tuning_bwd.h shared_keys).
TEST(HopperHost, BackwardBuckets) {
  using fa4::detail::hopper_bwd_bucket;
  struct Want {
    int d, dv, row_d, row_dv;
  };
  for (const Want w : {Want{8, 8, 64, 64}, Want{64, 64, 64, 64}, Want{40, 64, 64, 64}, Want{72, 72, 128, 128},
                       Want{64, 128, 128, 128}, Want{128, 128, 128, 128}, Want{136, 136, 192, 192},
                       Want{136, 128, 192, 128}, Want{192, 128, 192, 128}, Want{192, 96, 192, 128},
                       Want{192, 192, 192, 192}, Want{192, 160, 192, 192}, Want{200, 128, 256, 256},
                       Want{128, 256, 256, 256}, Want{256, 256, 256, 256}}) {
    const fa4::detail::HopperBwdConfig* c = hopper_bwd_bucket(w.d, w.dv);
    ASSERT_NE(c, nullptr) << w.d << "x" << w.dv;
    EXPECT_EQ(c->headdim, w.row_d) << w.d << "x" << w.dv;
    EXPECT_EQ(c->headdim_v, w.row_dv) << w.d << "x" << w.dv;
    EXPECT_EQ(c->shared_keys, w.row_d > 128) << w.d << "x" << w.dv;
    EXPECT_EQ(c->tile_n, c->shared_keys ? 64 : 128) << w.d << "x" << w.dv;
  }
  EXPECT_EQ(hopper_bwd_bucket(264, 264), nullptr);
}

// A walk visits every query block of [m_lo, m_hi) once: from the last down or from the first up.
TEST(HopperHost, BackwardWalkVisitsEveryBlockOnce) {
  for (int lo : {0, 3})
    for (int hi : {lo + 1, lo + 2, lo + 17})
      for (bool desc : {false, true}) {
        const fa4::hopper::QueryBlocks m{lo, hi};
        std::vector<int> seen;
        for (int s = 0; s < hi - lo; ++s) seen.push_back(fa4::hopper::bwd_step_block(m, desc, s));
        std::vector<int> want;
        for (int b = lo; b < hi; ++b) want.push_back(b);
        if (desc) std::reverse(want.begin(), want.end());
        EXPECT_EQ(seen, want) << lo << " " << hi << " " << desc;
      }
}

// Backward: a key block visits every query block holding a query that sees one of its keys.
template <int kM>
void check_query_blocks_cover() {
  using fa4::detail::MaskSpec;
  constexpr int kN = 128;
  const MaskSpec masks[] = {{-1, -1}, {-1, 0}, {0, 0}, {5, 3}, {200, -1}, {-1, 40}, {0, -1}, {130, 0}};
  for (const MaskSpec& mk : masks)
    for (int sq : {1, 63, 64, 130, 300})
      for (int sk : {0, 1, 127, 129, 400}) {
        for (int n = 0; n * kN < sk + kN; ++n) {
          const auto qb = fa4::hopper::query_blocks<kM, kN>(n, sq, sk, mk);
          for (int m = 0; m * kM < sq; ++m) {
            bool any = false;
            for (int i = m * kM; i < std::min((m + 1) * kM, sq) && !any; ++i)
              for (int j = n * kN; j < (n + 1) * kN && !any; ++j) any = fa4::detail::key_visible(i, j, sq, sk, mk);
            if (any) EXPECT_TRUE(m >= qb.m_lo && m < qb.m_hi) << "n " << n << " m " << m << " sq " << sq << " sk " << sk;
          }
          EXPECT_LE(qb.m_hi, (sq + kM - 1) / kM);
          if (n * kN >= sk) EXPECT_EQ(qb.m_hi, qb.m_lo);
        }
      }
}
TEST(HopperHost, BackwardQueryBlocksCoverThePredicate) {
  check_query_blocks_cover<64>();
  check_query_blocks_cover<128>();  // the d64 row's tile_m
}

// Backward: the consumers' dense steps (no per-pair mask) are exactly the query blocks (of 64 or
// 128 rows) whose every query sees every key of the CTA's 128 keys (and, as the helper is generic,
// of any 64), under every mask, length pair and tail.
template <int kM, int kKeys>
int check_dense_query_blocks() {
  using fa4::detail::MaskSpec;
  const MaskSpec masks[] = {{-1, -1}, {-1, 0}, {0, 0}, {5, 3}, {200, -1}, {-1, 40}, {0, -1}, {130, 0}, {64, 64}};
  int dense_seen = 0;
  for (const MaskSpec& mk : masks)
    for (int sq : {1, 63, 64, 130, 300, 512})
      for (int sk : {0, 1, 63, 64, 100, 129, 400, 512})
        for (int key0 = 0; key0 < sk + kKeys; key0 += kKeys) {
          const auto d = fa4::hopper::dense_query_blocks<kM, kKeys>(key0, sq, sk, mk);
          for (int m = 0; m * kM < sq + kM; ++m) {
            bool all = (m + 1) * kM <= sq && key0 + kKeys <= sk;
            for (int i = m * kM; i < (m + 1) * kM && all; ++i)
              for (int j = key0; j < key0 + kKeys && all; ++j) all = fa4::detail::key_visible(i, j, sq, sk, mk);
            EXPECT_EQ(all, m >= d.m_lo && m < d.m_hi)
                << kKeys << " keys from " << key0 << " m " << m << " sq " << sq << " sk " << sk << " mask "
                << mk.window_left << "," << mk.window_right;
            dense_seen += all;
          }
        }
  return dense_seen;
}
TEST(HopperHost, BackwardDenseQueryBlocksAreExactlyTheFullyVisibleOnes) {
  // The cases above include many dense steps, not only masked ones.
  EXPECT_GT((check_dense_query_blocks<64, 128>()), 50);
  EXPECT_GT((check_dense_query_blocks<64, 64>()), 100);
  EXPECT_GT((check_dense_query_blocks<128, 128>()), 20);  // the d64 row's tile_m
}

// At the row limit (launch_context.h kMaxRows) the int32 tile arithmetic (a block's first index
// plus its extent) still agrees with the predicate: the forward's key range and mask decision for
// the last query block, and the backward's query blocks of the last key block, for the tables'
// tile sizes, with full and partial last blocks.
template <int kM, int kN>
void check_row_limit_arithmetic() {
  using fa4::detail::MaskSpec;
  const MaskSpec masks[] = {{-1, -1}, {-1, 0}, {5, 3}, {0, -1}};
  const int32_t max_rows = int32_t(fa4::hopper::kMaxRows);
  // A block past the last row must stay inside int32 (else the sums below would overflow).
  ASSERT_LE(int64_t(max_rows) - 1 + 2 * std::max(kM, kN), int64_t(INT32_MAX));
  for (const MaskSpec& mk : masks)
    for (int32_t sq : {max_rows, max_rows - 37, 300})
      for (int32_t sk : {max_rows, max_rows - 61}) {
        const int32_t m_last = (sq - 1) / kM, n_last = (sk - 1) / kN;
        const int32_t row_lo = m_last * kM, row_hi = std::min(row_lo + kM, sq) - 1;  // as make_tile_info
        const auto kr = fa4::hopper::TileKeyRange::make(row_lo, row_hi, sq, sk, mk, kN);
        bool last_pair_sees = false;
        for (int32_t n = n_last - 1; n <= n_last; ++n) {
          bool any = false, all = true;
          for (int64_t i = row_lo; i <= row_hi; ++i)
            for (int64_t j = int64_t(n) * kN; j < int64_t(n + 1) * kN; ++j) {
              const bool v = fa4::detail::key_visible(i, j, sq, sk, mk);
              any |= v;
              all &= v;
            }
          const bool in_range = n >= kr.n_block_min && n < kr.n_block_max;
          if (any) EXPECT_TRUE(in_range) << kM << "x" << kN << " block " << n << " sq " << sq << " sk " << sk;
          if (in_range && !all)
            EXPECT_TRUE(kr.needs_mask(n, kN))
                << kM << "x" << kN << " block " << n << " sq " << sq << " sk " << sk;
          if (n == n_last) last_pair_sees = any;
        }
        const auto qb = fa4::hopper::query_blocks<kM, kN>(n_last, sq, sk, mk);
        EXPECT_GE(qb.m_lo, 0);
        EXPECT_LE(qb.m_hi, m_last + 1);
        if (last_pair_sees)
          EXPECT_TRUE(m_last >= qb.m_lo && m_last < qb.m_hi)
              << kM << "x" << kN << " sq " << sq << " sk " << sk;
      }
}
TEST(HopperHost, TileArithmeticAtTheRowLimit) {
  check_row_limit_arithmetic<192, 128>();  // forward d64
  check_row_limit_arithmetic<128, 96>();   // forward d192
  check_row_limit_arithmetic<128, 80>();   // forward d256
  check_row_limit_arithmetic<64, 128>();   // backward d128
  check_row_limit_arithmetic<128, 128>();  // backward d64, forward d128
  check_row_limit_arithmetic<64, 64>();    // backward d256
}

// Backward workspace: varlen sequences' chunk ranges are disjoint and inside bwd_num_chunks.
template <int kM>
void check_chunks_disjoint() {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + int(rng() % 9);
    std::vector<int> cu{0};
    for (int b = 0; b < batch; ++b) cu.push_back(cu.back() + int(rng() % 3 == 0 ? 0 : rng() % 300));
    const int64_t total = cu.back(), chunks = fa4::hopper::bwd_num_chunks<kM>(true, batch, total, 0);
    std::vector<int> owner(size_t(chunks), -1);
    for (int b = 0; b < batch; ++b) {
      const int base = fa4::hopper::bwd_chunk_base<kM>(true, b, cu[b], 0);
      for (int m = 0; m * kM < cu[b + 1] - cu[b]; ++m) {
        ASSERT_LT(base + m, chunks);
        EXPECT_EQ(owner[size_t(base + m)], -1) << "chunk " << base + m << " shared by " << owner[size_t(base + m)] << " and " << b;
        owner[size_t(base + m)] = b;
      }
    }
  }
}
TEST(HopperHost, BackwardChunksNeverOverlap) {
  check_chunks_disjoint<64>();
  check_chunks_disjoint<128>();  // the d64 row's tile_m
}

// Backward dQ staging: (warpgroup, column group, thread, value) -> offset covers the kM x d chunk
// exactly once, and the postprocess's reading of an offset (dq_part_origin plus the wgmma fragment
// map) covers every (row, column) of the chunk once.
template <int kM, int kD>
void check_dq_staging() {
  constexpr int kGroups = fa4::hopper::kDqGroupsPerPart<kM, kD>;
  static_assert(2 * kGroups * 512 == kM * kD, "two halves of 512-float groups");
  std::vector<int> seen(kM * kD, 0);
  std::set<std::pair<int, int>> cells;
  for (int wg = 0; wg < 2; ++wg) {
    const fa4::hopper::DqPartOrigin o = fa4::hopper::dq_part_origin<kM, kD>(wg);
    for (int g = 0; g < kGroups; ++g)
      for (int t = 0; t < 128; ++t)
        for (int e = 0; e < 4; ++e) {
          const int off = fa4::hopper::dq_chunk_index<kM, kD>(wg, g, t) + e;
          ASSERT_GE(off, 0);
          ASSERT_LT(off, kM * kD);
          ++seen[size_t(off)];
          // The accumulator value v = 4g + e of thread t (src/hopper/shared/softmax.cuh's map):
          const int v = 4 * g + e;
          const int row = o.row + 16 * (t / 32) + (t % 32) / 4 + 8 * ((v / 2) % 2);
          const int col = o.col + 8 * (v / 4) + 2 * (t % 4) + (v % 2);
          ASSERT_LT(row, kM);
          ASSERT_LT(col, kD);
          cells.insert({row, col});
        }
  }
  for (int i = 0; i < kM * kD; ++i) EXPECT_EQ(seen[size_t(i)], 1) << "offset " << i;
  EXPECT_EQ(int(cells.size()), kM * kD);
}
TEST(HopperHost, BackwardDqStagingIsABijection) {
  check_dq_staging<64, 64>();
  check_dq_staging<64, 128>();
  check_dq_staging<64, 256>();
  check_dq_staging<128, 64>();
  check_dq_staging<128, 128>();
}

}  // namespace

// The forward's query rows per (sequence, head): varlen's max_seqlen_q bounded by the packed rows,
// so a loose bound (INT32_MAX) neither overflows the block count nor adds empty tiles.
TEST(HopperHost, ForwardQueryRows) {
  fa4::detail::FwdParams p;
  p.seqlen_q = 300;
  EXPECT_EQ(fa4::hopper::fwd_query_rows(p), 300);
  p.is_varlen = true;
  p.seqlen_q = INT32_MAX;
  p.total_q = 1000;
  EXPECT_EQ(fa4::hopper::fwd_query_rows(p), 1000);
  p.seqlen_q = 200;
  EXPECT_EQ(fa4::hopper::fwd_query_rows(p), 200);
}

// Pack-GQA's row map (core/pack_gqa.h packed_row) as the forward's tiles use it (tile_info.cuh
// tile_row: a tile's packed rows from its first token on, tile_m / group tokens per tile): over the
// m-blocks of a KV head's tiles, every (token, query head of its group) pair is exactly one tile
// row, the tokens of a tile are consecutive and the heads of a token adjacent (the TMA box order:
// heads fastest), and each row is the one the decode kernel's map gives the same packed row
// counted from token 0.
TEST(HopperHost, PackedRowsCoverTheGroupOnce) {
  for (int32_t tile_m : {128, 192})
    for (int32_t group : {2, 3, 4, 6, 8, 16, 32, 64, 128}) {
      if (tile_m % group != 0) continue;
      const int32_t seqlen_q = 77, per_tile = tile_m / group;
      const int32_t m_blocks = (seqlen_q + per_tile - 1) / per_tile;
      for (int32_t kv_head : {0, 3}) {
        std::set<std::pair<int32_t, int32_t>> seen;
        for (int32_t m = 0; m < m_blocks; ++m)
          for (int32_t row = 0; row < tile_m; ++row) {
            fa4::detail::RowCoord c = fa4::detail::packed_row(row, kv_head, group);
            c.query += m * per_tile;
            ASSERT_EQ(c.query, m * per_tile + row / group);
            ASSERT_EQ(c.head - kv_head * group, row % group) << "the group's heads are fastest";
            const fa4::detail::RowCoord whole = fa4::detail::packed_row(m * tile_m + row, kv_head, group);
            ASSERT_EQ(whole.query, c.query);
            ASSERT_EQ(whole.head, c.head);
            if (c.query < seqlen_q) ASSERT_TRUE(seen.insert({c.query, c.head}).second) << "row " << row;
          }
        EXPECT_EQ(int32_t(seen.size()), seqlen_q * group) << "tile_m " << tile_m << " group " << group;
        for (const auto& [q, h] : seen) ASSERT_EQ(h / group, kv_head);
      }
    }
}

// When the forward packs a GQA group (fwd_packs_gqa): only on a gathering kernel (the only ones
// compiled with pack-GQA), a group of 2 or more that divides the row tile; by default only where
// measured faster (a row with pack_gqa_gather) for chunks filling at most half a row tile; the
// override forces it off, or on wherever it fits on a gathering kernel. The tuning table: d128 only.
TEST(HopperHost, ForwardPackGqaRule) {
  using fa4::hopper::fwd_pack_gqa_fits;
  using fa4::hopper::fwd_packs_gqa;
  EXPECT_FALSE(fwd_pack_gqa_fits(128, 8, 8));   // no group
  EXPECT_TRUE(fwd_pack_gqa_fits(128, 32, 8));   // 4
  EXPECT_FALSE(fwd_pack_gqa_fits(128, 28, 4));  // 7 does not divide 128
  EXPECT_TRUE(fwd_pack_gqa_fits(192, 24, 4));   // 6 divides 192
  EXPECT_FALSE(fwd_pack_gqa_fits(128, 30, 8));  // not a whole group
  EXPECT_FALSE(fwd_pack_gqa_fits(128, 8, 0));
  // fwd_packs_gqa(tile_m, tokens, heads, heads_kv, gathers, measured_gain[, forced])
  EXPECT_TRUE(fwd_packs_gqa(128, 64, 32, 8, true, true));     // half a tile
  EXPECT_TRUE(fwd_packs_gqa(128, 1, 32, 8, true, true));
  EXPECT_FALSE(fwd_packs_gqa(128, 65, 32, 8, true, true));    // more than half
  EXPECT_FALSE(fwd_packs_gqa(128, 4096, 32, 8, true, true));
  EXPECT_FALSE(fwd_packs_gqa(128, 64, 32, 8, true, false));   // not measured faster there
  EXPECT_TRUE(fwd_packs_gqa(192, 96, 24, 4, true, true));
  EXPECT_FALSE(fwd_packs_gqa(128, 64, 28, 4, true, true));    // group 7: no packing, even forced
  EXPECT_FALSE(fwd_packs_gqa(128, 64, 28, 4, true, true, 1));
  EXPECT_FALSE(fwd_packs_gqa(128, 64, 32, 8, true, true, 0));
  EXPECT_TRUE(fwd_packs_gqa(128, 4096, 32, 8, true, false, 1));
  EXPECT_FALSE(fwd_packs_gqa(128, 0, 32, 8, true, true, 1));  // no rows
  EXPECT_FALSE(fwd_packs_gqa(128, 64, 32, 8, false, true));   // a TMA-box kernel: never, even forced
  EXPECT_FALSE(fwd_packs_gqa(128, 64, 32, 8, false, true, 1));
  for (const auto& c : fa4::detail::kHopperFwdConfigs)
    EXPECT_EQ(c.pack_gqa_gather, c.headdim == 128 && c.headdim_v == 128) << c.headdim << "x" << c.headdim_v;
  // The override's knob: "0" / "1" / "auto".
  using fa4::detail::kernel_overrides;
  using fa4::detail::set_kernel_override;
  EXPECT_EQ(kernel_overrides().pack_gqa, -1);
  set_kernel_override("pack_gqa", "1");
  EXPECT_EQ(kernel_overrides().pack_gqa, 1);
  EXPECT_THROW(set_kernel_override("pack_gqa", "yes"), fa4::Error);
  set_kernel_override("pack_gqa", "0");
  EXPECT_EQ(kernel_overrides().pack_gqa, 0);
  set_kernel_override("pack_gqa", "auto");
  EXPECT_EQ(kernel_overrides().pack_gqa, -1);
}

// How the forward loads a paged cache (fwd_paged_load): whole key blocks per page through TMA
// boxes; other powers of two from 8 rows gathered (a group of 8 keys, starting at a multiple of 8,
// must lie in one page: checked here for every key of every such page size); anything else, the
// decode kernel. Against every key tile of the forward's tuning rows.
TEST(HopperHost, PagedForwardLoad) {
  using fa4::hopper::FwdPagedLoad;
  using fa4::hopper::fwd_paged_load;
  std::set<int32_t> tiles;
  for (const auto& c : fa4::detail::kHopperFwdConfigs) tiles.insert(c.tile_n);
  EXPECT_EQ(tiles, (std::set<int32_t>{80, 96, 128}));
  for (int32_t tile_n : tiles) {
    SCOPED_TRACE("tile_n " + std::to_string(tile_n));
    for (int32_t page = -1; page <= 1024; ++page) {
      const FwdPagedLoad want = page > 0 && page % tile_n == 0                           ? FwdPagedLoad::kTmaBox
                                : page >= 8 && (page & (page - 1)) == 0                  ? FwdPagedLoad::kGather
                                                                                          : FwdPagedLoad::kNone;
      ASSERT_EQ(fwd_paged_load(page, tile_n), want) << "page_size " << page;
      if (want != FwdPagedLoad::kGather) continue;
      EXPECT_EQ(tile_n % fa4::hopper::kFwdGatherGroup, 0);
      for (int32_t key = 0; key < 4 * page; key += fa4::hopper::kFwdGatherGroup)  // one page per group
        ASSERT_EQ(key / page, (key + fa4::hopper::kFwdGatherGroup - 1) / page) << "key " << key;
    }
  }
  EXPECT_EQ(fwd_paged_load(16, 0), FwdPagedLoad::kNone);
}

// Where the forward's stream-K split may cut the tiles (fwd_key_split_eligible): planned at all of
// the key blocks, so every tile's visible blocks must be a prefix of them (no left window edge),
// batched; with a right edge and several query tiles per head, only where the first (shortest)
// tile sees at least half of them. Checked against each tile's TileKeyRange.
TEST(HopperHost, ForwardKeySplitEligibility) {
  using fa4::detail::MaskSpec;
  auto tile_ranges_allow = [](const fa4::detail::FwdParams& p, int32_t tile_m, int32_t tile_n) {
    if (p.is_varlen || p.seqlen_k <= 0) return false;
    const int32_t blocks = (p.seqlen_k + tile_n - 1) / tile_n;
    const int32_t m_blocks = (p.seqlen_q + tile_m - 1) / tile_m;
    int32_t least = blocks;
    for (int32_t t = 0; t < m_blocks; ++t) {
      const int32_t lo = t * tile_m, hi = std::min(p.seqlen_q, lo + tile_m) - 1;
      const fa4::hopper::TileKeyRange r =
          fa4::hopper::TileKeyRange::make(lo, hi, p.seqlen_q, p.seqlen_k, p.mask, tile_n);
      if (r.n_block_max > r.n_block_min) EXPECT_EQ(r.n_block_min, 0);  // (no left edge) a prefix
      EXPECT_LE(r.n_block_max, blocks);
      least = std::min(least, r.n_block_max > r.n_block_min ? r.n_block_max : 0);
    }
    return m_blocks == 1 || 2 * least >= blocks;
  };
  int eligible = 0, cases = 0;
  for (int32_t tile_m : {128, 192})
    for (int32_t tile_n : {80, 128})
      for (int32_t sq : {1, 100, 128, 129, 300, 700, 1000, 4096})
        for (int32_t sk : {0, 1, 500, 1200, 4096})
          for (int32_t wl : {-1, 0, 100})
            for (int32_t wr : {-1, 0, 10}) {
              fa4::detail::FwdParams p;
              p.seqlen_q = sq;
              p.seqlen_k = sk;
              p.mask = MaskSpec{wl, wr};
              const int64_t m_blocks = (sq + tile_m - 1) / tile_m;
              const bool got = fa4::hopper::fwd_key_split_eligible(p, m_blocks, tile_m, tile_n);
              // A left window edge is refused (even where it cuts no tile's keys); without one,
              // the split is allowed where every tile's blocks are a prefix and the first sees
              // at least half of them.
              if (wl >= 0) EXPECT_FALSE(got);
              else EXPECT_EQ(got, tile_ranges_allow(p, tile_m, tile_n))
                  << "tile " << tile_m << "x" << tile_n << " sq " << sq << " sk " << sk << " window " << wl << ","
                  << wr;
              eligible += got;
              ++cases;
              p.is_varlen = true;
              EXPECT_FALSE(fa4::hopper::fwd_key_split_eligible(p, m_blocks, tile_m, tile_n));
            }
  // The predicate is neither always nor never true over these cases (nor is either check).
  EXPECT_GT(eligible, 0);
  EXPECT_LT(eligible, cases);
}
