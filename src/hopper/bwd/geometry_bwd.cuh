// src/hopper/bwd/geometry_bwd.cuh — where the backward's work lies: a CTA's tile (one key block of
// one KV head), the query blocks that see it, and the workspace chunk of a query block.
//
// Workspace (allocated by launch_bwd.cuh, laid out per query head): a "chunk" is one query block of
// tile_m rows (tuning_bwd.h: 64, or 128 at d64). Sequence b's chunks start at chunk_base(b):
// b * num_m_blocks when batched, floor(cu_seqlens_q[b] / tile_m) + b for varlen (an upper bound on
// the chunks of the sequences before it, so sequences never share one; floor(total_q / tile_m) +
// batch chunks in all). Per (head, chunk):
//   dq_accum   tile_m x d fp32 (d of the tiles: kernel_traits_bwd.cuh kHeadDim) in the dQ
//              staging's fragment order (dq_chunk_index), zeroed by the preprocess and
//              reduce-added by the main kernel's CTAs;
//   lse_log2   tile_m rows: lse * log2(e), +inf where lse = -inf or past the sequence (P = 0 there);
//   dpsum      tile_m rows: D = rowsum(dO * O) (0 past the sequence);
//   semaphore  deterministic mode: how many key blocks have added their dQ part, in key order.
#pragma once

#include <cstdint>

#include "core/mask.h"
#include "hopper/arch/arch.cuh"
#include "hopper/bwd/schedule_bwd.h"
#include "hopper/shared/tile_info.cuh"
#include "hopper/shared/tile_scheduler.cuh"

namespace fa4::hopper {

/// First chunk of sequence b (see above). For varlen, cu_seqlens_q[b] must have passed seq_bounds'
/// checks (a bad sequence has no rows, so no chunk of it is ever touched).
template <int kBlockM, class Params>
__device__ __forceinline__ int32_t chunk_base(const Params& p, int32_t b, const SeqBounds& s) {
  return bwd_chunk_base<kBlockM>(p.is_varlen, b, s.q_row0, p.num_m_blocks);
}

/// Tile t of the main kernel (schedule_bwd.h bwd_tile_coord), with its sequence's bounds and the
/// query blocks that see it.
struct BwdTile {
  int32_t n_block, h_kv, b;
  SeqBounds s;
  int32_t chunk0;  // chunk_base(b)
  QueryBlocks m;
  bool has_keys;   // the key block starts inside the sequence (its dK/dV rows exist)
  bool descending;  // the walk goes from m_hi - 1 down to m_lo

