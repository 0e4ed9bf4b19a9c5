// src/hopper/fwd/tuning_fwd.h — THE tuning table of the Hopper (sm_90a) forward kernels.
//
// One row per bucket of src/hopper/buckets.h (checked below). Every knob that changes speed but not the maths
// lives here, with a name, so a tuning change is a one-line diff and the host selector
// (src/hopper/hopper_api.cu), the kernel (src/hopper/fwd/kernel_fwd.cuh), the generator
// (scripts/generate_kernels.py) and the benchmark read the same numbers. constexpr: usable from
// host code (g++) and device code (nvcc) alike.
//
// Tile geometry follows FlashAttention-3 (hopper/tile_size.h) for 16-bit inputs: 128 query rows per
// CTA split over two consumer warpgroups (64 rows each, one wgmma M-extent; d64: 192 rows over
// three), key tile chosen so
// q_stages * Q + stages * (K + V) (+ one Q-sized O buffer with o_buffer) fits in the 227 KB of
// shared memory an sm_90 CTA may use.
#pragma once

#include <cstdint>

#include "core/exp2.h"
#include "hopper/buckets.h"

namespace fa4::detail {

struct HopperFwdConfig {
  int32_t headdim;        ///< compiled q/k head dim (inputs with a smaller multiple of 8 are padded)
  int32_t headdim_v;      ///< compiled v/out head dim
  int32_t tile_m;         ///< query rows per CTA: 64 per consumer warpgroup (128 or 192)
  int32_t tile_n;         ///< keys per pipeline stage; multiple of 16 (k-extent of the PV wgmma)
  int32_t stages;         ///< depth of the K and V shared-memory rings
  /// Q buffers. 2 lets the next tile's Q load during this tile, but measured 1-5% SLOWER on H200
  /// at d128 non-causal 4k-16k, so only d64 keeps 2 (equal there).
  int32_t q_stages;
  Exp2Emulation exp2_emulation;   ///< default share of exp2 done on the FMA pipe (FA4 Sec. 3)
  /// setmaxnreg for the softmax/MMA warpgroups and the TMA producer warpgroup (the gathering kernel
  /// splits the registers its own way: kernel_traits_fwd.cuh kConsumerRegs / kProducerRegs).
  int32_t consumer_regs;
  int32_t producer_regs;
  bool pingpong;          ///< named-barrier ordering (round robin) of the warpgroups' wgmma issue
  /// O is staged for its TMA store in its own smem buffer (tile_m x headdim) instead of the tile's
  /// dead Q buffer: Q is then released right after the key loop, so the next tile's Q loads
  /// under the last P V and the epilogue, and the TMA store is waited for one tile later. Measured
  /// at d128 +1.0..1.3% causal and Llama, +-0.7% non-causal; d96 +1.7% / +1.5%, d64 +0.2..0.3%
  /// at 8k and +1.0% / +3.1% at 512 (bench/results/history.md). Only where the smem fits.
  bool o_buffer;
  /// Key loop: the exponentials of a block start from the running row max, with no block max in
  /// front of them; the lazy-rescaling test runs on the exponentials afterwards
  /// (src/hopper/shared/softmax.cuh, OnlineSoftmax::step_from_running_max). Pays where the
  /// softmax sets the pace (bench/results/history.md; x cuDNN at 8k non-causal / causal: d64 1.11 -> 1.20 / 1.04 -> 1.15, d96 1.06 -> 1.13 /
  /// 1.11 -> 1.17, d128 1.01 -> 1.07 / 1.03 -> 1.10, d192x128 1.09 -> 1.14 / 1.20 -> 1.23); the
  /// MMA-bound d192 and d256 kernels measured 0.92 / 0.97 of the max-first loop at d192 8k and
  /// 0.92 at d256 causal 512, so they keep the block max first.
  bool exp_from_running_max;
  /// The gathering kernel packs a KV-cache chunk's GQA group into its row tiles (pack-GQA,
  /// launch_fwd.h fwd_packs_gqa) where the chunk's tokens fill at most half a row tile and the
  /// group divides tile_m: each gathered K/V block then serves the group's heads. (With d128's
  /// gather_min_seqlen_q of 64 that is chunks of exactly 64 tokens, group 3 or more: the decode
  /// kernel takes 128 rows per KV head or fewer.) d128, pages of
  /// 16, GQA 32/8, 64 tokens, an H100, kernel time packed / not: causal 8k 45.95 / 51.43 us,
  /// non-causal 16k 62.36 / 85.28. Elsewhere packing measured slower (bench/results/history.md
  /// 2026-12-07 08:xx: the TMA-box forward at 100-200 tokens per head and d64 128 tokens, 9-22%),
  /// and d64 / d256's gathering kernels were not measured packed: off.
  bool pack_gqa_gather;
  /// KV-cache chunks on gathered pages (gather_kernel, below) take the gathering kernel from this
  /// many query tokens (seqlen_q) on, the decode kernel below (launch_fwd.h kvcache_gathers).
  /// Measured before the forward could pack GQA groups (pack_gqa_gather): a chunk of seqlen_q tokens
  /// filled seqlen_q of a query head's tile_m rows, where the decode kernel packs a group's heads
  /// into its 16- or 64-row tiles. Pages
  /// of 16 on an H100, kernel time gathered / decode kernel: d64 (192-row tiles) 64 queries 1.26x
  /// (causal) and 1.48x (non-causal), 128 queries 0.90x, 512 0.80x; d128 64 queries 0.93x causal,
  /// 1.10x non-causal, 128-512 queries 0.61-0.69x; so half a row tile (96, 64). d256 measured at
  /// 256 queries only (0.21x; its decode kernel has no wide tile): 0, i.e. every chunk the route gives
  /// the forward (bench/results/history.md).
  int32_t gather_min_seqlen_q;
  /// Paged KV-cache chunks whose pages are no whole key blocks but a power of two from 8 rows
  /// (launch_fwd.h fwd_paged_load) run this bucket's gathering kernel (producer warps copying the
  /// rows with cp.async; scripts/generate_kernels.py writes its own instantiation file) instead of
  /// the decode kernel, from gather_min_seqlen_q queries on. Pages of 16 on an H100, kernel time
  /// against the decode kernel's: d256 4.7x faster (256 queries); d128 1.07-1.65x faster on 6 of 7
  /// shapes of 64-512 queries, causal and not, 0.91x at GQA 32/8 64 queries x 16k non-causal; d64
  /// 1.11-1.25x faster from 128 queries (bench/results/history.md).
  bool gather_kernel;
  /// A second kernel for causal masks and windows with a right edge (launch_fwd.h
  /// fwd_runs_local_kernel; scripts/generate_kernels.py writes its own instantiation file), whose
  /// consumer warpgroups each walk only the key blocks their own 64 rows see
  /// (src/hopper/fwd/mainloop_fwd_mma.cuh). Only a diagonal tile of three warpgroups or of key
  /// tiles under 128 has blocks some warpgroup's rows never see (at tile_m 128 with 128-key tiles a
  /// square causal tile has none). d64 (three warpgroups): causal 512 / 1k / 8k 0.59 / 0.67 / 1.10
  /// -> 0.72 / 0.82 / 1.16x cuDNN on the H200; d256 (80-key tiles) measured within noise (causal
  /// 512 / 8k +0.4% / +0.5%), not worth two instantiations; d192 is untimed. Masks without a
  /// right edge keep the plain kernel: the walk's code cost d64 non-causal 4-6% on an H100,
  /// though the key loop's instructions were the same (bench/results/history.md).
  bool local_kernel;
};

/// Registers: 2 x 128 x 240 + 128 x 24 = 64512 <= 65536 per SM (one CTA of 384 threads per SM);
/// with three consumer warpgroups (tile_m 192, 512 threads) 3 x 128 x 160 + 128 x 24 = 64512.
inline constexpr int32_t kHopperConsumerRegs = 240;
inline constexpr int32_t kHopperConsumerRegs3WG = 160;
inline constexpr int32_t kHopperProducerRegs = 24;
/// The gathering kernel's two consumer warpgroups (kernel_traits_fwd.cuh kConsumerRegs): 8 fewer,
/// so that its producer warpgroup, whose three warps copy K/V rows, gets 40 (the backward's
/// split). Three consumer warpgroups keep their 160 (152 made ptxas serialise their wgmmas,
/// C7512), which leaves the producers 32.
inline constexpr int32_t kHopperGatherConsumerRegs = 232;
/// A paged KV-cache call's producer warp 0 checks every page-table entry of a sequence's keys
/// before it publishes the sequence's tile (shared/tile_info.cuh seq_bounds), so each CTA's first
/// tile waits one round trip per 32 x this many entries: a 16k-key sequence has at most 16k /
/// tile_n entries on the TMA-box kernel's pages (whole key blocks: 128 at tile_n 128), 1024 on the
/// gathering kernel's pages of 16. Each entry in flight holds a register of the producer
/// warpgroup (24 in the TMA-box kernel, 32-40 in the gathering kernel), hence a knob per kernel.
inline constexpr int32_t kHopperPageCheckLoads = 4;
inline constexpr int32_t kHopperGatherPageCheckLoads = 4;
static_assert(kHopperPageCheckLoads >= 1 && kHopperGatherPageCheckLoads >= 1,
              "the paged producer checks every page-table entry: at least one load per lane");
inline constexpr int32_t kHopperRegisterFile = 64 * 1024;  ///< 32-bit registers per SM (sm_90)
/// Registers a CTA of `threads` threads holds for setmaxnreg to move between its warpgroups. With
/// __launch_bounds__(threads, 1) each thread starts with the register file's share, at most 255,
/// rounded down to a multiple of 8 (168 at 384 threads: 64512 in all, not 65536); setmaxnreg.inc
/// waits until the CTA's other warpgroups have released enough, so a split needing more than this
/// never completes (the kernel hangs).
constexpr int32_t hopper_cta_registers(int32_t threads) {
  const int32_t share = kHopperRegisterFile / threads;
  return threads * ((share < 255 ? share : 255) / 8 * 8);
}
static_assert(hopper_cta_registers(384) == 64512 && hopper_cta_registers(512) == 65536);
inline constexpr int32_t kHopperTileM = 128;      ///< two consumer warpgroups
inline constexpr int32_t kHopperTileM3WG = 192;   ///< three consumer warpgroups

// Exp2 emulation shares are in 8-column groups out of a period of 16 groups (core/exp2.h). Emulation pays
// where the MUFU unit (16 ex2/clk/SM) is the bottleneck and the FMA pipe has room: d96/d128. d128,
// measured with the exponentials started from the running max (bench/results/history.md), x cuDNN
// non-causal 4k/8k/16k | causal 4k/8k/16k | Llama: 0 -> 1.061/1.071/1.079 | 1.071/1.128/1.133 | 1.088,
// 1/16 -> 1.070/1.095/1.086 | 1.072/1.133/1.131 | 1.102, 2/16 (the max-first loop's best) ->
// 1.049/1.052/1.066 | 1.063/1.108/1.111 | 1.067. d >= 192 is MMA-bound, and d64's three
// warpgroups fill the FMA pipe with softmax work already (measured below), so everything stays on
// MUFU there. (d96's 3/16 was last tuned with the max-first loop.)
// Internal linkage (not `inline`): an inline variable is a GNU-unique symbol, which the dynamic
// linker shares between every libfa4 loaded in one process (A/B runs load several builds),
// so one build would read another build's table.
constexpr HopperFwdConfig kHopperFwdConfigs[] = {
    // d, dv, tile_m, tile_n, stages, q_stages, exp2_emulation, regs (consumer, producer), pingpong, o_buffer,
    // exp_from_running_max, pack_gqa_gather, gather_min_seqlen_q, gather_kernel, local_kernel
    // d64: three consumer warpgroups (192 query rows, FA3's tile): at d64 a warpgroup's softmax of a
    // block takes ~2x its Q K^T + P V, so two warpgroups leave the tensor core idle half the time.
    // Measured at 8k (x cuDNN): two warpgroups 0.90 / 0.91 (non-causal / causal); three with
    // exp2 emulation share 4/16 1.02-1.03 / 0.98-0.99, 2/16 1.06 / 1.01, 1/16 1.10 / 1.03, 0 1.11 / 1.06-1.07:
    // with three warpgroups the FMA pipe, not MUFU, is the scarcer unit, so d64 emulates nothing.
    {64, 64, kHopperTileM3WG, 128, 3, 2, Exp2Emulation{16, 0}, kHopperConsumerRegs3WG, kHopperProducerRegs, true, true, true, false, 96, true, true},
    {96, 96, kHopperTileM, 128, 2, 1, Exp2Emulation{16, 3}, kHopperConsumerRegs, kHopperProducerRegs, true, true, true, false, 0, false, false},
    {128, 128, kHopperTileM, 128, 2, 1, Exp2Emulation{16, 1}, kHopperConsumerRegs, kHopperProducerRegs, true, true, true, true, 64, true, false},
    // d192x128: key tile 128 measured +2.4% / +1.7% (non-causal / causal 8k) over 112.
    {192, 128, kHopperTileM, 128, 2, 1, Exp2Emulation{16, 0}, kHopperConsumerRegs, kHopperProducerRegs, false, false, true, false, 0, false, false},
    {192, 192, kHopperTileM, 96, 2, 1, Exp2Emulation{16, 0}, kHopperConsumerRegs, kHopperProducerRegs, false, false, false, false, 0, false, false},
    {256, 256, kHopperTileM, 80, 2, 1, Exp2Emulation{16, 0}, kHopperConsumerRegs, kHopperProducerRegs, false, false, false, false, 0, true, false},
};
inline constexpr int32_t kHopperNumFwdConfigs =
    int32_t(sizeof(kHopperFwdConfigs) / sizeof(kHopperFwdConfigs[0]));

/// Row of the table for the compiled bucket (headdim, headdim_v); nullptr if none.
constexpr const HopperFwdConfig* find_hopper_fwd_config(int32_t headdim, int32_t headdim_v) {
  return find_bucket_row(kHopperFwdConfigs, headdim, headdim_v);
}

/// The row a compile-time instantiation uses (a compile error if the bucket has no row).
constexpr HopperFwdConfig hopper_fwd_config(int32_t headdim, int32_t headdim_v) {
  const HopperFwdConfig* c = find_hopper_fwd_config(headdim, headdim_v);
  return c ? *c : throw "fa4: no Hopper forward config for this (headdim, headdim_v)";
}

// Exactly one row per bucket of the bucket list, and no other row.
#define FA4_TUNING_ROW_FOUND(D, DV) +(find_hopper_fwd_config(D, DV) != nullptr ? 1 : 0)
static_assert(0 FA4_HOPPER_BUCKETS(FA4_TUNING_ROW_FOUND) == kHopperNumFwdConfigs,
              "kHopperFwdConfigs must have one row per bucket of src/hopper/buckets.h");
#undef FA4_TUNING_ROW_FOUND

/// Compiled bucket an input (headdim, headdim_v) runs on: the smallest row with headdim >= d and
/// headdim_v >= dv, preferring equal q/v dims. Returns nullptr if none fits.
constexpr const HopperFwdConfig* hopper_fwd_bucket(int32_t d, int32_t dv) {
  return smallest_fitting_row(kHopperFwdConfigs, d, dv);
}

}  // namespace fa4::detail
