// src/common/validate_kvcache.cpp — forward_with_kvcache arguments -> KVCacheParams (validate.h).
//
// Same order as make_fwd_params (validate.cpp), through the same checks (validate_checks.h):
// options that do not apply (varlen) and the option combinations, each view on its own, ranks,
// dtypes, devices, the contiguous last dim, every shape relation through one table of named dims,
// heads and head dims, the scalar options and the sink (shared with forward), the cache geometry,
// and last the CONTENTS of host-resident cache_seqlens / cache_batch_idx / page_table, because
// indices that disagree with the tensor sizes would read or write out of bounds. Device-resident
// indices are checked by the kernel (attention.h, forward_with_kvcache). Nothing is written.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/validate.h"
#include "common/validate_checks.h"

namespace fa4::detail {

using namespace checks;

namespace {

std::optional<Named> optional_view(const Checker& c, const std::optional<TensorView>& t,
                                   const char* name) {
  if (!t.has_value()) return std::nullopt;
  return Named{name, check_view(c, *t, name)};
}

/// An int32 index tensor of rank `ndim` on q's device, last dim contiguous.
void check_index(const Checker& c, const Named& x, int ndim, const char* layout, const Named& q) {
  check_ndim(c, x, ndim, layout);
  check_dtype_is(c, x, DType::kInt32, "KV-cache index tensors are int32");
  check_same_device(c, x, q);
  check_last_contiguous(c, x);
}

/// The first varlen option set, or nullptr.
const char* varlen_option_set(const KVCacheOptions& o) {
  if (o.cu_seqlens_q.has_value()) return "cu_seqlens_q";
  if (o.cu_seqlens_k.has_value()) return "cu_seqlens_k";
  if (o.seqused_k.has_value()) return "seqused_k";
  if (o.max_seqlen_q != 0) return "max_seqlen_q";
  if (o.max_seqlen_k != 0) return "max_seqlen_k";
  return nullptr;
}

/// Contents of host-resident index tensors (the rules of attention.h, forward_with_kvcache).
void check_host_indices(const Checker& c, const KVCacheParams& p,
                        const std::optional<Named>& seqlens, const std::optional<Named>& bidx,
                        const std::optional<Named>& pt) {
  const int64_t room = int64_t(p.key_capacity) - p.seqlen_new;  // >= 0, checked before
  const bool append = p.k_new != nullptr;
  std::vector<int32_t> lens;
  if (seqlens) {
    lens = read_int32_host(*seqlens);
    for (size_t b = 0; b < lens.size(); ++b)
      if (!cached_keys_valid(lens[b], int32_t(room)))
        c.invalid("cache_seqlens[", b, "] = ", lens[b], " must be in [0, ", room,
                  "] (key_capacity ", p.key_capacity, " - seqlen_new ", p.seqlen_new,
                  "): the cache holds cache_seqlens[b] + seqlen_new keys of sequence b");
  }
  if (bidx) {
    const std::vector<int32_t> idx = read_int32_host(*bidx);
    std::vector<std::pair<int32_t, size_t>> rows;  // (cache row, q sequence), for distinctness
    for (size_t b = 0; b < idx.size(); ++b) {
      if (idx[b] < 0 || idx[b] >= p.batch_cache)
        c.invalid("cache_batch_idx[", b, "] = ", idx[b], " must be in [0, ", p.batch_cache,
                  ") (k_cache.shape[0], batch_cache)");
      if (append) rows.emplace_back(idx[b], b);
    }
    std::sort(rows.begin(), rows.end());
    for (size_t i = 1; i < rows.size(); ++i)
      if (rows[i].first == rows[i - 1].first)
        c.invalid("cache_batch_idx[", rows[i].second, "] = ", rows[i].first,
                  " equals cache_batch_idx[", rows[i - 1].second, "]: with k_new the cache "
                  "sequences must be distinct (two sequences appending into one cache row would "
                  "race)");
  }
  if (pt) {
    const auto* table = static_cast<const int32_t*>(pt->t.data);
    const int64_t row_stride = pt->t.stride[0];
    std::vector<std::pair<int64_t, int32_t>> written;  // (page * page_size + slot, sequence)
    for (int32_t b = 0; b < p.batch; ++b) {
      const int64_t sk = (seqlens ? lens[size_t(b)] : room) + p.seqlen_new;
      const int64_t pages = (sk + p.page_size - 1) / p.page_size;
      const int32_t* row = table + b * row_stride;
      for (int64_t j = 0; j < pages; ++j)
        if (!page_in_pool(row[j], p.num_pages))
          c.invalid("page_table[", b, "][", j, "] = ", row[j], " must be in [0, ", p.num_pages,
                    ") (k_cache.shape[0], num_pages): sequence ", b, " holds ", sk,
                    " keys, so its first ", pages, " pages are read");
      if (!append) continue;
      for (int64_t t = 0; t < p.seqlen_new; ++t) {
        const int64_t pos = lens[size_t(b)] + t;
        written.emplace_back(int64_t(row[pos / p.page_size]) * p.page_size + pos % p.page_size, b);
      }
    }
    std::sort(written.begin(), written.end());
    for (size_t i = 1; i < written.size(); ++i)
      if (written[i].first == written[i - 1].first)
        c.invalid("page_table: sequences ", written[i - 1].second, " and ", written[i].second,
                  " both append into page ", written[i].first / p.page_size, " slot ",
                  written[i].first % p.page_size, "; with k_new the appended (page, slot) "
                  "positions must be distinct (two sequences appending into one slot would race)");
  }
}

}  // namespace

KVCacheParams make_kvcache_params(const TensorView& q_in, const TensorView& k_cache_in,
                                  const TensorView& v_cache_in, const TensorView& out_in,
                                  const TensorView& lse_in, const KVCacheOptions& o,
                                  const char* fn) {
  const Checker c(fn);

  // ---- options that do not apply, and option combinations ----
  if (const char* varlen = varlen_option_set(o))
    c.invalid("varlen q is not supported by forward_with_kvcache; leave options.cu_seqlens_q, "
              "cu_seqlens_k, seqused_k, max_seqlen_q and max_seqlen_k unset (options.", varlen,
              " is set), pass q as (batch, seqlen_q, num_heads, headdim) and the per-sequence "
              "key counts in options.cache_seqlens");
  if (o.k_new.has_value() != o.v_new.has_value())
    c.invalid("options.", o.k_new ? "v_new" : "k_new",
              " is missing: an append needs both k_new and v_new, or neither");
  const bool append = o.k_new.has_value();
  if (append && !o.cache_seqlens.has_value())
    c.invalid("options.k_new/v_new need options.cache_seqlens: new keys are written at key "
              "position cache_seqlens[b] + t of sequence b");
  if (o.page_table.has_value() && o.cache_batch_idx.has_value())
    c.invalid("options.cache_batch_idx cannot be combined with options.page_table: a paged "
              "cache maps each sequence to its pages through page_table alone");
  if (o.num_splits < 0)
    c.invalid("options.num_splits = ", o.num_splits, " must be >= 0 (0 = automatic)");

  // ---- each view on its own; the caches are outputs when appended to ----
  const Named q{"q", check_view(c, q_in, "q")};
  const Named kc{"k_cache", check_view(c, k_cache_in, "k_cache", /*is_output=*/append)};
  const Named vc{"v_cache", check_view(c, v_cache_in, "v_cache", /*is_output=*/append)};
  const Named out{"out", check_view(c, out_in, "out", /*is_output=*/true)};
  const Named lse{"lse", check_view(c, lse_in, "lse", /*is_output=*/true)};
  const std::optional<Named> kn = optional_view(c, o.k_new, "k_new");
  const std::optional<Named> vn = optional_view(c, o.v_new, "v_new");
  const std::optional<Named> seqlens = optional_view(c, o.cache_seqlens, "cache_seqlens");
  const std::optional<Named> bidx = optional_view(c, o.cache_batch_idx, "cache_batch_idx");
  const std::optional<Named> pt = optional_view(c, o.page_table, "page_table");
  const bool paged = pt.has_value();

  // ---- ranks ----
  check_ndim(c, q, 4, "q is (batch, seqlen_q, num_heads, headdim); forward_with_kvcache has no "
             "varlen layout");
  if (paged) {
    check_ndim(c, kc, 4, "a paged k_cache is (num_pages, page_size, num_heads_kv, headdim)");
    check_ndim(c, vc, 4, "a paged v_cache is (num_pages, page_size, num_heads_kv, headdim_v)");
  } else {
    check_ndim(c, kc, 4, "k_cache is (batch_cache, seqlen_cache, num_heads_kv, headdim)");
    check_ndim(c, vc, 4, "v_cache is (batch_cache, seqlen_cache, num_heads_kv, headdim_v)");
  }
  check_ndim(c, out, 4, "out is (batch, seqlen_q, num_heads, headdim_v)");
  check_ndim(c, lse, 3, "lse is (batch, num_heads, seqlen_q)");
  if (append) {
    check_ndim(c, *kn, 4, "k_new is (batch, seqlen_new, num_heads_kv, headdim)");
    check_ndim(c, *vn, 4, "v_new is (batch, seqlen_new, num_heads_kv, headdim_v)");
  }

  // ---- dtypes, devices and the contiguous last dim ----
  check_float_dtypes(c, q, {&kc, &vc, &out});
  if (append) check_float_dtypes(c, q, {&*kn, &*vn});
  check_dtype_is(c, lse, DType::kFP32, "lse is always fp32");
  for (const Named* x : {&kc, &vc, &out, &lse}) check_same_device(c, *x, q);
  for (const Named* x : {&q, &kc, &vc, &out}) check_last_contiguous(c, *x);
  if (append) {
    for (const Named* x : {&*kn, &*vn}) {
      check_same_device(c, *x, q);
      check_last_contiguous(c, *x);
    }
  }
  if (seqlens) check_index(c, *seqlens, 1, "cache_seqlens is (batch,)", q);
  if (bidx) check_index(c, *bidx, 1, "cache_batch_idx is (batch,)", q);
  if (pt) check_index(c, *pt, 2, "page_table is (batch, max_pages), the page dim contiguous", q);

  // ---- shape relations ----
  DimTable dims(c);
  dims.visit(q, {"batch", "seqlen_q", "num_heads", "headdim"});
  if (paged) {
    dims.visit(kc, {"num_pages", "page_size", "num_heads_kv", "headdim"});
    dims.visit(vc, {"num_pages", "page_size", "num_heads_kv", "headdim_v"});
  } else {
    dims.visit(kc, {"batch_cache", "seqlen_cache", "num_heads_kv", "headdim"});
    dims.visit(vc, {"batch_cache", "seqlen_cache", "num_heads_kv", "headdim_v"});
  }
  dims.visit(out, {"batch", "seqlen_q", "num_heads", "headdim_v"});
  dims.visit(lse, {"batch", "num_heads", "seqlen_q"});
  if (append) {
    dims.visit(*kn, {"batch", "seqlen_new", "num_heads_kv", "headdim"});
    dims.visit(*vn, {"batch", "seqlen_new", "num_heads_kv", "headdim_v"});
  }
  if (seqlens) dims.visit(*seqlens, {"batch"});
  if (bidx) dims.visit(*bidx, {"batch"});
  if (pt) dims.visit(*pt, {"batch", "max_pages"});

  // ---- heads, head dims, the options and the sink (shared with forward) ----
  KVCacheParams p;
  resolve_heads(c, dims, q, "k_cache", p);
  p.is_varlen = false;
  resolve_scalar_options(c, o, p);
  resolve_sink(c, o, q, dims, p);

  // ---- cache geometry ----
  p.batch = to_int32(c, dims, "batch");
  p.seqlen_q = to_int32(c, dims, "seqlen_q");
  p.seqlen_new = append ? to_int32(c, dims, "seqlen_new") : 0;
  p.paged = paged;
  int64_t capacity = 0;
  const char* capacity_src = nullptr;
  if (paged) {
    p.num_pages = to_int32(c, dims, "num_pages");
    p.page_size = to_int32(c, dims, "page_size");
    p.max_pages = to_int32(c, dims, "max_pages");
    if (p.page_size < 1)
      c.invalid("k_cache.shape[1] (page_size) = ", p.page_size, " must be >= 1");
    capacity = int64_t(p.max_pages) * p.page_size;
    capacity_src = "page_table.shape[1] * k_cache.shape[1] (max_pages * page_size)";
    if (capacity > kInt32Max)
      c.fail(ErrorCode::kUnsupported, capacity_src, " = ", capacity, " exceeds the int32 limit ",
             kInt32Max);
  } else {
    p.batch_cache = to_int32(c, dims, "batch_cache");
    if (!bidx && p.batch_cache != p.batch)
      c.invalid("k_cache.shape[0] (batch_cache) = ", p.batch_cache, " must equal q.shape[0] "
                "(batch) = ", p.batch, " without options.cache_batch_idx (give it to map q's "
                "sequences to cache sequences)");
    if (bidx && p.batch > 0 && p.batch_cache < 1)
      c.invalid("k_cache.shape[0] (batch_cache) = 0 must be >= 1: cache_batch_idx must name a "
                "cache sequence");
    capacity = to_int32(c, dims, "seqlen_cache");
    capacity_src = "k_cache.shape[1] (seqlen_cache)";
  }
  p.key_capacity = static_cast<int32_t>(capacity);
  if (p.seqlen_new > p.key_capacity)
    c.invalid("k_new.shape[1] (seqlen_new) = ", p.seqlen_new, " exceeds the key capacity of a "
              "cache sequence, ", capacity_src, " = ", p.key_capacity);

  // ---- the FwdParams part: a batched forward whose k/v are the caches ----
  p.seqlen_k = p.key_capacity;  // informational: sequence b uses seqlen_k(b) keys
  p.total_q = int64_t(p.batch) * p.seqlen_q;
  p.total_k = 0;
  p.q = q.t.data;
  p.k = kc.t.data;
  p.v = vc.t.data;
  p.out = out.t.data;
  p.lse = static_cast<float*>(lse.t.data);
  set_batched_strides(q, kc, vc, out, lse, p);

  // ---- the cache description ----
  if (pt) {
    p.page_table = static_cast<const int32_t*>(pt->t.data);
    p.page_table_batch_stride = pt->t.stride[0];
  }
  if (seqlens) p.cache_seqlens = static_cast<const int32_t*>(seqlens->t.data);
  if (bidx) p.cache_batch_idx = static_cast<const int32_t*>(bidx->t.data);
  if (append) {
    p.k_new = kn->t.data;
    p.v_new = vn->t.data;
    p.k_new_stride = {kn->t.stride[0], kn->t.stride[1], kn->t.stride[2]};
    p.v_new_stride = {vn->t.stride[0], vn->t.stride[1], vn->t.stride[2]};
  }
  p.num_splits = o.num_splits;

  // ---- outputs apart from everything else (the caches are outputs when appended to) ----
  auto opt = [](const std::optional<Named>& x) { return x ? &*x : nullptr; };
  const Named sink = named_option("sink", o.sink);
  if (append)
    check_outputs_apart(c, {&out, &lse, &kc, &vc}, {&q, opt(kn), opt(vn), opt(seqlens), opt(bidx), opt(pt), &sink});
  else
    check_outputs_apart(c, {&out, &lse}, {&q, &kc, &vc, opt(seqlens), opt(bidx), opt(pt), &sink});

  // ---- contents of host-resident indices (device-resident: checked by the kernel) ----
  if (!q.t.is_cuda()) check_host_indices(c, p, seqlens, bidx, pt);
  return p;
}

}  // namespace fa4::detail
