// src/cpu/kvcache.cpp — forward_with_kvcache on the CPU: append, then the existing forward per
// sequence (cpu_attention.h).
//
//   (a) APPEND (k_new given): row t of k_new/v_new of sequence b is copied, bitwise, to key
//       position cache_seqlens[b] + t of its cache sequence: dense, cache row cache_batch_idx[b]
//       (or b); paged, slot pos % page_size of page page_table[b][pos / page_size]. Validation
//       made the written positions distinct across sequences, so sequences are appended in
//       parallel. Every append happens before any attention, so a sequence sees its own new keys.
//   (b) ATTEND: per sequence b, its seqlen_k(b) keys and values are gathered (bitwise, in the
//       cache dtype) into contiguous (seqlen_k(b), num_heads_kv, d) buffers, and flash_forward /
//       reference_forward runs on a batch-1 FwdParams whose q/out/lse point at sequence b and
//       whose seqlen_k is seqlen_k(b). The masks, softcap, sink, exp2 share and lazy rescaling are
//       thus exactly those of fa4::forward on the gathered keys (bottom-right aligned per
//       sequence). Keys past seqlen_k(b) are never read.
// p.num_splits has no effect here: the CPU forward does not split the keys.
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/cpu_attention.h"

namespace fa4::cpu {
namespace {

using detail::KVCacheParams;
using detail::RowStrides;

/// seqlen_k(b): keys sequence b attends to, the appended ones included (host cache_seqlens).
int64_t seqlen_k_of(const KVCacheParams& p, int32_t b) {
  return int64_t(p.cache_seqlens ? p.cache_seqlens[b] : p.key_capacity - p.seqlen_new) +
         p.seqlen_new;
}

/// Element offset, in k_cache (s = k_stride) or v_cache (s = v_stride), of key position `pos` of
/// sequence b, kv head h.
int64_t cache_offset(const KVCacheParams& p, const RowStrides& s, int32_t b, int64_t pos,
                     int32_t h) {
  if (p.paged) {
    const int64_t page = p.page_table[int64_t(b) * p.page_table_batch_stride + pos / p.page_size];
    return page * s.batch + (pos % p.page_size) * s.row + int64_t(h) * s.head;
  }
  const int64_t row = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
  return row * s.batch + pos * s.row + int64_t(h) * s.head;
}

void append(const KVCacheParams& p) {
  if (p.k_new == nullptr || p.seqlen_new == 0) return;
  const int64_t es = dtype_size(p.dtype);
  auto* kc = static_cast<uint8_t*>(const_cast<void*>(p.k));  // written in place (validated)
  auto* vc = static_cast<uint8_t*>(const_cast<void*>(p.v));
  const auto* kn = static_cast<const uint8_t*>(p.k_new);
  const auto* vn = static_cast<const uint8_t*>(p.v_new);
#pragma omp parallel for schedule(static)
  for (int32_t b = 0; b < p.batch; ++b) {
    for (int64_t t = 0; t < p.seqlen_new; ++t) {
      const int64_t pos = int64_t(p.cache_seqlens[b]) + t;
      for (int32_t h = 0; h < p.num_heads_kv; ++h) {
        const RowStrides& ks = p.k_new_stride;
        const RowStrides& vs = p.v_new_stride;
        const int64_t ko = b * ks.batch + t * ks.row + h * ks.head;
        const int64_t vo = b * vs.batch + t * vs.row + h * vs.head;
        std::memcpy(kc + cache_offset(p, p.k_stride, b, pos, h) * es, kn + ko * es,
                    size_t(p.headdim * es));
        std::memcpy(vc + cache_offset(p, p.v_stride, b, pos, h) * es, vn + vo * es,
                    size_t(p.headdim_v * es));
      }
    }
  }
}

/// Gathers sequence b's keys/values and runs `forward` (flash_forward or reference_forward) on
/// the batch-1 problem of sequence b, for every b.
template <class Forward>
void attend(const KVCacheParams& p, Forward forward) {
  if (p.seqlen_q == 0) return;
  const int64_t es = dtype_size(p.dtype);
  const int64_t hkv = p.num_heads_kv, d = p.headdim, dv = p.headdim_v;
  const auto* kc = static_cast<const uint8_t*>(p.k);
  const auto* vc = static_cast<const uint8_t*>(p.v);
  std::vector<uint8_t> kbuf, vbuf;
  for (int32_t b = 0; b < p.batch; ++b) {
    const int64_t sk = seqlen_k_of(p, b);
    kbuf.resize(size_t(sk * hkv * d * es));
    vbuf.resize(size_t(sk * hkv * dv * es));
#pragma omp parallel for schedule(static) if (sk * hkv > 256)
    for (int64_t j = 0; j < sk; ++j) {
      for (int32_t h = 0; h < hkv; ++h) {
        std::memcpy(kbuf.data() + (j * hkv + h) * d * es,
                    kc + cache_offset(p, p.k_stride, b, j, h) * es, size_t(d * es));
        std::memcpy(vbuf.data() + (j * hkv + h) * dv * es,
                    vc + cache_offset(p, p.v_stride, b, j, h) * es, size_t(dv * es));
      }
    }
    detail::FwdParams f = p;  // the FwdParams part: dtype, heads, options, mask, sink, strides
    f.batch = 1;
    f.seqlen_k = int32_t(sk);
    f.total_q = p.seqlen_q;
    f.total_k = sk;
    f.q = static_cast<const uint8_t*>(p.q) + b * p.q_stride.batch * es;
    f.out = static_cast<uint8_t*>(p.out) + b * p.out_stride.batch * es;
    f.lse = p.lse + b * p.lse_batch_stride;
    f.k = kbuf.data();
    f.v = vbuf.data();
    f.k_stride = {sk * hkv * d, hkv * d, d};
    f.v_stride = {sk * hkv * dv, hkv * dv, dv};
    forward(f);
  }
}

}  // namespace

void flash_forward_with_kvcache(const KVCacheParams& p) {
  if (p.batch == 0) return;
  append(p);
  attend(p, flash_forward);
}

void reference_forward_with_kvcache(const KVCacheParams& p) {
  if (p.batch == 0) return;
  append(p);
  attend(p, reference_forward);
}

}  // namespace fa4::cpu
