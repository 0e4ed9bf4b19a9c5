// src/hopper/decode/kernel_decode.cuh — the Hopper KV-cache kernels: append, and split-KV decode with
// the splits' merge.
//
// Decode is bandwidth-bound: every K/V byte of the cache is read once per step and used by only the
// few query rows of its head group. The kernel therefore
//   * packs the group (pack-GQA): a CTA's rows (a tile of 16 or 64, below) are (query token, query
//     head of one KV head), row r -> token r / group, head kv_head * group + r % group
//     (core/pack_gqa.h), so one K/V load serves them all;
//   * splits the keys (split-KV, FlashDecoding): grid (split, kv head x row tile, batch), each CTA
//     one range of kBlockN-key blocks (64, or 128 in the 8-warp form below), merged with the shared merge maths (core/softmax.h). The splits
//     of a tile that form one thread-block cluster (up to 16) merge through distributed shared
//     memory: CTA q of the cluster merges columns q x kD / cluster.. of the tile, and every CTA
//     pushes its normalised partial's columns and log2-sum-exps to the CTA that merges them (remote
//     stores need no round trip, remote loads would), so after one cluster barrier each merge reads
//     only its own shared memory and no CTA waits for its peers' merges. Where a tile has
//     more splits than a cluster, CTA q of each cluster writes its merged columns to global
//     scratch and arrives at the tile's counter q, and the last to arrive there merges those
//     columns (all of the cluster's ranks at once); without a cluster launch each split's partial
//     goes there and arrives at the tile's one counter, and the last CTA merges the tile. No
//     second kernel: a combine launch would cost more than the merge itself at batch 1, where
//     split-KV matters most. A cluster holding all of a tile's splits skips the global round
//     trip and the atomic; clusters are used where the global merge is long (launch_decode.h);
//   * gathers K/V rows one by one with cp.async (16 bytes per copy; a row's address comes from the
//     page table when paged, so every page size works and pages may be in any order), into a ring
//     of `stages` swizzled smem blocks;
//   * computes in one of two tile shapes (kRowWarps): a narrow tile of 16 rows on mma.sync
//     m16n8k16, whose warp w of 4 takes keys 16w..16w+15 of each 64-key block (decode steps: few
//     rows, and the warps still share every K/V load; where a CTA has its SM to itself, 8 warps on
//     128-key blocks, two per scheduler to overlap their latency chains), or a wide tile of 64 rows
//     on one warpgroup's wgmma, whose warp w holds rows 16w..16w+15 over all 64 keys (chunked
//     prefill, speculative decoding with many rows: a K/V block's copies then serve 4x the rows;
//     its ring is in wgmma's swizzled layout, swz_slab). Each warp keeps its own
//     online-softmax state (lazy rescaling, FlashAttention-4 Sec. 3: the running max is raised only
//     when it grows by more than tau); the warps that share rows merge at the end.
// Device-resident indices are checked here (the host never reads them): cache_seqlens,
// cache_batch_idx and the page-table entries of keys [0, seqlen_k) (each split checks its keys,
// split 0 also those before the first visible one); a split that meets a broken rule writes
// nothing and sets the rule's AsyncError bit; its tile's merge writes nothing either: the split
// arrives flagged at the global merge, or, in a cluster, flags its partial for its peers (and the
// cluster arrives flagged where a global merge follows).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/constants.h"
#include "core/mask.h"
#include "core/params.h"
#include "core/softmax.h"
#include "hopper/arch/arch.cuh"
#include "hopper/arch/wgmma_raw.cuh"
#include "hopper/decode/args_decode.cuh"
#include "hopper/decode/merge_decode.cuh"
#include "hopper/decode/tuning_decode.h"
#include "hopper/shared/device_state.h"

