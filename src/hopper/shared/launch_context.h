// src/hopper/shared/launch_context.h — what the selector (hopper_api.cu) hands every Hopper launch
// (fwd/, bwd/, decode/): the device's facts and the launch choices it made. Host only, no CUDA.
#pragma once

#include <cstdint>

namespace fa4::hopper {

/// Most tiles one launch numbers: tile indices are int32 and a CTA computes `t + grid` (grid
/// <= 2^16) past the last one, which must not overflow.
inline constexpr int64_t kMaxTiles = int64_t(INT32_MAX) - (int64_t(1) << 16);

/// Longest block any kernel walks (query rows or keys): the tuning tables are checked against it
/// (hopper_api.cu).
inline constexpr int32_t kMaxBlockRows = 256;
/// Most rows of q and of k/v a launch takes (a batched sequence length, a varlen packed total, a
/// decode kernel's key capacity). Rows and keys are int32 in the kernels, which add a block's
/// extent to its first index and form fragment rows past a sequence's last row; two blocks of
/// margin keep those sums inside int32: 2^31 - 512.
inline constexpr int64_t kMaxRows = int64_t(INT32_MAX) + 1 - 2 * kMaxBlockRows;

/// Host facts the launch needs (queried once per device by hopper_api.cu) and its choices.
struct LaunchContext {
  int32_t num_sms = 0;
  int64_t l2_bytes = 0;
  /// LPT order + L2 sections (forward: masked/varlen; backward: tuning_bwd.h bwd_order; override
  /// "lpt" forces)
  bool lpt = true;
  /// Backward under lpt: key blocks per band (bwd/schedule_bwd.h bwd_tile_coord; hopper_api.cu
  /// sets it from bwd/tuning_bwd.h, override "bwd_lpt_band" forces).
  int32_t bwd_lpt_band = 1;
  /// Backward: each CTA walks its query blocks from the last down (bwd/schedule_bwd.h
  /// bwd_step_block; hopper_api.cu sets it, override "bwd_walk" forces).
  bool bwd_descending = false;
  /// Tiles claimed from an atomic counter (greedy, tile_scheduler.cuh) instead of a static stride
  /// (hopper_api.cu sets it: causal/window, not varlen; override "schedule" forces).
  /// Used only when there are more tiles than CTAs.
  bool dynamic_schedule = false;
  /// O (forward), dK and dV (backward) through smem + TMA store (hopper_api.cu sets it where they
  /// are TMA-aligned, and batched for O; override "epilogue" = direct forces the direct register
  /// stores, for the ablation).
  bool tma_epilogue = false;
  /// Forward: pack-GQA, a row tile's rows are (token, head) pairs of one KV head's group
  /// (hopper_api.cu sets it by fwd/launch_fwd.h fwd_packs_gqa; override "pack_gqa" forces), only
  /// for a gathering kernel (kernel_traits_fwd.cuh kPackGqa; launch_fwd.cuh throws otherwise). O
  /// then leaves through direct stores (tma_epilogue false).
  bool pack_gqa = false;
  /// A KV-cache call on the forward kernel (hopper_api.cu forward_kvcache): sequence b attends to
  /// the first cache_seqlens[b] + seqlen_new keys of its row of the dense cache (k/v, seqlen_k = the
  /// capacity); cache_seqlens nullptr: all of them.
  const int32_t* cache_seqlens = nullptr;
  int32_t seqlen_new = 0;
  /// ... of a paged cache: k/v are the page pool (num_pages, page_size, heads_kv, d) and key j of
  /// sequence b is row j % page_size of page page_table[b * page_table_batch_stride + j /
  /// page_size]; page_size a multiple of the forward's key tile or, on a bucket with a gathering
  /// kernel, a power of two from 8 rows (fwd/launch_fwd.h fwd_paged_load). nullptr: a dense cache.
  const int32_t* page_table = nullptr;
  int64_t page_table_batch_stride = 0;
  int32_t page_size = 0, num_pages = 0;
  /// The decode launch runs only the append of k_new / v_new (the forward kernel attends).
  bool decode_append_only = false;
  /// Stream-K split of the last partial round (core/stream_k.h; tiles planned at every key block,
  /// launch_fwd.h fwd_key_split_eligible): -1
  /// where the cost model predicts a gain, 0 never, 1 wherever there is a partial round
  /// (override "stream_k" forces; tests and the ablation; common/overrides.h).
  int stream_k = -1;
  /// ... and a CTA's least share of the tail's key blocks (0: the model's; override
  /// "stream_k_min_share").
  int32_t stream_k_min_share = 0;
  /// Decode: the splits of a tile merge through distributed shared memory as one thread-block
  /// cluster where that pays (-1, decode/launch_decode.h decode_cluster_size), wherever clusters
  /// take no more waves than the plain launch (1), or never (0): override "decode_cluster", for
  /// the tests and the A/B.
  int8_t decode_cluster = -1;
  /// Decode: the row tile (decode/launch_decode.h decode_tile): the selector's (-1), narrow 16-row
  /// tiles (0) or wide 64-row tiles where the bucket has them (1): override "decode_tile", for the
  /// tests and the A/B.
  int8_t decode_tile = -1;
  /// Decode: the narrow tile's 4-warp (0) or 8-warp (1) form, or the selector's (-1,
  /// decode/launch_decode.h decode_eight_warps): override "decode_warps", for the tests and the A/B.
  int8_t decode_warps = -1;
  /// Decode: microseconds every append CTA waits before its writes (override
  /// "decode_append_delay_us", for the test of the decode's wait for the append); 0: none.
  int32_t decode_append_delay_us = 0;
  /// Varlen and KV-cache calls: the device's asynchronous error record (device_state.h); else nullptr.
  uint8_t* async_error = nullptr;
  /// The API call a launch names in CUDA errors (fa4::forward, fa4::forward_with_kvcache; a
  /// small-query forward on the decode kernel and a KV-cache call on the forward kernel name the call
  /// made).
  const char* fn = "fa4::forward_with_kvcache";
  /// Forward kernel: called once right before the kernel is launched, after everything that can
  /// fail on the host (the smem limit, scratch): a KV-cache call's append (hopper_api.cu
  /// forward_kvcache), so no error leaves the cache written. nullptr: none.
  void (*before_kernel)(const void* arg) = nullptr;
  const void* before_kernel_arg = nullptr;
};

}  // namespace fa4::hopper
