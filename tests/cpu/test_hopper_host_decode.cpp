// tests/cpu/test_hopper_host_decode.cpp — host-side checks of the Hopper decode kernel's launch
// rules (no GPU needed, so these run in CI): the cluster size of a tile's splits, the automatic
// split count, the row tile and its 8-warp form, each with its override, and the small-query route
// of the forward against a forward that splits its keys. The tile logic of the forward and backward:
// test_hopper_host.cpp.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/overrides.h"
#include "core/stream_k.h"
#include "fa4/error.h"
#include "hopper/decode/launch_decode.h"
#include "hopper/fwd/tuning_fwd.h"

// The decode's cluster of splits (decode/launch_decode.h): the largest power of two up to 16 that
// divides the split count and keeps the launch in as few waves as the plain launch (forced, and
// automatically past one CTA per SM), at one CTA per SM the largest up to 8 where its partials fit
// one merge batch unless one cluster holds every split; 1 (no cluster) for odd counts or where no cluster size fits; all of a tile's splits
// (up to 8) in a small dense launch. And its override.
TEST(HopperHost, DecodeClusterSize) {
  using fa4::hopper::decode_cluster_size;
  fa4::hopper::DecodeClusterCapacity roomy;  // sizes 2, 4, 8 hold 264 CTAs at once, 16 holds 256
  roomy.clusters[0] = 132; roomy.clusters[1] = 66; roomy.clusters[2] = 33; roomy.clusters[3] = 16;
  // {splits, forced, automatic (8 tiles, within one wave: up to 32 splits; 0 unused)}
  const int expect[][3] = {{1, 1, 1},   {2, 2, 2},   {3, 1, 1},   {4, 4, 4},   {6, 2, 2},
                           {7, 1, 1},   {8, 8, 8},   {12, 4, 4},  {16, 16, 16}, {24, 8, 8},
                           {32, 16, 16}, {48, 16, 0}, {64, 16, 0}, {96, 16, 0},  {256, 16, 0}};
  const int64_t big = fa4::detail::kDecodeClusterMinMergeBytes;  // a merge worth a cluster
  for (const auto& e : expect) {
    const int64_t ctas = 8 * e[0];  // 8 tiles
    EXPECT_EQ(decode_cluster_size(e[0], ctas, 264, 132, 0, roomy, /*forced=*/true), e[1]) << e[0] << " splits";
    EXPECT_EQ(e[0] % decode_cluster_size(e[0], ctas, 264, 132, 0, roomy, true), 0) << e[0];
    // Automatic: only within one wave and for a merge of kDecodeClusterMinMergeBytes or more (or
    // of kDecodeClusterMinSplits partials at one CTA per SM: not these 8 tiles).
    EXPECT_EQ(decode_cluster_size(e[0], ctas, 264, 132, big, roomy), ctas <= 264 ? e[2] : 1) << e[0] << " splits";
    EXPECT_EQ(decode_cluster_size(e[0], ctas, 264, 132, big - 1, roomy), 1) << e[0] << " splits";
  }
  // One tile (GQA 8/1 at batch 1): 64 splits in 8 clusters of 8 (8 global partials: one batch),
  // 112 in 7 of 16 (clusters of 8 would leave 14 partials).
  EXPECT_EQ(decode_cluster_size(64, 64, 132, 132, big, roomy), 8);
  EXPECT_EQ(decode_cluster_size(112, 112, 132, 132, big, roomy), 16);
  EXPECT_EQ(decode_cluster_size(64, 64, 132, 132, 0, roomy, /*forced=*/true), 16);
  EXPECT_EQ(decode_cluster_size(64, 64, 132, 132, big / 2, roomy), 8);  // d64: a small merge of many partials
  EXPECT_EQ(decode_cluster_size(40, 120, 132, 132, big / 2, roomy), 8);  // 3 tiles at one CTA per SM
  EXPECT_EQ(decode_cluster_size(64, 256, 264, 132, big / 2, roomy), 1);  // 4 tiles, 2 CTAs per SM: global
  EXPECT_EQ(decode_cluster_size(32, 256, 264, 132, big, roomy), 16);     // ... and its big merges keep 16
  EXPECT_EQ(decode_cluster_size(16, 64, 264, 132, big / 2, roomy), 1);  // few partials, small: global
  // 256 CTAs fit one plain wave of 264; clusters of 16 hold 16 x 12 = 192 (a second wave): 8.
  fa4::hopper::DecodeClusterCapacity tight = roomy;
  tight.clusters[3] = 12;
  EXPECT_EQ(decode_cluster_size(32, 256, 264, 132, big, tight), 8);
  tight.clusters[2] = 20;  // clusters of 8 hold 160: 4
  EXPECT_EQ(decode_cluster_size(32, 256, 264, 132, big, tight), 4);
  // Forced, more than one plain wave: clusters may take as many waves (512 CTAs: 2).
  EXPECT_EQ(decode_cluster_size(64, 512, 264, 132, 0, tight, true), 4);
  EXPECT_EQ(decode_cluster_size(64, 512, 264, 132, big, tight), 1);
  fa4::hopper::DecodeClusterCapacity none;  // no cluster launches at all
  EXPECT_EQ(decode_cluster_size(16, 128, 264, 132, big, none), 1);
  EXPECT_EQ(decode_cluster_size(16, 128, 264, 132, big, none, true), 1);
  // A small dense launch (half the SMs free): a tile's splits in one cluster of at most 8 whatever
  // the merge size; not 16, not a count that is no power of two, not where the clusters do not fit.
  EXPECT_EQ(decode_cluster_size(8, 64, 264, 132, 0, roomy, false, /*small_dense=*/true), 8);
  EXPECT_EQ(decode_cluster_size(4, 32, 264, 132, 0, roomy, false, true), 4);
  EXPECT_EQ(decode_cluster_size(2, 2, 264, 132, 0, roomy, false, true), 2);
  EXPECT_EQ(decode_cluster_size(8, 64, 264, 132, 0, roomy), 1);
  EXPECT_EQ(decode_cluster_size(16, 64, 264, 132, 0, roomy, false, true), 1);
  // Room for one cluster per tile: half the SMs free, or full tiles within 2/3 of the wave.
  using fa4::hopper::decode_cluster_room;
  EXPECT_TRUE(decode_cluster_room(66, 264, 132, false));
  EXPECT_FALSE(decode_cluster_room(67, 264, 132, false));
  EXPECT_FALSE(decode_cluster_room(176, 264, 132, false));
  EXPECT_TRUE(decode_cluster_room(176, 264, 132, true));
  EXPECT_TRUE(decode_cluster_room(256, 396, 132, true));  // a 128-query chunk at d64, 4 splits
  EXPECT_FALSE(decode_cluster_room(256, 264, 132, true));
  EXPECT_EQ(decode_cluster_size(16, 64, 264, 132, big, roomy, false, true), 16);
  EXPECT_EQ(decode_cluster_size(6, 48, 264, 132, 0, roomy, false, true), 1);
  EXPECT_EQ(decode_cluster_size(8, 64, 264, 132, 0, none, false, true), 1);
  fa4::hopper::DecodeClusterCapacity few = roomy;
  few.clusters[2] = 7;  // 8 tiles need 8 clusters of 8
  EXPECT_EQ(decode_cluster_size(8, 64, 264, 132, 0, few, false, true), 1);
  // An on/off override: auto (-1), its off and on values, a bad value refused and leaving it as was.
  auto check_knob = [](const char* name, int8_t fa4::detail::KernelOverrides::*field, const char* off,
                       const char* on, const char* bad) {
    using fa4::detail::kernel_overrides;
    using fa4::detail::set_kernel_override;
    SCOPED_TRACE(name);
    EXPECT_EQ(kernel_overrides().*field, -1);
    set_kernel_override(name, off);
    EXPECT_EQ(kernel_overrides().*field, 0);
    EXPECT_THROW(set_kernel_override(name, bad), fa4::Error);
    EXPECT_EQ(kernel_overrides().*field, 0);
    set_kernel_override(name, on);
    EXPECT_EQ(kernel_overrides().*field, 1);
    set_kernel_override(name, "auto");
    EXPECT_EQ(kernel_overrides().*field, -1);
  };
  check_knob("decode_cluster", &fa4::detail::KernelOverrides::decode_cluster, "0", "1", "off");
  // The decode's row tile (decode/launch_decode.h decode_tile): "16" (narrow) / "64" (wide).
  check_knob("decode_tile", &fa4::detail::KernelOverrides::decode_tile, "16", "64", "32");
  // The decode's narrow tile in its 4-warp or 8-warp form (decode/launch_decode.h decode_eight_warps).
  check_knob("decode_warps", &fa4::detail::KernelOverrides::decode_warps, "4", "8", "16");
  // Who owns a captured call's scratch (hopper/shared/device_state.h): "graph" / "retained".
  check_knob("capture_scratch", &fa4::detail::KernelOverrides::capture_scratch, "graph", "retained", "1");
}