namespace fa4::hopper::decode {

/// Sequence b's cache geometry, checked. Uniform over a CTA.
struct CacheSeq {
  int32_t cache_b;   ///< dense: cache sequence
  int32_t cached;    ///< keys already in the cache (before the append)
  int32_t seqlen_k;  ///< keys attended to: cached + seqlen_new (0 when bad)
  uint32_t bad;      ///< AsyncError bits of the broken rules
};

__device__ __forceinline__ CacheSeq cache_seq(const detail::KVCacheParams& p, int32_t b) {
  CacheSeq s;
  const int32_t room = p.key_capacity - p.seqlen_new;  // >= 0 (validated on the host)
  s.cached = p.cache_seqlens ? p.cache_seqlens[b] : room;
  s.cache_b = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
  s.bad = 0;
  if (!detail::cached_keys_valid(s.cached, room)) s.bad |= kBadCacheSeqlens;
  if (!p.paged && uint32_t(s.cache_b) >= uint32_t(p.batch_cache)) s.bad |= kBadCacheBatchIdx;
  s.seqlen_k = s.bad ? 0 : s.cached + p.seqlen_new;
  return s;
}


/// Offset (elements) of row `slot` of page `page` in a paged cache of strides s.
__device__ __forceinline__ int64_t page_row_offset(int32_t page, int32_t slot, const detail::RowStrides& s) {
  return int64_t(page) * s.batch + int64_t(slot) * s.row;
}

/// Offset (elements) of key j's row in a cache (page-table entry already checked).
__device__ __forceinline__ int64_t cache_row_offset(const detail::KVCacheParams& p, const int32_t* pages,
                                                    int32_t cache_b, int32_t j, const detail::RowStrides& s) {
  if (p.paged) {
    const int32_t page = pages[j / p.page_size];
    return page_row_offset(page, j % p.page_size, s);
  }
  return int64_t(cache_b) * s.batch + int64_t(j) * s.row;
}

// ---------------------------------------------------------------------------------------------
/// True if one of this thread's share of the page-table entries of keys [lo, hi) of a sequence is
/// not a page of the pool (the CTA's threads stride over the entries).
__device__ __forceinline__ bool pages_outside_pool(const detail::KVCacheParams& p, const int32_t* pages, int32_t lo,
                                                   int32_t hi) {
  bool bad = false;
  if (hi > lo)
    for (int32_t i = lo / p.page_size + int32_t(threadIdx.x); i <= (hi - 1) / p.page_size; i += int32_t(blockDim.x))
      bad |= !detail::page_in_pool(pages[i], p.num_pages);
  return bad;
}

/// True if every page-table entry of keys [lo, hi) of a sequence is a page of the pool. Called by
/// the whole CTA (the result is uniform).
__device__ __forceinline__ bool pages_valid(const detail::KVCacheParams& p, const int32_t* pages, int32_t lo, int32_t hi) {
  return !__syncthreads_or(pages_outside_pool(p, pages, lo, hi));
}

// ---------------------------------------------------------------------------------------------
// Append: k_new/v_new rows (b, t) -> cache key cached(b) + t. Grid (seqlen_new, num_heads_kv, batch).
// A sequence with a broken index is not appended at all (nor attended to, decode_kernel).
template <class Elem>
__global__ void __launch_bounds__(64) append_kernel(const __grid_constant__ DecodeArgs a) {
  const detail::KVCacheParams& p = a.p;
  const int32_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const CacheSeq s = cache_seq(p, b);
  const int32_t* pages = p.paged ? p.page_table + int64_t(b) * p.page_table_batch_stride : nullptr;
  uint32_t bad = s.bad;
  if (!bad && p.paged && !pages_valid(p, pages, 0, s.seqlen_k)) bad |= kBadPageTable;
  if (bad) {
    if (threadIdx.x == 0) report_async_error(a.async_error, bad);
    return;
  }
  const int32_t j = s.cached + t;
  const int64_t k_dst = cache_row_offset(p, pages, s.cache_b, j, p.k_stride) + int64_t(h) * p.k_stride.head;
  const int64_t v_dst = cache_row_offset(p, pages, s.cache_b, j, p.v_stride) + int64_t(h) * p.v_stride.head;
  const Elem* k_src = static_cast<const Elem*>(p.k_new) + int64_t(b) * p.k_new_stride.batch +
                      int64_t(t) * p.k_new_stride.row + int64_t(h) * p.k_new_stride.head;
  const Elem* v_src = static_cast<const Elem*>(p.v_new) + int64_t(b) * p.v_new_stride.batch +
                      int64_t(t) * p.v_new_stride.row + int64_t(h) * p.v_new_stride.head;
  Elem* k_cache = const_cast<Elem*>(static_cast<const Elem*>(p.k)) + k_dst;
  Elem* v_cache = const_cast<Elem*>(static_cast<const Elem*>(p.v)) + v_dst;
  // 16-byte chunks (head dims are multiples of 8; the selector checked 16-byte alignment).
  for (int c = threadIdx.x; c < p.headdim / 8; c += blockDim.x)
    reinterpret_cast<int4*>(k_cache)[c] = reinterpret_cast<const int4*>(k_src)[c];
  for (int c = threadIdx.x; c < p.headdim_v / 8; c += blockDim.x)
    reinterpret_cast<int4*>(v_cache)[c] = reinterpret_cast<const int4*>(v_src)[c];
}

// ---------------------------------------------------------------------------------------------
// Split-KV decode.

/// Element offset of 16-byte chunk c of row r in a tile kD elements wide: chunks are XOR-swizzled
/// with r % 8, so the 8 rows an ldmatrix phase reads sit in 8 different bank groups (kD >= 64).
template <int kD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * kD + ((c ^ (r & 7)) << 3);
}
/// The wide tile's layout of Q and of each K / V block (kTileRows = 64 rows each): wgmma's 128-byte
/// swizzle (arch/wgmma_raw.cuh), slabs of 64 columns x kTileRows rows one after another, chunk c of
/// row r in slab c / 8 at chunk (c % 8) ^ (r % 8). At a head dim of 64 it is swz's.
template <int kTileRows>
__device__ __forceinline__ int swz_slab(int r, int c) {
  return (c >> 3) * (kTileRows * 64) + r * 64 + (((c & 7) ^ (r & 7)) << 3);
}

/// Key of a decode kernel's once-per-device shared-memory raise (launch_common.cuh).
template <bool kBF16, int kD, int kRows, int kBlockN>
struct DecodeKernelKey {};

/// Warps of a decode CTA: a narrow tile's warps take 16 keys each of a block (4 of a 64-key block,
/// 8 of a 128-key one), a wide tile's 16 rows each.
template <int kBlockN, int kRows>
inline constexpr int kDecodeCtaWarps = kRows == 16 ? kBlockN / 16 : kRows / 16;

