// src/hopper/decode/cache_decode.cuh — the KV cache's indices on the device and the append kernel:
// a sequence's cache geometry (cache_seqlens, cache_batch_idx) checked with the CPU path's rules,
// a row's offset in a dense or paged cache, the page-table checks, and the in-place append of
// k_new / v_new before the decode kernel (kernel_decode.cuh) reads the cache.
#pragma once

#include <cstdint>

#include "core/constants.h"
#include "core/params.h"
#include "hopper/arch/arch.cuh"
#include "hopper/decode/args_decode.cuh"
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
/// not a page of the pool (the CTA's threads stride over the entries, one 4-byte load each). The
/// decode kernel's split ranges use this form: sequence_pages_valid's 16-byte loads, tried there
/// too, made short paged calls 0.5 to 2 us slower (bench/results/history.md).
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

/// 16-byte page-table loads each thread of sequence_pages_valid issues before it tests any.
inline constexpr int kAppendCheckLoads = 4;

/// True if every page-table entry of keys [0, hi) of a sequence is a page of the pool, for the append
/// kernel, whose every (token, KV head) CTA checks its sequence's whole range before it writes:
/// four entries per 16-byte load from the row's first 16-byte boundary on, loaded kAppendCheckLoads
/// at a time per thread before any is tested (a long range of small pages, 128k keys of pages of
/// one key, is 512 KB of entries, which 64 threads reading one 4-byte entry at a time fetch 256 B
/// per round trip). The up to 3 entries before the boundary and after the last whole vector are
/// loaded by the first threads before the first batch and tested after the last. Called by the
/// whole CTA (the result is uniform).
__device__ __forceinline__ bool sequence_pages_valid(const detail::KVCacheParams& p, const int32_t* pages,
                                                     int32_t hi) {
  const int32_t tid = int32_t(threadIdx.x), threads = int32_t(blockDim.x);
  const int32_t n = hi > 0 ? (hi - 1) / p.page_size + 1 : 0;  // entries [0, n)
  // Entries before the first 16-byte boundary (a row starts on a 4-byte one), whole vectors, the rest.
  const int32_t head = min(n, int32_t((16u - (uint32_t(reinterpret_cast<uintptr_t>(pages)) & 15u)) / 4u & 3u));
  const int32_t vecs = (n - head) / 4, tail0 = head + 4 * vecs;
  const int4* body = reinterpret_cast<const int4*>(pages + head);
  // (Tested after the vectors, so that their round trip overlaps the vectors' first batch.)
  const bool has_head = tid < head, has_tail = tid < n - tail0;
  const int32_t head_page = has_head ? pages[tid] : 0, tail_page = has_tail ? pages[tail0 + tid] : 0;
  bool bad = false;
  for (int32_t i0 = tid; i0 < vecs; i0 += kAppendCheckLoads * threads) {
    int4 e[kAppendCheckLoads];
#pragma unroll
    for (int k = 0; k < kAppendCheckLoads; ++k)
      e[k] = i0 + k * threads < vecs ? body[i0 + k * threads] : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < kAppendCheckLoads; ++k)
      if (i0 + k * threads < vecs)
        bad |= !detail::page_in_pool(e[k].x, p.num_pages) || !detail::page_in_pool(e[k].y, p.num_pages) ||
               !detail::page_in_pool(e[k].z, p.num_pages) || !detail::page_in_pool(e[k].w, p.num_pages);
  }
  bad |= (has_head && !detail::page_in_pool(head_page, p.num_pages)) ||
         (has_tail && !detail::page_in_pool(tail_page, p.num_pages));
  return !__syncthreads_or(bad);
}

// ---------------------------------------------------------------------------------------------
// Append: k_new/v_new rows (b, t) -> cache key cached(b) + t. Grid (seqlen_new, num_heads_kv, batch),
// append_threads(p) threads: a row's copies need at most d / 8 = 32, a CTA's page-table check of a
// long row more (kAppendThreads), while many short CTAs (a chunk of new tokens) want to fit an SM
// many at a time.
// A sequence with a broken index is not appended at all (nor attended to, decode_kernel).
inline constexpr int kAppendThreads = 256;
/// Page-table rows up to this many entries are checked by 64 threads in one batch of
/// kAppendCheckLoads 16-byte loads each (64 x 4 loads x 4 entries).
inline constexpr int32_t kAppendNarrowMaxPages = 64 * kAppendCheckLoads * 4;
/// Threads of p's append CTAs (shapes only: max_pages, never cache_seqlens).
inline int append_threads(const detail::KVCacheParams& p) {
  return p.paged && p.max_pages > kAppendNarrowMaxPages ? kAppendThreads : 64;
}
template <class Elem>
__global__ void __launch_bounds__(kAppendThreads) append_kernel(const __grid_constant__ DecodeArgs a) {
  // The decode launched after it may start now (its launch and prologue overlap this kernel; it
  // waits for these writes before its first K / V copy: launch_decode).
  arch::launch_dependents();
  const detail::KVCacheParams& p = a.p;
  const int32_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const CacheSeq s = cache_seq(p, b);
  const int32_t* pages = p.paged ? p.page_table + int64_t(b) * p.page_table_batch_stride : nullptr;
  uint32_t bad = s.bad;
  if (!bad && p.paged && !sequence_pages_valid(p, pages, s.seqlen_k)) bad |= kBadPageTable;
  if (bad) {
    if (threadIdx.x == 0) report_async_error(a.async_error, bad);
    return;
  }
  if (a.append_delay_ns != 0) arch::spin_for_ns(a.append_delay_ns);
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

}  // namespace fa4::hopper::decode
