// tests/gpu/test_hopper_decode.cu — fa4::forward_with_kvcache on the Hopper decode kernels against
// the GPU fp32 reference (gpu_reference.cuh) run on the same keys gathered into a varlen problem.
//
// Each case builds a dense or paged cache (pages shuffled, unused page-table slots -1), optionally
// appends k/v, runs fa4 twice (bitwise equal), then checks: the cache after the append equals the
// host's expectation bitwise (appended rows written, nothing else touched); out and lse against the
// exact reference within 2 x the naive same-precision implementation's error + atol; rows that see
// no key are O = 0, lse = -inf (or the sink); NaN only where the reference has one.
// Sanitizer subset: --gtest_filter='HopperDecode.Sanitize*'.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/validate.h"
#include "core/float16.h"
#include "fa4/attention.h"
#include "gpu/gpu_reference.cuh"
#include "hopper/shared/device_state.h"

#include "gpu_test_util.cuh"

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
  // bad_page_b a page id past the pool in the middle of its used pages (-1: none).
  int bad_seqlen_b = -1, bad_page_b = -1;
  int bad_seqlen_value = 0;      // 0: capacity + 1 (too long); else this value (e.g. -1)
  int bad_batch_idx_b = -1;      // dense + batch_idx: this sequence's cache row is out of range
  bool nan_q = false;            // q[0, 0, 0, 0] = NaN: that row's out/lse must be NaN, only there
  float tau = 8.f;               // rescale_threshold (0: rescale at every new max)
  bool full_page_table = false;  // every page-table slot holds a page (lengths may change later)
  bool nan_past_keys = false;    // every cache row no sequence attends to (at build time) holds NaN
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

