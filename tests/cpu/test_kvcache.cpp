// tests/cpu/test_kvcache.cpp — accuracy matrix of fa4::forward_with_kvcache on the CPU
// (src/cpu/kvcache.cpp) against an INDEPENDENT float64 computation: the test gathers each
// sequence's keys/values itself (from the cache as the test expects it after the append), builds
// a batch-1 FwdParams by hand and runs the naive maths (src/cpu/naive_attention.h) in float64
// (the oracle) and at the input precision (the "plain" baseline). The project rule applies
// (tests/test_util.h): max|fa4 - ref64| <= 2 * max|plain - ref64| + atol, NaN never passes.
//
// Every cache element that no sequence may read (past seqlen_k(b), rows/pages of no sequence,
// the append region before the append) holds NaN, so any stray read shows in out. After the call
// the whole k_cache/v_cache must equal, bitwise, the cache before it with exactly the appended
// rows replaced. Backend::kCpuReference must give the oracle rounded once to the dtype, and a
// second call (re-appending the same rows onto the appended cache) the same bits again.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "accuracy_check.h"
#include "cpu/cpu_attention.h"
#include "cpu/naive_attention.h"
#include "fa4/attention.h"
#include "test_util.h"

namespace fa4::test {
namespace {

struct KvCase {
  std::string name;
  DType dtype = DType::kBF16;
  int batch = 3, sq = 1, h = 4, hkv = 2, d = 32, dv = 0;  // dv 0: = d
  bool paged = false;
  int page_size = 16, max_pages = 4;  // paged: capacity max_pages * page_size
  int seqlen_cache = 40;              // dense capacity
  std::vector<int> seqlens;           // cache_seqlens; empty = unset (every sequence full)
  int seqlen_new = 0;                 // > 0: k_new/v_new appended
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.0f;
  bool sink = false;
  bool batch_idx = false;  // dense: cache_batch_idx into a larger, shuffled cache
  std::optional<float> exp2_fraction;
};

std::ostream& operator<<(std::ostream& os, const KvCase& c) { return os << c.name; }

/// Copies element `src_i` of `src` into element `dst_i` of `dst` bitwise (same dtype).
void copy_element(HostTensor& dst, int64_t dst_i, const HostTensor& src, int64_t src_i) {
  const int64_t es = dtype_size(dst.dtype());
  std::memcpy(static_cast<uint8_t*>(dst.data()) + dst_i * es,
              static_cast<const uint8_t*>(src.data()) + src_i * es, size_t(es));
}

/// One problem: tensors, the options pointing at them, and the test's own view of the layout.
struct KvProblem {
  KvCase c;
  int cap = 0, batch_cache = 0, num_pages = 0;
  HostTensor q, kc, vc, kn, vn, out, lse, sink, seqlens, bidx, table;
  std::vector<int32_t> rows;              // dense: cache row of sequence b
  std::vector<std::vector<int32_t>> pages;  // paged: page of (b, p)
  KVCacheOptions opt;

