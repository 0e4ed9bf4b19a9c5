// src/hopper/bwd/tuning_bwd.h — THE tuning table of the Hopper (sm_90a) backward kernels.
//
// One row per bucket of src/hopper/buckets.h that has a backward kernel (every row must be a
// bucket; checked below). An input runs on the smallest row that holds its head dims
// (hopper_bwd_bucket), padded like the forward; with none, the selector (hopper_api.cu
// backward_support) reports it unsupported.
//
// Tile geometry (FlashAttention-3's hopper backward, arXiv 2407.08608, for 16-bit inputs): a CTA
// owns tile_n = 128 keys of one KV head (d <= 128), split over two consumer warpgroups (64 keys each, one
// wgmma M-extent), and walks the query blocks of tile_m rows that see them. dK and dV stay in
// fp32 registers for the whole walk (2 x 64 x d / 128 floats per thread), so d is bounded by the
// register file: 64 + 64 floats at d128, with S^T, dP^T and dQ (32 each) beside them. d64 has
// room for tile_m = 128 (FlashAttention-3's d64 tile): 32 + 32 floats of dK/dV, 64 each of S^T
// and dP^T, 32 of dQ. Its SS products (S^T, dP^T, dQ) are then 128 queries wide or d deep per
// warpgroup, where at tile_m = 64 an m64n64k16 wgmma reads 4 KB of smem operands per 32 cycles of
// tensor work (128 B/cycle, all the bandwidth of the SM's shared memory for one warpgroup), and
// the steps, with their barrier and dQ reduce-add, are half as many.
// Above d128 that would be 2 x 64 x 256 / 128 = 256 floats at d256, so the d256 row shares the
// keys instead (`shared_keys`, FlashAttention-3's d256 split in our swapped form): tile_n = 64
// keys, both warpgroups hold all of them and each half of the query block for S^T and dP^T, and
// half of d's (dv's) columns of dK, dV and dQ: 64 + 64 floats of dK/dV, dQ in parts of 64 columns
// (32 floats), S^T and dP^T 16 each. P^T then goes through smem too (both warpgroups' dV reads all
// 64 queries' P^T). The d192 and 192 x 128 rows have the same layout on 256 x 256 and 256 x 128
// tiles (kernel_traits_bwd.cuh rounds shared-key rows' dims up to 128; TMA zero-fills the padded
// columns): with 96 columns per warpgroup a warpgroup's half would start inside a 128-byte
// swizzle atom. The padding costs no products: S^T and dP^T issue only the bucket's k-steps, and
// warpgroup 1 skips its dQ part of padding columns (192..255) and runs dK (dV at d192) as one
// 64-column product over its real columns; at 192 x 128 dP^T and dV also do half the d256 row's
// work and dO and V take half its smem.
// (These are not always the forward's buckets: a d96 input runs the forward's d96 kernel and the
// backward's d128.)
// Shared memory (d128): K, V 32 KB each, q_stages x (Q + dO) 64 KB, dS^T double buffer 32 KB,
// the dQ staging 32 KB; d64 (tile_m 128): K, V 16 KB each, Q + dO 64 KB, dS^T 64 KB, dQ 32 KB.
// d256: K, V 32 KB each, two stages of Q 64 KB and one of dO 32 KB, P^T and dS^T double buffers
// 32 KB, the dQ staging one 64-column part per warpgroup 32 KB (224 KB; d192 the same); 192 x 128
// the same with V and the dO stage 16 KB each, and its dQ in one 128-column part per warpgroup
// (dq_parts 1: no second part waiting for the writer's read of the first) staged in 64 KB (224 KB;
// with two parts, 192 KB: two dO stages in Q's ring measured 1-3.5% slower in the default mode,
// three Q stages 0-2%). With one stage of Q and dO and all of dQ
// staged at once (the same 224 KB) the d256 row's next step's Q / dO load could start only at a
// step's end and the next step waited for it: 25-53% slower (bench/results/history.md).
#pragma once