void build(KvProblem& P, const KvCase& c) {
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
  fill(P.hk, size_t(P.cache_rows) * P.HK * c.d);
  fill(P.hv, size_t(P.cache_rows) * P.HK * c.dv);
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
    dev_pt[c.bad_page_b * P.max_pages + used / 2] = P.num_pages + 7;
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
void run_fa4(KvProblem& P, std::vector<uint16_t>& out, std::vector<float>& lse, std::string* kernel = nullptr) {
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

/// Captures one forward_with_kvcache call of each problem (its options and tensors moved to stream
/// s), in order, into a graph. The capture ends even if a call throws (a thread left capturing
/// fails every later CUDA call); the message is then in *thrown.
cudaGraph_t capture_calls(const std::vector<KvProblem*>& problems, cudaStream_t s, std::string* thrown) {
  auto on = [&](TensorView t) { t.device.stream = s; return t; };
  const fa4::test::Capture c = fa4::test::capture_graph(
      s, cudaStreamCaptureModeThreadLocal,
      [&] {
        for (KvProblem* P : problems) {
          fa4::KVCacheOptions o = P->o;
          if (o.cache_seqlens) o.cache_seqlens = on(*o.cache_seqlens);
          if (o.page_table) o.page_table = on(*o.page_table);
          fa4::forward_with_kvcache(on(P->tq), on(P->tk), on(P->tv), on(P->tout), on(P->tlse), o);
        }
      },
      [] {});
  *thrown = c.thrown;
  if (c.ended != cudaSuccess && thrown->empty()) *thrown = "cudaStreamEndCapture failed";
  return c.graph;
}

cudaGraph_t capture_call(KvProblem& P, cudaStream_t s, std::string* thrown) { return capture_calls({&P}, s, thrown); }

/// The whole check of one case (see the file comment); none where the case is left out (its bucket
/// not compiled in this build).
void run_case(const KvCase& c) {
  if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) return;
  KvProblem P;
  build(P, c);
  if (::testing::Test::HasFatalFailure()) return;
  const int B = P.B, Sq = P.Sq, H = P.H, HK = P.HK;
  std::string kernel;
  std::vector<uint16_t> out, out2;
  std::vector<float> lse, lse2;
  run_fa4(P, out, lse, &kernel);
  if (::testing::Test::HasFatalFailure()) return;
  const bool expect_async = c.bad_seqlen_b >= 0 || c.bad_page_b >= 0 || c.bad_batch_idx_b >= 0;
  if (expect_async) {
    try {
      fa4::check_async_errors(0);
      ADD_FAILURE() << c.name() << ": broken indices were not reported";
    } catch (const fa4::Error& e) {
      // CTAs meeting different rules at once may merge their bits (device_state.h): with two broken
      // rules in one call, one of them is enough.
      const std::string m = e.what();
      auto has = [&](const char* rule) { return m.find(rule) != std::string::npos; };
      const bool seqlens = has("cache_seqlens[b] must"), pages = has("page_table[b][p] must"),
                 rows = has("cache_batch_idx[b] must");
      if (c.bad_seqlen_b >= 0 && c.bad_page_b >= 0) EXPECT_TRUE(seqlens || pages) << m;
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
    const char* base = fa4::hopper::acquire_scratch(0, nullptr, tiles * 4, tiles * 4,
                                                    fa4::hopper::ScratchKind::kDecodeArrivals).ptr;
    std::vector<int32_t> counters(tiles);
    CUDA_OK(cudaMemcpy(counters.data(), base, tiles * 4, cudaMemcpyDeviceToHost));
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
  const size_t smem = (size_t(max_sk + 3) / 4 * 4 + 4) * sizeof(float);
  fa4::test::reference_attention_kernel<<<grid, fa4::test::kRefThreads, smem>>>(rp, false, ref_o.ptr, ref_l.ptr);
  fa4::test::reference_attention_kernel<<<grid, fa4::test::kRefThreads, smem>>>(rp, true, nv_o.ptr, nv_l.ptr);
  CUDA_OK(cudaGetLastError());
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

// (Here and in the paged test below the cache rows past the lengths hold NaN: a block that ends
// past its sequence must never bring them into the products, where P = 0 x NaN would be NaN.)
TEST(HopperDecode, DenseSplitCounts) {
  REQUIRE_HOPPER();
  for (int splits : {1, 2, 3, 7, 64, 0}) {
    KvCase c;
    c.cache_seqlens = {300, 77};
    c.nan_past_keys = true;
    c.num_splits = splits;
    c.seed = 10 + splits;
    run_case(c);
  }
}

TEST(HopperDecode, PagedPageSizesAndBoundaries) {
  REQUIRE_HOPPER();
  for (int ps : {1, 3, 16, 64, 256}) {
    KvCase c;
    c.batch = 4;
    c.page_size = ps;
    c.capacity = 1024;
    c.cache_seqlens = {0, 1, std::min(1024, 2 * ps) - 1, std::min(1024, 2 * ps + 1)};
    c.nan_past_keys = true;
    for (int splits : {1, 0}) {
      c.num_splits = splits;
      c.seed = 100 + ps + splits;
      run_case(c);
    }
  }
}

TEST(HopperDecode, AppendDensePagedBatchIdx) {
  REQUIRE_HOPPER();
  for (int ps : {0, 16, 5}) {
    KvCase c;
    c.batch = 3;
    c.page_size = ps;
    c.capacity = 256;
    c.cache_seqlens = {0, 100, 253};
    c.seqlen_new = 3;
    c.seqlen_q = 3;
    c.causal = true;
    c.batch_idx = ps == 0;
    c.seed = 200 + ps;
    run_case(c);
    c.num_splits = 4;
    run_case(c);
  }
}

TEST(HopperDecode, SeqlenQAndGroupsCausal) {
  REQUIRE_HOPPER();
  for (int sq : {1, 2, 5, 16})
    for (int group : {1, 4, 8, 16}) {
      KvCase c;
      c.seqlen_q = sq;
      c.heads_kv = 2;
      c.heads = 2 * group;
      c.capacity = 700;
      c.cache_seqlens = {699, 9};  // the second: fewer keys than queries for sq 16 (masked rows)
      c.causal = true;
      c.seed = 300 + sq * 17 + group;
      run_case(c);
    }
}

TEST(HopperDecode, WindowSoftcapSinkFp16) {
  REQUIRE_HOPPER();
  KvCase c;
  c.batch = 3;
  c.seqlen_q = 4;
  c.page_size = 32;
  c.capacity = 2000;
  c.cache_seqlens = {1999, 500, 0};
  c.window_left = 100;
  c.window_right = 0;
  c.softcap = 20.f;
  c.sink = true;
  for (DType t : {DType::kBF16, DType::kFP16})
    for (int splits : {1, 0}) {
      c.dtype = t;
      c.num_splits = splits;
      c.seed = 400 + splits + int(t);
      run_case(c);
    }
}

TEST(HopperDecode, HeadDimsAndPadding) {
  REQUIRE_HOPPER();
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {80, 80}, {192, 128}, {32, 32}};
  for (const auto& dd : dims) {
    KvCase c;
    c.d = dd[0];
    c.dv = dd[1];
    c.page_size = 16;
    c.capacity = 600;
    c.cache_seqlens = {600, 333};
    c.seqlen_new = 0;
    c.seed = 500 + dd[0] + dd[1];
    run_case(c);
    // The cluster merge at every width: 16 splits of 10 key blocks (6 empty) in clusters of up to
    // 16, each CTA merging d / 16 columns of the tile (4 at d64; at 32 of 64, 80 of 128 and 128 of
    // 256 the last CTAs own only padding columns yet receive every row's log2-sum-exp).
    const fa4::test::ScopedOverride cluster("decode_cluster", "1");
    c.num_splits = 16;
    run_case(c);
  }
}

TEST(HopperDecode, LongCacheAutoSplit) {
  REQUIRE_HOPPER();
  KvCase c;
  c.batch = 1;
  c.heads = 32;
  c.heads_kv = 8;
  c.capacity = 12000;
  c.page_size = 64;
  c.cache_seqlens = {11999};
  c.seqlen_new = 1;
  c.seed = 600;
  run_case(c);
}

TEST(HopperDecode, EmptyCachesGiveMaskedRows) {
  REQUIRE_HOPPER();
  KvCase c;
  c.cache_seqlens = {0, 0};
  c.sink = true;
  for (int splits : {1, 5}) {
    c.num_splits = splits;
    run_case(c);
  }
}

TEST(HopperDecode, BrokenDeviceIndicesSkipTheSequence) {
  REQUIRE_HOPPER();
  const int broken[][2] = {{1, -1}, {-1, 2}, {1, 2}};  // (bad cache_seqlens, bad page) sequence
  for (const auto& bb : broken)
    for (int splits : {1, 6}) {
      KvCase c;
      c.batch = 3;
      c.page_size = 16;
      c.capacity = 512;
      c.cache_seqlens = {400, 300, 200};
      c.seqlen_new = 2;
      c.bad_seqlen_b = bb[0];
      c.bad_page_b = bb[1];
      c.num_splits = splits;
      c.seed = 700 + splits;
      run_case(c);
    }
}

TEST(HopperDecode, NegativeLengthAndBadCacheRow) {
  REQUIRE_HOPPER();
  for (int splits : {1, 4}) {
    KvCase c;
    c.batch = 3;
    c.capacity = 300;
    c.cache_seqlens = {100, 200, 250};
    c.seqlen_new = 1;
    c.bad_seqlen_b = 0;
    c.bad_seqlen_value = -1;
    c.num_splits = splits;
    run_case(c);
    c.bad_seqlen_b = -1;
    c.batch_idx = true;
    c.bad_batch_idx_b = 2;
    run_case(c);
  }
}

// A NaN in one query row reaches that row only, whether one split finishes it or the last split
// merges several; tau = 0 takes the rescale branch at every larger block max.
TEST(HopperDecode, NaNRowAndEagerRescale) {
  REQUIRE_HOPPER();
  for (int splits : {1, 5}) {
    KvCase c;
    c.batch = 2;
    c.capacity = 900;
    c.cache_seqlens = {900, 400};
    c.nan_q = true;
    c.num_splits = splits;
    run_case(c);
    c.nan_q = false;
    c.tau = 0.f;
    c.page_size = 16;
    run_case(c);
  }
}

TEST(HopperDecode, GraphReplayFollowsCacheSeqlens) {
  REQUIRE_HOPPER();
  KvCase c;
  REQUIRE_BUCKETS(c.d, c.dv, fa4::test::kDecode);
  c.batch = 2;
  c.page_size = 16;
  c.capacity = 1024;
  c.cache_seqlens = {1000, 50};
  c.full_page_table = true;  // the replay changes the lengths
  // 6 splits, clusters forced: clusters of 2 merge in shared memory, the 3 cluster partials
  // through global scratch, whose arrival counters every replay must leave reset.
  c.num_splits = 6;
  const fa4::test::ScopedOverride cluster("decode_cluster", "1");
  c.seed = 800;
  // Two problems of one shape with different inputs: captured alone, then one after the other on
  // one stream, where the second shares the first's captured partials and arrival counters (the
  // capture orders the calls as the stream would; counters the first left set would make the
  // second merge the first's partials).
  KvProblem P[2];
  std::vector<uint16_t> eager[2][2];  // [problem][lengths]
  std::vector<float> lse[2][2];
  const std::vector<int> other{37, 1020};
  for (int i = 0; i < 2; ++i) {
    KvCase ci = c;
    ci.seed = 800 + i;
    build(P[i], ci);
    if (::testing::Test::HasFatalFailure()) return;
    run_fa4(P[i], eager[i][0], lse[i][0]);
    P[i].d_cl->upload(other);
    run_fa4(P[i], eager[i][1], lse[i][1]);
    P[i].d_cl->upload(c.cache_seqlens);
  }
  ASSERT_NO_THROW(fa4::check_async_errors(0));
  ASSERT_NE(eager[0][0], eager[1][0]);  // a replay giving one call's rows twice fails

  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Both owners of captured scratch: fa4 (retained, the default within its budget) and the graph
  // (a CUDA user object).
  for (const bool retained : {true, false})
  for (const int calls : {1, 2}) {
    SCOPED_TRACE(std::string(calls == 1 ? "one captured call" : "two captured calls") +
                 (retained ? ", retained scratch" : ", graph-owned scratch"));
    const fa4::test::ScopedOverride owner("capture_scratch", retained ? "retained" : "graph");
    const fa4::hopper::CaptureScratchStats before = fa4::hopper::capture_scratch_stats();
    std::string thrown;
    cudaGraph_t g = capture_calls(calls == 1 ? std::vector<KvProblem*>{&P[0]} : std::vector<KvProblem*>{&P[0], &P[1]}, s, &thrown);
    cudaGraphExec_t ge;
    ASSERT_EQ(thrown, "");
    const fa4::hopper::CaptureScratchStats after = fa4::hopper::capture_scratch_stats();
    EXPECT_EQ(after.retained - before.retained, retained ? 2u : 0u) << "partials and arrival counters, retained";
    EXPECT_EQ(after.created + after.reused - before.created - before.reused, retained ? 0u : 2u)
        << "partials and arrival counters, graph-owned";
    EXPECT_EQ(after.shared - before.shared, calls == 2 ? 2u : 0u);
    // The split partials and their arrival counters are captured scratch, retained or owned by the
    // graph: the kernels alone (no memset, no graph-memory allocation and free).
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel), calls);
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel, /*other=*/true), 0)
        << "the captured call added nodes besides its kernels";
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    for (int round = 0; round < 2; ++round) {  // the replay follows the lengths
      for (int i = 0; i < calls; ++i) {
        P[i].d_cl->upload(round ? other : c.cache_seqlens);
        CUDA_OK(cudaMemsetAsync(P[i].out->ptr, 0xFF, P[i].out->n * 2, s));
        CUDA_OK(cudaMemsetAsync(P[i].lse->ptr, 0xFF, P[i].lse->n * 4, s));
      }
      CUDA_OK(cudaGraphLaunch(ge, s));
      CUDA_OK(cudaStreamSynchronize(s));
      for (int i = 0; i < calls; ++i) {
        EXPECT_TRUE(P[i].out->download() == eager[i][round]) << "call " << i << ", replay " << round;
        EXPECT_EQ(0, std::memcmp(P[i].lse->download().data(), lse[i][round].data(), lse[i][round].size() * 4))
            << "call " << i << ", replay " << round;
      }
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  }
  cudaStreamDestroy(s);
}

