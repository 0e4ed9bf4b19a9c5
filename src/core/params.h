// src/core/params.h — validated, implementation-ready arguments.
//
// User arguments (TensorView + AttentionOptions) become FwdParams/BwdParams in ONE step
// (src/common/validate.cpp: make_fwd_params / make_bwd_params). Every implementation — CPU
// reference, CPU FA4, Hopper kernels — consumes only these structs, so no implementation re-derives
// shapes, defaults or masks on its own. Plain data: trivially copyable, passable to a kernel by value.
#pragma once

#include <cstdint>

#include "core/macros.h"
#include "core/mask.h"
#include "core/exp2.h"
#include "fa4/tensor.h"

namespace fa4::detail {

/// Strides (elements) of a (batch, row, head, dim) tensor; dim stride is 1 by validation.
/// Varlen tensors have batch_stride = 0 and rows are addressed by cu_seqlens offsets.
struct RowStrides {
  int64_t batch = 0;
  int64_t row = 0;
  int64_t head = 0;
};

struct FwdParams {
  DType dtype = DType::kBF16;  ///< q, k, v, out
  Device device{};

  int32_t batch = 0;
  int32_t num_heads = 0;
  int32_t num_heads_kv = 0;
  int32_t headdim = 0;    ///< real (unpadded) headdim of q and k
  int32_t headdim_v = 0;  ///< real headdim of v and out
  /// Batched: the sequence lengths. Varlen: max_seqlen_q / max_seqlen_k.
  int32_t seqlen_q = 0;
  int32_t seqlen_k = 0;
  int64_t total_q = 0;    ///< varlen: q.shape[0]; batched: batch * seqlen_q
  int64_t total_k = 0;    ///< varlen: k.shape[0]; batched: batch * seqlen_k

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  RowStrides q_stride, k_stride, v_stride, out_stride;
  /// lse element (b, h, i) is at lse[b*lse_batch_stride + h*lse_head_stride + i*lse_row_stride]
  /// (varlen: b term is 0 and i is the packed row).
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 1;

  bool is_varlen = false;
  const int32_t* cu_seqlens_q = nullptr;  ///< (batch+1) or nullptr; same device as q
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_k = nullptr;     ///< (batch) or nullptr
  const float* sink = nullptr;            ///< (num_heads) fp32 or nullptr

  float softmax_scale = 1.0f;        ///< resolved default 1/sqrt(headdim)
  float softmax_scale_log2 = 1.0f;   ///< softmax_scale * log2(e) (no softcap), for exp2
  float softcap = 0.0f;              ///< 0 = off
  MaskSpec mask{};                   ///< causal folded in (window_right = 0)
  bool causal = false;               ///< as given (informational: mask already holds it)

  float rescale_threshold = 8.0f;    ///< tau, log2 units
  bool exp2_fraction_given = false;  ///< false: the kernel's tuned default applies
  Exp2Emulation exp2_emulation{};            ///< valid when exp2_fraction_given