// The decode's automatic split count (decode/launch_decode.h): one CTA per SM when that covers
// 2/3 of the SMs with a dense cache (a paged one: if each split then keeps at most 128 key blocks),
// or when the keys are few (not rounded to a power of two;
// 9-16 blocks of a dense cache in a small launch: 8 splits, one cluster), else one wave of CTAs
// rounded down to a power of two, none when the tiles fill the GPU, never more splits than key
// blocks; full tiles (seqlen_q > 1, a tile's rows per KV head) take the wave's count, at most 8
// unless the splits keep 16 blocks each; explicit counts win.
TEST(HopperHost, DecodeSplitCount) {
  fa4::detail::KVCacheParams p;
  p.batch = 1;
  p.seqlen_q = 1;
  p.num_heads = 32;
  p.num_heads_kv = 8;
  p.key_capacity = 131072;
  const fa4::detail::HopperDecodeConfig c = fa4::detail::hopper_decode_config(128, 128);  // 2 CTAs/SM
  const int sms = 132;
  // 8 tiles (one 16-row tile per KV head): 132 / 8 = 16 splits, one CTA on each of 128 SMs.
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.batch = 32;  // 256 tiles: more than half a wave -> no split
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 1);
  p.batch = 16;  // 128 tiles: one CTA on each of 128 SMs
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 1);
  p.batch = 12;  // 96 tiles: one CTA on each of 96 SMs
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 1);
  p.batch = 9;   // 72 tiles: one split would leave 60 SMs idle, so 264 / 72 = 3 -> 2
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 2);
  p.batch = 8;   // 64 tiles: 2 splits, 128 SMs
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 2);
  p.batch = 6;   // 48 tiles: 2 splits, 96 SMs
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 2);
  p.batch = 4;   // 32 tiles: 4 splits, 128 SMs
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 4);
  p.num_heads_kv = 16;
  p.num_heads = 64;
  p.batch = 5;   // 80 tiles: 1 split covers 80 SMs (< 2/3), so 264 / 80 = 3 -> 2
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 2);
  p.num_heads_kv = 8;
  p.num_heads = 32;
  p.batch = 3;   // 24 tiles: 5 splits, 120 SMs (not rounded to 4)
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 5);
  p.paged = true;  // paged: one wave, 264 / 24 = 11 -> 8
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 8);
  p.batch = 1;     // 8 tiles, 2048 blocks: 128 per split at one CTA per SM, few enough for that
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.key_capacity = 131072 + 64;  // 2049 blocks: 129 per split at one CTA per SM -> one wave, 264 / 8 = 33 -> 32
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 32);
  p.key_capacity = 16384;  // 256 blocks: 16 per split at one CTA per SM
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.key_capacity = 2048;  // ... a short cache: 32 blocks, 2 per split at one CTA per SM
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.key_capacity = 131072;
  p.paged = false;
  p.batch = 1;
  p.key_capacity = 8192;  // 128 blocks
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.key_capacity = 2048;  // 32 blocks: 2 per split at one CTA per SM
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.key_capacity = 1024;  // 16 blocks, 1 per split at one CTA per SM: 2 per split in 8 (one cluster)
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 8);
  p.key_capacity = 576;   // 9 blocks: 8 splits of up to 2
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 8);
  p.paged = true;         // paged: one block per split
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 9);
  p.paged = false;
  p.num_heads = 40;
  p.num_heads_kv = 10;    // 10 tiles: 8 splits each would take 160 SMs, so one per block
  p.key_capacity = 768;   // 12 blocks
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 12);
  p.num_heads = 32;
  p.num_heads_kv = 8;
  p.key_capacity = 400;   // 7 blocks: no more splits than blocks
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 7);
  p.key_capacity = 64;
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 1);
  p.key_capacity = 0;     // an empty cache still launches one split per tile
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 1);
  const fa4::detail::HopperDecodeConfig c64 = fa4::detail::hopper_decode_config(64, 64);  // 3 CTAs/SM
  p.key_capacity = 1024;
  p.seqlen_q = 128;
  p.num_heads = 8;  // a 128-query chunk: 8 full narrow tiles per KV head, 64 tiles: the wave (396 / 64 -> 4)
  EXPECT_EQ(fa4::hopper::decode_tile(p, c64, sms).rows, fa4::detail::kDecodeNarrowRows);
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c64, sms), 4);
  // ... in wide tiles (forced): 16 tiles, 264 / 16 = 16, at most 8 blocks of 2, at most 8
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c64, sms, fa4::hopper::decode_tile(p, c64, sms, /*forced=*/1)), 8);
  p.seqlen_q = 1;
  p.key_capacity = 1 << 30;
  p.num_heads = 8;
  p.num_heads_kv = 1;  // one tile: 132 splits at one CTA per SM, capped (a long cache: at 112)
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), fa4::detail::kDecodeMaxAutoSplitsOneTile);
  p.key_capacity = 131072;  // 2048 blocks: 18 per split at 112
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 112);
  p.paged = true;  // paged: 16 blocks per split at one CTA per SM, 132 -> 128, capped alike
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 112);
  p.key_capacity = 16384;  // 256 blocks: at least 2 per split at 112
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 112);
  p.paged = false;
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 112);
  p.key_capacity = 14336 - 64;  // 223 blocks: under 2 per split at 112, so 64
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 64);
  p.paged = true;
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 64);
  p.paged = false;
  p.batch = 2;  // two tiles: 66 splits each, capped at 64
  p.key_capacity = 131072;
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 64);
  p.batch = 1;
  p.key_capacity = 1 << 30;
  p.num_splits = 7;  // explicit: honoured
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 7);
  p.num_splits = 0;
  p.batch = 2;
  p.seqlen_q = 16;
  p.num_heads = 128;  // 16 x 16 rows: 4 wide tiles per KV head, 64 tiles at 2 CTAs per SM: 4 splits
  p.num_heads_kv = 8;
  EXPECT_EQ(fa4::hopper::decode_tile(p, c, sms).rows, fa4::detail::kDecodeWideRows);
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 4);
  // ... in narrow tiles: 16 per KV head, 256 tiles: no split
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms, fa4::hopper::decode_tile(p, c, sms, /*forced=*/0)), 1);
  p.batch = 1;
  p.seqlen_q = 16;
  p.num_heads = 8;
  p.num_heads_kv = 1;
  p.key_capacity = 4096;  // GQA 8/1, 16 queries: 8 full narrow tiles, 264 / 8 -> 32, capped at 8
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 8);
  p.seqlen_q = 4;
  p.num_heads = 64;
  p.num_heads_kv = 16;
  p.key_capacity = 131072;  // 4 queries, group 4: 16 full tiles, 264 / 16 = 16 splits of 128 blocks
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.key_capacity = 40 * 1024;  // 640 blocks: 264 / 16 = 16, under the cap 640 / 16 = 40 -> 16
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 16);
  p.num_heads = 16;
  p.num_heads_kv = 1;  // 64 rows, 4 full tiles: 264 / 4 = 66, 320 blocks of 2, cap 40 -> 32 (a power of two)
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 32);
  p.num_heads = 64;
  p.num_heads_kv = 4;
  p.seqlen_q = 1;  // a decode step with a group of 16: one CTA per SM (132 / 4 = 33) as for any
  p.key_capacity = 131072;  // step, cut to a multiple of 8 for the cluster merge: 32
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 32);
  p.num_heads_kv = 5;  // 5 tiles: 26 splits, under kDecodeClusterMinSplits: not cut
  p.num_heads = 80;
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 26);
  p.num_heads_kv = 3;  // 3 tiles: 44 -> 40
  p.num_heads = 48;
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 40);
  p.key_capacity = 35 * 64;  // ... but 35 blocks: 35 splits of one block each, not cut (32 would
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c, sms), 35);  // leave 18 splits of 2 and 14 empty)
}

