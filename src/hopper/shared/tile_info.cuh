// src/hopper/shared/tile_info.cuh — per-tile sequence geometry shared by the producer and consumers.
#pragma once

#include <cstdint>

#include "core/pack_gqa.h"
#include "core/params.h"
#include "hopper/arch/arch.cuh"
#include "hopper/shared/device_state.h"
#include "hopper/shared/mask.cuh"
#include "hopper/shared/tile_scheduler.cuh"

namespace fa4::hopper {

struct TileInfo {
  TileCoord c;
  int32_t seqlen_q, seqlen_k;  // this sequence (seqused_k applied)
  int32_t q_row0, k_row0;      // first packed row (varlen) or 0
  bool has_rows;               // m-block starts inside the sequence
  TileKeyRange keys;

  __device__ __forceinline__ bool has_keys() const { return keys.n_block_max > keys.n_block_min; }
};

/// One sequence's bounds: first packed rows (varlen) and lengths (seqused_k applied).
struct SeqBounds {
  int32_t q_row0, k_row0;
  int32_t seqlen_q, seqlen_k;
};

/// Sequence b's bounds, for every Hopper kernel (forward, backward and its pre/post passes), from
/// the varlen indices or the batched lengths. Called by whole warps (the loads are broadcast from
/// lane 0). kValidate: check the varlen rules (the host cannot read the indices without a sync): a
/// sequence that breaks one gets zero lengths, so no row of it is read or written, and thread 0 of
/// the CTA records the rule in the device's error record (device_state.h).
/// A batched forward serving a KV-cache call (Params with seqlen_new; seqused_k = cache_seqlens,
/// hopper_api.cu kvcache_on_forward): sequence b sees keys [0, cache_seqlens[b] + seqlen_new) of
/// its cache row, and kValidate checks cache_seqlens[b] against the capacity as the append did
/// and, with kPageLoads > 0 (the forward's paged producer), the page-table entries of those keys,
/// kPageLoads entries in flight per lane (each round trip checks 32 x kPageLoads of them).
/// kReport false: callers where thread 0 never runs (the backward's consumer warpgroups and dQ
/// writer warps) leave the record's stores out (inlined there, dead, they cost registers: ptxas
/// serialised the d128 backward's wgmmas for them).
template <bool kValidate, class Params, int kPageLoads = 0, bool kReport = true>
__device__ __forceinline__ SeqBounds seq_bounds(const Params& p, int32_t b) {
  static_assert(kPageLoads >= 0, "kPageLoads: 0 (no page-table check) or the loads in flight per lane");
  SeqBounds s;
  if (!p.is_varlen) {
    s.q_row0 = s.k_row0 = 0;
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    if constexpr (requires { p.seqlen_new; }) {
      if (p.seqused_k) {
        const int32_t cached = __shfl_sync(0xffffffffu, p.seqused_k[b], 0);
        s.seqlen_k = cached + p.seqlen_new;
        if constexpr (kValidate) {
          if (!detail::cached_keys_valid(cached, p.seqlen_k - p.seqlen_new)) {
            if (kReport && threadIdx.x == 0) report_async_error(p.async_error, kBadCacheSeqlens);
            s.seqlen_q = s.seqlen_k = 0;
          }
        }
      }
    }
    if constexpr (kValidate && kPageLoads > 0) {
      // A paged cache: every page-table entry of the sequence's keys must be a page of the pool
      // (the decode kernel's rule); a sequence with one that is not is skipped like a bad length.
      // The whole warp loads, kPageLoads page-table lines per round trip.
      if (s.seqlen_k > 0) {
        const int32_t* row = p.page_table + int64_t(b) * p.page_table_batch_stride;
        const int32_t used = (s.seqlen_k - 1) / p.page_size + 1;
        bool bad = false;
        for (int32_t i = int32_t(threadIdx.x % 32); i < used; i += 32 * kPageLoads) {
          int32_t e[kPageLoads];
#pragma unroll
          for (int u = 0; u < kPageLoads; ++u) e[u] = i + 32 * u < used ? __ldg(row + i + 32 * u) : 0;
#pragma unroll
          for (int u = 0; u < kPageLoads; ++u) bad |= !detail::page_in_pool(e[u], p.num_pages);
        }
        if (__any_sync(0xffffffffu, bad)) {
          if (kReport && threadIdx.x == 0) report_async_error(p.async_error, kBadPageTable);
          s.seqlen_q = s.seqlen_k = 0;
        }
      }
    }
    return s;
  }
  // Every lane loads the same words; the broadcast from lane 0 tells the compiler the values are
  // warp-uniform, so loop bounds derived from them stay in uniform registers (a loop whose trip
  // count might diverge demotes its loop-carried pipeline states).
  const int32_t q0 = __shfl_sync(0xffffffffu, p.cu_seqlens_q[b], 0);
  const int32_t q1 = __shfl_sync(0xffffffffu, p.cu_seqlens_q[b + 1], 0);
  const int32_t k0 = __shfl_sync(0xffffffffu, p.cu_seqlens_k[b], 0);
  const int32_t k1 = __shfl_sync(0xffffffffu, p.cu_seqlens_k[b + 1], 0);
  const int32_t used = p.seqused_k ? __shfl_sync(0xffffffffu, p.seqused_k[b], 0) : k1 - k0;
  s.q_row0 = q0;
  s.k_row0 = k0;
  s.seqlen_q = q1 - q0;
  s.seqlen_k = used;
  if constexpr (kValidate) {
    // Unsigned compares fold "< 0" into "> bound"; with both offsets in [0, total] their
    // difference cannot overflow, and a negative length fails "<= max_seqlen" the same way.
    auto out_of = [](int32_t x, int32_t bound) { return uint32_t(x) > uint32_t(bound); };
    uint32_t bad = 0;
    if ((b == 0 && q0 != 0) || out_of(q0, p.total_q) || out_of(q1, p.total_q) || out_of(q1 - q0, p.seqlen_q))
      bad |= kBadCuSeqlensQ;
    if ((b == 0 && k0 != 0) || out_of(k0, p.total_k) || out_of(k1, p.total_k) || out_of(k1 - k0, p.seqlen_k))
      bad |= kBadCuSeqlensK;
    else if (out_of(used, k1 - k0))
      bad |= kBadSequsedK;
    if (bad != 0) {
      if (kReport && threadIdx.x == 0) report_async_error(p.async_error, bad);
      s.q_row0 = s.k_row0 = s.seqlen_q = s.seqlen_k = 0;
    }
  }
  return s;
}

using detail::RowCoord;

/// The query token (within its sequence) and query head of row `row` of tile ti: the forward's one
/// place that says which (token, head) a row is. With pack-GQA (Params::packed(): the launch
/// packs, in a kernel compiled with it) a tile of KV head c.head holds tile_queries whole tokens
/// (the group divides the row tile: fwd/launch_fwd.h fwd_pack_gqa_fits), its rows core/pack_gqa.h's
/// packed rows from its first token on, in the order of the Q box over (d, heads, tokens, batch)
/// (fwd/mainloop_fwd_load.cuh load_q); else a tile is kBlockM consecutive tokens of query head
/// c.head.
template <int kBlockM, class Params>
__device__ __forceinline__ RowCoord tile_row(const Params& p, const TileInfo& ti, int32_t row) {
  if (p.packed()) {
    RowCoord rc = detail::packed_row(row, ti.c.head, p.group_size);
    rc.query += ti.c.m_block * p.tile_queries;
    return rc;
  }
  return {ti.c.m_block * kBlockM + row, ti.c.head};
}

/// ... of fragment row r (0 or 1) of consumer thread `tid`.
template <int kBlockM, class Params>
__device__ __forceinline__ RowCoord fragment_row_coord(const Params& p, const TileInfo& ti, int tid, int r) {
  return tile_row<kBlockM>(p, ti, arch::fragment_row(tid) + 8 * r);
}

/// The KV head whose keys tile ti reads.
template <class Params>
__device__ __forceinline__ int32_t tile_kv_head(const Params& p, const TileInfo& ti) {
  return p.packed() ? ti.c.head : ti.c.head / p.group_size;
}

/// kValidate: check the varlen indices (the producer, which sees every tile first and publishes
/// only tiles with rows; the consumers then recompute the same geometry without the checks, which
/// would cost them registers in the key loop).
template <int kBlockM, int kBlockN, bool kValidate, int kPageLoads = 0, class Params>
__device__ __forceinline__ TileInfo make_tile_info(const Params& p, int32_t t) {
  TileInfo ti;
  ti.c = tile_coord(p, t);
  const SeqBounds s = seq_bounds<kValidate, Params, kPageLoads>(p, ti.c.batch);
  ti.q_row0 = s.q_row0;
  ti.k_row0 = s.k_row0;
  ti.seqlen_q = s.seqlen_q;
  ti.seqlen_k = s.seqlen_k;
  const int32_t queries = p.queries_per_tile();
  const int32_t row_lo = ti.c.m_block * queries;
  ti.has_rows = row_lo < ti.seqlen_q;
  if (ti.has_rows) {
    const int32_t row_hi = min(row_lo + queries, ti.seqlen_q) - 1;
    ti.keys = TileKeyRange::make(row_lo, row_hi, ti.seqlen_q, ti.seqlen_k, p.mask, kBlockN);
  }
  return ti;
}

/// A stream-K piece (core/stream_k.h) runs only the key blocks of [n_lo, n_hi) its tile sees: the
/// plan counts every tile at all key blocks (fwd/launch_fwd.h fwd_key_split_eligible), so a piece
/// past a short tile's last visible block (a causal chunk's early query tiles, a KV-cache sequence
/// shorter than the cache) has fewer blocks or none (has_keys false: an empty partial, weight 0).
/// The element masks stay those of the whole tile (TileKeyRange::needs_mask is per block).
__device__ __forceinline__ void restrict_keys(TileInfo& ti, const detail::WorkItem& w) {
  if (w.n_lo < w.n_hi) {
    ti.keys.n_block_min = max(w.n_lo, ti.keys.n_block_min);
    ti.keys.n_block_max = min(w.n_hi, ti.keys.n_block_max);
  }
}

/// The tile of work item w (published by the producer: its indices passed the checks), with the
/// key range of its stream-K piece (the producer and the consumers must agree on it block for
/// block).
template <int kBlockM, int kBlockN, class Params>
__device__ __forceinline__ TileInfo make_tile_info(const Params& p, const detail::WorkItem& w) {
  TileInfo ti = make_tile_info<kBlockM, kBlockN, false>(p, w.tile);
  restrict_keys(ti, w);
  return ti;
}

}  // namespace fa4::hopper
