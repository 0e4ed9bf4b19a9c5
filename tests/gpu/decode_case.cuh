// tests/gpu/decode_case.cuh — the KV-cache test case of the Hopper decode suites
// (test_hopper_decode.cu, test_hopper_decode_merge.cu): a dense or paged cache built from a KvCase
// (pages shuffled, unused page-table slots -1), fa4::forward_with_kvcache run on it twice (bitwise
// equal), and run_case's checks: the cache after the append equals the host's expectation bitwise
// (appended rows written, nothing else touched); out and lse against the exact reference (the GPU
// fp32 reference of gpu_reference.cuh on the same keys gathered into a varlen problem) within 2 x
// the naive same-precision implementation's error + atol; rows that see no key are O = 0, lse =
// -inf (or the sink); NaN only where the reference has one.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/validate.h"
#include "core/float16.h"
#include "fa4/attention.h"
#include "gpu/gpu_reference.cuh"
#include "hopper/shared/device_state.h"

#include "gpu_test_util.cuh"
#include "test_util.h"

// Internal linkage: each suite has its own copy.
namespace {

using fa4::DType;
using fa4::TensorView;
using fa4::test::DevBuf;
using fa4::test::from16;
using fa4::test::to16;
using fa4::test::kAtolLse;
using fa4::test::kAtolO;
using fa4::test::kPoison16;


struct KvCase {
  DType dtype = DType::kBF16;
  int batch = 2, seqlen_q = 1, heads = 8, heads_kv = 2, d = 128, dv = 128;
  int page_size = 0;          // 0: dense cache
  int capacity = 512;         // keys per sequence (paged: rounded up to whole pages)
  std::vector<int> cache_seqlens;  // per sequence; empty: every sequence full
  int seqlen_new = 0;
  bool batch_idx = false;     // dense: q's sequence b uses cache row perm[b] of batch + 2 rows
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool sink = false;
  int num_splits = 0;
  // Indices broken on purpose: sequence bad_seqlen_b gets cache_seqlens = capacity + 1, sequence
  // bad_page_b a page id past the pool in the middle of its used pages (-1: none), or in its
  // page-table slot bad_page_slot where that is >= 0.
  int bad_seqlen_b = -1, bad_page_b = -1, bad_page_slot = -1;
  int bad_seqlen_value = 0;      // 0: capacity + 1 (too long); else this value (e.g. -1)
  int bad_batch_idx_b = -1;      // dense + batch_idx: this sequence's cache row is out of range
  bool nan_q = false;            // q[0, 0, 0, 0] = NaN: that row's out/lse must be NaN, only there
  float tau = 8.f;               // rescale_threshold (0: rescale at every new max)
  bool full_page_table = false;  // every page-table slot holds a page (lengths may change later)
  bool nan_past_keys = false;    // every cache row no sequence attends to (at build time) holds NaN
  int guard_rows = 0;            // k/v buffer rows after the cache (outside its views): never written
  uint32_t seed = 1;

  std::string name() const {
    return std::string(fa4::dtype_name(dtype)) + " b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) +
           " h" + std::to_string(heads) + "/" + std::to_string(heads_kv) + " d" + std::to_string(d) + "x" +
           std::to_string(dv) + (page_size ? " page" + std::to_string(page_size) : " dense") + " cap" +
           std::to_string(capacity) + " new" + std::to_string(seqlen_new) + (causal ? " causal" : "") +
           " win(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")" +
           (softcap > 0 ? " softcap" : "") + (sink ? " sink" : "") + " splits" + std::to_string(num_splits) +
           (batch_idx ? " batch_idx" : "");
  }
};

/// Device state of one case, kept so a test can run fa4 again (graph replay) on it.
struct KvProblem {
  KvCase c;
  int B, Sq, H, HK, cap, max_pages = 0, num_pages = 0, cache_rows = 0, batch_cache = 0;
  std::vector<int> cl, cb, page_table;
  std::vector<uint16_t> hq, hk, hv, hkn, hvn, k_after, v_after;
  DevBuf<uint16_t> *q{}, *k{}, *v{}, *kn{}, *vn{}, *out{};
  DevBuf<float>* lse{};
  DevBuf<float>* sink{};
  DevBuf<int> *d_cl{}, *d_cb{}, *d_pt{};
  std::vector<float> hsink;
  TensorView tq, tk, tv, tout, tlse;
  fa4::KVCacheOptions o;
  ~KvProblem() { for (auto* p : {q, k, v, kn, vn, out}) delete p; delete lse; delete sink; delete d_cl; delete d_cb; delete d_pt; }