TEST(HopperHost, DecodeTile) {
  using fa4::hopper::decode_tile;
  const fa4::detail::HopperDecodeConfig c128 = fa4::detail::hopper_decode_config(128, 128);
  const fa4::detail::HopperDecodeConfig c256 = fa4::detail::hopper_decode_config(256, 256);
  const int sms = 132;
  fa4::detail::KVCacheParams p;
  p.batch = 2;
  p.seqlen_q = 8;
  p.num_heads = 64;
  p.num_heads_kv = 8;  // 64 rows per KV head
  p.key_capacity = 32768;
  // 64 narrow tiles x 512 key blocks = 248 steps per SM: wide, 16 tiles, 16 splits at 2 CTAs per SM
  // (32 blocks each: past the full tiles' cap of 8)
  EXPECT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeWideRows);
  EXPECT_EQ(decode_tile(p, c128, sms).ctas_per_sm, c128.wide_ctas_per_sm);
  EXPECT_EQ(fa4::hopper::decode_num_splits(p, c128, sms), 16);
  EXPECT_EQ(decode_tile(p, c256, sms).rows, fa4::detail::kDecodeNarrowRows);  // no wide kernel at d256
  p.batch = 1;  // 124 steps per SM: narrow with 64 rows per KV head ...
  EXPECT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeNarrowRows);
  EXPECT_EQ(decode_tile(p, c128, sms).ctas_per_sm, c128.ctas_per_sm);
  p.seqlen_q = 16;  // ... wide with 128 rows: 64 narrow tiles x 198 blocks = 96 steps per SM
  p.key_capacity = 198 * 64;
  EXPECT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeWideRows);
  p.key_capacity = 197 * 64;  // one block less: narrow
  EXPECT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeNarrowRows);
  p.key_capacity = 198 * 64;
  p.seqlen_q = 15;  // 120 rows, still 8 narrow tiles per KV head: narrow
  EXPECT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeNarrowRows);
  p.seqlen_q = 1;  // a decode step of a 128-head group (MQA), 8 KV heads x 8 tiles: narrow
  p.num_heads = 1024;
  EXPECT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeNarrowRows);
  p.num_heads = 64;
  p.key_capacity = 32768;
  p.batch = 4;
  p.seqlen_q = 7;  // 56 rows: narrow however many steps
  EXPECT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeNarrowRows);
  // Forced (override decode_tile): either way where the bucket has both, narrow where it has one.
  EXPECT_EQ(decode_tile(p, c128, sms, 1).rows, fa4::detail::kDecodeWideRows);
  p.seqlen_q = 8;
  EXPECT_EQ(decode_tile(p, c128, sms, 0).rows, fa4::detail::kDecodeNarrowRows);
  EXPECT_EQ(decode_tile(p, c256, sms, 1).rows, fa4::detail::kDecodeNarrowRows);
}

