// fa4/tile_scheduler.h — the order in which a persistent forward kernel processes its tiles.
// Host planner with a makespan simulator. STATUS: the Hopper forward does NOT read this schedule
// yet — it computes a closed-form order on the device (src/hopper/tile_scheduler.cuh: reversed
// m-blocks inside L2 sections of query heads, a static grid stride), and the CPU implementation
// uses its own OpenMP work list. Uploading TileSchedule::tiles with an atomic tile counter (true
// LPT across sequences for varlen) is the planned use; until then this is tested host code only.
//
// A WORK ITEM (tile) is (batch, head, m_block): query rows [m_block*tile_m, +tile_m) of one
// sequence and one query head. Its COST is the number of key tiles (tile_n keys each) the kernel
// visits for it: the key tiles that intersect the union of visible_key_range() over its rows
// (fa4/detail/mask.h, the one visibility predicate). Tiles of cost 0 (every row fully masked, or
// seqlen_k == 0) still appear — they write out = 0, lse = -inf — but after all the others.
// Sequences with seqlen_q == 0 contribute no tile.
//
// ORDER POLICY (sources: FlashAttention-4 flash_attn/cute/tile_scheduler.py
// SingleTileLPTScheduler and FA3 hopper/tile_scheduler.hpp; notes in
// /work/shared/design/upstream_fa4_fa3_notes.md §3.6):
//   * L2 SECTIONS. Within a sequence, kv heads are grouped into sections of p kv heads, p the
//     largest power of two (<= num_heads_kv) with p * seqlen_k * (headdim + headdim_v) *
//     element_size <= l2_bytes (p = 1 if even one head does not fit; the last section of a
//     sequence takes the remainder). A section holds every query head of its kv heads. Inside a
//     section the query head varies fastest, so the tiles in flight at one time share the K/V of
//     few heads, which then stay in L2. Query heads of one kv head (GQA) are adjacent
//     (h = kv_head * group + g).
//   * LPT (longest processing time first; causal, windowed and varlen problems): sections are
//     ordered by their largest tile cost, then their total cost, descending (ties: batch, then kv
//     head, ascending); inside a section tiles go by cost descending, ties by m_block descending,
//     then head ascending. So cost is non-increasing inside every section, and the tail of the
//     whole schedule is the cheapest section's cheapest tiles. This is the upstream compromise: a
//     global cost sort would put the same m_block of every head in flight together, i.e. the K/V
//     of all heads at once, which does not fit in L2.
//   * PLAIN (dense, uniform problems, where every tile costs the same; also the ablation
//     baseline): sections in (batch, kv head) order, inside a section m_block ascending, head
//     fastest.
//   * Either way the cost-0 tiles come last, in (batch, head, m_block) order.
#pragma once

#include <cstdint>
#include <vector>

#include "fa4/detail/mask.h"

namespace fa4 {
namespace detail {
struct FwdParams;
}

/// One work item; 16 bytes so a GPU thread reads it with one vector load.
struct TileWork {
  int32_t batch;
  int32_t head;          ///< query head
  int32_t m_block;       ///< query rows [m_block * tile_m, min(seqlen_q, (m_block + 1) * tile_m))
  int32_t num_n_blocks;  ///< cost: key tiles visited (0 = fully masked / empty keys)
};
static_assert(sizeof(TileWork) == 16, "TileWork is read by the GPU as one 16-byte vector");

/// (seqlen_q, seqlen_k) of one sequence; seqlen_k is the number of keys USED (seqused_k applied).
struct SeqLens {
  int32_t seqlen_q;
  int32_t seqlen_k;
};

/// The problem as the scheduler sees it.
struct TileProblem {
  int32_t num_heads = 0;
  int32_t num_heads_kv = 0;
  std::vector<SeqLens> seqs;  ///< one per sequence (batch entries)
  bool is_varlen = false;
  detail::MaskSpec mask{};    ///< causal folded in (window_right = 0)

