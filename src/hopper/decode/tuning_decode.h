// src/hopper/decode/tuning_decode.h — THE tuning table of the Hopper decode (KV-cache) kernels.
//
// One row per bucket of src/hopper/buckets.h that has a decode kernel (checked below); an input
// runs on the smallest row that holds max(headdim, headdim_v) (both padded to the row's width: the
// decode kernel has one head dim for K and V). Without a row the selector (hopper_api.cu
// kvcache_support) reports the head dims unsupported.
//
// Geometry (decode/kernel_decode.cuh): a CTA owns the query rows of one tile of one KV head
// (pack-GQA: row = query token x head of the group) and one split of the keys. A narrow tile has 16
// rows and its 4 warps take 16 keys each of every 64-key block (8 warps of a 128-key block in its
// 8-warp form), so one K/V load serves the whole head group; a wide tile (decode_tile) has 64 rows,
// one warp per 16 of them over all the keys. The kernel is bandwidth-bound: the stages keep (stages - 1) K/V blocks in flight per CTA while one is
// consumed, and the shared memory they take decides how many CTAs fit an SM (228 KB per SM on the
// H200).
#pragma once

#include <cstdint>

#include "fa4/attention.h"
#include "hopper/buckets.h"

namespace fa4::detail {

struct HopperDecodeConfig {
  int32_t headdim;     ///< compiled head dim of q, k and v
  int32_t headdim_v;   ///< = headdim (one width for K and V tiles)
  int32_t block_n;     ///< keys per pipeline stage (4 groups of 16)
  int32_t stages;      ///< cp.async ring depth
  int32_t ctas_per_sm; ///< what the shared memory allows (the automatic split count's wave, where
                       ///< one CTA per SM would leave too many SMs idle)
  int32_t wide_ctas_per_sm;  ///< the same for the wide tile (its Q tile is 4x larger); 0: no wide kernel
  int32_t wide_stages;       ///< the wide tile's ring depth
  /// Ring depth of the 8-warp narrow tile (128-key blocks, kDecodeEightWarpKeys; launch_decode.h
  /// decode_eight_warps), 0: no such kernel
  int32_t eight_warp_stages;
};

// Internal linkage (not `inline`): see bwd/tuning_bwd.h (several libfa4 builds in one process).
constexpr HopperDecodeConfig kHopperDecodeConfigs[] = {
    // d, dv, block_n, stages, CTAs/SM narrow, wide, wide stages, 8-warp stages: smem = stages x (2 x
    // keys x d x 2 B + keys x 16 B of row offsets) + the Q tile (16 or 64 rows x d x 2 B), + 1 KB
    // for the wide tile's 1024-byte alignment. At d128 the wide tile's ring of 2 leaves room for a
    // second CTA per SM, which overlaps its latency chain: a ring of 3 at one CTA per SM (and at d64
    // one of 6) measured slower (bench/results/history.md). The 8-warp tile keeps (stages - 1)
    // 128-key blocks in flight: twice the narrow tile's keys, which it consumes about twice as fast.
    {64, 64, 64, 4, 3, 2, 4, 4},     //  70 KB, wide 77 KB, 8-warp 138 KB
    {128, 128, 64, 3, 2, 2, 2, 3},   // 103 KB, wide 83 KB, 8-warp 202 KB
    {256, 256, 64, 3, 1, 0, 0, 0},   // 203 KB (a wide or 8-warp tile would not fit)
};
inline constexpr int32_t kHopperNumDecodeConfigs =
    int32_t(sizeof(kHopperDecodeConfigs) / sizeof(kHopperDecodeConfigs[0]));

/// Rows of Q per CTA of the narrow tile (one m16 MMA tile; 4 warps on 64-key blocks).
inline constexpr int32_t kDecodeNarrowRows = 16;
/// The narrow tile's 8-warp form: 128-key blocks (8 warps of 16 keys), so a CTA alone on its SM
/// has two warps per scheduler to overlap its latency chains (at batch 1 a 4-warp CTA is
/// issue-bound on one warp per scheduler: ncu, bench/results/history.md) and walks its keys in
/// about half the steps, each step's copies spread over 256 threads. Used where every CTA of the
/// launch has an SM of its own and its split is short (launch_decode.h decode_eight_warps): at
/// most kDecodeEightWarpMaxSplitBlocks 64-key blocks. A longer split is a stream that DRAM paces,
/// where the 4-warp CTA's finer ring was as fast or up to 1.5% faster.
inline constexpr int32_t kDecodeEightWarpKeys = 128;
inline constexpr int32_t kDecodeEightWarpMaxSplitBlocks = 16;
/// Full narrow tiles run one 8-warp split each from more than num_sms / this many tiles
/// (launch_decode.h decode_full_tiles_one_split). At d64 from half the SMs: with fewer tiles the
/// 4-warp form's splits were as fast (GQA 32/8, 4 queries over 1k keys, 64 tiles on 132 SMs: 9.35
/// us split, 9.53 one 8-warp split). At d128, whose per-block chain is twice as long, from a quarter:
/// the same at 48 / 64 tiles 14.84 / 15.50 -> 12.88 / 13.02 us, over 512 keys 13.67 -> 9.21, pages
/// of 16 16.15 -> 14.17 (H100, bench/decode_split_sweep.py, bench/results/history.md).
constexpr int32_t decode_one_split_sms_per_tile(int32_t headdim) { return headdim >= 128 ? 4 : 2; }
/// Rows of Q per CTA of the wide tile (one warpgroup's m64 wgmma): its 4 warps share every K/V
/// copy of a block, which the 16-row tiles of the same rows would each repeat, but a wide CTA has
/// 4x the rows' work per block and 4x the rows to merge, and a quarter of the CTAs to spread the
/// keys over. So the wide tile pays only where the narrow launch has more block steps than the SMs
/// can overlap (launch_decode.h decode_tile): from kDecodeWideMinRows packed rows per KV head
/// (seqlen_q x group) and kDecodeWideMinBlockSteps narrow (tile, key block) steps per SM, or from
/// kDecodeWideManyRows rows (two wide tiles per KV head, whose copies of a block replace those of
/// 8 narrow tiles) and kDecodeWideManyRowsMinBlockSteps steps.
inline constexpr int32_t kDecodeWideRows = 64;
inline constexpr int32_t kDecodeWideMinRows = 64;
inline constexpr int64_t kDecodeWideMinBlockSteps = 160;
inline constexpr int32_t kDecodeWideManyRows = 128;
inline constexpr int64_t kDecodeWideManyRowsMinBlockSteps = 96;
/// The automatic split count of a launch whose tiles are full (seqlen_q > 1 and at least a tile's
/// rows per KV head: chunked prefill, speculative decoding) fills the wave, with at most this many
/// splits: each split adds a partial of 16 (or 64) whole rows to the merge (one split where they
/// run in the 8-warp form: launch_decode.h decode_full_tiles_one_split).
inline constexpr int32_t kDecodeMaxAutoSplitsFullTile = 8;
/// Small-query route (hopper_api.cu small_q_on_decode) against a forward whose few tiles split
/// their keys over the idle SMs (stream-K, core/stream_k.h: no mask, or a causal or right-windowed
/// chunk of one forward tile per head): the decode
/// kernel walks a KV head's keys once per narrow row tile, the forward once per tile of tile_m
/// rows, at about twice the decode's time per key (H200, bench/results/h200_small_q_route_*.json:
/// 0.37-0.65 us per 64 keys of a 16-row tile per SM, against ~1.5 us per 128 keys of a 128-row
/// forward tile). So the decode is taken only while its narrow tiles are at most this many times
/// the forward's: 1 x 128 queries x 32k keys, 16 heads, ran on the decode at 107 TFLOP/s (128
/// narrow tiles against 16 forward tiles), the split forward at 262-373.
inline constexpr int64_t kSmallQSplitForwardTiles = 2;
/// ... and against a forward of shorter tiles (fewer than about 14 key blocks: core/stream_k.h
/// stream_k_splits_coarsely), which the launch's plan cuts into pieces of 1-4 blocks
/// (plan_stream_k) and which finishes in about one piece's time whatever the heads: the decode is
/// kept while its narrow tiles times the head dim are at most this many columns per SM, i.e. its
/// tiles' walks stay short (one row tile per KV head always stays). H100, causal chunks
/// of 128 queries over 1k keys, kernel us decode / split forward: d128 8 heads (64 narrow tiles)
/// 14.21 / 14.86, 12 heads 17.2 / 14.61, 16 heads 17.49 / 14.68, batch 2 17.53 / 14.61, 16 heads
/// over 1.5k keys 20.9 / 15.7, d256 8 heads 27.85 / 24.13; d64 8 heads 9.75 / 12.47 (the issue's
/// prefill chunk), 16 heads (128 tiles) 10.96 / 12.68; 64 queries x 16 heads d128 (64 tiles)
/// 14.28 / 14.62 (bench/results/history.md).
inline constexpr int64_t kSmallQDecodeColumnsPerSm = 64;
/// Largest explicit num_splits (fa4::kMaxNumSplits; more is kUnsupported on CUDA): the merge's
/// arrival counters are sized for it (merge_decode.cuh).
inline constexpr int32_t kDecodeMaxSplits = kMaxNumSplits;
/// The automatic split count gives each split at least this many key blocks.
inline constexpr int32_t kDecodeMinBlocksPerSplit = 2;
/// ... and uses at most this many splits,
inline constexpr int32_t kDecodeMaxAutoSplits = 64;
/// ... or this many for a launch of one tile (e.g. batch 1, one KV head) whose splits each keep at
/// least kDecodeOneTileMinBlocks key blocks: 7 clusters of 16 (decode_cluster_size), each merging
/// its partials in DSMEM, then every cluster rank's columns merged from the 7 cluster partials by
/// the last of them (bench/results/history.md: dense and paged KV 32k-128k faster at 112 than at
/// 64 splits; 128 / 132 slower than 112: they take two waves of clusters).
inline constexpr int32_t kDecodeMaxAutoSplitsOneTile = 112;
inline constexpr int32_t kDecodeOneTileMinBlocks = 2;
/// A paged cache takes one CTA per SM (as a dense one does) where each split then keeps at most
/// this many key blocks (counted at num_sms / tiles splits, before the split count's cut to a
/// multiple of 8 and its caps): the kernel loads a block's page-table entries an iteration before
/// their copies, and a second CTA per SM adds more partials to the merge than it hides. Longer
/// splits over shuffled pages stream faster two or three to an SM (bench/results/history.md;
/// measured at d128, where 16 -> 128 gained up to 3%; at d64 +2% at batch 1 and -1.5% at batch 2,
/// KV 32k).
inline constexpr int32_t kDecodePagedOnePerSmMaxBlocks = 128;
/// Blocks per split past which a full tile's split count may pass kDecodeMaxAutoSplitsFullTile.
inline constexpr int32_t kDecodeLongSplitBlocks = 16;
/// Splits of one tile that merge through distributed shared memory, as one thread-block cluster
/// (decode/kernel_decode.cuh): at most this many (a power of two that divides the split count;
/// launch_decode.h decode_cluster_size). 16 is past the portable cluster size (8): it is used where
/// the device schedules such clusters (asked once per device).
inline constexpr int32_t kDecodeMaxCluster = 16;
/// ... and only where the global merge would be the long pole: the merging CTA of a tile would read
/// at least this many bytes of partials (splits x live rows x headdim_v x 4), serially over its
/// loads. Below it the global merge is shorter than a cluster launch's own cost (its barriers and
/// scheduling; decode/README.md has the measurements).
inline constexpr int64_t kDecodeClusterMinMergeBytes = 192 * 1024;
/// ... or, in a launch of at most one CTA per SM, at least this many partials (4 merge batches, one
/// round trip each, in one CTA): at d64 a merge of 64 partials of 8 rows is 128 KB, and clusters
/// of 8 took GQA 8/1 at batch 1 from 9.84 to 8.23 us at KV 8k and from 9.48 to 7.70 at 4k; GQA 8/1
/// d128 at batch 3 (44 splits merged in one CTA -> 40 in clusters of 8, 160 KB) 13.79 -> 10.75
/// (GQA 32/8 at batch 1, 33 -> 32 splits: equal).
/// With 2 CTAs per SM (64 splits of a paged GQA 32/8 call at batch 1, KV 8k) clusters lost 5%.
/// The one-CTA-per-SM split count is cut to a multiple of kDecodePortableCluster from this many
/// (launch_decode.h decode_num_splits).
inline constexpr int32_t kDecodeClusterMinSplits = 32;
/// The largest cluster every Hopper device schedules (CUDA's portable size). Where a launch leaves
/// at least half the SMs free and a dense tile's splits fit one cluster of at most this many,
/// that cluster merges them however short the merge (launch_decode.h decode_cluster_size), and
/// a cache of 9 to 16 key blocks is cut into this many splits of up to 2 blocks instead of one
/// per block (decode_num_splits): at batch 1 a cluster holding all of a tile's splits was 0.4 to
/// 1.0 us faster than the global merge of as many splits, while clusters of 16 were not
/// (bench/results/history.md).
inline constexpr int32_t kDecodePortableCluster = 8;

/// Partials a merge reads per round trip (decode/merge_decode.cuh merge_partials: all loads of a
/// batch are issued before the first is used).
inline constexpr int32_t kDecodeMergeBatch = 8;

constexpr const HopperDecodeConfig* find_hopper_decode_config(int32_t headdim, int32_t headdim_v) {
  return find_bucket_row(kHopperDecodeConfigs, headdim, headdim_v);
}

/// The decode bucket an input (d, dv) runs on; nullptr if none fits.
constexpr const HopperDecodeConfig* hopper_decode_bucket(int32_t d, int32_t dv) {
  const int32_t w = d > dv ? d : dv;
  return smallest_fitting_row(kHopperDecodeConfigs, w, w);
}

/// The row tile of a decode launch: rows per CTA and the CTAs an SM holds (the split count's
/// wave; the 8-warp form of the narrow tile is chosen after the split count, launch_decode.h).
struct DecodeTile {
  int32_t rows;
  int32_t ctas_per_sm;
};

/// Row c's wide tile if `wide` and c has one, else its narrow tile.
constexpr DecodeTile decode_tile_of(const HopperDecodeConfig& c, bool wide) {
  return wide && c.wide_ctas_per_sm > 0 ? DecodeTile{kDecodeWideRows, c.wide_ctas_per_sm}
                                        : DecodeTile{kDecodeNarrowRows, c.ctas_per_sm};
}

constexpr HopperDecodeConfig hopper_decode_config(int32_t headdim, int32_t headdim_v) {
  const HopperDecodeConfig* c = find_hopper_decode_config(headdim, headdim_v);
  return c ? *c : throw "fa4: no Hopper decode config for this (headdim, headdim_v)";
}

#define FA4_DECODE_ROW_IS_BUCKET(D, DV) +(find_hopper_decode_config(D, DV) != nullptr ? 1 : 0)
static_assert(0 FA4_HOPPER_BUCKETS(FA4_DECODE_ROW_IS_BUCKET) == kHopperNumDecodeConfigs,
              "every row of kHopperDecodeConfigs must be a bucket of src/hopper/buckets.h");
#undef FA4_DECODE_ROW_IS_BUCKET

}  // namespace fa4::detail