template <int kD, int kBlockN, int kStages, int kRows>
struct DecodeSmem {
  static constexpr int kWarps = kDecodeCtaWarps<kBlockN, kRows>;
  static constexpr int kQElems = kRows * kD;
  static constexpr int kStageElems = 2 * kBlockN * kD;  // K block then V block
  // + the K/V row offsets of every stage's block (int64, 2 x kBlockN per stage).
  static constexpr int kBytes = (kQElems + kStages * kStageElems) * 2 + kStages * 2 * kBlockN * 8;
  /// The wide tile computes on one warpgroup's wgmma (m64: its 4 warps' 64 rows), the narrow one on
  /// mma.sync.
  static constexpr bool kWgmma = kRows == 64;
  // The wide tile's wgmma operands start on 1024-byte boundaries (the swizzle's period): the kernel
  // rounds the dynamic shared memory's start up to one, within this much more.
  static constexpr int kAlignPad = kWgmma ? 1024 : 0;
  static constexpr int kAllocBytes = kBytes + kAlignPad;
  // The cross-warp merge reuses the ring: kWarps x 16 rows x kOStride fp32 + row stats. Rows are
  // kD + 8 floats apart: a warp's float2 store of its O fragment writes 8 rows, which kD apart all
  // fall on the same 8 banks (8 wavefronts instead of 2).
  static constexpr int kOStride = kD + 8;
  static constexpr int kMergeFloats = kWarps * 16 * kOStride + 2 * kWarps * 16 + kRows;
  static_assert(kMergeFloats * 4 <= kStages * kStageElems * 2, "merge buffers do not fit");
  // A cluster launch adds, behind kBytes, the buffer into which the cluster's CTAs push their
  // partials for this CTA's columns (cluster_merge): kRows rows x kD / cluster columns fp32 from
  // each of `cluster` CTAs, their kRows log2-sum-exps each and their broken-index flags. It cannot
  // share the ring: peers push while this CTA may still be walking its keys.
  static constexpr int cluster_bytes(int cluster) {
    return kAllocBytes + (ClusterRecv::bytes<kD, kRows>(cluster) + 15) / 16 * 16;
  }
};

