// src/core/stream_k.h — stream-K split of the last, partial round of a persistent tile schedule.
//
// Why: a problem whose tiles all walk the same key blocks (no mask; or a causal chunk against a
// long cache, whose tiles see all or most of them: hopper/fwd/launch_fwd.h fwd_key_split_eligible)
// has num_tiles equal tiles on `grid` persistent CTAs. When num_tiles is not a
// multiple of grid, the last round keeps only num_tiles % grid CTAs busy. A small batch (fewer
// tiles than SMs) then leaves most of the GPU idle: that is where the split runs automatically.
// (Splitting the half-empty last round of the benchmark's shapes, d128: 2048 tiles on 132 SMs =
// 15.5 rounds, was priced at ~3% on paper but measured no gain on H200; see plan_stream_k.) Stream-K (Osama et al., "Stream-K:
// Work-centric Parallel Decomposition for Dense Matrix-Multiplication on the GPU", PPoPP 2023)
// spreads the tail's key blocks evenly over the CTAs instead: every CTA first runs whole tiles
// ("data-parallel" rounds) and a contiguous share of the tail's (tile, key block) sequence. A
// tile cut between CTAs is finished by the CTA holding its first piece (the combiner), which merges
// the other pieces' un-normalised O and row statistics exactly (max-rescaled sums, the same algebra
// as the online softmax) before the normal epilogue.
//
// Order inside one CTA: the piece that does NOT start a tile (a contributor; at most one per CTA,
// the first of its range) runs FIRST, before the whole tiles, and combiners last. So a combiner
// finds its contributors' partials long written and never waits in practice; and the kernel is
// launched cooperatively (all CTAs co-resident) so the wait that remains cannot deadlock.
//
// Everything here is host/device: the launch plans, the kernel enumerates a CTA's work items, and
// tests/cpu/test_stream_k.cpp checks coverage and the combiner lists without a GPU.
#pragma once

#include <cstdint>
#include <climits>

#include "core/macros.h"