  explicit KvProblem(const KvCase& cs) : c(cs) {
    if (c.dv == 0) c.dv = c.d;
    std::mt19937_64 rng(next_seed());
    cap = c.paged ? c.max_pages * c.page_size : c.seqlen_cache;
    const int B = c.batch;
    q = HostTensor(c.dtype, {B, c.sq, c.h, c.d});
    fill_normal(q);
    out = HostTensor(c.dtype, {B, c.sq, c.h, c.dv});
    lse = HostTensor(DType::kFP32, {B, c.h, c.sq});
    if (c.paged) {
      num_pages = B * c.max_pages + 3;  // spare pages nobody uses
      kc = HostTensor(c.dtype, {num_pages, c.page_size, c.hkv, c.d});
      vc = HostTensor(c.dtype, {num_pages, c.page_size, c.hkv, c.dv});
      std::vector<int32_t> perm(static_cast<size_t>(num_pages));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);  // shuffled page order
      table = HostTensor(DType::kInt32, {B, c.max_pages});
      auto* t = static_cast<int32_t*>(table.data());
      pages.assign(size_t(B), std::vector<int32_t>(size_t(c.max_pages), -1));
      size_t next = 0;
      for (int b = 0; b < B; ++b) {
        const int64_t used = (seqlen_k(b) + c.page_size - 1) / c.page_size;
        for (int p = 0; p < c.max_pages; ++p) {
          pages[b][p] = p < used ? perm[next++] : -1;  // unused entries hold -1
          t[b * c.max_pages + p] = pages[b][p];
        }
      }
      opt.page_table = table.view();
    } else {
      batch_cache = c.batch_idx ? B + 2 : B;
      kc = HostTensor(c.dtype, {batch_cache, cap, c.hkv, c.d});
      vc = HostTensor(c.dtype, {batch_cache, cap, c.hkv, c.dv});
      rows.resize(size_t(B));
      std::vector<int32_t> perm(static_cast<size_t>(batch_cache));
      std::iota(perm.begin(), perm.end(), 0);
      if (c.batch_idx) std::shuffle(perm.begin(), perm.end(), rng);
      for (int b = 0; b < B; ++b) rows[b] = perm[b];
      if (c.batch_idx) {
        bidx = HostTensor(DType::kInt32, {B});
        std::memcpy(bidx.data(), rows.data(), rows.size() * sizeof(int32_t));
        opt.cache_batch_idx = bidx.view();
      }
    }
    // Everything nobody may read is NaN; the keys already cached are N(0, 1).
    fill_poison(kc);
    fill_poison(vc);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int b = 0; b < B; ++b)
      for (int64_t j = 0; j < cached(b); ++j)
        for (int hh = 0; hh < c.hkv; ++hh) {
          for (int e = 0; e < c.d; ++e) kc.set(key_elem(b, j, hh, c.d) + e, nd(rng));
          for (int e = 0; e < c.dv; ++e) vc.set(key_elem(b, j, hh, c.dv) + e, nd(rng));
        }
    if (!c.seqlens.empty()) {
      seqlens = HostTensor(DType::kInt32, {B});
      for (int b = 0; b < B; ++b) static_cast<int32_t*>(seqlens.data())[b] = c.seqlens[b];
      opt.cache_seqlens = seqlens.view();
    }
    if (c.seqlen_new > 0) {
      kn = HostTensor(c.dtype, {B, c.seqlen_new, c.hkv, c.d});
      vn = HostTensor(c.dtype, {B, c.seqlen_new, c.hkv, c.dv});
      fill_normal(kn);
      fill_normal(vn);
      opt.k_new = kn.view();
      opt.v_new = vn.view();
    }
    sink = HostTensor(DType::kFP32, {c.h});
    fill_normal(sink);
    if (c.sink) opt.sink = sink.view();
    opt.causal = c.causal;
    opt.window_size_left = c.wl;
    opt.window_size_right = c.wr;
    opt.softcap = c.softcap;
    opt.exp2_emulation_fraction = c.exp2_fraction;
  }

  int64_t cached(int b) const { return c.seqlens.empty() ? cap - c.seqlen_new : c.seqlens[b]; }
  int64_t seqlen_k(int b) const { return cached(b) + c.seqlen_new; }
  /// Element index of (key position j of sequence b, kv head h, channel 0) in k_cache (width d)
  /// or v_cache (width dv): the test's own reading of the documented layout.
  int64_t key_elem(int b, int64_t j, int hh, int width) const {
    if (c.paged) {
      const int64_t page = pages[b][size_t(j / c.page_size)];
      return ((page * c.page_size + j % c.page_size) * c.hkv + hh) * width;
    }
    return ((int64_t(rows[b]) * cap + j) * c.hkv + hh) * width;
  }

  /// The caches as they must be after the call: before, with the appended rows replaced.
  void expected_caches(HostTensor& ek, HostTensor& ev) const {
    for (int b = 0; b < c.batch; ++b)
      for (int t = 0; t < c.seqlen_new; ++t)
        for (int hh = 0; hh < c.hkv; ++hh) {
          const int64_t j = cached(b) + t;
          const int64_t src = ((int64_t(b) * c.seqlen_new + t) * c.hkv + hh);
          for (int e = 0; e < c.d; ++e) copy_element(ek, key_elem(b, j, hh, c.d) + e, kn, src * c.d + e);
          for (int e = 0; e < c.dv; ++e) copy_element(ev, key_elem(b, j, hh, c.dv) + e, vn, src * c.dv + e);
        }
  }