  __device__ __forceinline__ bool has_steps() const { return m.m_hi > m.m_lo; }
  __device__ __forceinline__ int32_t num_steps() const { return m.m_hi - m.m_lo; }
  /// The query block of step s (0 <= s < num_steps()); every role walks the same order.
  __device__ __forceinline__ int32_t step_block(int32_t s) const { return bwd_step_block(m, descending, s); }
};

/// kReport: see seq_bounds (false where thread 0 never runs: the consumer warpgroups and the dQ
/// writer warps, in whose inlined copies the report's dead stores cost registers).
template <int kBlockM, int kBlockN, bool kValidate, bool kReport = true, class Params>
__device__ __forceinline__ BwdTile make_bwd_tile(const Params& p, int32_t t) {
  BwdTile ti;
  const BwdTileCoord c = bwd_tile_coord(t, p.num_n_blocks, p.num_heads_kv, p.batch, p.lpt, p.lpt_band);
  ti.n_block = c.n_block;
  ti.h_kv = c.h_kv;
  ti.b = c.b;
  ti.s = seq_bounds<kValidate, Params, 0, kReport>(p, ti.b);
  ti.chunk0 = chunk_base<kBlockM>(p, ti.b, ti.s);
  ti.m = query_blocks<kBlockM, kBlockN>(ti.n_block, ti.s.seqlen_q, ti.s.seqlen_k, p.mask);
  ti.has_keys = ti.n_block * kBlockN < ti.s.seqlen_k;
  ti.descending = p.descending;
  return ti;
}

/// This CTA's tile of iteration i (schedule_bwd.h bwd_tile_index): its first (i = 0) in either
/// schedule, every one in the static schedule.
template <class Params>
__device__ __forceinline__ int32_t bwd_tile_index(const Params& p, int32_t i) {
  return bwd_tile_index(i, int32_t(blockIdx.x), int32_t(gridDim.x), p.lpt);
}

/// The TMA warp's next tile (iteration i >= 1): the static one, or under the dynamic schedule
/// (tile_counter set) the next unclaimed tile of the same order, claimed once the warp has issued
/// the current tile's last loads, i.e. about when the CTA is ready for it (greedy list scheduling:
/// tiles of unequal cost no longer pile up on the CTAs a fixed order hands them to). The claims
/// number the tiles grid .. in claim order, so a CTA's tiles still increase (shared/
/// tile_scheduler.cuh claim_tile, shared with the forward). The counter lives in the backward's
/// workspace, which other launches overwrite, so the preprocess zeroes it before this grid starts
/// (it is launched plainly after it; as its programmatic dependent the first claim would need
/// griddepcontrol.wait). Whole warp.
template <class Params>
__device__ __forceinline__ int32_t bwd_next_tile(const Params& p, int32_t i) {
  if (!p.tile_counter) return bwd_tile_index(p, i);
  return claim_tile</*kResetAtLast=*/false>(p.tile_counter, p.num_tiles);
}

// Where each role of the main kernel gets its tiles: `for (t = tiles.first(p); t < p.num_tiles;
// t = tiles.next(p))`. Kernels with tile claims (tuning_bwd.h tile_claims) have the TMA warp
// take every tile and publish it, the first past the end included (it ends the other roles),
// through a TileRing in smem; the consumers and the dQ writers receive it. Kernels without
// compute the static order in every role and have no ring.

/// The smem ring of a kernel with tile claims (16-byte aligned), and its stand-in without.
struct alignas(16) BwdTileRingStorage : TileRing::SharedStorage {};
struct BwdNoTileRing {};

/// Every role, no claims: this CTA's tiles in the static order.
struct BwdStaticTiles {
  int32_t i = 0;
  template <class Params>
  __device__ __forceinline__ int32_t first(const Params& p) {
    i = 0;
    return bwd_tile_index(p, 0);
  }
  template <class Params>
  __device__ __forceinline__ int32_t next(const Params& p) {
    return bwd_tile_index(p, ++i);
  }
};

/// The TMA warp (whole warp) with claims: takes the tiles (the first static, then bwd_next_tile)
/// and publishes each. It takes the next once the current tile's loads are issued.
struct BwdRingProducerTiles {
  TileRing::Pipeline& ring;
  TileRing::SharedStorage& storage;
  uint32_t published = 0;
  int32_t i = 0;
  __device__ __forceinline__ int32_t publish(int32_t t) {
    detail::WorkItem w;
    w.tile = t;
    TileRing::publish(ring, storage, published++, w);
    return t;
  }
  template <class Params>
  __device__ __forceinline__ int32_t first(const Params& p) {
    return publish(bwd_tile_index(p, 0));
  }
  template <class Params>
  __device__ __forceinline__ int32_t next(const Params& p) {
    return publish(bwd_next_tile(p, ++i));
  }
};

/// The consumers and the dQ writers with claims: each tile as the TMA warp published it.
struct BwdRingReceiverTiles {
  TileRing::Pipeline& ring;
  TileRing::SharedStorage& storage;
  TileRing::State state{};
  template <class Params>
  __device__ __forceinline__ int32_t first(const Params&) {
    return TileRing::receive(ring, storage, state).tile;
  }
  template <class Params>
  __device__ __forceinline__ int32_t next(const Params&) {
    return TileRing::receive(ring, storage, state).tile;
  }
};

/// The ring's pipeline (claims) or nothing; every thread, before the __syncthreads that publishes
/// the barrier inits.
template <bool kClaims, class Storage>
__device__ __forceinline__ auto make_bwd_tile_ring(Storage& storage, bool producer, uint32_t receivers) {
  if constexpr (kClaims) return TileRing::make(storage, producer, receivers);
  else return BwdNoTileRing{};
}

/// The tile source of a producer (TMA warp) or receiving role.
template <bool kClaims, bool kProducer, class Ring, class Storage>
__device__ __forceinline__ auto bwd_tiles(Ring& ring, Storage& storage) {
  if constexpr (!kClaims) return BwdStaticTiles{};
  else if constexpr (kProducer) return BwdRingProducerTiles{ring, storage};
  else return BwdRingReceiverTiles{ring, storage};
}

}  // namespace fa4::hopper