  /// Group size: query head h uses kv head h / (num_heads / num_heads_kv).
  FA4_HD int32_t kv_head(int32_t h) const { return h / (num_heads / num_heads_kv); }
};

struct BwdParams : FwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dsink = nullptr;  ///< (num_heads) fp32 or nullptr
  RowStrides dout_stride, dq_stride, dk_stride, dv_stride;
  bool deterministic = false;
  /// BackwardOptions::workspace given (its data 256-byte aligned, nullptr for an empty one) and its
  /// bytes; not given: the library's scratch.
  bool has_workspace = false;
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

/// forward_with_kvcache after validation (src/common/validate.cpp make_kvcache_params). The
/// FwdParams part is a batched forward: q/out/lse (batch, seqlen_q, ...), k/v = k_cache/v_cache
/// with k_stride/v_stride = the cache strides (dense: batch = cache sequence stride; paged: batch =
/// page stride, row = slot within a page), seqlen_k = key_capacity (informational), total_k = 0,
/// is_varlen = false, seqused_k = nullptr. Sequence b attends to keys [0, seqlen_k(b)) of its cache
/// sequence, seqlen_k(b) = (cache_seqlens ? cache_seqlens[b] : key_capacity - seqlen_new)
/// + seqlen_new, with the masks bottom-right aligned per sequence (seqlen_q vs seqlen_k(b)).
struct KVCacheParams : FwdParams {
  bool paged = false;
  int32_t batch_cache = 0;    ///< dense: k_cache.shape[0]; paged: 0
  int32_t key_capacity = 0;   ///< keys a sequence can hold: dense seqlen_cache, paged max_pages * page_size
  // Paged KV: k_cache/v_cache (num_pages, page_size, num_heads_kv, d); key j of sequence b is slot
  // j % page_size of page page_table[b * page_table_batch_stride + j / page_size].
  const int32_t* page_table = nullptr;   ///< int32 (batch, max_pages) or nullptr (dense)
  int64_t page_table_batch_stride = 0;   ///< elements; the page dim is contiguous
  int32_t max_pages = 0;                 ///< page_table.shape[1]
  int32_t page_size = 0;                 ///< k_cache.shape[1] (paged)
  int32_t num_pages = 0;                 ///< k_cache.shape[0] (paged)
  const int32_t* cache_seqlens = nullptr;    ///< int32 (batch,): keys already cached; nullptr = full
  const int32_t* cache_batch_idx = nullptr;  ///< int32 (batch,): cache sequence of q's sequence b (dense only)
  // New keys/values appended in place at cache_seqlens[b] before attending (k_new/v_new given).
  const void* k_new = nullptr;           ///< (batch, seqlen_new, num_heads_kv, headdim) or nullptr
  const void* v_new = nullptr;           ///< (batch, seqlen_new, num_heads_kv, headdim_v)
  RowStrides k_new_stride, v_new_stride;
  int32_t seqlen_new = 0;                ///< 0 when k_new/v_new are not given
  int32_t num_splits = 0;                ///< 0 = automatic, else the exact number of key splits
};

// The KV-cache index rules, one definition for every checker: the host's (common/validate_kvcache.cpp,
// where it can read the indices) and the kernels' (the decode kernel, the forward's KV-cache route),
// which skip a sequence that breaks one and report it (hopper/shared/device_state.h AsyncError).
// Unsigned compares fold "< 0" into "> bound".
/// cache_seqlens[b] = `cached`: in [0, room], room = key_capacity - seqlen_new (>= 0).
FA4_HD constexpr bool cached_keys_valid(int32_t cached, int32_t room) { return uint32_t(cached) <= uint32_t(room); }
/// A page-table entry a sequence uses: a page of the pool, in [0, num_pages).
FA4_HD constexpr bool page_in_pool(int32_t page, int32_t num_pages) { return uint32_t(page) < uint32_t(num_pages); }

/// Sequence b's lengths and first packed row (varlen), for either layout. Element (b, i, h, d) of q
/// is at  q + (is_varlen ? 0 : b * q_stride.batch) + (q_row0 + i) * q_stride.row + h * q_stride.head + d
/// and lse (b, h, i) at  (is_varlen ? 0 : b * lse_batch_stride) + h * lse_head_stride
///                       + (q_row0 + i) * lse_row_stride;  k/v likewise with k_row0.
struct SeqInfo {
  int64_t q_row0;    ///< varlen: cu_seqlens_q[b]; batched: 0
  int64_t k_row0;    ///< varlen: cu_seqlens_k[b]; batched: 0
  int32_t seqlen_q;
  int32_t seqlen_k;  ///< keys used (seqused_k applied)
};

/// Host-side helper (the cu_seqlens/seqused pointers must be host-readable).
inline SeqInfo seq_info_host(const FwdParams& p, int32_t b) {
  if (!p.is_varlen) return {0, 0, p.seqlen_q, p.seqlen_k};
  const int32_t q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
  const int32_t k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
  const int32_t sk = p.seqused_k ? p.seqused_k[b] : k1 - k0;
  return {q0, k0, q1 - q0, sk};
}

}  // namespace fa4::detail
