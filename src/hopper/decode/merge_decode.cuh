// src/hopper/decode/merge_decode.cuh — the split-KV merge of the decode kernel (kernel_decode.cuh):
// through distributed shared memory within a thread-block cluster, and through global scratch by
// the last CTA of each (sequence, kv head x row tile) to arrive, or, after clusters, of each (tile,
// cluster rank) for that rank's columns; all with the shared merge maths of core/softmax.h.
#pragma once

#include <cstdint>

#include "core/pack_gqa.h"
#include "core/softmax.h"
#include "hopper/arch/arch.cuh"
#include "hopper/decode/args_decode.cuh"
#include "hopper/decode/tuning_decode.h"

namespace fa4::hopper::decode {

/// Arrivals at a tile's counter carry this bit from a split that met a broken index rule (at most
/// kDecodeMaxSplits of them, so the count below never reaches it).
constexpr int32_t kBadArrival = 1 << 16;
static_assert(detail::kDecodeMaxSplits < kBadArrival && int64_t(detail::kDecodeMaxSplits) * kBadArrival < (1ll << 31),
              "arrival count and bad count must fit their fields");

/// The CTA's arrival at counter `slot` of its tile (a.arrivals: a.cluster slots per tile, see
/// DecodeArgs), after its partial rows are written (or, bad, instead of them); `expected` CTAs
/// arrive there. True in the CTA that arrives last when none was bad; the partials of every
/// arrival are then visible to all its threads (the barrier before the release add orders the
/// CTA's writes, the one after the acquiring add orders its reads). The last arrival resets the
/// counter for the next launch.
__device__ __forceinline__ bool arrive_last(const DecodeArgs& a, int32_t* s_last, bool bad, int32_t slot,
                                            int32_t expected) {
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* counter = a.arrivals + (int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * a.cluster + slot;
    const int32_t inc = bad ? 1 + kBadArrival : 1;
    const int32_t total = arch::fetch_add_acq_rel(counter, inc) + inc;
    const bool last = (total & (kBadArrival - 1)) == expected;
    if (last) *counter = 0;
    *s_last = last && total < kBadArrival;
  }
  __syncthreads();
  return *s_last != 0;
}

/// A tile row's merged state over some partials: running max m (log2 units), sum l relative to it,
/// and 4 columns of the un-normalised output.
struct MergedSlice {
  float m, l;
  float4 acc;
};

/// Merges n partial rows (core/softmax.h merge_weight): load(s, L_s, x_s) gives partial s's
/// log2-sum-exp and its 4 columns of the normalised row, which is the state
/// (m = L_s, l = 1, O = x_s). Each load is a round trip to L2 or to shared memory, so the
/// partials come kMergeBatch at a time and all loads of a batch are issued before the first use.
/// A batch raises the max once (to the max over the state and its partials), then adds its
/// partials against it (a long global merge, 64 partials, pays one round trip per batch:
/// bench/results/history.md). An empty partial (L_s = -inf) has weight 0 and its row is not used;
/// fmaxf drops a NaN L_s from the max, but its weight is NaN and so is the row. The global and the
/// cluster merge share this, so a tile merged either way is bitwise the same.
constexpr int kMergeBatch = detail::kDecodeMergeBatch;
template <class Load>
__device__ __forceinline__ MergedSlice merge_partials(int32_t n, Load load) {
  auto ex2 = [](float x) { return arch::ex2_approx(x); };
  MergedSlice r{-INFINITY, 0.f, make_float4(0.f, 0.f, 0.f, 0.f)};
  for (int32_t s0 = 0; s0 < n; s0 += kMergeBatch) {
    float ls[kMergeBatch], w[kMergeBatch];
    float4 x[kMergeBatch];
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) load(min(s0 + j, n - 1), ls[j], x[j]);
    float m_new = r.m;
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      ls[j] = s0 + j < n ? ls[j] : -INFINITY;  // past n: a repeat of the last, weight 0
      m_new = fmaxf(m_new, ls[j]);
    }
    const float alpha = detail::merge_weight(r.m, m_new, 1.f, ex2);
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) w[j] = detail::merge_weight(ls[j], m_new, 1.f, ex2);
    r.m = m_new;
    r.l *= alpha;
    r.acc.x *= alpha; r.acc.y *= alpha; r.acc.z *= alpha; r.acc.w *= alpha;
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const bool use = w[j] != 0.f;
      r.l += w[j];
      r.acc.x += use ? w[j] * x[j].x : 0.f;
      r.acc.y += use ? w[j] * x[j].y : 0.f;
      r.acc.z += use ? w[j] * x[j].z : 0.f;
      r.acc.w += use ? w[j] * x[j].w : 0.f;
    }
  }
  return r;
}

