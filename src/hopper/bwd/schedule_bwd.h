// src/hopper/bwd/schedule_bwd.h — the backward's index arithmetic, host + device (no CUDA, so the
// CPU tests check it: tests/cpu/test_hopper_host.cpp): which tile a CTA runs, which query blocks a
// key block sees, where a sequence's workspace chunks start, and the dQ staging order.
// geometry_bwd.cuh wraps these for the kernels.
#pragma once

#include <cstdint>

#include "core/mask.h"
#include "core/macros.h"

namespace fa4::hopper {

/// The query blocks [m_lo, m_hi) a key block sees: the union over its keys of core/mask.h's
/// visible_query_range, whose ends are monotone in the key, is inside [first(j_lo), last(j_hi)).
/// Empty when the block is past seqlen_k or no query sees any of its keys.
struct QueryBlocks {
  int32_t m_lo = 0, m_hi = 0;
};
template <int kBlockM, int kBlockN>
FA4_HD QueryBlocks query_blocks(int32_t n_block, int32_t seqlen_q, int32_t seqlen_k, detail::MaskSpec mask) {
  QueryBlocks r;
  const int32_t j_lo = n_block * kBlockN;
  if (j_lo >= seqlen_k) return r;
  const int32_t j_hi = (j_lo + kBlockN < seqlen_k ? j_lo + kBlockN : seqlen_k) - 1;
  const detail::QueryRange a = detail::visible_query_range(j_lo, seqlen_q, seqlen_k, mask);
  const detail::QueryRange z = detail::visible_query_range(j_hi, seqlen_q, seqlen_k, mask);
  if (z.last <= a.first) return r;
  r.m_lo = int32_t(a.first / kBlockM);
  r.m_hi = int32_t((z.last + kBlockM - 1) / kBlockM);
  return r;
}

/// The query blocks [m_lo, m_hi) that every key of [key0, key0 + kKeys) sees whole: all kBlockM
/// queries of the block (each below seqlen_q) see every one of those keys (each below seqlen_k),
/// so a step there needs no per-pair mask. The visible range's ends rise with the key, so the
/// last key bounds the start and the first key the end. Empty (m_lo >= m_hi) when a key is past
/// seqlen_k or no block qualifies.
template <int kBlockM, int kKeys>
FA4_HD QueryBlocks dense_query_blocks(int32_t key0, int32_t seqlen_q, int32_t seqlen_k, detail::MaskSpec mask) {
  QueryBlocks r;
  if (key0 < 0 || int64_t(key0) + kKeys > seqlen_k) return r;
  const int64_t first = detail::visible_query_range(key0 + kKeys - 1, seqlen_q, seqlen_k, mask).first;
  const int64_t last = detail::visible_query_range(key0, seqlen_q, seqlen_k, mask).last;
  r.m_lo = int32_t((first + kBlockM - 1) / kBlockM);
  r.m_hi = int32_t(last / kBlockM);
  return r;
}

/// The query block of step s (0 <= s < m_hi - m_lo) of a walk over [m_lo, m_hi): from the last
/// down when `descending`, else from the first up. Every role of the CTA walks the same order.
FA4_HD int32_t bwd_step_block(QueryBlocks m, bool descending, int32_t s) {
  return descending ? m.m_hi - 1 - s : m.m_lo + s;
}

/// Coordinates of tile t: key block n_block of KV head h_kv of sequence b. Dense problems: key
/// block fastest, so the CTAs running at once share a head's Q and dO in L2. Masked (causal,
/// window) and varlen problems (lpt): longest first (under a bottom-right causal mask the first
/// key blocks see the most queries) in bands of `band` key blocks: band after band, and inside a
/// band each (sequence, KV head)'s key blocks next to each other, so the CTAs running at once
/// hold `band` tiles of each head they work on (band 1: key block slowest, and with more
/// (sequence, KV head) pairs than CTAs those of a round share nothing). The last band may be
/// narrower. Either way a key block of a head has a higher index than the blocks before it,
/// which the deterministic mode's ordering relies on (mainloop_bwd_load.cuh).
struct BwdTileCoord {
  int32_t n_block, h_kv, b;
};
FA4_HD BwdTileCoord bwd_tile_coord(int32_t t, int32_t num_n_blocks, int32_t num_heads_kv, int32_t batch, bool lpt,
                                   int32_t band) {
  const int32_t num_bh = num_heads_kv * batch;
  int32_t n, bh;
  if (!lpt) {
    n = t % num_n_blocks;
    bh = t / num_n_blocks;
  } else {
    const int32_t n0 = t / (band * num_bh) * band;  // the band's first key block
    const int32_t width = band < num_n_blocks - n0 ? band : num_n_blocks - n0;
    const int32_t r = t - n0 * num_bh;  // index inside the band
    n = n0 + r % width;
    bh = r / width;
  }
  return {n, bh % num_heads_kv, bh / num_heads_kv};
}

/// The tile of CTA `cta`'s i-th iteration in a grid of `grid` CTAs (>= the tile count: none).
/// Rounds of `grid` tiles; with lpt odd rounds run backwards, so the CTA that took the first
/// (longest) end of a round takes the shorter end of the next (a plain stride hands CTA 0 the
/// first tile of every round). Inside a band the cost falls with the key block and rises again
/// at the next head, so a round is a sawtooth of band-wide teeth and the snake evens out the
/// rounds' ends. Every CTA's sequence increases, so the lowest unfinished tile is always running.
FA4_HD int32_t bwd_tile_index(int32_t i, int32_t cta, int32_t grid, bool lpt) {
  return i * grid + (lpt && (i & 1) ? grid - 1 - cta : cta);
}

/// First workspace chunk (query block of kBlockM rows) of sequence b, whose first packed row is
/// q_row0: b * num_m_blocks when batched; for varlen floor(q_row0 / kBlockM) + b, an upper bound
/// on the chunks of the sequences before it, so sequences never share one and all fit in
/// bwd_num_chunks.
template <int kBlockM>
FA4_HD int32_t bwd_chunk_base(bool varlen, int32_t b, int32_t q_row0, int32_t num_m_blocks) {
  return varlen ? q_row0 / kBlockM + b : b * num_m_blocks;
}
FA4_HD int64_t bwd_num_chunks(int32_t block_m, bool varlen, int64_t batch, int64_t total_q,
                              int64_t num_m_blocks) {
  return varlen ? total_q / block_m + batch : batch * num_m_blocks;
}
template <int kBlockM>
FA4_HD int64_t bwd_num_chunks(bool varlen, int64_t batch, int64_t total_q, int64_t num_m_blocks) {
  return bwd_num_chunks(kBlockM, varlen, batch, total_q, num_m_blocks);
}

/// The dQ accumulator of a (head, chunk) holds kBlockM x kHeadDim floats as two halves, one per
/// consumer warpgroup wg, each 64 rows x kHeadDim * kBlockM / 128 columns: for kBlockM = 64 the
/// block's rows and columns [wg d/2, (wg + 1) d/2); for kBlockM = 128 (dq_split_rows) rows
/// [64 wg, 64 wg + 64) and every column. The kernel's dQ product splits the same way
/// (kernel_traits_bwd.cuh kDqSplitRows). dq_part_origin gives a half's first row and column.
template <int kBlockM>
inline constexpr bool dq_split_rows = kBlockM == 128;
struct DqPartOrigin {
  int32_t row, col;
};
template <int kBlockM, int kHeadDim>
FA4_HD DqPartOrigin dq_part_origin(int wg) {
  static_assert(kBlockM == 64 || kBlockM == 128, "query blocks of 64 or 128 rows");
  return dq_split_rows<kBlockM> ? DqPartOrigin{64 * wg, 0} : DqPartOrigin{0, wg * (kHeadDim / 2)};
}
/// 8-column groups in a half (kBlockM * kHeadDim / 2 floats, 512 per group).
template <int kBlockM, int kHeadDim>
inline constexpr int kDqGroupsPerPart = kBlockM * kHeadDim / 1024;

/// Offset, inside a (head, chunk) dQ accumulator, of the float4 that thread t (0..127) of warpgroup
/// wg stages for the 8-column group g of its half: its accumulator values 4g..4g+3, i.e. rows
/// origin.row + r0 and + 8 (r0 = the wgmma fragment row of t: 16 (t / 32) + (t % 32) / 4) at
/// columns origin.col + 8g + 2 (t % 4) + {0, 1}, in the order (r0, c), (r0, c+1), (r0+8, c),
/// (r0+8, c+1).
template <int kBlockM, int kHeadDim>
FA4_HD int32_t dq_chunk_index(int wg, int g, int t) {
  return wg * (kBlockM * kHeadDim / 2) + g * 512 + t * 4;
}

}  // namespace fa4::hopper