// The narrow tile's 8-warp form (decode/launch_decode.h decode_eight_warps): where every CTA of the
// launch has an SM of its own and each split keeps one 128-key block to 16 64-key blocks; never on
// the wide tile or at d256 (no such kernel); the override forces it either way where it exists.
TEST(HopperHost, DecodeEightWarps) {
  using fa4::hopper::decode_eight_warps;
  using fa4::hopper::decode_num_splits;
  using fa4::hopper::decode_tile;
  const fa4::detail::HopperDecodeConfig c128 = fa4::detail::hopper_decode_config(128, 128);
  const fa4::detail::HopperDecodeConfig c256 = fa4::detail::hopper_decode_config(256, 256);
  const int sms = 132;
  fa4::detail::KVCacheParams p;
  p.batch = 1;
  p.seqlen_q = 1;
  p.num_heads = 8;
  p.num_heads_kv = 1;
  p.key_capacity = 8192;  // one tile, 128 blocks: 64 splits of 2 blocks, 64 CTAs
  auto eight = [&](const fa4::detail::HopperDecodeConfig& c, int8_t forced = -1) {
    const fa4::detail::DecodeTile t = decode_tile(p, c, sms);
    return decode_eight_warps(p, c, sms, t, decode_num_splits(p, c, sms, t), forced);
  };
  EXPECT_EQ(decode_num_splits(p, c128, sms), 64);
  EXPECT_TRUE(eight(c128));
  EXPECT_FALSE(eight(c256));
  EXPECT_FALSE(eight(c256, 1));
  EXPECT_FALSE(eight(c128, 0));
  p.num_heads = 32;
  p.num_heads_kv = 8;  // 8 tiles x 16 splits = 128 CTAs <= 132 SMs
  EXPECT_TRUE(eight(c128));
  p.seqlen_q = 4;  // 16 rows per KV head: full tiles (chunked prefill, speculative decoding), 8
  EXPECT_FALSE(eight(c128));  // tiles: not the one-split rule (decode_full_tiles_one_split)
  EXPECT_TRUE(eight(c128, 1));
  {
    // Prefill chunks (decode_full_tiles_one_split): narrow full tiles that fill the 132 SMs once
    // but not twice (67..132 tiles), over 2..16 64-key blocks, at the row's own head dim (d64,
    // d128): one split in the 8-warp form; not with the 4-warp form forced (override decode_warps
    // 4: its own split count), nor on the wide tile, nor at d256 (no 8-warp kernel).
    using fa4::hopper::decode_full_tiles_one_split;
    const fa4::detail::HopperDecodeConfig c64 = fa4::detail::hopper_decode_config(64, 64);
    fa4::detail::KVCacheParams q = p;
    q.seqlen_q = 128;
    q.headdim = q.headdim_v = 64;
    q.num_heads = q.num_heads_kv = 16;  // 8 row tiles per head: 128 tiles
    q.key_capacity = 1024;
    const fa4::detail::DecodeTile t = decode_tile(q, c64, sms);
    ASSERT_EQ(t.rows, fa4::detail::kDecodeNarrowRows);
    auto one = [&](const fa4::detail::HopperDecodeConfig& c, int8_t warps = -1) {
      return decode_full_tiles_one_split(q, c, sms, t, warps);
    };
    EXPECT_TRUE(one(c64));
    EXPECT_EQ(decode_num_splits(q, c64, sms, t), 1);
    EXPECT_TRUE(decode_eight_warps(q, c64, sms, t, 1));
    EXPECT_FALSE(one(c64, 0));  // the 4-warp form forced: its own splits (2 here)
    EXPECT_EQ(decode_num_splits(q, c64, sms, t, 0), 2);
    EXPECT_FALSE(decode_eight_warps(q, c64, sms, t, 2, 0));
    const fa4::detail::DecodeTile wide = decode_tile(q, c64, sms, 1);
    ASSERT_EQ(wide.rows, fa4::detail::kDecodeWideRows);
    EXPECT_FALSE(decode_full_tiles_one_split(q, c64, sms, wide));
    q.num_heads = q.num_heads_kv = 17;  // 136 tiles: more than the SMs
    EXPECT_FALSE(one(c64));
    q.num_heads = q.num_heads_kv = 8;  // 64 tiles: two splits fit; the 4-warp form's 4
    EXPECT_FALSE(one(c64));
    EXPECT_EQ(decode_num_splits(q, c64, sms, t), 4);
    EXPECT_FALSE(decode_eight_warps(q, c64, sms, t, 4));
    q.seqlen_q = 136;  // 9 row tiles x 8 heads = 72 tiles
    EXPECT_TRUE(one(c64));
    q.seqlen_q = 128;
    q.num_heads = q.num_heads_kv = 16;
    q.key_capacity = 1025;  // 17 blocks
    EXPECT_FALSE(one(c64));
    q.key_capacity = 2048;  // 32 blocks: the 4-warp form's splits
    EXPECT_FALSE(one(c64));
    EXPECT_GT(decode_num_splits(q, c64, sms, t), 1);
    EXPECT_FALSE(decode_eight_warps(q, c64, sms, t, 1));
    q.key_capacity = 65;  // 2 blocks: one 128-key block
    EXPECT_TRUE(one(c64));
    q.key_capacity = 64;  // 1 block: less than a 128-key block
    EXPECT_FALSE(one(c64));
    q.key_capacity = 1024;
    q.headdim = q.headdim_v = 128;  // d128, the same tiles
    EXPECT_TRUE(one(c128));
    q.headdim = q.headdim_v = 96;  // padded onto the d128 row: not measured there
    EXPECT_FALSE(one(c128));
    q.headdim = q.headdim_v = 256;
    EXPECT_FALSE(one(c256));
    q.headdim = q.headdim_v = 128;
    q.seqlen_q = 1;  // decode steps: not full tiles
    EXPECT_FALSE(one(c128));
    // d128 from more than a quarter of the SMs, d64 from more than half
    // (decode_one_split_sms_per_tile): GQA 32/8, 4 queries (16 rows per KV head) over 1k keys.
    fa4::detail::KVCacheParams r = q;
    r.seqlen_q = 4;
    r.num_heads = 32;
    r.num_heads_kv = 8;
    r.key_capacity = 1024;
    for (int d : {128, 64}) {
      const fa4::detail::HopperDecodeConfig& c = d == 128 ? c128 : c64;
      r.headdim = r.headdim_v = d;
      for (int batch : {4, 5, 8, 9}) {  // 32, 40, 64, 72 tiles
        r.batch = batch;
        const fa4::detail::DecodeTile tr = decode_tile(r, c, sms);
        ASSERT_EQ(tr.rows, fa4::detail::kDecodeNarrowRows);
        const bool expected = d == 128 ? batch >= 5 : batch >= 9;
        EXPECT_EQ(decode_full_tiles_one_split(r, c, sms, tr), expected) << "d" << d << " batch " << batch;
        if (expected) {
          EXPECT_EQ(decode_num_splits(r, c, sms, tr), 1) << "d" << d << " batch " << batch;
          EXPECT_TRUE(decode_eight_warps(r, c, sms, tr, 1)) << "d" << d << " batch " << batch;
        } else {
          EXPECT_GT(decode_num_splits(r, c, sms, tr), 1) << "d" << d << " batch " << batch;
        }
      }
    }
  }
  p.seqlen_q = 1;
  p.key_capacity = 1024;  // 16 blocks: 8 splits of 2 (one cluster per tile)
  EXPECT_EQ(decode_num_splits(p, c128, sms), 8);
  EXPECT_TRUE(eight(c128));
  p.key_capacity = 640;  // 10 blocks, 8 splits: a split would keep less than a 128-key block
  EXPECT_FALSE(eight(c128));
  p.key_capacity = 8192;
  p.batch = 8;  // 64 tiles x 2 splits = 128 CTAs, but 64 blocks per split: a stream DRAM paces
  EXPECT_EQ(decode_num_splits(p, c128, sms), 2);
  EXPECT_FALSE(eight(c128));
  p.batch = 32;  // 256 tiles, one split: more CTAs than SMs
  EXPECT_FALSE(eight(c128));
  EXPECT_TRUE(eight(c128, 1));
  p.batch = 1;
  p.num_heads = 8;
  p.num_heads_kv = 1;
  p.key_capacity = 32768;  // one tile, 512 blocks: 112 splits of up to 5
  EXPECT_EQ(decode_num_splits(p, c128, sms), 112);
  EXPECT_TRUE(eight(c128));
  p.key_capacity = 131072;  // 2048 blocks: 112 splits of up to 19
  EXPECT_FALSE(eight(c128));
  p.batch = 2;
  p.seqlen_q = 8;
  p.num_heads = 64;  // 64 rows per KV head over 32k keys: the wide tile
  p.key_capacity = 32768;
  ASSERT_EQ(decode_tile(p, c128, sms).rows, fa4::detail::kDecodeWideRows);
  EXPECT_FALSE(eight(c128, 1));
}

