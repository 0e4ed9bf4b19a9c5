// src/common/overrides.cpp — storage of the kernel-choice overrides (overrides.h).
#include "common/overrides.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fa4/error.h"

namespace fa4::detail {
namespace {

struct Knob {
  const char* name;
  const char* off;  ///< value for 0
  const char* on;   ///< value for 1
  std::atomic<int8_t>* slot;
};

std::atomic<int8_t> g_lpt{-1}, g_schedule{-1}, g_epilogue{-1}, g_stream_k{-1}, g_small_q{-1}, g_bwd_walk{-1},
    g_decode_cluster{-1}, g_decode_tile{-1}, g_decode_warps{-1}, g_capture_scratch{-1}, g_pack_gqa{-1};
std::atomic<int32_t> g_bwd_lpt_band{0}, g_stream_k_min_share{0}, g_decode_append_delay_us{0};

const Knob kKnobs[] = {
    {"lpt", "0", "1", &g_lpt},
    {"schedule", "static", "dynamic", &g_schedule},
    {"epilogue", "direct", "tma", &g_epilogue},
    {"stream_k", "0", "1", &g_stream_k},
    {"small_q", "fwd", "decode", &g_small_q},
    {"bwd_walk", "asc", "desc", &g_bwd_walk},
    {"decode_cluster", "0", "1", &g_decode_cluster},
    {"decode_tile", "16", "64", &g_decode_tile},
    {"decode_warps", "4", "8", &g_decode_warps},
    {"capture_scratch", "graph", "retained", &g_capture_scratch},
    {"pack_gqa", "0", "1", &g_pack_gqa},
};

/// Integer knobs: 1..max, or "auto" (0: the selector's).
struct IntKnob {
  const char* name;
  int32_t max;
  std::atomic<int32_t>* slot;
};

const IntKnob kIntKnobs[] = {{"bwd_lpt_band", kMaxBwdLptBand, &g_bwd_lpt_band},
                             {"stream_k_min_share", kMaxStreamKMinShare, &g_stream_k_min_share},
                             {"decode_append_delay_us", kMaxDecodeAppendDelayUs, &g_decode_append_delay_us}};

}  // namespace

KernelOverrides kernel_overrides() {
  KernelOverrides o;
  o.lpt = g_lpt.load(std::memory_order_relaxed);
  o.dynamic_schedule = g_schedule.load(std::memory_order_relaxed);
  o.tma_epilogue = g_epilogue.load(std::memory_order_relaxed);
  o.stream_k = g_stream_k.load(std::memory_order_relaxed);
  o.small_q_decode = g_small_q.load(std::memory_order_relaxed);
  o.bwd_descending = g_bwd_walk.load(std::memory_order_relaxed);
  o.bwd_lpt_band = g_bwd_lpt_band.load(std::memory_order_relaxed);
  o.stream_k_min_share = g_stream_k_min_share.load(std::memory_order_relaxed);
  o.decode_cluster = g_decode_cluster.load(std::memory_order_relaxed);
  o.decode_tile = g_decode_tile.load(std::memory_order_relaxed);
  o.decode_warps = g_decode_warps.load(std::memory_order_relaxed);
  o.capture_scratch = g_capture_scratch.load(std::memory_order_relaxed);
  o.pack_gqa = g_pack_gqa.load(std::memory_order_relaxed);
  o.decode_append_delay_us = g_decode_append_delay_us.load(std::memory_order_relaxed);
  return o;
}

void set_kernel_override(const char* name, const char* value) {
  constexpr const char* kFn = "fa4_internal_set_override";
  if (!name || !value) throw Error(ErrorCode::kInvalidArgument, std::string(kFn) + ": name and value must not be NULL");
  for (const IntKnob& k : kIntKnobs) {
    if (std::strcmp(name, k.name) != 0) continue;
    int32_t v = 0;
    if (std::strcmp(value, "auto") != 0) {
      char* end = nullptr;
      const long x = std::strtol(value, &end, 10);
      if (value[0] < '0' || value[0] > '9' || *end != '\0' || x < 1 || x > k.max)
        throw Error(ErrorCode::kInvalidArgument, std::string(kFn) + ": " + name + " = '" + value +
                                                     "' must be an integer in 1.." + std::to_string(k.max) +
                                                     " or 'auto'");
      v = int32_t(x);
    }
    k.slot->store(v, std::memory_order_relaxed);
    return;
  }
  for (const Knob& k : kKnobs) {
    if (std::strcmp(name, k.name) != 0) continue;
    int8_t v;
    if (std::strcmp(value, "auto") == 0) v = -1;
    else if (std::strcmp(value, k.off) == 0) v = 0;
    else if (std::strcmp(value, k.on) == 0) v = 1;
    else
      throw Error(ErrorCode::kInvalidArgument, std::string(kFn) + ": " + name + " = '" + value + "' must be '" +
                                                   k.off + "', '" + k.on + "' or 'auto'");
    k.slot->store(v, std::memory_order_relaxed);
    return;
  }
  throw Error(ErrorCode::kInvalidArgument, std::string(kFn) + ": unknown override '" + name +
                                               "' (lpt, schedule, epilogue, stream_k, small_q, bwd_walk, bwd_lpt_band, stream_k_min_share, decode_cluster, decode_tile, decode_warps, decode_append_delay_us, capture_scratch, pack_gqa)");
}

}  // namespace fa4::detail