/// kRowWarps: 1 (narrow tile: 16 rows, warp w takes keys 16w.. of a block: 4 warps on 64-key
/// blocks, or 8 on 128-key blocks) or 4 (wide tile: 64 rows, warp w takes rows 16w.. and every key
/// of a 64-key block).
template <bool kBF16, int kD, int kBlockN, int kStages, int kRowWarps>
__global__ void __launch_bounds__(32 * kDecodeCtaWarps<kBlockN, 16 * kRowWarps>)
    decode_kernel(const __grid_constant__ DecodeArgs a) {
  static_assert(kRowWarps == 1 || kRowWarps == 4, "16-row or 64-row tiles");
  constexpr int kRows = 16 * kRowWarps;
  constexpr int kWarps = kDecodeCtaWarps<kBlockN, kRows>;
  constexpr int kThreads = 32 * kWarps;
  constexpr int kKeyWarps = kWarps / kRowWarps;  // warps sharing a row (each its own keys of a block)
  constexpr int kKeyGroups = kRowWarps;          // 16-key groups of a block per warp
  using Elem = typename ElemOf<kBF16>::type;
  using Smem = DecodeSmem<kD, kBlockN, kStages, kRows>;
  static_assert((kBlockN == 64 || (kBlockN == 128 && kRowWarps == 1)) && kD % 64 == 0,
                "16 keys of a block per warp (4 or 8 warps: 64 or 128 keys; the wide tile 64); "
                "8+ swizzled chunks per row");
  static_assert(kBlockN == 16 * kKeyWarps * kKeyGroups, "a block's keys are the warps' 16-key groups");
  constexpr int kC = kD / 8;            // 16-byte chunks per row
  constexpr int kRowsPerPass = kThreads / kC;
  // The wide tile reads Q, K and V from shared memory in wgmma's swizzled layout (swz_slab).
  constexpr bool kWgmma = Smem::kWgmma;
  static_assert(!kWgmma || kD == 64 || kD == 128, "the wide tile's P V wgmma is 64 or 128 columns wide");
  // The wide tile's P V of block it reads that block's stage until the wait at the top of iteration
  // it + 1, which precedes the barrier after which iteration it + 1 refills that same stage
  // ((it + kStages) % kStages): keep the wait before the barrier.
  extern __shared__ __align__(128) char smem_raw[];
  char* const smem = kWgmma ? smem_raw + ((1024u - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u)
                            : smem_raw;
  static_assert(!kWgmma || kRows == kBlockN, "one slab layout (swz_slab) for the Q tile and the K / V blocks");
  auto tile_off = [](int r, int c) { return kWgmma ? swz_slab<kRows>(r, c) : swz<kD>(r, c); };
  Elem* sQ = reinterpret_cast<Elem*>(smem);
  Elem* sRing = sQ + Smem::kQElems;

  const detail::KVCacheParams& p = a.p;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // The warp's 16 rows and its keys of a block (spelled out per tile so that the narrow tile's
  // index maths folds: warp < kWarps is not known to the compiler).
  const int rw = kRowWarps == 1 ? 0 : warp, kw = kRowWarps == 1 ? warp : 0;
  const int32_t split = blockIdx.x, b = blockIdx.z;
  const int32_t kv_head = blockIdx.y / a.row_tiles, row_tile = blockIdx.y % a.row_tiles;
  const int32_t rows = p.seqlen_q * a.group;  // packed rows of this KV head
  const int32_t row0 = row_tile * kRows;

  // A cluster's CTAs push their partials into each other's shared memory at the end; arriving here
  // makes the wait before the pushes a proof, at no cost by then, that every peer has started.
  if (a.cluster > 1) arch::cluster_arrive_relaxed();

  // ---- sequence, split range, index checks ----
  const CacheSeq cs = cache_seq(p, b);
  uint32_t bad = cs.bad;
  const int32_t seqlen_k = cs.seqlen_k;
  // Keys any query row sees (bottom-right masks: both ends grow with the row), in kBlockN-key blocks
  // from `first`; split s takes blocks [s * per, (s + 1) * per). Sequence-wide, so every CTA of one
  // (split, sequence) checks the same pages (with its key walk, below) and agrees on its flag.
  const detail::KeyRange seq_keys{detail::visible_key_range(0, p.seqlen_q, seqlen_k, p.mask).first,
                                  detail::visible_key_range(p.seqlen_q - 1, p.seqlen_q, seqlen_k, p.mask).last};
  const int32_t n_blocks = int32_t((seq_keys.last - seq_keys.first + kBlockN - 1) / kBlockN);
  const int32_t per = (n_blocks + a.num_splits - 1) / a.num_splits;
  const int32_t blk_lo = min(n_blocks, split * per), blk_hi = min(n_blocks, blk_lo + per);
  const int32_t split_first = int32_t(seq_keys.first) + blk_lo * kBlockN;
  const int32_t split_last = min(int32_t(seq_keys.last), int32_t(seq_keys.first) + blk_hi * kBlockN);
  const int32_t* pages = p.paged ? p.page_table + int64_t(b) * p.page_table_batch_stride : nullptr;
  // Page-table entries the split checks: its keys' and, in split 0, those before the first visible
  // key. Up to 8 loads per thread they are checked before the first copy (the loads also bring the
  // lines the row offsets read next); more are checked as the row offsets read them (below).
  const int32_t check_lo = split == 0 ? 0 : split_first;
  const int32_t check_entries = split_last > check_lo ? (split_last - 1) / p.page_size - check_lo / p.page_size + 1 : 0;
  const bool check_first = p.paged && check_entries <= 8 * kThreads;
  if (check_first && !bad && !pages_valid(p, pages, check_lo, split_last)) bad |= kBadPageTable;
  __shared__ int32_t s_last;
  if (bad) {
    if (tid == 0) report_async_error(a.async_error, bad);
    if (a.cluster == 1) {
      if (a.num_splits > 1) arrive_last(a, &s_last, true, 0, a.num_splits);  // never the merging CTA
      return;
    }
    // In a cluster the CTA stays for its peers' barriers: it reads no key and flags its partial.
  }

  // This row tile's keys within the split.
  // Bottom-right masks: both ends of a row's range grow with the row, so the first and the last
  // row of the tile bound the keys any row sees (tile_keys) and those every row sees (all_keys).
  const int32_t last_row = min(rows, row0 + kRows) - 1;
  const detail::KeyRange first_row_keys = detail::visible_key_range(row0 / a.group, p.seqlen_q, seqlen_k, p.mask);
  const detail::KeyRange last_row_keys = detail::visible_key_range(last_row / a.group, p.seqlen_q, seqlen_k, p.mask);
  const detail::KeyRange tile_keys{first_row_keys.first, last_row_keys.last};
  const int32_t key_end = min(split_last, int32_t(tile_keys.last));
  int32_t t_lo = blk_lo, t_hi = blk_hi;  // blocks of the split that hold tile keys
  if (key_end <= split_first || tile_keys.first >= key_end) {
    t_hi = t_lo;
  } else {
    t_lo = max(blk_lo, int32_t((tile_keys.first - seq_keys.first) / kBlockN));
    t_hi = min(blk_hi, int32_t((key_end - seq_keys.first + kBlockN - 1) / kBlockN));
  }
  const int32_t n_iter = bad ? 0 : t_hi - t_lo;

  // ---- Q tile (cp.async group 0, with the first K/V block) ----
  const Elem* q = static_cast<const Elem*>(p.q);
  for (int idx = tid; idx < kRows * kC; idx += kThreads) {
    const int r = idx / kC, c = idx % kC;
    const int32_t row = row0 + r;
    const bool valid = row < rows && c * 8 < p.headdim;
    const Elem* src = q;
    if (valid) {
      const detail::RowCoord pr = detail::packed_row(row, kv_head, a.group);
      src = q + int64_t(b) * p.q_stride.batch + int64_t(pr.query) * p.q_stride.row + int64_t(pr.head) * p.q_stride.head +
            c * 8;
    }
    arch::cp_async_16(sQ + tile_off(r, c), src, valid);
  }

  const Elem* k_base = static_cast<const Elem*>(p.k) + int64_t(kv_head) * p.k_stride.head;
  const Elem* v_base = static_cast<const Elem*>(p.v) + int64_t(kv_head) * p.v_stride.head;
  // Paged: row offsets (elements; -1: not loaded) of a block's kBlockN keys in K and V, one row per
  // thread of the first kBlockN, in a per-stage table the copies read. A block's page-table entries
  // are loaded an iteration before its offsets are computed and stored (after the compute), so the
  // entry's load latency (an L2 round trip where the line left L1, queued behind the stream's
  // copies) hides behind a whole iteration instead of one block's compute: with one CTA per SM
  // its wait held up the next barrier. A dense cache's rows are one stride apart: each thread
  // steps its own pointer instead.
  // Every page-table entry of keys [0, seqlen_k) must be a page (the rule of the CPU path and of
  // the append kernel). Past check_first's limit the entries a row offset reads are checked there
  // (a row of a page outside the pool is zero-filled, never read), the split's others once the
  // first copies are issued: a check of the whole split before the first copy would put a round
  // trip per page-table line of the split (thousands of entries with pages of 16 over a long
  // cache) ahead of the stream. The CTA's flag is reduced after the key walk, before anything is
  // written.
  bool page_bad = false;  // this thread's: an entry it read is outside the pool
  int64_t* sOff = reinterpret_cast<int64_t*>(sRing + kStages * Smem::kStageElems);  // [stage][K, V][kBlockN]
  // A row's page-table entry and slot within the page (slot -1: no key, nothing read).
  struct PageRef {
    int32_t page, slot;
  };
  auto page_ref = [&](int32_t blk) -> PageRef {
    const int32_t j = int32_t(seq_keys.first) + blk * kBlockN + tid;
    if (j >= key_end) return {0, -1};
    return {pages[j / p.page_size], j % p.page_size};
  };
  auto row_offsets = [&](PageRef r, int64_t& ko, int64_t& vo) {
    ko = vo = -1;
    if (r.slot >= 0) {
      if (detail::page_in_pool(r.page, p.num_pages)) {
        ko = page_row_offset(r.page, r.slot, p.k_stride);
        vo = page_row_offset(r.page, r.slot, p.v_stride);
      } else {
        page_bad = true;
      }
    }
  };
  // Block blk of the split into ring stage `stage`: thread t copies 16-byte chunk t % kC of rows
  // t / kC + kRowsPerPass * i; rows past key_end and head-dim padding are zero-filled, never read.
  auto load_block = [&](int stage, int32_t blk) {
    Elem* sK = sRing + stage * Smem::kStageElems;
    Elem* sV = sK + kBlockN * kD;
    const int c = tid % kC;
    const bool k_col = c * 8 < p.headdim, v_col = c * 8 < p.headdim_v;
    if (p.paged) {
      const int64_t* off = sOff + stage * 2 * kBlockN;
#pragma unroll
      for (int it = 0; it < kBlockN / kRowsPerPass; ++it) {
        const int r = tid / kC + it * kRowsPerPass;
        const int64_t ko = off[r], vo = off[kBlockN + r];
        const bool k_ok = ko >= 0 && k_col, v_ok = vo >= 0 && v_col;
        arch::cp_async_16(sK + tile_off(r, c), k_base + (k_ok ? ko + c * 8 : 0), k_ok);
        arch::cp_async_16(sV + tile_off(r, c), v_base + (v_ok ? vo + c * 8 : 0), v_ok);
      }
    } else {
      const int32_t j = int32_t(seq_keys.first) + blk * kBlockN + tid / kC;  // key of this thread's first row
      const Elem* k_row = k_base + int64_t(cs.cache_b) * p.k_stride.batch + int64_t(j) * p.k_stride.row + c * 8;
      const Elem* v_row = v_base + int64_t(cs.cache_b) * p.v_stride.batch + int64_t(j) * p.v_stride.row + c * 8;
      const int64_t k_step = int64_t(kRowsPerPass) * p.k_stride.row, v_step = int64_t(kRowsPerPass) * p.v_stride.row;
#pragma unroll
      for (int it = 0; it < kBlockN / kRowsPerPass; ++it) {
        const int r = tid / kC + it * kRowsPerPass;
        const bool in = j + it * kRowsPerPass < key_end;
        const bool k_ok = in && k_col, v_ok = in && v_col;
        arch::cp_async_16(sK + tile_off(r, c), k_ok ? k_row : k_base, k_ok);
        arch::cp_async_16(sV + tile_off(r, c), v_ok ? v_row : v_base, v_ok);
        k_row += k_step;
        v_row += v_step;
      }
    }
  };
  PageRef next_ref{0, -1};  // this thread's row of block it + kStages, stored at the end of iteration it
  if (p.paged && tid < kBlockN) {
    for (int s = 0; s < kStages && s < n_iter; ++s)
      row_offsets(page_ref(t_lo + s), sOff[s * 2 * kBlockN + tid], sOff[s * 2 * kBlockN + kBlockN + tid]);
    if (kStages < n_iter) next_ref = page_ref(t_lo + kStages);
  }
  __syncthreads();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iter) load_block(s, t_lo + s);
    arch::cp_async_commit();
  }
  // Paged: the split's entries no row offset reads (those of its keys outside this tile's blocks
  // and, in split 0, those of the keys before the first visible one), while the first blocks land.
  if (p.paged && !bad && !check_first) {
    const int32_t read_lo = n_iter > 0 ? int32_t(seq_keys.first) + t_lo * kBlockN : split_last;
    const int32_t read_hi = n_iter > 0 ? key_end : split_last;
    page_bad |= pages_outside_pool(p, pages, check_lo, read_lo);
    page_bad |= pages_outside_pool(p, pages, max(check_lo, read_hi), split_last);
  }

  // ---- per-thread row geometry: fragment rows lane/4 and lane/4 + 8 of the warp's 16 ----
  detail::KeyRange row_keys[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int32_t row = row0 + 16 * rw + lane / 4 + 8 * rr;
    row_keys[rr] = row < rows ? detail::visible_key_range(row / a.group, p.seqlen_q, seqlen_k, p.mask)
                              : detail::KeyRange{0, 0};
  }
  const detail::KeyRange all_keys{last_row_keys.first, first_row_keys.last};
  // 32 registers at d128; d256 holds 128 O registers already; the wide tile's wgmma reads Q from smem.
  constexpr bool kQInRegs = kD <= 128 && !kWgmma;
  uint32_t q_frag[kQInRegs ? kD / 16 : 1][4];
  const bool softcap = p.softcap > 0.f;
  const float s_mul = softcap ? p.softmax_scale / p.softcap : p.softmax_scale_log2;
  const float s_cap = p.softcap * detail::kLog2e;
  const float tau = p.rescale_threshold;

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[kKeyGroups][4] = {};  // P's A fragments (the wide tile's P V reads them asynchronously)

  for (int32_t it = 0; it < n_iter; ++it) {
    arch::cp_async_wait<kStages - 2>();
    if constexpr (kWgmma) {
      arch::fence_proxy_async_smem();  // this thread's copies, for wgmma's reads
      // the previous block's P V, which ran while this block's copies landed (its A registers
      // stay untouched until then)
      cute::warpgroup_wait<0>();
      arch::fence_regs(o);
      arch::fence_regs(pa);
    }
    __syncthreads();  // block `it` landed for every thread; the stage refilled below is consumed
    const int32_t nxt = it + kStages - 1;
    if (nxt < n_iter) load_block(nxt % kStages, t_lo + nxt);
    arch::cp_async_commit();
    const Elem* sK = sRing + (it % kStages) * Smem::kStageElems;
    const Elem* sV = sK + kBlockN * kD;

    // Q's A fragments: read from smem once (the first block's wait covered the Q copy) where they
    // fit in registers, else per block.
    if constexpr (kQInRegs) {
      if (it == 0) {
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks)
          arch::ldmatrix_x4<false>(q_frag[ks], sQ + swz<kD>(16 * rw + lane % 16, ks * 2 + lane / 16));
      }
    }
    // S = Q K^T for this warp's keys (kNt n8 tiles from key key0). On mma.sync the narrow tile's
    // two n8 tiles accumulate in two chains each (even and odd k steps) so that four independent
    // chains of kD/32 overlap their latency.
    constexpr int kNt = 2 * kKeyGroups;
    constexpr bool kOddChains = kKeyGroups == 1;
    const int key0 = 16 * kKeyGroups * kw;  // the warp's first key of the block
    float sc[kNt][4], sc_odd[kOddChains ? kNt : 1][4];
    if constexpr (kWgmma) {
      // S = Q K^T (64 rows x 64 keys), both K-major.
      cute::warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks)
        arch::wgmma_m64n64k16_ss<kBF16>(sc, arch::desc_kmajor_sw128<kRows>(sQ, ks),
                                        arch::desc_kmajor_sw128<kBlockN>(sK, ks), ks > 0);
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();
      arch::fence_regs(sc);
    } else {
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[nt][e] = 0.f;
      if constexpr (kOddChains) {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc_odd[nt][e] = 0.f;
      }
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t qa[4];
        if constexpr (kQInRegs) {
#pragma unroll
          for (int x = 0; x < 4; ++x) qa[x] = q_frag[ks][x];
        } else {
          arch::ldmatrix_x4<false>(qa, sQ + swz<kD>(16 * rw + lane % 16, ks * 2 + lane / 16));
        }
#pragma unroll
        for (int g = 0; g < kKeyGroups; ++g) {
          uint32_t kb[4];
          arch::ldmatrix_x4<false>(kb,
                                   sK + swz<kD>(key0 + 16 * g + (lane / 16) * 8 + lane % 8, ks * 2 + (lane / 8) % 2));
          float(*acc)[4] = kOddChains && ks % 2 ? sc_odd : sc;
          arch::mma_m16n8k16<kBF16>(acc[2 * g], qa, kb[0], kb[1]);
          arch::mma_m16n8k16<kBF16>(acc[2 * g + 1], qa, kb[2], kb[3]);
        }
      }
      if constexpr (kOddChains) {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[nt][e] += sc_odd[nt][e];
      }
    }

    // Scores in log2 units, masked to -inf; the online softmax per row. Softcap and the mask are
    // CTA-uniform choices made per block, outside the element loop (a per-element select would
    // evaluate tanh and the two bounds for every score of every block).
    const int32_t blk_first = int32_t(seq_keys.first) + (t_lo + it) * kBlockN;
    const int32_t key_w = blk_first + key0 + 2 * (lane % 4);
    float row_max[2] = {-INFINITY, -INFINITY};
    auto scores = [&](auto capped, auto masked) {
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int rr = e / 2;
          float x;
          if constexpr (decltype(capped)::value) x = s_cap * tanhf(sc[nt][e] * s_mul);
          else x = sc[nt][e] * s_mul;
          if constexpr (decltype(masked)::value) {
            const int32_t j = key_w + nt * 8 + e % 2;
            if (j < row_keys[rr].first || j >= row_keys[rr].last) x = -INFINITY;
          }
          sc[nt][e] = x;
          row_max[rr] = fmaxf(row_max[rr], x);
        }
    };
    // Unmasked: every key of the block is one every row of the tile sees (rows past the tile's
    // last are never stored, whatever they compute).
    const bool masked = blk_first < all_keys.first || blk_first + kBlockN > all_keys.last;
    using Yes = std::true_type;
    using No = std::false_type;
    if (softcap) {
      if (masked) scores(Yes{}, Yes{});
      else scores(Yes{}, No{});
    } else {
      if (masked) scores(No{}, Yes{});
      else scores(No{}, No{});
    }
    bool grow[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      row_max[rr] = arch::quad_max(row_max[rr]);
      grow[rr] = row_max[rr] > m[rr] + tau;  // also true for the first finite max (m = -inf)
    }
    if (__any_sync(0xffffffffu, grow[0] || grow[1])) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float alpha = !grow[rr] ? 1.f : m[rr] == -INFINITY ? 0.f : arch::ex2_approx(m[rr] - row_max[rr]);
        if (grow[rr]) m[rr] = row_max[rr];
        l[rr] *= alpha;
