// src/hopper/tile_scheduler.cuh — persistent tile order of the forward kernel.
//
// The grid has min(num_tiles, num_SMs) CTAs; CTA c processes tiles c, c + grid, c + 2 grid, ...
// A tile is (m_block, head, batch): 128 query rows of one head. The linear tile index is mapped so
//   * LPT: under causal/window masks the bottom m-blocks see the most keys; handing them out first
//     (longest-processing-time first) keeps the last wave short. Used for masked (causal/window)
//     and varlen problems; dense ones take the plain order (hopper_api.cu; FA4_HOPPER_LPT=0/1
//     forces it for the ablation).
//   * L2 sections: (batch, head) pairs are processed in sections of `heads_per_section` whose K/V
//     fit in half the L2 together, iterating all m-blocks of a section before the next. Concurrent
//     CTAs then re-read the same K/V from L2 instead of HBM. Query heads of one KV head are
//     adjacent (GQA groups are contiguous), so a section shares K/V across the group too.
// The producer warp and both consumer warpgroups walk the same sequence, so they agree on every
// tile without communicating.
#pragma once

#include <cstdint>

#include "fa4/detail/macros.h"

namespace fa4::hopper {

struct TileCoord {
  int32_t m_block;
  int32_t head;
  int32_t batch;
};

template <class Params>
FA4_HD TileCoord tile_coord(const Params& p, int32_t t) {
  const int32_t num_m = p.num_m_blocks;
  if (!p.lpt) {  // plain order: m fastest, then head, then batch
    const int32_t bh = t / num_m;
    return {t % num_m, bh % p.num_heads, bh / p.num_heads};
  }
  const int32_t num_bh = p.num_heads * p.batch;
  const int32_t sec = p.heads_per_section;
  const int32_t section = t / (sec * num_m);
  const int32_t in_section = t - section * sec * num_m;
  const int32_t rest = num_bh - section * sec;
  const int32_t sec_heads = sec < rest ? sec : rest;  // the last section may be short
  const int32_t m_idx = in_section / sec_heads;
  const int32_t bh = section * sec + in_section % sec_heads;
  return {num_m - 1 - m_idx, bh % p.num_heads, bh / p.num_heads};
}

}  // namespace fa4::hopper