#include <cstdint>

#include "common/overrides.h"
#include "core/exp2.h"
#include "hopper/buckets.h"

namespace fa4::detail {

struct HopperBwdConfig {
  int32_t headdim;        ///< compiled q/k head dim (inputs with a smaller multiple of 8 are padded)
  int32_t headdim_v;      ///< compiled v/dout head dim
  int32_t tile_m;         ///< query rows per step of the walk (the N of S^T = K Q^T): 64 or 128
  int32_t tile_n;         ///< keys per CTA: 64 per consumer warpgroup
  int32_t q_stages;       ///< depth of the Q / lse_log2 ring
  /// Depth of the dO / D ring. Equal to q_stages: one ring holds both (one wait, one release per
  /// step). Fewer: a ring of its own, released once dV has read dO (mid-step), so the next step's
  /// dO loads under this step's dK and dQ while its Q is already in the second Q stage.
  int32_t do_stages;
  /// Shared keys: dQ products per warpgroup and step (kernel_traits_bwd.cuh kDqParts), each over
  /// d / 2 / dq_parts columns (a multiple of 64) into the same registers; 1 elsewhere. One part
  /// costs d / 4 accumulator registers per thread but no wait: a warpgroup's second part is staged
  /// only once the writer has read its first (with one part staged at a time).
  int32_t dq_parts;
  /// dQ parts (kernel_traits_bwd.cuh kDqParts) a warpgroup stages at once; its next part waits
  /// until the dQ writer's bulk reduce has read the staging.
  int32_t dq_staged_parts;
  /// lse_log2 pairs (of tile_n * tile_m / 1024 per consumer thread: one per 8-query-column group
  /// of S^T) read from smem while S^T's product runs; the rest are read where P^T needs them,
  /// after the wait for S^T, and then queue behind dP^T's operand reads (mainloop_bwd_mma.cuh
  /// load_lse). Each costs two registers across the wait.
  int32_t lse_early_pairs;
  /// Share of P^T's exponentials computed on the FMA pipe (core/exp2.h exp2_emulated; FA4 Sec. 3),
  /// by 8-query-column groups of S^T, the rest on MUFU (16 per clock per SM).
  Exp2Emulation exp2_emulation;
  int32_t consumer_regs;  ///< setmaxnreg of the two MMA warpgroups
  int32_t producer_regs;  ///< setmaxnreg of the producer warpgroup (TMA warp + two dQ writer warps)
  /// Masked / varlen / deterministic problems (longest first): key blocks of one (sequence, KV
  /// head) handed out together (schedule_bwd.h bwd_tile_coord). With one key block per head in
  /// flight (band 1) and more heads than CTAs, every Q / dO load and dQ reduce-add of a step
  /// misses L2 (the walk turns DRAM-bound); a band's CTAs share them.
  int32_t lpt_band;
  /// ... in deterministic mode (every problem takes the longest-first order then): the key blocks
  /// of a band reach a dQ chunk in the same step and add into it one after another, each after
  /// the previous one's add is performed, so the last of a band starts that many round trips
  /// late; a narrower band shortens the chain and shares less in L2.
  int32_t det_lpt_band;
  /// ... and walk their query blocks from the last down (schedule_bwd.h bwd_step_block): under a
  /// bottom-right causal mask every key block's walk then starts at the same (last) query block,
  /// so a band's CTAs stay on the same block step after step.
  bool walk_descending;
  /// Both consumer warpgroups hold all tile_n (= 64) keys and split the query block of S^T / dP^T
  /// and the columns of dK, dV and dQ (kernel_traits_bwd.cuh); otherwise each holds 64 of the keys.
  bool shared_keys;
  /// The kernel can claim its tiles greedily (bwd_order's dynamic schedule): the TMA warp takes
  /// each tile and hands it to the other roles through a ring in smem (geometry_bwd.cuh
  /// bwd_tiles: BwdRingProducerTiles, BwdRingReceiverTiles). Without, every role computes the
  /// static order itself (BwdStaticTiles) and the kernel has no ring.
  bool tile_claims;
};

// Internal linkage (not `inline`): an inline variable is a GNU-unique symbol, which the dynamic
// linker shares between every libfa4 loaded in one process (A/B runs load several builds),
// so one build would read another build's table.
constexpr HopperBwdConfig kHopperBwdConfigs[] = {
    // d, dv, tile_m, tile_n, q_stages, do_stages, dq_parts, dq_staged_parts, lse_early_pairs,
    // exp2_emulation {period, emulated}, regs (consumer, producer), lpt_band, det_lpt_band,
    // walk_descending, shared_keys, tile_claims.
    // lse_early_pairs: all 8 at d128; half of d64's 16 (all of them, 32 registers across the
    // wait beside 64 + 64 of S^T and dP^T, make ptxas spill in the step; the A/Bs are in
    // bench/results/history.md); the shared-key rows none (their 4 pairs measured 0-2% slower).
    // The producer warpgroup's warps (TMA, dQ writers with the deterministic ordering) spill at
    // 24 registers, the consumers below 232: ptxas reports no spill stores at 232/40 (d64 and
    // d128); 240/24 spills in the producer (d64 with tile_m 128: 36 B).
    // Exp2 emulation: none. 2/16 and 4/16 measured 2-4% slower at d64 and within noise at d128
    // (bench/results/history.md): the exponentials run beside the dP^T product on MUFU already.
    // Deterministic bands: 8 at d64 and d128, the fastest of 16 / 8 / 4 / 2 at 8k, causal and
    // not (bench/results/history.md; d64 measured with tile_m 64); 8 at d256 too (2-4% faster
    // than 16 at 4k-8k; 4 and 2 gain 1-2.5% at d256 8k and d64 causal 8k but lose up to 10% at
    // d256 causal 4k and 2-6% at d64 / d128 non-causal 8k).
    // Tile claims: 1.2-3% faster at d128 causal 8k-16k and Llama GQA; the 192 x 128 kernel ran
    // 6% (causal) and 10% (not) slower with the ring, whichever schedule it took: none there
    // (bench/results/history.md).
    {64, 64, 128, 128, 2, 2, 1, 1, 8, {16, 0}, 232, 40, 16, 8, true, false, true},
    {128, 128, 64, 128, 2, 2, 1, 1, 8, {16, 0}, 232, 40, 16, 8, true, false, true},
    {192, 128, 64, 64, 2, 1, 1, 1, 0, {16, 0}, 232, 40, 16, 8, true, true, false},
    {192, 192, 64, 64, 2, 1, 2, 1, 0, {16, 0}, 232, 40, 16, 8, true, true, true},
    {256, 256, 64, 64, 2, 1, 2, 1, 0, {16, 0}, 232, 40, 16, 8, true, true, true},
};
// No d96 row: the transposed views of a 96-column (64-byte swizzled) Q / dO tile are not a
// canonical MN-major wgmma layout (CuTe's GMMA layout check), so 72..128 run on the d128 kernel
// (TMA zero-fills the padded columns).
inline constexpr int32_t kHopperNumBwdConfigs =
    int32_t(sizeof(kHopperBwdConfigs) / sizeof(kHopperBwdConfigs[0]));

/// Row for the compiled bucket (headdim, headdim_v); nullptr if the bucket has no backward.
constexpr const HopperBwdConfig* find_hopper_bwd_config(int32_t headdim, int32_t headdim_v) {
  return find_bucket_row(kHopperBwdConfigs, headdim, headdim_v);
}

/// The backward bucket an input (headdim, headdim_v) runs on: the smallest row with headdim >= d and
/// headdim_v >= dv; nullptr if none fits.
constexpr const HopperBwdConfig* hopper_bwd_bucket(int32_t d, int32_t dv) {
  return smallest_fitting_row(kHopperBwdConfigs, d, dv);
}

/// The row a compile-time instantiation uses (a compile error if the bucket has no row).
constexpr HopperBwdConfig hopper_bwd_config(int32_t headdim, int32_t headdim_v) {
  const HopperBwdConfig* c = find_hopper_bwd_config(headdim, headdim_v);
  return c ? *c : throw "fa4: no Hopper backward config for this (headdim, headdim_v)";
}

/// The backward's tile order (schedule_bwd.h): longest first (lpt), its band, the walk direction.
struct BwdOrder {
  bool lpt;
  int32_t band;
  bool descending;
  bool dynamic;  ///< tiles claimed greedily from a counter (more tiles than CTAs), else a static stride
};

/// The order of a backward on `row`. Tiles of unequal cost (causal/window masks, varlen): longest
/// first in the row's bands and walk direction, so a band's CTAs read the same Q / dO block and
/// reduce-add into the same dQ chunk at about the same time, in L2. Deterministic mode takes that
/// order on dense problems too: key block fastest, every key block of a head would reach each
/// chunk at once and add into it one after another, a chain as long as the head's key blocks;
/// in bands the chain is at most a band long (the row's det_lpt_band). Other dense problems: key
/// block fastest, walked from the first query block up (all of a head's key blocks see every
/// block, so they walk together either way). The overrides "lpt", "bwd_lpt_band", "bwd_walk" and
/// "schedule" (on rows with tile_claims) force each part.
inline BwdOrder bwd_order(const HopperBwdConfig& row, bool masked, bool varlen, bool deterministic,
                          const KernelOverrides& o) {
  BwdOrder r;
  r.lpt = o.lpt < 0 ? (masked || varlen || deterministic) : o.lpt == 1;
  r.band = o.bwd_lpt_band > 0 ? o.bwd_lpt_band : deterministic ? row.det_lpt_band : row.lpt_band;
  r.descending = o.bwd_descending >= 0 ? o.bwd_descending == 1 : (r.lpt && row.walk_descending);
  // Masked tiles differ in cost, and a static stride over the longest-first order leaves the
  // busiest CTA ~3% above the mean (d128 causal 4k-16k, by steps per tile); claimed greedily,
  // 0.5-2%. Varlen keeps the static stride, as in the forward: its tile grid (the longest
  // sequence's key blocks for every sequence) is mostly empty tiles.
  // Rows without tile_claims have no claiming code: the static stride whatever "schedule" says.
  r.dynamic = row.tile_claims && (o.dynamic_schedule >= 0 ? o.dynamic_schedule == 1 : (masked && !varlen));
  return r;
}

// Bands the overrides could also ask for (common/overrides.h kMaxBwdLptBand).
constexpr bool bwd_bands_in_range() {
  for (const HopperBwdConfig& c : kHopperBwdConfigs)
    if (c.lpt_band < 1 || c.lpt_band > kMaxBwdLptBand || c.det_lpt_band < 1 || c.det_lpt_band > kMaxBwdLptBand)
      return false;
  return true;
}
static_assert(bwd_bands_in_range(), "kHopperBwdConfigs: lpt_band and det_lpt_band must be in 1..kMaxBwdLptBand");

// Every row is a bucket of the bucket list.
#define FA4_BWD_ROW_IS_BUCKET(D, DV) +(find_hopper_bwd_config(D, DV) != nullptr ? 1 : 0)
static_assert(0 FA4_HOPPER_BUCKETS(FA4_BWD_ROW_IS_BUCKET) == kHopperNumBwdConfigs,
              "every row of kHopperBwdConfigs must be a bucket of src/hopper/buckets.h");
#undef FA4_BWD_ROW_IS_BUCKET

}  // namespace fa4::detail
