// src/common/overrides.h — kernel-choice overrides for tests and benchmarks (ablations).
//
// The selector picks the tile order, the tile claiming, the epilogue, the stream-K split and the
// kernel of small-query forwards by itself; tests and benchmarks force them through these
// process-wide overrides, set once through fa4_internal_set_override (declared below, exported
// from libfa4 but not part of the public headers). Reading them on the call path is a few relaxed
// atomic loads: no environment lookup. One of them is a test hook, not a kernel choice:
// decode_append_delay_us slows the append kernel so a test can show that the decode waits for it.
#pragma once

#include <cstdint>

#include "fa4/c_api.h"

namespace fa4::detail {

/// The widest band "bwd_lpt_band" accepts (and the tuning table may hold: bwd/tuning_bwd.h).
inline constexpr int32_t kMaxBwdLptBand = 64;
/// The largest least share (key blocks) "stream_k_min_share" accepts.
inline constexpr int32_t kMaxStreamKMinShare = 64;
/// The longest delay (microseconds) "decode_append_delay_us" accepts.
inline constexpr int32_t kMaxDecodeAppendDelayUs = 1000;

/// -1: the selector decides; 0 / 1: forced off / on.
struct KernelOverrides {
  int8_t lpt = -1;               ///< "lpt": LPT order + L2 sections
  /// "schedule": tiles claimed from an atomic counter (1) or a static stride (0); the backward's
  /// rows without tile_claims (tuning_bwd.h) take the static stride either way
  int8_t dynamic_schedule = -1;
  int8_t tma_epilogue = -1;      ///< "epilogue": O (dK, dV) through smem + TMA store (1) or direct stores (0)
  int8_t stream_k = -1;          ///< "stream_k": split the partial last round (1) or never (0)
  /// "small_q": a forward with few query rows per KV head on the decode kernel (1, where it can
  /// run) or on the forward kernel (0)
  int8_t small_q_decode = -1;
  /// "bwd_lpt_band": the backward's key blocks per band of the longest-first order (1..64), 0: the
  /// selector's (bwd/tuning_bwd.h bwd_order)
  int32_t bwd_lpt_band = 0;
  /// "stream_k_min_share": the least key blocks of a stream-K CTA's tail share (1..64); 0: 1, the
  /// cost model alone picks the CTA count (core/stream_k.h plan_stream_k)
  int32_t stream_k_min_share = 0;
  /// "bwd_walk": a backward CTA walks its query blocks from the last down ("desc", 1) or up ("asc", 0)
  int8_t bwd_descending = -1;
  /// "decode_cluster": the decode's splits merge in thread-block clusters wherever clusters take no
  /// more waves than the plain launch (1), or always through global scratch (0); -1: where it
  /// pays (decode/launch_decode.h decode_cluster_size)
  int8_t decode_cluster = -1;
  /// "decode_tile": the decode's row tiles of 16 rows ("16", 0) or of 64 where the bucket has them
  /// ("64", 1); -1: the selector's (decode/launch_decode.h decode_tile)
  int8_t decode_tile = -1;
  /// "decode_warps": the decode's narrow tile in its 4-warp form on 64-key blocks ("4", 0) or its
  /// 8-warp form on 128-key blocks where the bucket has it ("8", 1); -1: the selector's
  /// (decode/launch_decode.h decode_eight_warps)
  int8_t decode_warps = -1;
  /// "capture_scratch": the scratch of a call captured into a CUDA graph is kept by fa4 for the
  /// life of the process ("retained", 1: no CUDA user object, so a replay costs nothing more), or
  /// owned by the graph through a user object and reused once the graph is destroyed ("graph",
  /// 0); -1: retained while the device's retained scratch stays within
  /// hopper/shared/device_state.h kRetainedCaptureScratchBytes
  int8_t capture_scratch = -1;
  /// "pack_gqa": the gathering forward kernel's row tiles hold (token, head) pairs of a KV head's
  /// GQA group wherever the group divides the row tile (1), or one query head each (0); -1: where
  /// measured faster (hopper/fwd/launch_fwd.h fwd_packs_gqa; the other forward kernels never pack)
  int8_t pack_gqa = -1;
  /// "decode_append_delay_us": every CTA of a KV-cache call's append kernel waits this long (1..1000
  /// microseconds) between its checks and its writes; 0: none. Only a slow append shows whether the
  /// decode kernel, its programmatic dependent, waits for it: the test of that wait sets it.
  int32_t decode_append_delay_us = 0;
};

/// The current overrides.
KernelOverrides kernel_overrides();

/// Sets one override: name "lpt" (value "0" | "1"), "schedule" ("static" | "dynamic"), "epilogue"
/// ("direct" | "tma"), "stream_k" ("0" | "1"), "small_q" ("fwd" | "decode"), "bwd_walk" ("asc" |
/// "desc"), "decode_cluster" ("0" | "1"), "decode_tile" ("16" | "64"), "decode_warps" ("4" | "8"),
/// "capture_scratch" ("graph" | "retained"), "pack_gqa" ("0" | "1"), "bwd_lpt_band" ("1" .. "64"),
/// "stream_k_min_share" ("1" .. "64") or "decode_append_delay_us" ("1" .. "1000"); the value "auto"
/// returns the choice to the selector. Throws fa4::Error(kInvalidArgument) naming the rule for any
/// other name or value.
void set_kernel_override(const char* name, const char* value);

}  // namespace fa4::detail

extern "C" {
/// C entry point of set_kernel_override for the Python tests and benchmarks; returns an
/// fa4_status (fa4_last_error() has the message). Not part of the stable ABI.
FA4_C_EXPORT int32_t fa4_internal_set_override(const char* name, const char* value);
}
