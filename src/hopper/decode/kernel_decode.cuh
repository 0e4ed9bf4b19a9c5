// src/hopper/decode/kernel_decode.cuh — the Hopper split-KV decode kernel with the splits' merge (the
// append kernel and the cache's index checks: cache_decode.cuh).
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
#include "hopper/decode/cache_decode.cuh"
#include "hopper/decode/merge_decode.cuh"
#include "hopper/decode/tuning_decode.h"
#include "hopper/shared/device_state.h"

namespace fa4::hopper::decode {

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
  static constexpr int kQRingBytes = (kQElems + kStages * kStageElems) * 2;
  // Behind the ring: per stage, each row's K and V offsets (two int64) for paged caches whose
  // page size is not a multiple of the kernel's run of keys (kernel: row_table).
  static constexpr int kBytes = kQRingBytes + kStages * kBlockN * 16;
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
  // A paged block's thread (and a dense one's at d256, load_block) copies chunk tid % kC of a run of
  // kRowRun consecutive keys: one page holds the run where the page size is a multiple of kRowRun
  // (the blocks start at a multiple of it), so one page-table entry gives the thread's first row
  // and the others are a row stride on, as in a dense cache.
  constexpr int kRowRun = kBlockN / kRowsPerPass;
  static_assert(kRowRun * kRowsPerPass == kBlockN, "a block's rows are whole passes");
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
  // (split, sequence) checks the same pages (with its key walk, below) and agrees on its flag. A
  // paged cache's blocks start at a multiple of kRowRun (a left window's first key rounded down:
  // the keys before it are masked like any other the rows do not see, and their page-table entries
  // are among those of keys [0, seqlen_k) that must be pages anyway).
  const detail::KeyRange seen{detail::visible_key_range(0, p.seqlen_q, seqlen_k, p.mask).first,
                              detail::visible_key_range(p.seqlen_q - 1, p.seqlen_q, seqlen_k, p.mask).last};
  const detail::KeyRange seq_keys{p.paged && seen.last > seen.first ? seen.first - seen.first % kRowRun : seen.first,
                                  seen.last};
  const int32_t n_blocks = int32_t((seq_keys.last - seq_keys.first + kBlockN - 1) / kBlockN);
  const int32_t per = (n_blocks + a.num_splits - 1) / a.num_splits;
  const int32_t blk_lo = min(n_blocks, split * per), blk_hi = min(n_blocks, blk_lo + per);
  const int32_t split_first = int32_t(seq_keys.first) + blk_lo * kBlockN;
  const int32_t split_last = min(int32_t(seq_keys.last), int32_t(seq_keys.first) + blk_hi * kBlockN);
  const int32_t* pages = p.paged ? p.page_table + int64_t(b) * p.page_table_batch_stride : nullptr;
  // Page-table entries the split checks: its keys' and, in split 0, those before the first visible
  // key. Up to 8 loads per thread they are checked before the first copy (the loads also bring the
  // lines the copies' runs read next); more are checked as the copies read them (below).
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
  // Paged: each block's copies start from the page-table entry of the thread's run of kRowRun keys,
  // loaded two blocks ahead (an iteration before the copies that use it), so that its latency (an
  // L2 round trip where its line has left L1, queued behind the stream's copies) hides behind a
  // whole iteration: loaded in the iteration of its copies it held up the next barrier wherever
  // its line had left L1. Page sizes that are not a multiple of kRowRun (runs across pages: pages
  // of one key, SGLang's, among them) need every row's entry: thread t < kBlockN loads row t's an
  // iteration ahead and stores the row's K and V offsets once into the stage's row table, which
  // the run's copies read (each of a row's kC threads converting the entry itself put kC times the
  // integer work on the copy path).
  // Every page-table entry of keys [0, seqlen_k) must be a page (the rule of the CPU path and of
  // the append kernel). Past check_first's limit the entries the copies read are checked there
  // (the rows of a page outside the pool are zero-filled, never read), the split's others once the
  // first copies are issued: a check of the whole split before the first copy would put a round
  // trip per page-table line of the split (thousands of entries with pages of 16 over a long
  // cache) ahead of the stream. The CTA's flag is reduced after the key walk, before anything is
  // written.
  bool page_bad = false;  // this thread's: an entry it read is outside the pool
  const bool runs_in_page = p.paged && p.page_size % kRowRun == 0;
  const bool rows_tabled = p.paged && !runs_in_page;
  const int run0 = (tid / kC) * kRowRun;  // the thread's first row of a block
  // A run's page-table entry and the slot of its first key within the page (slot -1: no key). At
  // d256 (registers full: O alone takes 128) only the entry is carried, and the slot is computed
  // where the copies use it (a division per block).
  constexpr bool kCompactRuns = kD > 128;
  struct PageRef {
    int32_t page, slot;
  };
  // The thread's walk over its runs, one block a step: the next run's keys left before key_end
  // (<= 0: none), its first key's page-table index and slot (one division per CTA; a step adds
  // kBlockN keys).
  int32_t walk_left = 0, walk_idx = 0, walk_slot = 0, step_idx = 0, step_slot = 0;
  if (runs_in_page) {
    const int32_t j = int32_t(seq_keys.first) + t_lo * kBlockN + run0;
    walk_left = key_end - j;
    walk_idx = j / p.page_size;
    walk_slot = j % p.page_size;
    step_idx = kBlockN / p.page_size;
    step_slot = kBlockN % p.page_size;
  }
  // [stage][row] {K offset, V offset} in elements, -1: nothing read (no key, or a page outside the
  // pool). Row tid's entry of block blk (slot -1: no key), and its offsets stored into `stage`.
  longlong2* const row_table = reinterpret_cast<longlong2*>(smem + Smem::kQRingBytes);
  auto row_ref = [&](int32_t blk) -> PageRef {
    const int32_t j = int32_t(seq_keys.first) + blk * kBlockN + tid;
    if (tid >= kBlockN || j >= key_end) return {0, -1};
    return {pages[j / p.page_size], j % p.page_size};
  };
  auto store_row = [&](int stage, PageRef r) {
    if (tid >= kBlockN) return;
    longlong2 off{-1, -1};
    if (r.slot >= 0) {
      if (detail::page_in_pool(r.page, p.num_pages)) {
        off.x = page_row_offset(r.page, r.slot, p.k_stride);
        off.y = page_row_offset(r.page, r.slot, p.v_stride);
      } else {
        page_bad = true;
      }
    }
    row_table[stage * kBlockN + tid] = off;
  };
  // Byte offset in a K block of chunk c of row run0 + i: tile_off(run0 + i, c) is tile_off(run0, c)
  // with the chunk's bits (byte offset bits 4-6) XOR i % 8, plus i rows (run0 is a multiple of
  // kRowRun, at least 4: its low 3 bits and i's are disjoint, and both swizzles XOR the chunk with
  // the row's low 3 bits; rows are whole multiples of 128 bytes).
  constexpr uint32_t kRowBytes = (kWgmma ? 64 : kD) * 2;  // a row of one swz slab / of swz's tile
  static_assert(kRowRun >= 4 && kRowRun % 4 == 0 && kRowBytes % 128 == 0, "runs of whole swizzle phases");
  const uint32_t run_off = uint32_t(tile_off(run0, tid % kC)) * 2;
  auto run_dst = [&](uint32_t stage_base, int i) {
    return stage_base + ((run_off ^ uint32_t((i % 8) << 4)) + uint32_t(i) * kRowBytes);
  };
  auto next_run = [&]() -> PageRef {
    PageRef r{0, -1};
    if constexpr (kCompactRuns) {
      if (walk_left > 0) r.page = pages[(key_end - walk_left) / p.page_size];
    } else {
      if (walk_left > 0) r = {pages[walk_idx], walk_slot};
      walk_idx += step_idx;
      walk_slot += step_slot;
      if (walk_slot >= p.page_size) {
        walk_slot -= p.page_size;
        ++walk_idx;
      }
    }
    walk_left -= kBlockN;
    return r;
  };
  // Dense: up to d128 the thread copies rows tid / kC + kRowsPerPass * i of a block (the same
  // swizzle phase: the copies' shared addresses are one register plus constants) and keeps its
  // row pointers of the next block to load (blocks load in order, each once), which saves a
  // block's address arithmetic; at d256 (registers full) it copies a run like a paged block, from
  // key seq_keys.first + blk * kBlockN + run0.
  constexpr bool kPassRows = kD <= 128;
  static_assert(!kPassRows || kRowsPerPass % 8 == 0, "a pass's rows in one swizzle phase");
  auto dense_row = [&](const Elem* base, const detail::RowStrides& st, int32_t blk, int row) {
    const int64_t j = seq_keys.first + int64_t(blk) * kBlockN + row;
    return base + (int64_t(cs.cache_b) * st.batch + j * st.row + (tid % kC) * 8);
  };
  const Elem* k_walk = kPassRows && !p.paged ? dense_row(k_base, p.k_stride, t_lo, tid / kC) : k_base;
  const Elem* v_walk = kPassRows && !p.paged ? dense_row(v_base, p.v_stride, t_lo, tid / kC) : v_base;
  const int64_t k_step = int64_t(kRowsPerPass) * p.k_stride.row, v_step = int64_t(kRowsPerPass) * p.v_stride.row;
  // Block blk of the split into ring stage `stage` (paged: `ref` is the thread's run of it): the
  // thread copies 16-byte chunk tid % kC of rows run0 .. run0 + kRowRun - 1 (dense up to d128: of
  // rows tid / kC + kRowsPerPass * i); rows past key_end and head-dim padding are zero-filled,
  // never read (a copy that reads nothing may have any address).
  auto load_block = [&](int stage, int32_t blk, PageRef ref) {
    const int c = tid % kC;
    const bool k_col = c * 8 < p.headdim, v_col = c * 8 < p.headdim_v;
    Elem* sK = sRing + stage * Smem::kStageElems;
    if (kPassRows && !p.paged) {
      const int32_t rows_in = key_end - (int32_t(seq_keys.first) + blk * kBlockN + tid / kC);
      const int32_t k_rows = k_col ? rows_in : 0, v_rows = v_col ? rows_in : 0;
#pragma unroll
      for (int it = 0; it < kBlockN / kRowsPerPass; ++it) {
        const int r = tid / kC + it * kRowsPerPass;
        arch::cp_async_16(sK + tile_off(r, c), k_walk, it * kRowsPerPass < k_rows);
        arch::cp_async_16(sK + kBlockN * kD + tile_off(r, c), v_walk, it * kRowsPerPass < v_rows);
        k_walk += k_step;
        v_walk += v_step;
      }
      return;
    }
    const uint32_t stage_base = uint32_t(__cvta_generic_to_shared(sK));
    const int32_t j = int32_t(seq_keys.first) + blk * kBlockN + run0;  // the run's first key
    if (rows_tabled) {  // a run may span pages: each row's offsets from the stage's table
      const longlong2* off = row_table + stage * kBlockN + run0;
#pragma unroll
      for (int i = 0; i < kRowRun; ++i) {
        const longlong2 o = off[i];
        const bool k_ok = o.x >= 0 && k_col, v_ok = o.y >= 0 && v_col;
        const uint32_t dst = run_dst(stage_base, i);
        arch::cp_async_16(dst, k_base + (k_ok ? o.x + c * 8 : 0), k_ok);
        arch::cp_async_16(dst + kBlockN * kD * 2, v_base + (v_ok ? o.y + c * 8 : 0), v_ok);
      }
      return;
    }
    int32_t rows_in = key_end - j;  // the run's rows that are keys
    const Elem* k_row;
    const Elem* v_row;
    if (p.paged) {  // the run is in one page
      if constexpr (kCompactRuns) ref.slot = j < key_end ? j % p.page_size : -1;
      const bool used = ref.slot >= 0, ok = used && detail::page_in_pool(ref.page, p.num_pages);
      page_bad |= used && !ok;
      // (Offsets of page 0 where nothing is read: no branch. Both are non-negative: unsigned
      // products.)
      const uint32_t page = ok ? uint32_t(ref.page) : 0u, slot = ok ? uint32_t(ref.slot) : 0u;
      if (!ok) rows_in = 0;
      k_row = k_base + (int64_t(page) * p.k_stride.batch + int64_t(slot) * p.k_stride.row + c * 8);
      v_row = v_base + (int64_t(page) * p.v_stride.batch + int64_t(slot) * p.v_stride.row + c * 8);
    } else {
      k_row = dense_row(k_base, p.k_stride, blk, run0);
      v_row = dense_row(v_base, p.v_stride, blk, run0);
    }
    const int32_t k_rows = k_col ? rows_in : 0, v_rows = v_col ? rows_in : 0;
#pragma unroll
    for (int i = 0; i < kRowRun; ++i) {
      const uint32_t dst = run_dst(stage_base, i);
      arch::cp_async_16(dst, k_row, i < k_rows);
      arch::cp_async_16(dst + kBlockN * kD * 2, v_row, i < v_rows);
      k_row += p.k_stride.row;
      v_row += p.v_stride.row;
    }
  };
  // The runs of blocks it + kStages - 1 (copied in iteration it) and it + kStages (loaded ahead).
  PageRef run_next{0, -1}, run_after{0, -1};
  // Runs across pages: the ring's first kStages blocks' row offsets, then block kStages's entry
  // (stored at the end of iteration 0).
  PageRef row_next{0, -1};
  if (rows_tabled) {
    for (int s = 0; s < kStages && s < n_iter; ++s) store_row(s, row_ref(t_lo + s));
    if (kStages < n_iter) row_next = row_ref(t_lo + kStages);
    __syncthreads();
  }
  // Launched as the append's programmatic dependent (launch_decode.cuh), the kernel has read only
  // what the append does not write so far (indices, page table, Q): the cache's rows wait for it.
  // Other launches skip the wait (a scheduling barrier for the compiler, with nothing to wait for).
  if (a.after_append) arch::wait_on_prerequisites();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_iter) load_block(s, t_lo + s, runs_in_page ? next_run() : PageRef{0, -1});
    arch::cp_async_commit();
  }
  if (runs_in_page) {
    run_next = next_run();
    run_after = next_run();
  }
  // Paged: the split's entries no copy reads (those of its keys outside this tile's blocks
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
    if (nxt < n_iter) load_block(nxt % kStages, t_lo + nxt, run_next);
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
    // Paged: the run of block nxt + 1 (loaded an iteration ago) is copied next; load the one after.
    // Runs across pages: block nxt + 1's row offsets into its stage (the block that stage held was
    // issued before this iteration's barrier), from the entry loaded an iteration ago; then the
    // entry of block nxt + 2.
    if (runs_in_page) {
      run_next = run_after;
      run_after = next_run();
    } else if (rows_tabled && nxt + 1 < n_iter) {
      store_row((nxt + 1) % kStages, row_next);
      if (nxt + 2 < n_iter) row_next = row_ref(t_lo + nxt + 2);
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