/// A partial state (m, l, acc) as merge_partials reads it: the normalised row acc / l and its
/// log2-sum-exp. Empty (no key seen) only when l == 0: a NaN from the data must reach the merge,
/// which then propagates it like one split would.
__device__ __forceinline__ float4 normalised_row(float l, const float4& acc) {
  const float inv = l != 0.f ? 1.f / l : 0.f;
  return make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}
__device__ __forceinline__ float partial_lse(float m, float l) { return l != 0.f ? m + log2f(l) : -INFINITY; }

/// Stores a partial state of row (b, i, h), columns c..c+3, as partial `part` of the global scratch,
/// and, from the thread of the slice's first column (`first`), its log2-sum-exp into lse slot
/// `slot` of the partial (a.cluster slots: every column slice of a cluster merge computes the same
/// row lse and keeps its own copy, so the CTA that merges a slice's partials reads only what the
/// CTAs that arrived at its counter wrote).
template <int kD>
__device__ __forceinline__ void store_partial(const DecodeArgs& a, int32_t part, int32_t slot, int32_t b, int32_t i,
                                              int32_t h, int c, bool first, float m, float l, const float4& acc) {
  const detail::KVCacheParams& p = a.p;
  const int64_t prow = ((int64_t(part) * p.batch + b) * p.seqlen_q + i) * p.num_heads + h;
  *reinterpret_cast<float4*>(a.o_partial + prow * kD + c) = normalised_row(l, acc);
  if (first)
    a.lse_partial[(((int64_t(part) * a.cluster + slot) * p.batch + b) * p.num_heads + h) * p.seqlen_q + i] =
        partial_lse(m, l);
}

/// Writes one finished output slice: row (b, i, h), columns c..c+3 of out (o = acc / l with the
/// sink, core/softmax.h finalize_row) and, from the thread of column 0, the row's lse.
template <bool kBF16>
__device__ __forceinline__ void store_final(const detail::KVCacheParams& p, int32_t b, int32_t i, int32_t h, int c,
                                            float m, float l, const float4& acc, const float* sink) {
  using Elem = typename ElemOf<kBF16>::type;
  const detail::RowNorm nrm = detail::finalize_row(m, l, sink ? sink[h] : -INFINITY);
  Elem* out = static_cast<Elem*>(p.out) + int64_t(b) * p.out_stride.batch + int64_t(i) * p.out_stride.row +
              int64_t(h) * p.out_stride.head + c;
  uint2 v;
  v.x = pack2<kBF16>(acc.x * nrm.o_scale, acc.y * nrm.o_scale);
  v.y = pack2<kBF16>(acc.z * nrm.o_scale, acc.w * nrm.o_scale);
  *reinterpret_cast<uint2*>(out) = v;
  if (c == 0)
    p.lse[int64_t(b) * p.lse_batch_stride + int64_t(h) * p.lse_head_stride + int64_t(i) * p.lse_row_stride] = nrm.lse;
}

/// Merges n partial states of this CTA's share of one tile's (row, 4 columns) slices of columns
/// [c_lo, c_lo + width) (rows row0.. of kv_head in sequence b, kRows per tile; slice idx = first,
/// first + stride, ... of kRows x width / 4) with merge_partials, and writes each finished (part < 0: finalize_row,
/// the sink joins here, as one split would have been) or as global partial `part`.
/// load(r, c, i, h, s, L_s, x_s) reads partial s of row r (token i, head h), columns c..c+3. Each
/// thread merges 4 columns of one row and loads that row's L_s itself, kMergeBatch partials in
/// flight at once.
template <bool kBF16, int kD, int kRows, class Load>
__device__ __forceinline__ void merge_tile(const DecodeArgs& a, int32_t b, int32_t kv_head, int32_t row0,
                                           int32_t rows, int c_lo, int width, int first, int stride, int32_t n,
                                           int32_t part, Load load) {
  const detail::KVCacheParams& p = a.p;
  const int32_t n_rows = min(kRows, rows - row0);
  const int c4 = width / 4;
  for (int idx = first; idx < n_rows * c4; idx += stride) {
    const int r = idx / c4, c = c_lo + (idx % c4) * 4;
    if (c >= p.headdim_v) continue;
    const detail::RowCoord pr = detail::packed_row(row0 + r, kv_head, a.group);
    const MergedSlice ms =
        merge_partials(n, [&](int32_t s, float& ls, float4& x) { load(r, c, pr.query, pr.head, s, ls, x); });
    if (part < 0) store_final<kBF16>(p, b, pr.query, pr.head, c, ms.m, ms.l, ms.acc, p.sink);
    else store_partial<kD>(a, part, c_lo / width, b, pr.query, pr.head, c, c == c_lo, ms.m, ms.l, ms.acc);
  }
}