  void run(Backend backend, int32_t num_splits = 0) {
    opt.backend = backend;
    opt.num_splits = num_splits;
    forward_with_kvcache(q.view(), kc.view(), vc.view(), out.view(), lse.view(), opt);
  }
};

/// Adds a base offset to the element offsets of a batch-1 problem's outputs.
struct OffsetWriter {
  MirrorWriter w;
  int64_t out_base = 0, lse_base = 0;
  void out(int64_t off, double x) { w.out(out_base + off, x); }
  void lse(int64_t off, double x) { w.lse(lse_base + off, x); }
  void dq(int64_t, double) {}
  void dk(int64_t, double) {}
  void dv(int64_t, double) {}
  void dsink(int32_t, double) {}
};

/// The oracle (exact) or the plain baseline over every sequence, from the expected caches.
void reference(const KvProblem& pr, const HostTensor& ek, const HostTensor& ev, bool exact,
               Exp2Emulation emulation, Mirror& mo, Mirror& ml) {
  const KvCase& c = pr.c;
  for (int b = 0; b < c.batch; ++b) {
    const int64_t sk = pr.seqlen_k(b);
    HostTensor kb(c.dtype, {1, sk, c.hkv, c.d}), vb(c.dtype, {1, sk, c.hkv, c.dv});
    for (int64_t j = 0; j < sk; ++j)
      for (int hh = 0; hh < c.hkv; ++hh) {
        for (int e = 0; e < c.d; ++e)
          copy_element(kb, (j * c.hkv + hh) * c.d + e, ek, pr.key_elem(b, j, hh, c.d) + e);
        for (int e = 0; e < c.dv; ++e)
          copy_element(vb, (j * c.hkv + hh) * c.dv + e, ev, pr.key_elem(b, j, hh, c.dv) + e);
      }
    detail::FwdParams f;
    f.dtype = c.dtype;
    f.batch = 1;
    f.num_heads = c.h;
    f.num_heads_kv = c.hkv;
    f.headdim = c.d;
    f.headdim_v = c.dv;
    f.seqlen_q = c.sq;
    f.seqlen_k = int32_t(sk);
    f.total_q = c.sq;
    f.total_k = sk;
    const int64_t es = dtype_size(c.dtype);
    f.q = static_cast<const uint8_t*>(pr.q.data()) + int64_t(b) * c.sq * c.h * c.d * es;
    f.k = kb.data();
    f.v = vb.data();
    f.q_stride = {int64_t(c.sq) * c.h * c.d, int64_t(c.h) * c.d, c.d};
    f.k_stride = {sk * c.hkv * c.d, int64_t(c.hkv) * c.d, c.d};
    f.v_stride = {sk * c.hkv * c.dv, int64_t(c.hkv) * c.dv, c.dv};
    f.out_stride = {int64_t(c.sq) * c.h * c.dv, int64_t(c.h) * c.dv, c.dv};
    f.lse_batch_stride = int64_t(c.h) * c.sq;
    f.lse_head_stride = c.sq;
    f.lse_row_stride = 1;
    f.sink = c.sink ? static_cast<const float*>(pr.sink.data()) : nullptr;
    f.softmax_scale = float(1.0 / std::sqrt(double(c.d)));
    f.softmax_scale_log2 = float(double(f.softmax_scale) * 1.4426950408889634);
    f.softcap = c.softcap;
    f.mask.window_left = c.wl;
    f.mask.window_right = c.causal ? 0 : c.wr;
    OffsetWriter w{MirrorWriter{&mo, &ml}, int64_t(b) * c.sq * c.h * c.dv, int64_t(b) * c.h * c.sq};
    if (exact) {
      cpu::naive::forward<double>(f, cpu::naive::NoRounding{}, w);
    } else {
      const cpu::naive::RoundToDtype rnd{c.dtype, c.dtype == DType::kFP32 && emulation.emulated > 0};
      cpu::naive::forward<float>(f, rnd, w);
    }
  }
}