// The splits of a tile that form one thread-block cluster merge through distributed shared memory,
// in split order: bitwise the result of the global merge (override decode_cluster = 0) for split
// counts one cluster of the portable size holds whole (2, 4, 8; clusters forced: decode_cluster =
// 1). With 16 (one cluster of 16 where the device schedules it, else two of 8 and a global merge of
// their partials), 24, 64 and 112 (clusters of 8 and 16, then the global merge; at 64 and 112 the
// automatic rule picks the clusters itself, 256 / 448 KB of partials per tile), and with the global
// merge alone, each within the accuracy rule (run_case). A call whose splits form one cluster of 8
// per tile needs no scratch: captured, it is one kernel node (this also proves the clusters were
// used).
TEST(HopperDecode, ClusterMergeMatchesTheGlobalMerge) {
  REQUIRE_HOPPER();
  for (int splits : {2, 4, 8, 16, 24, 64, 112}) {
    KvCase c;
    c.batch = 2;
    c.heads = 16;
    c.heads_kv = 2;       // group 8: 8 live rows of the 16-row tile
    c.capacity = 64 * 70;  // 70 blocks: uneven shares, and empty splits at 64
    c.cache_seqlens = {64 * 70, 1000};
    c.page_size = splits == 8 ? 16 : 0;
    c.sink = splits == 4;
    c.num_splits = splits;
    c.seed = 900 + splits;
    if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;  // the calls below too
    run_case(c);
    for (const char* mode : {"0", "1"}) {
      const fa4::test::ScopedOverride merge("decode_cluster", mode);
      run_case(c);
    }
    if (splits > 8) continue;
    KvProblem P;
    build(P, c);
    std::vector<uint16_t> out_cluster, out_global;
    std::vector<float> lse_cluster, lse_global;
    {  // (each override scope ends at "auto", so the two must not nest)
      const fa4::test::ScopedOverride cluster("decode_cluster", "1");
      run_fa4(P, out_cluster, lse_cluster);
    }
    {
      const fa4::test::ScopedOverride global("decode_cluster", "0");
      run_fa4(P, out_global, lse_global);
    }
    EXPECT_TRUE(out_cluster == out_global) << c.name() << ": the cluster merge differs from the global merge";
    EXPECT_EQ(0, std::memcmp(lse_cluster.data(), lse_global.data(), lse_global.size() * 4)) << c.name();
    if (splits != 8) continue;
    const fa4::test::ScopedOverride cluster("decode_cluster", "1");
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::string thrown;
    cudaGraph_t g = capture_call(P, s, &thrown);
    ASSERT_EQ(thrown, "");
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel), 1);
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel, /*other=*/true), 0)
        << "a captured decode whose splits form one cluster added non-kernel nodes";
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  }
}