  /// batch sequences of identical lengths.
  static TileProblem batched(int32_t batch, int32_t seqlen_q, int32_t seqlen_k, int32_t num_heads,
                             int32_t num_heads_kv, detail::MaskSpec mask);
  /// Varlen from HOST arrays: cu_seqlens_q/k (batch + 1), seqused_k (batch) or nullptr.
  static TileProblem varlen(int32_t batch, const int32_t* cu_seqlens_q,
                            const int32_t* cu_seqlens_k, const int32_t* seqused_k,
                            int32_t num_heads, int32_t num_heads_kv, detail::MaskSpec mask);
  /// From validated params. Varlen: p.cu_seqlens_q/k and p.seqused_k must be host-readable (GPU
  /// callers copy them to the host first).
  static TileProblem from_params(const detail::FwdParams& p);
};

/// Which order to build. kAuto: LPT if the problem is varlen or the mask is causal/local, else
/// plain.
enum class TileOrder : int32_t { kAuto = 0, kLpt = 1, kPlain = 2 };

/// Bytes of L2 the section policy assumes when the caller does not know the device's (upstream
/// FA4 uses 50 MB; Hopper H100/H200 have 50 MiB of L2).
inline constexpr int64_t kDefaultL2Bytes = int64_t(50) << 20;

struct TileSchedulerConfig {
  int32_t tile_m = 128;        ///< query rows per tile, > 0
  int32_t tile_n = 128;        ///< keys per key tile, > 0
  int32_t headdim = 0;         ///< > 0
  int32_t headdim_v = 0;       ///< > 0
  int32_t element_size = 2;    ///< bytes per K/V element, > 0
  int64_t l2_bytes = kDefaultL2Bytes;  ///< > 0
  TileOrder order = TileOrder::kAuto;
};

struct TileSchedule {
  /// Every tile exactly once, in processing order.
  std::vector<TileWork> tiles;
  /// Tiles of cost > 0 are tiles[0, num_work_tiles); the cost-0 tiles follow.
  int64_t num_work_tiles = 0;
  /// L2 sections of the work tiles: section s is tiles[section_offsets[s], section_offsets[s+1]).
  /// Size num_sections + 1; first entry 0, last entry num_work_tiles.
  std::vector<int64_t> section_offsets;
  bool lpt = false;         ///< the order that was built (kAuto resolved)
  int64_t total_cost = 0;   ///< sum of num_n_blocks
};

/// Key tiles visited by query rows [row_begin, row_end) of a sequence: the tiles that intersect
/// the union of visible_key_range over those rows ([n_block_min, n_block_max); empty when no row
/// sees a key). Exactly what the kernels loop over.
struct NBlockRange {
  int32_t n_block_min;
  int32_t n_block_max;
};
NBlockRange n_block_range(int64_t row_begin, int64_t row_end, int32_t seqlen_q, int32_t seqlen_k,
                          int32_t tile_n, detail::MaskSpec mask);

/// Kv heads per L2 section for a sequence with seqlen_k keys (policy above); >= 1.
int32_t kv_heads_per_l2_section(int32_t seqlen_k, int32_t num_heads_kv,
                                const TileSchedulerConfig& cfg);

/// Builds the schedule. Throws fa4::Error(kInvalidArgument) naming the field on a bad problem or
/// config (non-positive tile sizes, head counts, head dims, element size or L2 size; num_heads not
/// a multiple of num_heads_kv; negative lengths).
TileSchedule make_tile_schedule(const TileProblem& problem, const TileSchedulerConfig& cfg);

/// Simulates num_workers persistent workers taking tiles in order: each tile goes to the worker
/// that becomes free first (lowest index on ties) and occupies it for num_n_blocks +
/// per_tile_overhead time units. Returns the makespan (time the last worker finishes). Used by the
/// tests and the LPT on/off benchmark ablation. num_workers must be > 0.
double simulate_makespan(const std::vector<TileWork>& order, int32_t num_workers,
                         double per_tile_overhead = 0.0);

}  // namespace fa4