  /// Cache row (in rows of HK x d) holding key j of sequence b.
  int64_t row_of(int b, int j) const {
    if (c.page_size) return int64_t(page_table[b * max_pages + j / c.page_size]) * c.page_size + j % c.page_size;
    return int64_t(cb[b]) * cap + j;
  }
  int seqlen_k(int b) const { return cl[b] + c.seqlen_new; }
  bool seq_bad(int b) const { return b == c.bad_seqlen_b || b == c.bad_page_b || b == c.bad_batch_idx_b; }
};

inline void build(KvProblem& P, const KvCase& c) {
  P.c = c;
  P.B = c.batch; P.Sq = c.seqlen_q; P.H = c.heads; P.HK = c.heads_kv;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  if (c.page_size) {
    P.max_pages = (c.capacity + c.page_size - 1) / c.page_size;
    P.cap = P.max_pages * c.page_size;
    P.num_pages = P.B * P.max_pages + 3;  // spare pages nobody uses
    P.cache_rows = P.num_pages * c.page_size;
    std::vector<int> perm(P.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    P.page_table.assign(size_t(P.B) * P.max_pages, -1);
  } else {
    P.cap = c.capacity;
    P.batch_cache = c.batch_idx ? P.B + 2 : P.B;
    P.cache_rows = P.batch_cache * P.cap;
    P.cb.resize(P.B);
    std::vector<int> perm(P.batch_cache);
    std::iota(perm.begin(), perm.end(), 0);
    if (c.batch_idx) std::shuffle(perm.begin(), perm.end(), rng);
    for (int b = 0; b < P.B; ++b) P.cb[b] = perm[b];
  }
  P.cl = c.cache_seqlens.empty() ? std::vector<int>(P.B, P.cap - c.seqlen_new) : c.cache_seqlens;
  if (c.page_size) {  // the pages each sequence uses, in shuffled order; the rest of its row is -1
    std::vector<int> perm(P.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int b = 0; b < P.B; ++b) {
      const int used = c.full_page_table ? P.max_pages : (P.seqlen_k(b) + c.page_size - 1) / c.page_size;
      for (int p = 0; p < std::min(used, P.max_pages); ++p) P.page_table[b * P.max_pages + p] = perm[b * P.max_pages + p];
    }
  }
  auto fill = [&](std::vector<uint16_t>& v, size_t n) { v.resize(n); for (auto& x : v) x = to16(c.dtype, nd(rng)); };
  fill(P.hq, size_t(P.B) * P.Sq * P.H * c.d);
  if (c.nan_q) P.hq[0] = kPoison16;
  // (guard_rows more rows after the cache's views: compared after the call like the cache's own)
  fill(P.hk, size_t(P.cache_rows + c.guard_rows) * P.HK * c.d);
  fill(P.hv, size_t(P.cache_rows + c.guard_rows) * P.HK * c.dv);
  if (c.nan_past_keys) {  // before k_after / v_after are copied, so the expectation holds the NaNs
    std::vector<char> used(size_t(P.cache_rows), 0);
    for (int b = 0; b < P.B; ++b)
      for (int j = 0; j < (P.seq_bad(b) ? 0 : P.seqlen_k(b)); ++j) used[size_t(P.row_of(b, j))] = 1;
    for (int64_t r = 0; r < P.cache_rows; ++r)
      if (!used[size_t(r)]) {
        std::fill_n(P.hk.begin() + r * P.HK * c.d, size_t(P.HK) * c.d, kPoison16);
        std::fill_n(P.hv.begin() + r * P.HK * c.dv, size_t(P.HK) * c.dv, kPoison16);
      }
  }
  fill(P.hkn, size_t(P.B) * c.seqlen_new * P.HK * c.d);
  fill(P.hvn, size_t(P.B) * c.seqlen_new * P.HK * c.dv);
  P.hsink.resize(P.H);
  for (auto& s : P.hsink) s = nd(rng);
  // The append as the host expects it (valid sequences only).
  P.k_after = P.hk;
  P.v_after = P.hv;
  for (int b = 0; b < P.B; ++b) {
    if (P.seq_bad(b)) continue;
    for (int t = 0; t < c.seqlen_new; ++t) {
      const int64_t r = P.row_of(b, P.cl[b] + t);
      std::memcpy(&P.k_after[r * P.HK * c.d], &P.hkn[(int64_t(b) * c.seqlen_new + t) * P.HK * c.d], size_t(P.HK) * c.d * 2);
      std::memcpy(&P.v_after[r * P.HK * c.dv], &P.hvn[(int64_t(b) * c.seqlen_new + t) * P.HK * c.dv], size_t(P.HK) * c.dv * 2);
    }
  }
  // Broken indices (after the expectation, which leaves those sequences alone).
  std::vector<int> dev_cl = P.cl, dev_pt = P.page_table, dev_cb = P.cb;
  if (c.bad_seqlen_b >= 0) dev_cl[c.bad_seqlen_b] = c.bad_seqlen_value ? c.bad_seqlen_value : P.cap + 1;
  if (c.bad_batch_idx_b >= 0) dev_cb[c.bad_batch_idx_b] = P.batch_cache + 5;
  if (c.bad_page_b >= 0) {
    const int used = (P.seqlen_k(c.bad_page_b) + c.page_size - 1) / c.page_size;
    dev_pt[c.bad_page_b * P.max_pages + (c.bad_page_slot >= 0 ? c.bad_page_slot : used / 2)] = P.num_pages + 7;
  }

  const auto dev = fa4::Device::cuda(0);
  const DType t = c.dtype;
  P.q = new DevBuf<uint16_t>(P.hq.size()); P.q->upload(P.hq);
  P.k = new DevBuf<uint16_t>(P.hk.size()); P.k->upload(P.hk);
  P.v = new DevBuf<uint16_t>(P.hv.size()); P.v->upload(P.hv);
  P.kn = new DevBuf<uint16_t>(P.hkn.size()); P.kn->upload(P.hkn);
  P.vn = new DevBuf<uint16_t>(P.hvn.size()); P.vn->upload(P.hvn);
  P.out = new DevBuf<uint16_t>(size_t(P.B) * P.Sq * P.H * c.dv);
  P.lse = new DevBuf<float>(size_t(P.B) * P.H * P.Sq);
  P.sink = new DevBuf<float>(P.H); P.sink->upload(P.hsink);
  P.d_cl = new DevBuf<int>(P.B); P.d_cl->upload(dev_cl);
  P.d_cb = new DevBuf<int>(P.cb.size()); P.d_cb->upload(dev_cb);
  P.d_pt = new DevBuf<int>(dev_pt.size()); P.d_pt->upload(dev_pt);
  P.tq = TensorView::contiguous(P.q->ptr, t, {P.B, P.Sq, P.H, c.d}, dev);
  const int64_t outer = c.page_size ? P.num_pages : P.batch_cache, inner = c.page_size ? c.page_size : P.cap;
  P.tk = TensorView::contiguous(P.k->ptr, t, {outer, inner, P.HK, c.d}, dev);
  P.tv = TensorView::contiguous(P.v->ptr, t, {outer, inner, P.HK, c.dv}, dev);
  P.tout = TensorView::contiguous(P.out->ptr, t, {P.B, P.Sq, P.H, c.dv}, dev);
  P.tlse = TensorView::contiguous(P.lse->ptr, DType::kFP32, {P.B, P.H, P.Sq}, dev);
  fa4::KVCacheOptions& o = P.o;
  o.backend = fa4::Backend::kCuda;
  o.causal = c.causal;
  o.window_size_left = c.window_left;
  o.window_size_right = c.window_right;
  o.softcap = c.softcap;
  o.num_splits = c.num_splits;
  o.rescale_threshold = c.tau;
  if (c.sink) o.sink = TensorView::contiguous(P.sink->ptr, DType::kFP32, {P.H}, dev);
  if (!c.cache_seqlens.empty() || c.seqlen_new > 0 || c.bad_seqlen_b >= 0)
    o.cache_seqlens = TensorView::contiguous(P.d_cl->ptr, DType::kInt32, {P.B}, dev);
  if (c.batch_idx) o.cache_batch_idx = TensorView::contiguous(P.d_cb->ptr, DType::kInt32, {P.B}, dev);
  if (c.page_size) o.page_table = TensorView::contiguous(P.d_pt->ptr, DType::kInt32, {P.B, P.max_pages}, dev);
  if (c.seqlen_new > 0) {
    o.k_new = TensorView::contiguous(P.kn->ptr, t, {P.B, c.seqlen_new, P.HK, c.d}, dev);
    o.v_new = TensorView::contiguous(P.vn->ptr, t, {P.B, c.seqlen_new, P.HK, c.dv}, dev);
  }
}

/// Runs fa4 on a fresh (pre-append) cache with poisoned outputs; returns out and lse.
inline void run_fa4(KvProblem& P, std::vector<uint16_t>& out, std::vector<float>& lse, std::string* kernel = nullptr) {
  P.k->upload(P.hk);
  P.v->upload(P.hv);
  CUDA_OK(cudaMemset(P.out->ptr, 0xFF, P.out->n * 2));
  CUDA_OK(cudaMemset(P.lse->ptr, 0xFF, P.lse->n * 4));
  if (kernel) {
    const std::string why = fa4::forward_with_kvcache_support(P.tq, P.tk, P.tv, P.tout, P.tlse, P.o, kernel);
    ASSERT_EQ(why, "") << P.c.name();
  }
  fa4::forward_with_kvcache(P.tq, P.tk, P.tv, P.tout, P.tlse, P.o);
  CUDA_OK(cudaDeviceSynchronize());
  out = P.out->download();
  lse = P.lse->download();
}

/// Captures one forward_with_kvcache call of each problem (its tensors and the options' tensors,
/// k_new / v_new included, moved to stream s), in order, into a graph. The capture ends even if a
/// call throws (a thread left capturing fails every later CUDA call); the message is then in *thrown.
inline cudaGraph_t capture_calls(const std::vector<KvProblem*>& problems, cudaStream_t s, std::string* thrown) {
  auto on = [&](TensorView t) { t.device.stream = s; return t; };
  const fa4::test::Capture c = fa4::test::capture_graph(
      s, cudaStreamCaptureModeThreadLocal,
      [&] {
        for (KvProblem* P : problems) {
          fa4::KVCacheOptions o = P->o;  // every tensor of the call on s (the rule: q's stream)
          for (std::optional<TensorView>* t : {&o.cache_seqlens, &o.page_table, &o.cache_batch_idx, &o.k_new,
                                               &o.v_new, &o.sink})
            if (*t) *t = on(**t);
          fa4::forward_with_kvcache(on(P->tq), on(P->tk), on(P->tv), on(P->tout), on(P->tlse), o);
        }
      },
      [] {});
  *thrown = c.thrown;
  if (c.ended != cudaSuccess && thrown->empty()) *thrown = "cudaStreamEndCapture failed";
  return c.graph;
}

inline cudaGraph_t capture_call(KvProblem& P, cudaStream_t s, std::string* thrown) { return capture_calls({&P}, s, thrown); }

/// A serving loop: two problems built from case c (the same seed: the same cache, pages and
/// inputs), one call of the first captured on stream s and replayed, the second called eagerly;
/// both get the same fresh q, k_new and v_new and the same lengths at each of `steps` steps, the
/// lengths growing by c's seqlen_new (at least 1) per step. Each replay's out, lse and cache must
/// equal the eager call's bitwise, out must be written, and no broken index may be reported.
/// kernel: the selector's kernel name for the call.
inline void graph_loop_matches_eager(const KvCase& c, cudaStream_t s, int steps, std::string* kernel = nullptr) {
  KvProblem graph, eager;
  build(graph, c);
  build(eager, c);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  if (kernel)
    ASSERT_EQ(fa4::forward_with_kvcache_support(graph.tq, graph.tk, graph.tv, graph.tout, graph.tlse, graph.o, kernel), "");
  std::string thrown;
  cudaGraph_t g = capture_call(graph, s, &thrown);
  ASSERT_EQ(thrown, "");
  cudaGraphExec_t ge;
  CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
  std::mt19937 rng(fa4::test::next_seed());
  std::normal_distribution<float> nd;
  std::vector<int> lens = graph.cl;
  for (int step = 0; step < steps; ++step) {
    std::vector<uint16_t> q(graph.hq.size()), kn(graph.hkn.size()), vn(graph.hvn.size());
    for (auto* v : {&q, &kn, &vn}) for (auto& x : *v) x = to16(graph.c.dtype, nd(rng));
    for (KvProblem* P : {&graph, &eager}) {
      P->q->upload(q);
      P->kn->upload(kn);
      P->vn->upload(vn);
      P->d_cl->upload(lens);
      CUDA_OK(cudaMemset(P->out->ptr, 0xFF, P->out->n * 2));
      CUDA_OK(cudaMemset(P->lse->ptr, 0xFF, P->lse->n * 4));
    }
    CUDA_OK(cudaGraphLaunch(ge, s));
    CUDA_OK(cudaStreamSynchronize(s));
    fa4::forward_with_kvcache(eager.tq, eager.tk, eager.tv, eager.tout, eager.tlse, eager.o);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> out = eager.out->download();
    EXPECT_TRUE(graph.out->download() == out) << "out, step " << step;
    EXPECT_TRUE(graph.lse->download() == eager.lse->download()) << "lse, step " << step;
    EXPECT_TRUE(graph.k->download() == eager.k->download()) << "k_cache, step " << step;
    EXPECT_TRUE(graph.v->download() == eager.v->download()) << "v_cache, step " << step;
    EXPECT_EQ(std::count(out.begin(), out.end(), uint16_t(0xFFFF)), 0) << "out left unwritten, step " << step;
    for (int& n : lens) n += std::max(1, graph.c.seqlen_new);
  }
  EXPECT_NO_THROW(fa4::check_async_errors(0));
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
}

/// run_case's checks on a built problem (whose host and device index tensors a test may have
/// edited alike after build, e.g. to share pages). kernel_out: the selector's kernel name.
inline void check_built(KvProblem& P, std::string* kernel_out = nullptr) {
  const KvCase& c = P.c;
  const int B = P.B, Sq = P.Sq, H = P.H, HK = P.HK;
  std::string kernel;
  std::vector<uint16_t> out, out2;
  std::vector<float> lse, lse2;
  run_fa4(P, out, lse, &kernel);
  if (::testing::Test::HasFatalFailure()) return;
  if (kernel_out) *kernel_out = kernel;
  const bool expect_async = c.bad_seqlen_b >= 0 || c.bad_page_b >= 0 || c.bad_batch_idx_b >= 0;
  if (expect_async) {
    try {
      fa4::check_async_errors(0);
      ADD_FAILURE() << c.name() << ": broken indices were not reported";
    } catch (const fa4::Error& e) {
      // Every rule broken is named (each has its own flag byte, device_state.h); the tests break
      // each rule in another sequence.
      const std::string m = e.what();
      auto has = [&](const char* rule) { return m.find(rule) != std::string::npos; };
      const bool seqlens = has("cache_seqlens[b] must"), pages = has("page_table[b][p] must"),
                 rows = has("cache_batch_idx[b] must");
      if (c.bad_seqlen_b >= 0 && c.bad_page_b >= 0) EXPECT_TRUE(seqlens && pages) << m;
      else if (c.bad_seqlen_b >= 0) EXPECT_TRUE(seqlens) << m;
      else if (c.bad_page_b >= 0) EXPECT_TRUE(pages) << m;
      else EXPECT_TRUE(rows) << m;
    }
  } else {
    EXPECT_NO_THROW(fa4::check_async_errors(0)) << c.name();
  }
  // The cache after the append, bitwise (the second run re-uploads the pre-append cache).
  EXPECT_TRUE(P.k->download() == P.k_after) << c.name() << ": k_cache after the append";
  EXPECT_TRUE(P.v->download() == P.v_after) << c.name() << ": v_cache after the append";
  run_fa4(P, out2, lse2);
  if (::testing::Test::HasFatalFailure()) return;
  if (expect_async) try { fa4::check_async_errors(0); } catch (const fa4::Error&) {}
  EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * 2)) << c.name() << ": not bitwise repeatable";
  EXPECT_EQ(0, std::memcmp(lse.data(), lse2.data(), lse.size() * 4)) << c.name() << ": lse not repeatable";
  // Split-KV: every tile's arrival counter is back at zero (the default stream's buffer, which
  // both runs used), bad sequences included; a counter left set would stop the next merge. Only
  // with explicit splits > 1: then the buffer exists and holds at least these counters (with one
  // split, or one thread-block cluster holding every split of a tile, the acquire below would
  // allocate a fresh, zeroed buffer and check nothing).
  if (c.num_splits > 1) {
    const size_t tiles = size_t(B) * HK * ((size_t(Sq) * (H / HK) + 15) / 16);
    fa4::hopper::ScratchHold held(nullptr);
    const char* base = held.hold(fa4::hopper::acquire_scratch(0, nullptr, tiles * 4, tiles * 4,
                                                              fa4::hopper::ScratchKind::kDecodeArrivals));
    std::vector<int32_t> counters(tiles);
    CUDA_OK(cudaMemcpy(counters.data(), base, tiles * 4, cudaMemcpyDeviceToHost));
    held.release();
    EXPECT_EQ(size_t(std::count(counters.begin(), counters.end(), 0)), tiles) << c.name() << ": arrival counters left set";
  }

  // The reference: the keys each sequence sees, gathered from the expected cache, as varlen.
  std::vector<int> cu_q{0}, cu_k{0};
  for (int b = 0; b < B; ++b) {
    cu_q.push_back(cu_q.back() + Sq);
    cu_k.push_back(cu_k.back() + (P.seq_bad(b) ? 0 : P.seqlen_k(b)));
  }
  const int64_t total_k = cu_k.back();
  std::vector<uint16_t> gk(std::max<int64_t>(total_k, 1) * HK * c.d), gv(std::max<int64_t>(total_k, 1) * HK * c.dv);
  int max_sk = 1;
  for (int b = 0; b < B; ++b) {
    const int n = cu_k[b + 1] - cu_k[b];
    max_sk = std::max(max_sk, n);
    for (int j = 0; j < n; ++j) {
      const int64_t r = P.row_of(b, j);
      std::memcpy(&gk[(cu_k[b] + j) * int64_t(HK) * c.d], &P.k_after[r * HK * c.d], size_t(HK) * c.d * 2);
      std::memcpy(&gv[(cu_k[b] + j) * int64_t(HK) * c.dv], &P.v_after[r * HK * c.dv], size_t(HK) * c.dv * 2);
    }
  }
  ASSERT_LE(max_sk, fa4::test::kRefMaxSeqlenK);
  DevBuf<uint16_t> dgk(gk.size()), dgv(gv.size());
  dgk.upload(gk);
  dgv.upload(gv);
  DevBuf<int> dcu_q(cu_q.size()), dcu_k(cu_k.size());
  dcu_q.upload(cu_q);
  dcu_k.upload(cu_k);
  const auto dev = fa4::Device::cuda(0);
  const int64_t rows = int64_t(B) * Sq;
  DevBuf<uint16_t> scratch_out(rows * H * c.dv);
  DevBuf<float> scratch_lse(rows * H);
  fa4::AttentionOptions ro = P.o;  // mask, softcap, sink, scale as given
  ro.cu_seqlens_q = TensorView::contiguous(dcu_q.ptr, DType::kInt32, {B + 1}, dev);
  ro.cu_seqlens_k = TensorView::contiguous(dcu_k.ptr, DType::kInt32, {B + 1}, dev);
  ro.max_seqlen_q = std::max(Sq, 1);
  ro.max_seqlen_k = max_sk;
  const fa4::detail::FwdParams rp = fa4::detail::make_fwd_params(
      TensorView::contiguous(P.q->ptr, c.dtype, {rows, H, c.d}, dev),
      TensorView::contiguous(dgk.ptr, c.dtype, {std::max<int64_t>(total_k, 1), HK, c.d}, dev),
      TensorView::contiguous(dgv.ptr, c.dtype, {std::max<int64_t>(total_k, 1), HK, c.dv}, dev),
      TensorView::contiguous(scratch_out.ptr, c.dtype, {rows, H, c.dv}, dev),
      TensorView::strided(scratch_lse.ptr, DType::kFP32, {H, rows}, {1, H}, dev), ro, "reference");
  DevBuf<float> ref_o(rows * H * c.dv), ref_l(rows * H), nv_o(rows * H * c.dv), nv_l(rows * H);
  const dim3 grid(Sq, H, B);
  CUDA_OK(fa4::test::launch_reference(grid, max_sk, rp, false, ref_o.ptr, ref_l.ptr));
  CUDA_OK(fa4::test::launch_reference(grid, max_sk, rp, true, nv_o.ptr, nv_l.ptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto r_o = ref_o.download(), r_l = ref_l.download(), n_o = nv_o.download(), n_l = nv_l.download();

  double err = 0, nerr = 0, lerr = 0, nlerr = 0;
  int64_t bad_nan = 0, bad_masked = 0, bad_skipped = 0;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < Sq; ++i)
      for (int h = 0; h < H; ++h) {
        const int64_t orow = (int64_t(b) * Sq + i) * H + h;  // out (b, i, h) and the reference's row
        const float fl = lse[(int64_t(b) * H + h) * Sq + i];
        if (P.seq_bad(b)) {  // skipped: poison kept
          uint32_t bits;
          std::memcpy(&bits, &fl, 4);
          bad_skipped += bits != 0xFFFFFFFFu;
          for (int e = 0; e < c.dv; ++e) bad_skipped += out[orow * c.dv + e] != kPoison16;
          continue;
        }
        const float rl = r_l[orow];
        if (std::isinf(rl) && rl < 0) {
          bad_masked += !(std::isinf(fl) && fl < 0);
          for (int e = 0; e < c.dv; ++e) bad_masked += from16(c.dtype, out[orow * c.dv + e]) != 0.f;
          continue;
        }
        if (std::isnan(fl) != std::isnan(rl)) ++bad_nan;
        if (!std::isnan(rl)) {
          lerr = std::max(lerr, double(std::fabs(fl - rl)));
          nlerr = std::max(nlerr, double(std::fabs(n_l[orow] - rl)));
        }
        for (int e = 0; e < c.dv; ++e) {
          const float f = from16(c.dtype, out[orow * c.dv + e]), rv = r_o[orow * c.dv + e];
          if (std::isnan(f) != std::isnan(rv)) { ++bad_nan; continue; }
          if (std::isnan(rv)) continue;
          err = std::max(err, double(std::fabs(f - rv)));
          nerr = std::max(nerr, double(std::fabs(n_o[orow * c.dv + e] - rv)));
        }
      }
  EXPECT_EQ(bad_nan, 0) << c.name() << ": NaN placement differs from the reference";
  EXPECT_EQ(bad_masked, 0) << c.name() << ": rows without keys must be O = 0, LSE = -inf (or the sink)";
  EXPECT_EQ(bad_skipped, 0) << c.name() << ": a sequence with broken indices was written";
  EXPECT_LE(err, 2 * nerr + kAtolO) << c.name() << " kernel " << kernel << ": O err " << err << " naive " << nerr;
  EXPECT_LE(lerr, 2 * nlerr + kAtolLse) << c.name() << ": LSE err " << lerr << " naive " << nlerr;
}

/// The whole check of one case (see the file comment); none where the case is left out (its bucket
/// not compiled in this build: false). kernel: the selector's kernel name.
inline bool run_case(const KvCase& c, std::string* kernel = nullptr) {
  if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) return false;
  KvProblem P;
  build(P, c);
  if (::testing::Test::HasFatalFailure()) return false;
  check_built(P, kernel);
  return true;
}

}  // namespace