void run_case(const KvCase& cs) {
  KvProblem pr(cs);
  const KvCase& c = pr.c;
  HostTensor ek = pr.kc, ev = pr.vc;
  pr.expected_caches(ek, ev);

  fill_poison(pr.out);
  fill_poison(pr.lse);
  const HostTensor out0 = pr.out, lse0 = pr.lse;
  pr.run(Backend::kCpu);
  EXPECT_TRUE(pr.kc.bitwise_equal(ek)) << c.name << ": k_cache differs from the expected append";
  EXPECT_TRUE(pr.vc.bitwise_equal(ev)) << c.name << ": v_cache differs from the expected append";

  const Exp2Emulation emulation = c.exp2_fraction
                                  ? Exp2Emulation{16, int32_t(std::lround(*c.exp2_fraction * 16))}
                                  : cpu::default_exp2_emulation(c.dtype);
  Mirror ro(pr.out.numel()), rl(pr.lse.numel()), no(pr.out.numel()), nl(pr.lse.numel());
  reference(pr, ek, ev, true, emulation, ro, rl);
  reference(pr, ek, ev, false, emulation, no, nl);
  const double vmax = std::max(max_abs_finite(pr.vc), c.seqlen_new ? max_abs_finite(pr.vn) : 0.0);
  const FirstOrderSlack sl = first_order_slack(c.dtype, emulation, vmax, rl);
  // Every element of out and lse is written (no varlen: every query row of every sequence).
  const Accuracy ao = check_accuracy("out", pr.out, out0, ro, no, c.dtype, sl.out(ro), pr.out.numel());
  const Accuracy al = check_accuracy("lse", pr.lse, lse0, rl, nl, DType::kFP32, sl.lse(), pr.lse.numel());
  EXPECT_TRUE(ao.ok()) << c.name << " " << ao.str();
  EXPECT_TRUE(al.ok()) << c.name << " " << al.str();
  std::printf("[kvcache] %s | out %.2e/%.2e | lse %.2e/%.2e\n", c.name.c_str(), ao.err, ao.bound(),
              al.err, al.bound());

  // A second call re-appends the same rows onto the appended cache: the same cache, the same bits
  // (num_splits is accepted and, on the CPU, has no effect).
  const HostTensor out1 = pr.out, lse1 = pr.lse;
  fill_poison(pr.out);
  fill_poison(pr.lse);
  pr.run(Backend::kCpu, /*num_splits=*/3);
  EXPECT_TRUE(pr.out.bitwise_equal(out1) && pr.lse.bitwise_equal(lse1))
      << c.name << ": a repeated call gave other bits";
  EXPECT_TRUE(pr.kc.bitwise_equal(ek) && pr.vc.bitwise_equal(ev)) << c.name;

  // kCpuReference: the oracle rounded once to the output dtype (lse to fp32).
  fill_poison(pr.out);
  fill_poison(pr.lse);
  pr.run(Backend::kCpuReference);
  int64_t bad = 0;
  for (int64_t i = 0; i < pr.out.numel(); ++i) {
    const float want = detail::round_to(c.dtype, float(ro.v[size_t(i)]));
    const float got = pr.out.get(i);
    if (!(got == want || (std::isnan(got) && std::isnan(want)))) ++bad;
  }
  for (int64_t i = 0; i < pr.lse.numel(); ++i) {
    const float want = float(rl.v[size_t(i)]), got = pr.lse.get(i);
    if (!(got == want || (std::isnan(got) && std::isnan(want)))) ++bad;
  }
  EXPECT_EQ(bad, 0) << c.name << ": kCpuReference differs from the float64 oracle";
  EXPECT_TRUE(pr.kc.bitwise_equal(ek) && pr.vc.bitwise_equal(ev)) << c.name;
}