#pragma unroll
        for (int n = 0; n < kD / 8; ++n) {
          o[n][2 * rr] *= alpha;
          o[n][2 * rr + 1] *= alpha;
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const float ref = m[rr] == -INFINITY ? 0.f : m[rr];  // a row with no key yet: P = 2^-inf = 0
        const float p0 = arch::ex2_approx(sc[nt][2 * rr] - ref);
        const float p1 = arch::ex2_approx(sc[nt][2 * rr + 1] - ref);
        l[rr] += p0 + p1;
        pa[nt / 2][(nt % 2) * 2 + rr] = pack2<kBF16>(p0, p1);
      }

    // O += P V: P is already the A fragment of each 16-key group (rows lane/4, +8; keys 2(lane%4)
    // and +8).
    if constexpr (kWgmma) {
      // V MN-major: k16 step g is keys 16g..16g+15.
      arch::fence_regs(o);
      arch::fence_regs(pa);
      cute::warpgroup_arrive();
#pragma unroll
      for (int g = 0; g < kKeyGroups; ++g)
        arch::wgmma_m64nk16_rs<kBF16, kD>(o, pa[g], arch::desc_mnmajor_sw128<kBlockN, kD>(sV, g), true);
      cute::warpgroup_commit_batch();
    } else {
#pragma unroll
      for (int np = 0; np < kD / 16; ++np)
#pragma unroll
        for (int g = 0; g < kKeyGroups; ++g) {
          uint32_t vb[4];
          arch::ldmatrix_x4<true>(vb, sV + swz<kD>(key0 + 16 * g + lane % 16, np * 2 + lane / 16));
          arch::mma_m16n8k16<kBF16>(o[2 * np], pa[g], vb[0], vb[1]);
          arch::mma_m16n8k16<kBF16>(o[2 * np + 1], pa[g], vb[2], vb[3]);
        }
    }
    // Paged: offsets of block nxt + 1 into the stage computed on above (its offsets were read when
    // it was issued, before this iteration's barrier), from the entry loaded an iteration ago; then
    // the entry of the block after it.
    if (p.paged && tid < kBlockN && nxt + 1 < n_iter) {
      const int st = (nxt + 1) % kStages;
      row_offsets(next_ref, sOff[st * 2 * kBlockN + tid], sOff[st * 2 * kBlockN + kBlockN + tid]);
      if (nxt + 2 < n_iter) next_ref = page_ref(t_lo + nxt + 2);
    }
  }
  arch::cp_async_wait<0>();
  if constexpr (kWgmma) {
    cute::warpgroup_wait<0>();
    arch::fence_regs(o);
    arch::fence_regs(pa);
  }
  // The ring is free: it becomes the merge buffer.
  if (__syncthreads_or(page_bad)) {
    bad |= kBadPageTable;
    if (tid == 0) report_async_error(a.async_error, bad);
    if (a.cluster == 1) {  // nothing written; a cluster flags its partial below
      if (a.num_splits > 1) arrive_last(a, &s_last, true, 0, a.num_splits);  // never the merging CTA
      return;
    }
  }

  // ---- merge the states of the warps that share rows (core/softmax.h merge_weight; a wide tile's
  // warps hold rows of their own, weight 1) ----
  constexpr int kOStride = Smem::kOStride;
  float* sO = reinterpret_cast<float*>(sRing);  // [warp][16][kOStride]
  float* sM = sO + kWarps * 16 * kOStride;       // [warp][16] the warps' row maxes
  float* sL = sM + kWarps * 16;                  // [warp][16] their row sums, then weighted to sMax
  float* sMax = sL + kWarps * 16;                // [kRows] the merged row maxes
  const int w0 = rw * kKeyWarps;                 // the first warp of this warp's rows
  auto ex2 = [](float x) { return arch::ex2_approx(x); };
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l[rr] = arch::quad_sum(l[rr]);
    if (lane % 4 == 0) {
      sM[warp * 16 + lane / 4 + 8 * rr] = m[rr];
      sL[warp * 16 + lane / 4 + 8 * rr] = l[rr];
    }
  }
  __syncthreads();
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int r = lane / 4 + 8 * rr;
    float mm = sM[w0 * 16 + r];