// ... and against the finer split of short forward tiles (launch_decode.h small_q_split_forward_wins
// -> small_q_decode_beats_fine_split_forward, 132 SMs): the shapes measured on an H100
// (tuning_decode.h kSmallQDecodeColumnsPerSm) with their faster kernel, over 1k keys; and one row
// tile per KV head, which stays on the decode kernel whatever its columns.
TEST(HopperHost, SmallQueryRouteAgainstTheFineSplitForward) {
  struct Shape {
    int32_t batch, seqlen_q, heads, heads_kv, d;
    bool decode;
  };
  const Shape shapes[] = {
      {1, 128, 8, 8, 64, true},      // the prefill chunk: 64 narrow tiles x 64
      {1, 128, 16, 16, 64, true},    // 128 x 64
      {1, 128, 8, 8, 128, true},     // 64 x 128 (level: 14.21 / 14.86 us)
      {1, 64, 16, 16, 128, true},    // 64 x 128
      {1, 32, 32, 32, 128, true},    // 64 x 128
      {1, 128, 12, 12, 128, false},  // 96 x 128
      {2, 128, 8, 8, 128, false},    // 128 x 128
      {1, 128, 8, 8, 256, false},    // 64 x 256
      {1, 1, 40, 40, 256, true},     // 40 x 256, but one row tile per KV head: a decode step
  };
  for (const Shape& s : shapes) {
    fa4::detail::FwdParams p;
    p.batch = s.batch;
    p.seqlen_q = s.seqlen_q;
    p.seqlen_k = 1024;
    p.num_heads = s.heads;
    p.num_heads_kv = s.heads_kv;
    p.headdim = p.headdim_v = s.d;
    const fa4::detail::HopperFwdConfig* fc = fa4::detail::hopper_fwd_bucket(s.d, s.d);
    ASSERT_NE(fc, nullptr);
    const int64_t fwd_tiles = int64_t(s.batch) * s.heads * ((s.seqlen_q + fc->tile_m - 1) / fc->tile_m);
    const int32_t fwd_blocks = (p.seqlen_k + fc->tile_n - 1) / fc->tile_n;
    // Short tiles: split by the launch's plan only, not by the coarse split.
    EXPECT_FALSE(fa4::detail::stream_k_splits_coarsely(fwd_tiles, 132, fwd_blocks, -1)) << s.d;
    EXPECT_GT(fa4::detail::plan_stream_k(fwd_tiles, 132, fwd_blocks, -1).tail_ctas, 0) << s.d;
    EXPECT_EQ(fa4::hopper::small_q_split_forward_wins(p, fwd_tiles, fwd_blocks, 132, -1, 0), !s.decode)
        << s.batch << " x " << s.seqlen_q << ", heads " << s.heads << ", d" << s.d;
  }
}