std::vector<KvCase> matrix() {
  std::vector<KvCase> v;
  const DType bf = DType::kBF16, hf = DType::kFP16, f32 = DType::kFP32;
  // Dense: cache_seqlens 0 / 1 / middle / full, decode and short prefill, causal or not.
  v.push_back({.name = "dense_bf16_decode", .dtype = bf, .batch = 4, .seqlens = {0, 1, 23, 40}});
  v.push_back({.name = "dense_fp16_sq8_causal", .dtype = hf, .batch = 4, .sq = 8,
               .seqlens = {0, 1, 20, 40}, .causal = true});
  v.push_back({.name = "dense_fp32_unset_seqlens", .dtype = f32, .batch = 2, .sq = 3});
  v.push_back({.name = "dense_bf16_append1", .dtype = bf, .batch = 4, .seqlens = {0, 1, 20, 39},
               .seqlen_new = 1, .causal = true});
  v.push_back({.name = "dense_fp16_append5_sq5_causal", .dtype = hf, .batch = 3, .sq = 5,
               .seqlens = {0, 17, 35}, .seqlen_new = 5, .causal = true});
  v.push_back({.name = "dense_bf16_batch_idx_append", .dtype = bf, .batch = 3, .sq = 2,
               .seqlens = {3, 0, 38}, .seqlen_new = 2, .causal = true, .batch_idx = true});
  v.push_back({.name = "dense_fp32_batch_idx_noappend", .dtype = f32, .batch = 3, .sq = 4,
               .seqlens = {5, 40, 12}, .batch_idx = true});
  // GQA ratios 1 / 4 / 8.
  v.push_back({.name = "gqa1_bf16", .dtype = bf, .sq = 4, .h = 4, .hkv = 4, .seqlens = {7, 0, 33},
               .seqlen_new = 2, .causal = true});
  v.push_back({.name = "gqa4_fp16", .dtype = hf, .sq = 3, .h = 8, .hkv = 2, .seqlens = {9, 30, 1},
               .seqlen_new = 1});
  v.push_back({.name = "gqa8_bf16_d64_dv32", .dtype = bf, .sq = 6, .h = 8, .hkv = 1, .d = 64, .dv = 32,
               .seqlens = {13, 0, 28}, .seqlen_new = 3, .causal = true});
  // Windows, softcap, sink, exp2 emulation share.
  v.push_back({.name = "dense_window_causal", .dtype = bf, .sq = 4, .seqlens = {30, 2, 10},
               .seqlen_new = 2, .causal = true, .wl = 7});
  v.push_back({.name = "dense_window_lr", .dtype = hf, .sq = 5, .seqlens = {30, 0, 17}, .wl = 3, .wr = 2});
  v.push_back({.name = "dense_softcap", .dtype = bf, .sq = 2, .seqlens = {11, 40, 0}, .softcap = 5.0f});
  v.push_back({.name = "dense_sink", .dtype = f32, .sq = 3, .seqlens = {0, 12, 37}, .seqlen_new = 3,
               .causal = true, .sink = true});
  v.push_back({.name = "dense_fp32_exp2_half", .dtype = f32, .sq = 2, .seqlens = {39, 5, 22},
               .seqlen_new = 1, .exp2_fraction = 0.5f});
  // Paged: page sizes 1, 3, 16; cache_seqlens 0 / 1 / page boundary +-1 / full; shuffled pages.
  for (int ps : {1, 3, 16}) {
    const int mp = ps == 1 ? 24 : ps == 3 ? 9 : 3;
    const int capacity = ps * mp;
    for (int nnew : {0, 1, 3}) {
      const int room = capacity - nnew;
      std::vector<int> lens{0, 1, ps - 1, ps, ps + 1, room};
      for (int& l : lens) l = std::clamp(l, 0, room);
      const std::string tag = "paged_ps" + std::to_string(ps) + "_new" + std::to_string(nnew);
      v.push_back({.name = tag + "_decode", .dtype = bf, .batch = 6, .paged = true, .page_size = ps,
                   .max_pages = mp, .seqlens = lens, .seqlen_new = nnew, .causal = true});
      v.push_back({.name = tag + "_sq4_fp16", .dtype = hf, .batch = 6, .sq = 4, .h = 8, .hkv = 1,
                   .paged = true, .page_size = ps, .max_pages = mp, .seqlens = lens,
                   .seqlen_new = nnew, .causal = nnew != 1});
    }
  }
  v.push_back({.name = "paged_fp32_unset_seqlens", .dtype = f32, .batch = 2, .sq = 3, .paged = true,
               .page_size = 5, .max_pages = 3});
  v.push_back({.name = "paged_window_softcap_sink", .dtype = bf, .batch = 3, .sq = 8, .h = 8, .hkv = 2,
               .paged = true, .page_size = 16, .max_pages = 3, .seqlens = {40, 0, 15},
               .seqlen_new = 8, .causal = true, .wl = 12, .softcap = 3.0f, .sink = true});
  v.push_back({.name = "paged_gqa4_sq8_noncausal", .dtype = hf, .batch = 2, .sq = 8, .h = 8, .hkv = 2,
               .paged = true, .page_size = 3, .max_pages = 10, .seqlens = {11, 2}, .seqlen_new = 4});
  return v;
}

