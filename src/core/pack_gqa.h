// src/core/pack_gqa.h — pack-GQA's row map, the one place that says which query token and query
// head a packed row is. A tile of packed rows belongs to one KV head; its rows are (token, head of
// the group) pairs, the group's heads fastest, so the group's query heads share each K/V block
// that the tile loads (FlashAttention-3's PackGQA order). The decode kernel (hopper/decode/) packs
// every KV-cache call; the forward's gathering kernels pack where launch_fwd.h fwd_packs_gqa says,
// their tiles starting at whole tokens (hopper/shared/tile_info.cuh tile_row).
#pragma once

#include <cstdint>

#include "core/macros.h"

namespace fa4::detail {

/// A packed row's query token (within its sequence) and query head.
struct RowCoord {
  int32_t query;
  int32_t head;
};

/// Packed row `row` (counted from a token's first head) of KV head kv_head, whose group holds
/// `group` query heads: token row / group of query head kv_head * group + row % group.
FA4_HD RowCoord packed_row(int32_t row, int32_t kv_head, int32_t group) {
  return {row / group, kv_head * group + row % group};
}

}  // namespace fa4::detail