// The small-query route against a forward that splits its keys (hopper_api.cu small_q_on_decode):
// the decode is kept while its narrow tiles are at most kSmallQSplitForwardTiles times the
// forward's (d128: forward tiles of 128 rows and 128 keys; 132 SMs). Each shape also checks that
// the coarse split (core/stream_k.h stream_k_splits_coarsely) cuts that forward, so the rule is
// the one that applies.
TEST(HopperHost, SmallQueryRouteAgainstTheSplitForward) {
  struct Shape {
    int32_t batch, seqlen_q, seqlen_k, heads, heads_kv;
    bool decode;
  };
  const Shape shapes[] = {
      {1, 128, 32768, 16, 16, false},  // 128 narrow tiles against 16: measured 3x slower on the decode
      {1, 128, 8192, 16, 16, false},
      {1, 64, 16384, 32, 32, false},   // 128 against 32
      {1, 32, 8192, 32, 8, true},      // 64 against 32: 2x
      {1, 16, 32768, 32, 8, true},     // 32 against 32
      {1, 4, 32768, 32, 8, true},      // one row tile per KV head: always the decode
  };
  for (const Shape& s : shapes) {
    fa4::detail::FwdParams p;
    p.batch = s.batch;
    p.seqlen_q = s.seqlen_q;
    p.seqlen_k = s.seqlen_k;
    p.num_heads = s.heads;
    p.num_heads_kv = s.heads_kv;
    p.headdim = p.headdim_v = 128;
    const int64_t fwd_tiles = int64_t(s.batch) * s.heads * ((s.seqlen_q + 127) / 128);
    const int32_t fwd_blocks = (s.seqlen_k + 127) / 128;
    EXPECT_TRUE(fa4::detail::stream_k_splits_coarsely(fwd_tiles, 132, fwd_blocks, -1))
        << s.seqlen_q << " x " << s.seqlen_k << ": the forward would not split";
    EXPECT_EQ(fa4::hopper::small_q_decode_beats_split_forward(p, fwd_tiles), s.decode)
        << s.seqlen_q << " x " << s.seqlen_k << ", heads " << s.heads << "/" << s.heads_kv;
    EXPECT_EQ(fa4::hopper::small_q_split_forward_wins(p, fwd_tiles, fwd_blocks, 132, -1, 0), !s.decode);
  }
}
