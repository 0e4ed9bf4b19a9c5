// src/hopper/bwd/geometry_bwd.cuh — where the backward's work lies: a CTA's tile (one key block of
// one KV head), the query blocks that see it, and the workspace chunk of a query block.
//
// Workspace (allocated by launch_bwd.cuh, laid out per query head): a "chunk" is one query block of
// tile_m = 64 rows. Sequence b's chunks start at chunk_base(b): b * num_m_blocks when batched,
// floor(cu_seqlens_q[b] / 64) + b for varlen (an upper bound on the chunks of the sequences before
// it, so sequences never share one; floor(total_q / 64) + batch chunks in all). Per (head, chunk):
//   dq_accum   64 x d fp32 in the dQ staging's fragment order (dq_chunk_index), zeroed by the
//              preprocess and reduce-added by the main kernel's CTAs;
//   lse_log2   64 rows: lse * log2(e), +inf where lse = -inf or past the sequence (P = 0 there);
//   dpsum      64 rows: D = rowsum(dO * O) (0 past the sequence);
//   semaphore  deterministic mode: how many key blocks have added their dQ part, in key order.
#pragma once

#include <cstdint>

#include "core/mask.h"
#include "hopper/arch/arch.cuh"
#include "hopper/shared/tile_info.cuh"

namespace fa4::hopper {

/// First chunk of sequence b (see above). For varlen, cu_seqlens_q[b] must have passed seq_bounds'
/// checks (a bad sequence has no rows, so no chunk of it is ever touched).
template <int kBlockM, class Params>
__device__ __forceinline__ int32_t chunk_base(const Params& p, int32_t b, const SeqBounds& s) {
  return p.is_varlen ? s.q_row0 / kBlockM + b : b * p.num_m_blocks;
}

/// The query blocks [m_lo, m_hi) a key block sees: the union over its keys of core/mask.h's
/// visible_query_range, whose ends are monotone in the key, is inside [first(j_lo), last(j_hi)).
/// Empty when the block is past seqlen_k or no query sees any of its keys.
struct QueryBlocks {
  int32_t m_lo = 0, m_hi = 0;
};
template <int kBlockM, int kBlockN>
__device__ __forceinline__ QueryBlocks query_blocks(int32_t n_block, int32_t seqlen_q, int32_t seqlen_k,
                                                    detail::MaskSpec mask) {
  QueryBlocks r;
  const int32_t j_lo = n_block * kBlockN;
  if (j_lo >= seqlen_k) return r;
  const int32_t j_hi = min(j_lo + kBlockN, seqlen_k) - 1;
  const detail::QueryRange a = detail::visible_query_range(j_lo, seqlen_q, seqlen_k, mask);
  const detail::QueryRange z = detail::visible_query_range(j_hi, seqlen_q, seqlen_k, mask);
  if (z.last <= a.first) return r;
  r.m_lo = int32_t(a.first / kBlockM);
  r.m_hi = int32_t((z.last + kBlockM - 1) / kBlockM);
  return r;
}

/// Tile t of the main kernel: key block n_block of KV head h_kv of sequence b. Dense problems:
/// key block fastest, so the CTAs running at once share a head's Q and dO in L2. Masked (causal,
/// window) and varlen problems (p.lpt): key block slowest, so the tiles go longest first (under a
/// bottom-right causal mask the first key blocks see the most queries); the CTAs take them in
/// snake rounds (bwd_tile_index). Either way a key block of a head has a higher index than the
/// blocks before it, which the deterministic mode's ordering relies on (mainloop_bwd_load.cuh).
struct BwdTile {
  int32_t n_block, h_kv, b;
  SeqBounds s;
  int32_t chunk0;  // chunk_base(b)
  QueryBlocks m;
  bool has_keys;   // the key block starts inside the sequence (its dK/dV rows exist)

  __device__ __forceinline__ bool has_steps() const { return m.m_hi > m.m_lo; }
};

template <int kBlockM, int kBlockN, bool kValidate, class Params>
__device__ __forceinline__ BwdTile make_bwd_tile(const Params& p, int32_t t) {
  BwdTile ti;
  const int32_t num_bh = p.num_heads_kv * p.batch;
  ti.n_block = p.lpt ? t / num_bh : t % p.num_n_blocks;
  const int32_t bh = p.lpt ? t % num_bh : t / p.num_n_blocks;
  ti.h_kv = bh % p.num_heads_kv;
  ti.b = bh / p.num_heads_kv;
  ti.s = seq_bounds<kValidate>(p, ti.b);
  ti.chunk0 = chunk_base<kBlockM>(p, ti.b, ti.s);
  ti.m = query_blocks<kBlockM, kBlockN>(ti.n_block, ti.s.seqlen_q, ti.s.seqlen_k, p.mask);
  ti.has_keys = ti.n_block * kBlockN < ti.s.seqlen_k;
  return ti;
}

/// The tile of this CTA's i-th iteration (>= num_tiles: none). Rounds of gridDim.x tiles; with
/// p.lpt odd rounds run backwards, so the CTA that took a round's longest tile takes the next
/// round's shortest (a plain stride hands CTA 0 the longest tile of every round). Every CTA's
/// sequence increases, so the lowest unfinished tile is always running.
template <class Params>
__device__ __forceinline__ int32_t bwd_tile_index(const Params& p, int32_t i) {
  const int32_t round = i * int32_t(gridDim.x);
  return round + (p.lpt && (i & 1) ? int32_t(gridDim.x) - 1 - int32_t(blockIdx.x) : int32_t(blockIdx.x));
}

/// Offset, inside a (head, chunk) dQ accumulator of 64 x d floats, of the float4 that thread t
/// (0..127) of warpgroup wg stages for its 8-column group g: its accumulator values 4g..4g+3, i.e.
/// rows r0 and r0 + 8 (r0 = arch::fragment_row(t)) at columns wg * d/2 + 8g + fragment_col(t) + {0, 1}.
template <int kHeadDim>
__host__ __device__ __forceinline__ int32_t dq_chunk_index(int wg, int g, int t) {
  return wg * (64 * kHeadDim / 2) + g * 512 + t * 4;
}

}  // namespace fa4::hopper