// The wide row tile (64 rows, one warp per 16 over all keys of a block) and the narrow one (16
// rows, one warp per 16 keys), each forced onto the same inputs and checked against the reference:
// 1 to 132 rows per KV head (one live row, partial tiles, several tiles), causal with masked rows
// (the second sequence has fewer keys than queries), a window, softcap, sink, appended keys, pages
// of 16, 3 and automatic splits, the cluster merge (16 splits), fp16, d128 / d64 / d80 (padded).
TEST(HopperDecode, WideAndNarrowTilesOverTheOptions) {
  REQUIRE_HOPPER();
  const int shapes[][3] = {{1, 8, 8}, {5, 16, 2}, {16, 8, 2}, {33, 8, 2}, {66, 2, 1}};  // seqlen_q, heads, heads_kv
  for (const auto& sh : shapes)
    for (const char* tile : {"64", "16"}) {
      const fa4::test::ScopedOverride forced("decode_tile", tile);
      KvCase c;
      c.seqlen_q = sh[0];
      c.heads = sh[1];
      c.heads_kv = sh[2];
      c.capacity = 700;
      c.cache_seqlens = {690, 40};
      c.causal = true;
      c.seed = 1000 + sh[0] * 7 + sh[1];
      if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;
      run_case(c);
      c.causal = false;
      c.window_left = 50;
      c.window_right = 0;
      c.softcap = 20.f;
      c.sink = true;
      c.seqlen_new = 3;
      c.page_size = 16;
      c.num_splits = 3;
      run_case(c);
      c.dtype = DType::kFP16;
      c.d = c.dv = 64;
      c.page_size = c.num_splits = 0;
      if (!fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) run_case(c);
      c.dtype = DType::kBF16;
      c.d = c.dv = 80;
      c.num_splits = 16;
      const fa4::test::ScopedOverride cluster("decode_cluster", "1");
      if (!fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) run_case(c);
    }
}