class KvMatrix : public ::testing::TestWithParam<KvCase> {};

TEST_P(KvMatrix, MatchesFloat64Reference) { run_case(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cpu, KvMatrix, ::testing::ValuesIn(matrix()),
                         [](const ::testing::TestParamInfo<KvCase>& i) { return i.param.name; });

// A query-less call still appends; out/lse are empty.
TEST(KvCache, AppendWithoutQueries) {
  KvCase c{.name = "noq", .dtype = DType::kBF16, .batch = 2, .sq = 0, .paged = true, .page_size = 3,
           .max_pages = 4, .seqlens = {2, 7}, .seqlen_new = 3};
  KvProblem pr(c);
  HostTensor ek = pr.kc, ev = pr.vc;
  pr.expected_caches(ek, ev);
  pr.run(Backend::kCpu);
  EXPECT_TRUE(pr.kc.bitwise_equal(ek));
  EXPECT_TRUE(pr.vc.bitwise_equal(ev));
}

// batch 0: nothing is read or written (null data is fine for empty tensors). Through
// cache_batch_idx the cache keeps rows (batch_cache = 2), so "nothing written" is checked on real
// elements.
TEST(KvCache, EmptyBatchIsANoOp) {
  KvCase c{.name = "b0", .batch = 0, .sq = 1, .seqlens = {}, .seqlen_new = 1, .batch_idx = true};
  KvProblem pr(c);
  pr.seqlens = HostTensor(DType::kInt32, {0});
  pr.opt.cache_seqlens = pr.seqlens.view();
  const HostTensor k0 = pr.kc, v0 = pr.vc;
  ASSERT_GT(pr.kc.numel(), 0);
  ASSERT_GT(pr.vc.numel(), 0);
  EXPECT_NO_THROW(pr.run(Backend::kCpu));
  EXPECT_TRUE(pr.kc.bitwise_equal(k0));
  EXPECT_TRUE(pr.vc.bitwise_equal(v0));
}

// A sequence with no key at all: out 0 and lse -inf (or the sink), never NaN.
TEST(KvCache, EmptySequenceGivesZeroRow) {
  KvCase c{.name = "sk0", .dtype = DType::kFP32, .batch = 2, .sq = 2, .seqlens = {0, 4},
           .sink = true};
  KvProblem pr(c);
  fill_poison(pr.out);  // so a row left unwritten shows
  fill_poison(pr.lse);
  pr.run(Backend::kCpu);
  for (int hh = 0; hh < c.h; ++hh)
    for (int i = 0; i < c.sq; ++i) {
      EXPECT_EQ(pr.lse.get(hh * c.sq + i), pr.sink.get(hh));
      for (int e = 0; e < c.d; ++e) EXPECT_EQ(pr.out.get((int64_t(i) * c.h + hh) * c.d + e), 0.0f);
    }
}

// The support query names the CPU implementations and agrees with the call.
TEST(KvCache, SupportNamesTheImplementation) {
  KvProblem pr(KvCase{.name = "support", .seqlens = {1, 2, 3}});
  std::string name;
  EXPECT_EQ(forward_with_kvcache_support(pr.q.view(), pr.kc.view(), pr.vc.view(), pr.out.view(),
                                         pr.lse.view(), pr.opt, &name), "");
  EXPECT_EQ(name, "cpu::flash_forward_with_kvcache");
  pr.opt.backend = Backend::kCpuReference;
  EXPECT_EQ(forward_with_kvcache_support(pr.q.view(), pr.kc.view(), pr.vc.view(), pr.out.view(),
                                         pr.lse.view(), pr.opt, &name), "");
  EXPECT_EQ(name, "cpu::reference_forward_with_kvcache");
  pr.opt.backend = Backend::kCuda;
  const std::string why = forward_with_kvcache_support(pr.q.view(), pr.kc.view(), pr.vc.view(),
                                                       pr.out.view(), pr.lse.view(), pr.opt, &name);
  EXPECT_NE(why.find("fa4::forward_with_kvcache: options.backend = kCuda ('cuda') needs CUDA tensors"),
            std::string::npos) << why;
  EXPECT_EQ(name, "");
}

}  // namespace
}  // namespace fa4::test