/// Merges the global partials of columns [c_lo, c_lo + width) of one tile into out/lse (merge_tile
/// over the whole CTA). Partials are read through L2 (ld.cg): other SMs wrote them during this
/// launch.
template <bool kBF16, int kD, int kRows>
__device__ __forceinline__ void combine_tile(const DecodeArgs& a, int32_t b, int32_t kv_head, int32_t row0,
                                             int32_t rows, int c_lo, int width) {
  const detail::KVCacheParams& p = a.p;
  const int64_t lse_slot = int64_t(p.batch) * p.num_heads * p.seqlen_q;  // one slot of a partial
  const int64_t lse_stride = lse_slot * a.cluster;                          // one partial's
  const int64_t o_stride = int64_t(p.batch) * p.seqlen_q * p.num_heads * kD;
  merge_tile<kBF16, kD, kRows>(
      a, b, kv_head, row0, rows, c_lo, width, threadIdx.x, blockDim.x, a.num_partials, -1,
      [&](int r, int c, int32_t i, int32_t h, int32_t s, float& ls, float4& x) {
        const float* lse_src = a.lse_partial + (c_lo / width) * lse_slot + (int64_t(b) * p.num_heads + h) * p.seqlen_q + i;
        const float* o_src = a.o_partial + ((int64_t(b) * p.seqlen_q + i) * p.num_heads + h) * kD + c;
        ls = __ldcg(lse_src + s * lse_stride);
        x = __ldcg(reinterpret_cast<const float4*>(o_src + s * o_stride));
      });
}

/// Where the CTAs of a cluster push their partials for the CTA that merges columns
/// [c_lo, c_lo + width) of the tile (in that CTA's shared memory, `bytes` long):
/// o[(peer x kRows + row) x width + column - c_lo], lse[peer x kRows + row] and bad[peer] (16-byte
/// aligned, kDecodeMaxCluster slots of which those past the cluster size are never written).
struct ClusterRecv {
  float* o;
  float* lse;
  int32_t* bad;
  int c_lo, width;

  /// The buffer at `base` of CTA `rank` of a cluster of `cluster`, a tile of kRows rows and kD
  /// columns.
  template <int kD, int kRows>
  __device__ static ClusterRecv at(void* base, int32_t cluster, uint32_t rank) {
    float* const o = static_cast<float*>(base);
    const int width = kD / cluster;
    return {o, o + kRows * kD, reinterpret_cast<int32_t*>(o + kRows * kD + kRows * cluster), int(rank) * width, width};
  }
  /// Its size in bytes.
  template <int kD, int kRows>
  static constexpr int bytes(int32_t cluster) {
    return (kRows * kD + kRows * cluster + detail::kDecodeMaxCluster) * 4;
  }
};

/// The cluster merge of one tile: CTA `rank` of the cluster merges columns [rank x kD / cluster,
/// +kD / cluster) of all kRows rows. Every CTA of the cluster (one split each) has pushed its
/// normalised partial's share of those columns, its rows' log2-sum-exps and its broken-index flag
/// into this CTA's `recv` (published by a cluster barrier): the merge reads only its own shared
/// memory. Peers are merged in rank order (= split order) and the rows written finished (the
/// cluster holds every split) or as the cluster's global partial. Returns true, writing nothing,
/// when any CTA of the cluster met a broken index rule.
template <bool kBF16, int kD, int kRows>
__device__ __forceinline__ bool cluster_merge(const DecodeArgs& a, int32_t b, int32_t kv_head, int32_t row0,
                                              int32_t rows, const ClusterRecv& recv) {
  int32_t bad = 0;  // the peers' flags 4 at a time (one load each instead of a dependent chain)
#pragma unroll
  for (int q4 = 0; q4 < detail::kDecodeMaxCluster / 4; ++q4) {
    const int4 v = reinterpret_cast<const int4*>(recv.bad)[q4];
    const int32_t f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) bad |= 4 * q4 + k < a.cluster ? f[k] : 0;
  }
  if (bad) return true;
  merge_tile<kBF16, kD, kRows>(
      a, b, kv_head, row0, rows, recv.c_lo, recv.width, int(threadIdx.x), int(blockDim.x), a.cluster,
      a.num_partials == 1 ? -1 : int32_t(blockIdx.x) / a.cluster,
      [&](int r, int c, int32_t, int32_t, int32_t q, float& ls, float4& x) {
        ls = recv.lse[q * kRows + r];
        x = *reinterpret_cast<const float4*>(recv.o + (q * kRows + r) * recv.width + (c - recv.c_lo));
      });
  return false;
}

}  // namespace fa4::hopper::decode