#pragma unroll
    for (int w = 1; w < kKeyWarps; ++w) mm = fmaxf(mm, sM[(w0 + w) * 16 + r]);
    const float wgt = detail::merge_weight(m[rr], mm, 1.f, ex2);
    // Rows past the tile's live ones are never read back (the finalize and the pushes skip them):
    // a decode step's tile of 16 rows holds one query's group of heads, often 4 or 8 of them.
    if (row0 + 16 * rw + r < rows) {
#pragma unroll
      for (int n = 0; n < kD / 8; ++n)
        *reinterpret_cast<float2*>(&sO[(warp * 16 + r) * kOStride + n * 8 + 2 * (lane % 4)]) =
            make_float2(o[n][2 * rr] * wgt, o[n][2 * rr + 1] * wgt);
    }
    if (lane % 4 == 0) {  // this warp's entries only: the reads above are of sM
      sL[warp * 16 + r] = l[rr] * wgt;
      if (kw == 0) sMax[16 * rw + r] = mm;
    }
  }
  __syncthreads();

  // ---- finalize (one split) or the normalised partial (several): pushed to the CTAs of the
  // cluster that merge its columns, else to the global scratch ----
  // Row r's state over the warps that hold it, columns c..c+3 (sums of their weighted states).
  auto row_state = [&](int r, int c, float& ll, float4& acc) {
    ll = 0.f;
    acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const int r16 = kRowWarps == 1 ? r : r % 16, wr = kRowWarps == 1 ? 0 : r / 16;
#pragma unroll
    for (int w = wr; w < wr + kKeyWarps; ++w) {
      ll += sL[w * 16 + r16];
      const float4 x = *reinterpret_cast<const float4*>(&sO[(w * 16 + r16) * kOStride + c]);
      acc.x += x.x; acc.y += x.y; acc.z += x.z; acc.w += x.w;
    }
  };
  if (a.cluster == 1) {
    const float* sink = p.sink;
    for (int idx = tid; idx < kRows * (kD / 4); idx += kThreads) {
      const int r = idx / (kD / 4), c = (idx % (kD / 4)) * 4;
      const int32_t row = row0 + r;
      if (row >= rows || c >= p.headdim_v) continue;
      float ll;
      float4 acc;
      row_state(r, c, ll, acc);
      const detail::RowCoord pr = detail::packed_row(row, kv_head, a.group);
      if (a.num_splits == 1) store_final<kBF16>(p, b, pr.query, pr.head, c, sMax[r], ll, acc, sink);
      else store_partial<kD>(a, split, 0, b, pr.query, pr.head, c, c == 0, sMax[r], ll, acc);
    }
    if (a.num_splits > 1 && arrive_last(a, &s_last, false, 0, a.num_splits))
      combine_tile<kBF16, kD, kRows>(a, b, kv_head, row0, rows, 0, kD);
    return;
  }
  // ---- with a cluster: push the partial's slices to the CTAs that merge them, merge this CTA's ----
  const uint32_t rank = arch::cluster_ctarank();
  const ClusterRecv recv = ClusterRecv::at<kD, kRows>(smem + Smem::kBytes, a.cluster, rank);
  const int cols = recv.width;  // columns each CTA of the cluster merges (>= 4)
  // This thread's slices (row, 4 columns) of the partial, read from shared memory kChunk at a time,
  // then pushed back to back. Rows past the tile's live ones are skipped: the CTA's tail is a chain
  // of latencies, and every slice adds to it.
  constexpr int kPer = kRows * (kD / 4) / kThreads, kChunk = kPer <= 4 ? kPer : 2;
  static_assert(kPer >= 1 && kPer * kThreads == kRows * (kD / 4), "every thread pushes whole slices");
  arch::cluster_wait();  // the kernel-start arrival: every peer has started
  if (tid < a.cluster) arch::st_peer(recv.bad + rank, uint32_t(tid), int32_t(bad != 0));