TEST(HopperDecode, ExplicitExp2EmulationIsAClearError) {
  REQUIRE_HOPPER();
  KvCase c;
  REQUIRE_BUCKETS(c.d, c.dv, fa4::test::kDecode);  // without it the answer is "not compiled"
  KvProblem P;
  build(P, c);
  P.o.exp2_emulation_fraction = 0.5f;
  try {
    fa4::forward_with_kvcache(P.tq, P.tk, P.tv, P.tout, P.tlse, P.o);
    ADD_FAILURE() << "exp2_emulation_fraction was ignored";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("exp2_emulation_fraction"), std::string::npos) << e.what();
  }
}

TEST(HopperDecode, SanitizeSmall) {
  REQUIRE_HOPPER();
  // Page 7, and page 16 (a power of two, several pages per 64-key block), the sequences ending
  // inside a page (132 and 5 keys after the append).
  for (int ps : {7, 16}) {
    KvCase c;
    c.batch = 2;
    c.seqlen_q = 2;
    c.page_size = ps;
    c.capacity = 150;
    c.cache_seqlens = {130, 3};
    c.seqlen_new = 2;
    c.causal = true;
    const fa4::test::ScopedOverride cluster("decode_cluster", "1");  // wherever the launch fits
    for (int splits : {3, 4, 6}) {  // the global merge, one cluster per tile, clusters of 2 + global
      c.num_splits = splits;
      run_case(c);
    }
    c.bad_page_b = 0;
    for (int splits : {1, 4, 6}) {  // 6: a flagged cluster of 2 then arrives at the global merge
      c.num_splits = splits;
      run_case(c);
    }
    // The wide row tile: global merge, one cluster per tile, and the flagged cluster again.
    const fa4::test::ScopedOverride wide("decode_tile", "64");
    for (int splits : {3, 4, 6}) {
      c.bad_page_b = splits == 6 ? 0 : -1;
      c.num_splits = splits;
      run_case(c);
    }
  }
}

}  // namespace