namespace fa4::detail {

/// Cost model of the split (in key-block units of the bucket's tile_n): a tile costs
/// blocks_per_tile + kTileFixedCostBlocks (Q load, first Q K^T without overlap, last PV, epilogue:
/// measured ~1.4 blocks at d128, bench/results/history.md); a CTA's tail runs its share and up to
/// two pieces (two fixed costs; one where the shares cut the tiles into equal pieces) and one more
/// for the split, and a tile's combiner merges the partials of the tile's other pieces one after
/// another (kCombineCostBlocks each). H100, 8-32 tiles of 8-32 blocks, d64 and d128: each further
/// piece of a tile cost 0.4-0.9 us, about half a block, and shares that did not align with the
/// tiles about 2 blocks more (bench/results/history.md).
inline constexpr float kTileFixedCostBlocks = 1.5f;
inline constexpr float kCombineCostBlocks = 0.5f;
/// The least tail share of the coarse split (stream_k_splits_coarsely, below).
inline constexpr int32_t kStreamKRouteMinShare = 8;
inline constexpr float kStreamKMinGain = 0.75f;  ///< automatic split: predicted tail time ratio at most this

/// The split of one launch. tail_ctas == 0: off (every CTA runs whole tiles t = cta + k * grid).
struct StreamKPlan {
  int32_t grid = 0;             ///< CTAs to launch
  int32_t tail_ctas = 0;        ///< CTAs 0..tail_ctas-1 share the tail; 0: no split
  int32_t dp_rounds = 0;        ///< whole-tile rounds first: tiles [0, dp_rounds * grid)
  int32_t tail_tile0 = 0;       ///< first tail tile (= dp_rounds * grid)
  int32_t blocks_per_tile = 0;  ///< key blocks of every tile (the split is for tiles that all walk them)
  int32_t tail_blocks = 0;      ///< (num_tiles - tail_tile0) * blocks_per_tile (< 2^31)
  int32_t share = 0;            ///< tail_blocks / tail_ctas: CTA c's share is share or share + 1
  int32_t share_rem = 0;        ///< tail_blocks % tail_ctas: the first share_rem CTAs get share + 1
};

/// One unit of a CTA's work, as the producer hands it to the consumers.
struct WorkItem {
  int32_t tile = 0;  ///< linear tile index; >= num_tiles: none left for this CTA
  int32_t n_lo = 0;  ///< key blocks [n_lo, n_hi) of the tile; n_lo == n_hi: all of them
  int32_t n_hi = 0;
  /// 0: a whole tile (normal epilogue). -1: a contributor piece, stored as a partial in this CTA's
  /// slot. k > 0: a combiner piece; merge the partials of CTAs cta + 1 .. cta + k, then the epilogue.
  int32_t role = 0;
};

/// The partial last round of num_tiles tiles of blocks_per_tile key blocks on num_sms SMs, as far
/// as a split can take it: tiles == 0 where there is nothing to split (no partial round, or bad
/// sizes) or the tail is too long for the device's 32-bit walk (the producer warp runs on 24
/// registers, and a 64-bit division there spilled: tails of 2^31 key blocks or more).
struct StreamKTail {
  int64_t rounds = 0;  ///< full rounds of whole tiles before it
  int64_t tiles = 0;   ///< tiles of the partial round
  int64_t blocks = 0;  ///< their key blocks (< 2^31 - blocks_per_tile: a + nb - 1 stays in range)
};

inline StreamKTail stream_k_tail(int64_t num_tiles, int32_t num_sms, int32_t blocks_per_tile) {
  StreamKTail t;
  if (blocks_per_tile <= 0 || num_tiles <= 0 || num_sms <= 0) return t;
  t.rounds = num_tiles / num_sms;
  t.tiles = num_tiles - t.rounds * num_sms;
  t.blocks = t.tiles * blocks_per_tile;
  if (t.blocks > INT32_MAX - blocks_per_tile) t.tiles = t.blocks = 0;
  return t;
}

/// The most CTAs among which `blocks` key blocks split with shares of at least `least` blocks, at
/// most one per SM, at least one.
inline int64_t stream_k_max_ctas(int64_t blocks, int32_t least, int32_t num_sms) {
  const int64_t c = blocks / least;
  return c > num_sms ? num_sms : c < 1 ? 1 : c;
}

/// Plans the split for num_tiles equal tiles of blocks_per_tile key blocks on num_sms SMs.
/// mode: -1 automatic (fewer tiles than SMs, where the cost model above predicts a shorter
/// makespan), 0 off, 1 on wherever there is a partial round to split (tests and the ablation).
/// min_share: a CTA's least tail share in key blocks (0: 1; override "stream_k_min_share").
inline StreamKPlan plan_stream_k(int64_t num_tiles, int32_t num_sms, int32_t blocks_per_tile, int mode,
                                 int32_t min_share = 0) {
  StreamKPlan s;
  s.grid = int32_t(num_tiles < num_sms ? num_tiles : num_sms);
  const StreamKTail tail = stream_k_tail(num_tiles, num_sms, blocks_per_tile);
  if (mode == 0 || tail.tiles == 0) return s;  // (every round full: nothing to balance)
  const int64_t rounds = tail.rounds, tail_tiles = tail.tiles, tail_blocks = tail.blocks;
  // Makespan of the tail on c CTAs: one more round of whole tiles, or the longest share plus the
  // fixed costs of its pieces and the merge of a tile's pieces (the whole-tile rounds before it are
  // the same in both). Where the shares cut every tile into equal pieces, each CTA runs one piece;
  // otherwise up to two (a share that ends in the next tile), each with its fixed cost. The split
  // pays one fixed cost more either way (the cooperative launch, the partials' stores and flags).
  // More CTAs shorten the share but cut each tile into more pieces to merge.
  const float t_whole = float(blocks_per_tile) + kTileFixedCostBlocks;
  auto t_split_on = [&](int64_t c) {
    const int64_t share = (tail_blocks + c - 1) / c;  // the longest share
    const bool aligned = tail_blocks % c == 0 && blocks_per_tile % share == 0;
    const int64_t pieces = (blocks_per_tile + share - 1) / share;  // of a tile (about, where not aligned)
    return float(share) + kTileFixedCostBlocks * (aligned ? 2.f : 3.f) +
           kCombineCostBlocks * float(pieces - 1);
  };
  // Automatic: only with fewer tiles than SMs (then the split is split-KV: up to num_sms / tiles
  // times faster; H200 d128, 32 tiles of 256 key blocks: 4.9x). Splitting the last partial round
  // of a longer schedule measured no gain on H200 (d128 non-causal 4k/8k/16k, 15.5 rounds: +0.4%,
  // -2.7%, -0.7%; bench/results/README.md): the idle SMs of that round let the clock rise under the
  // power cap, and the split's cooperative launch and merge cost the rest.
  if (mode < 0 && rounds > 0) return s;
  // At most one CTA per SM, each with at least min_share blocks; of those, the count with the
  // shortest tail (the fewest CTAs on a tie), among the most CTAs and the counts that cut each
  // tile into the same number of pieces (equal pieces where that number divides the tile's blocks).
  const int64_t max_ctas = stream_k_max_ctas(tail_blocks, min_share > 0 ? min_share : 1, num_sms);
  int64_t ctas = max_ctas;
  float t_split = t_split_on(ctas);
  for (int64_t c = tail_tiles; c < max_ctas; c += tail_tiles) {
    const float t = t_split_on(c);
    if (t < t_split || (t == t_split && c < ctas)) {
      ctas = c;
      t_split = t;
    }
  }
  // Automatic: only where the split is predicted kStreamKMinGain faster. The model leaves out the
  // per-launch costs (cooperative launch, merge waits): 128 tiles of 128 blocks on 132 SMs,
  // predicted 1% faster split, measured 4.7% slower (bench/results/history.md, 40a0661).
  if (mode < 0 && !(t_split < kStreamKMinGain * t_whole)) return s;
  s.grid = int32_t(rounds > 0 ? num_sms : ctas);
  s.tail_ctas = int32_t(ctas);
  s.dp_rounds = int32_t(rounds);
  s.tail_tile0 = int32_t(rounds * s.grid);
  s.blocks_per_tile = blocks_per_tile;
  s.tail_blocks = int32_t(tail_blocks);
  s.share = int32_t(tail_blocks / ctas);
  s.share_rem = int32_t(tail_blocks % ctas);
  return s;
}

/// Whether the coarse split splits num_tiles tiles of blocks_per_tile key blocks (mode as for
/// plan_stream_k): as many CTAs as fit, one per SM, with shares of at least kStreamKRouteMinShare
/// blocks, at a flat merge cost: plan_stream_k's decision before it chose its count by the cost
/// model (6a9ef48), which the small-query route (hopper/decode/launch_decode.h
/// small_q_split_forward_wins) was measured against. With fewer tiles than SMs it splits tiles of
/// about 14 key blocks and more.
inline bool stream_k_splits_coarsely(int64_t num_tiles, int32_t num_sms, int32_t blocks_per_tile, int mode) {
  const StreamKTail tail = stream_k_tail(num_tiles, num_sms, blocks_per_tile);
  if (mode == 0 || tail.tiles == 0) return false;
  if (mode > 0) return true;
  if (tail.rounds > 0) return false;
  const int64_t ctas = stream_k_max_ctas(tail.blocks, kStreamKRouteMinShare, num_sms);
  const int64_t share = (tail.blocks + ctas - 1) / ctas;
  return float(share) + 2.f * kTileFixedCostBlocks + kCombineCostBlocks <
         kStreamKMinGain * (float(blocks_per_tile) + kTileFixedCostBlocks);
}

/// First position of CTA c's share in the tail sequence (tile-major, each tile's key blocks in
/// processing order: highest block first). CTA c's share is [stream_k_begin(c), stream_k_begin(c+1)):
/// share + 1 blocks for the first share_rem CTAs, share for the rest.
FA4_HD int32_t stream_k_begin(const StreamKPlan& s, int32_t c) {
  return c * s.share + (c < s.share_rem ? c : s.share_rem);
}

/// A CTA's tail, computed once per CTA (the kernel does it before the warp roles split, on full
/// registers, and keeps it in shared memory: the producer warp runs on 24 registers and spilled when
/// it evaluated this per item). In item order: `contrib` (a piece that does not start its tile),
/// `full_count` whole tiles from `full_begin`, then `last` (a combiner piece that ends inside its
/// tile). An absent piece has tile < 0. Only the last piece of a CTA can be a combiner: a segment
/// that starts a tile and is not the CTA's last covers the whole tile.
struct StreamKCtaItems {
  WorkItem contrib{-1, 0, 0, 0};
  int32_t full_begin = 0;
  int32_t full_count = 0;
  WorkItem last{-1, 0, 0, 0};
};

FA4_HD StreamKCtaItems stream_k_cta_items(const StreamKPlan& s, int32_t cta) {
  StreamKCtaItems r;
  if (s.tail_ctas == 0 || cta >= s.tail_ctas) return r;
  const int32_t nb = s.blocks_per_tile;
  const int32_t a = stream_k_begin(s, cta);
  const int32_t b = stream_k_begin(s, cta + 1);
  if (a >= b) return r;
  // Sequence offsets [o_lo, o_hi) of one tile -> key blocks, walked from the highest down.
  auto piece = [&](int32_t tile_in_tail, int32_t o_lo, int32_t o_hi, int32_t role) {
    WorkItem p;
    p.tile = s.tail_tile0 + tile_in_tail;
    p.n_lo = nb - o_hi;
    p.n_hi = nb - o_lo;
    p.role = role;
    return p;
  };
  if (a % nb != 0) {
    const int32_t tt = a / nb;
    const int32_t end = b < (tt + 1) * nb ? b : (tt + 1) * nb;
    r.contrib = piece(tt, a - tt * nb, end - tt * nb, -1);
  }
  const int32_t seg0 = (a + nb - 1) / nb * nb;  // first tile start in [a, b)
  if (seg0 >= b) return r;
  r.full_begin = s.tail_tile0 + seg0 / nb;
  r.full_count = (b - seg0) / nb;
  const int32_t rest = seg0 + r.full_count * nb;
  if (rest < b) {
    // Contributors: the CTAs after this one whose share starts inside this tile (at least the next).
    int32_t k = 1;
    while (cta + k + 1 < s.tail_ctas && stream_k_begin(s, cta + k + 1) < rest + nb) ++k;
    r.last = piece(rest / nb, 0, b - rest, k);
  }
  return r;
}

/// Item i (0, 1, 2, ...) of CTA `cta` whose tail is `r`; tile >= num_tiles once the CTA has no
/// more. With the split off, item i is the whole tile cta + i * grid.
FA4_HD WorkItem stream_k_item(const StreamKPlan& s, const StreamKCtaItems& r, int32_t num_tiles, int32_t cta,
                              int32_t i) {
  WorkItem w;
  if (s.tail_ctas == 0) {
    w.tile = int32_t(cta + int64_t(i) * s.grid < num_tiles ? cta + i * s.grid : num_tiles);
    return w;
  }
  const int32_t contrib = r.contrib.tile >= 0 ? 1 : 0;
  if (i < contrib) return r.contrib;
  int32_t j = i - contrib;
  if (j < s.dp_rounds) {
    w.tile = j * s.grid + cta;
    return w;
  }
  j -= s.dp_rounds;
  if (j < r.full_count) {
    w.tile = r.full_begin + j;
    return w;
  }
  if (j == r.full_count && r.last.tile >= 0) return r.last;
  w.tile = num_tiles;
  return w;
}

}  // namespace fa4::detail