#pragma unroll
  for (int k0 = 0; k0 < kPer; k0 += kChunk) {
    float4 x[kChunk];
    float lse[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      const int idx = tid + kThreads * (k0 + k), r = idx / (kD / 4), c = (idx % (kD / 4)) * 4;
      if (row0 + r >= rows) continue;
      float ll;
      float4 acc;
      row_state(r, c, ll, acc);
      x[k] = normalised_row(ll, acc);
      lse[k] = partial_lse(sMax[r], ll);
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      const int idx = tid + kThreads * (k0 + k), r = idx / (kD / 4), c = (idx % (kD / 4)) * 4;
      if (row0 + r >= rows) continue;
      const int owner = c / cols;
      if ((c & (cols - 1)) == 0) arch::st_peer(recv.lse + rank * kRows + r, uint32_t(owner), lse[k]);
      if (c < p.headdim_v)
        arch::st_peer(reinterpret_cast<float4*>(recv.o + (rank * kRows + r) * cols + (c & (cols - 1))), uint32_t(owner),
                      x[k]);
    }
  }
  // Every peer's pushes into this CTA's buffer are visible after the barrier, and no CTA touches
  // another's shared memory after it: a CTA may exit without waiting for its peers' merges.
  arch::cluster_arrive_release();
  arch::cluster_wait();
  const bool cluster_bad = cluster_merge<kBF16, kD, kRows>(a, b, kv_head, row0, rows, recv);
  // The clusters' partials of these columns meet at this rank's counter of the tile: the last of
  // them merges only its columns, so the tile's global merge runs in a.cluster CTAs at once.
  if (a.num_partials > 1 && arrive_last(a, &s_last, cluster_bad, int32_t(rank), a.num_partials))
    combine_tile<kBF16, kD, kRows>(a, b, kv_head, row0, rows, recv.c_lo, recv.width);
}

}  // namespace fa4::hopper::decode
