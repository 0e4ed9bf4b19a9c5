// tests/cpu/test_cpu_attention.cpp — accuracy matrix of the CPU FlashAttention-4 implementation
// (src/cpu/flash_fwd.cpp, flash_bwd.cpp) against the float64 oracle, plus the fused-attention
// failure cases that apply to it (C01 C03 C06 C10 C12 C13 C14 C15 C16 C21 C25 C26 C32).
//
// Every check applies the project rule (tests/test_util.h) to O, LSE, dQ, dK, dV and dsink:
//   max|flash - ref64| <= 2 * max|naive_same_precision - ref64| + atol, NaN never passes
//   (for fp32 with an exp2 emulation share the naive baseline uses the same exp2 polynomial, see
//   tests/accuracy_check.h run_naive),
// and every element the oracle does not write (varlen padding rows, gaps between heads of padded
// outputs, dk/dv rows past seqused_k) must keep its poison bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/cpu_attention.h"
#include "cpu/naive_attention.h"
#include "fa4/attention.h"
#include "fa4/error.h"
#include "core/exp2.h"
#include "accuracy_check.h"
#include "test_util.h"

namespace fa4::test {
namespace {

using detail::BwdParams;

constexpr int64_t kPadRows = 3;  // varlen buffers: rows past the last sequence (must stay untouched)
constexpr int64_t kPadCols = 8;  // padded outputs: gap after each head (no store may land there)
constexpr double kLog2e = 1.4426950408889634;

struct Case {
  std::string name;
  DType dtype = DType::kBF16;
  int batch = 2, sq = 65, sk = 65, h = 4, hkv = 2, d = 64, dv = 0;  // dv 0: = d
  bool causal = false;
  int wl = -1, wr = -1;
  float softcap = 0.0f;
  bool sink = false;
  std::optional<float> scale;
  std::vector<int> lens_q, lens_k, used_k;  // varlen when lens_q is non-empty
  bool packed_qkv = false, padded_out = false;
  float tau = 8.0f;
  std::optional<float> exp2_fraction;
  bool backward = true;
};

/// Strides of a (batch, row, head, width) buffer.
struct Layout {
  int64_t offset = 0;
  detail::RowStrides s;
};

/// All tensors of one problem, filled and poisoned, with BwdParams pointing at them.
struct Problem {
  Case c;
  bool varlen = false;
  int64_t rows_q = 0, rows_k = 0;  // rows per batch entry (batched) or total rows (varlen)
  HostTensor qkv, q, k, v, out, lse, dout, dq, dk, dv, sink, dsink;
  std::vector<int32_t> cu_q, cu_k, used;
  BwdParams p{};

  explicit Problem(const Case& cs) : c(cs) {
    if (c.dv == 0) c.dv = c.d;
    varlen = !c.lens_q.empty();
    if (varlen) {
      c.batch = int(c.lens_q.size());
      cu_q.assign(1, 0);
      cu_k.assign(1, 0);
      for (int b = 0; b < c.batch; ++b) {
        cu_q.push_back(cu_q.back() + c.lens_q[b]);
        cu_k.push_back(cu_k.back() + c.lens_k[b]);
      }
      used = c.used_k.empty() ? std::vector<int32_t>(c.lens_k.begin(), c.lens_k.end())
                              : std::vector<int32_t>(c.used_k.begin(), c.used_k.end());
      rows_q = cu_q.back() + kPadRows;
      rows_k = cu_k.back() + kPadRows;
      c.sq = *std::max_element(c.lens_q.begin(), c.lens_q.end());
      c.sk = *std::max_element(c.lens_k.begin(), c.lens_k.end());
    } else {
      rows_q = c.sq;
      rows_k = c.sk;
    }
    const int64_t B = varlen ? 1 : c.batch;
    auto layout = [&](int64_t rows, int64_t heads, int64_t width, int64_t offset) {
      Layout l;
      l.offset = offset;
      l.s.head = width;
      l.s.row = heads * width;
      l.s.batch = varlen ? 0 : rows * heads * width;
      return l;
    };
    Layout lq, lk, lv;
    if (c.packed_qkv) {  // q, k, v: views of one (.., h + 2 hkv, d) buffer (strided inputs)
      const int64_t ht = c.h + 2 * c.hkv;
      qkv = HostTensor(c.dtype, {B, rows_q, ht, c.d});
      fill_normal(qkv);
      lq = layout(rows_q, ht, c.d, 0);
      lk = layout(rows_k, ht, c.d, int64_t(c.h) * c.d);
      lv = layout(rows_k, ht, c.d, int64_t(c.h + c.hkv) * c.d);
    } else {
      q = HostTensor(c.dtype, {B, rows_q, c.h, c.d});
      k = HostTensor(c.dtype, {B, rows_k, c.hkv, c.d});
      v = HostTensor(c.dtype, {B, rows_k, c.hkv, c.dv});
      fill_normal(q);
      fill_normal(k);
      fill_normal(v);
      lq = layout(rows_q, c.h, c.d, 0);
      lk = layout(rows_k, c.hkv, c.d, 0);
      lv = layout(rows_k, c.hkv, c.dv, 0);
    }
    const int64_t pad = c.padded_out ? kPadCols : 0;
    out = HostTensor(c.dtype, {B, rows_q, c.h, c.dv + pad});
    dq = HostTensor(c.dtype, {B, rows_q, c.h, c.d + pad});
    dk = HostTensor(c.dtype, {B, rows_k, c.hkv, c.d + pad});
    dv = HostTensor(c.dtype, {B, rows_k, c.hkv, c.dv + pad});
    dout = HostTensor(c.dtype, {B, rows_q, c.h, c.dv});
    fill_normal(dout);
    lse = HostTensor(DType::kFP32, {B, c.h, rows_q});
    sink = HostTensor(DType::kFP32, {c.h});
    dsink = HostTensor(DType::kFP32, {c.h});
    fill_normal(sink);

    BwdParams& P = p;
    P.dtype = c.dtype;
    P.batch = c.batch;
    P.num_heads = c.h;
    P.num_heads_kv = c.hkv;
    P.headdim = c.d;
    P.headdim_v = c.dv;
    P.seqlen_q = c.sq;
    P.seqlen_k = c.sk;
    P.total_q = varlen ? rows_q : int64_t(c.batch) * c.sq;
    P.total_k = varlen ? rows_k : int64_t(c.batch) * c.sk;
    auto base = [&](HostTensor& t, const Layout& l) {
      return static_cast<uint8_t*>(t.data()) + l.offset * dtype_size(c.dtype);
    };
    HostTensor& qb = c.packed_qkv ? qkv : q;
    HostTensor& kb = c.packed_qkv ? qkv : k;
    HostTensor& vb = c.packed_qkv ? qkv : v;
    P.q = base(qb, lq);
    P.k = base(kb, lk);
    P.v = base(vb, lv);
    P.q_stride = lq.s;
    P.k_stride = lk.s;
    P.v_stride = lv.s;
    P.out = out.data();
    P.out_stride = layout(rows_q, c.h, c.dv + pad, 0).s;
    P.dq = dq.data();
    P.dq_stride = layout(rows_q, c.h, c.d + pad, 0).s;
    P.dk = dk.data();
    P.dk_stride = layout(rows_k, c.hkv, c.d + pad, 0).s;
    P.dv = dv.data();
    P.dv_stride = layout(rows_k, c.hkv, c.dv + pad, 0).s;
    P.dout = dout.data();
    P.dout_stride = layout(rows_q, c.h, c.dv, 0).s;
    P.lse = static_cast<float*>(lse.data());
    P.lse_batch_stride = varlen ? 0 : int64_t(c.h) * rows_q;
    P.lse_head_stride = rows_q;
    P.lse_row_stride = 1;
    P.is_varlen = varlen;
    if (varlen) {
      P.cu_seqlens_q = cu_q.data();
      P.cu_seqlens_k = cu_k.data();
      P.seqused_k = c.used_k.empty() ? nullptr : used.data();
    }
    P.sink = c.sink ? static_cast<const float*>(sink.data()) : nullptr;
    P.dsink = c.sink ? static_cast<float*>(dsink.data()) : nullptr;
    P.softmax_scale = c.scale ? *c.scale : float(1.0 / std::sqrt(double(c.d)));
    P.softmax_scale_log2 = float(double(P.softmax_scale) * kLog2e);
    P.softcap = c.softcap;
    P.causal = c.causal;
    P.mask.window_left = c.wl;
    P.mask.window_right = c.causal ? 0 : c.wr;
    P.rescale_threshold = c.tau;
    if (c.exp2_fraction) {
      P.exp2_fraction_given = true;
      P.exp2_emulation = Exp2Emulation{16, int32_t(std::lround(*c.exp2_fraction * 16))};
    }
    if (varlen) poison_unused_input_rows();
  }

  /// Varlen: every q/k/v/dout row outside the sequences (padding, k rows past seqused_k) holds NaN,
  /// so reading it anywhere would show (cases C12, C13).
  void poison_unused_input_rows() {
    std::vector<uint8_t> q_used(rows_q, 0), k_used(rows_k, 0);
    for (int b = 0; b < c.batch; ++b) {
      for (int64_t r = cu_q[b]; r < cu_q[b + 1]; ++r) q_used[r] = 1;
      for (int64_t r = cu_k[b]; r < cu_k[b] + used[b]; ++r) k_used[r] = 1;
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto poison_rows = [&](const void* base, const detail::RowStrides& s, int heads, int width,
                           const std::vector<uint8_t>& keep) {
      for (int64_t r = 0; r < int64_t(keep.size()); ++r) {
        if (keep[r]) continue;
        for (int h = 0; h < heads; ++h)
          for (int e = 0; e < width; ++e)
            detail::store_from_float(const_cast<void*>(base), c.dtype, r * s.row + h * s.head + e, nan);
      }
    };
    poison_rows(p.q, p.q_stride, c.h, c.d, q_used);
    poison_rows(p.k, p.k_stride, c.hkv, c.d, k_used);
    poison_rows(p.v, p.v_stride, c.hkv, c.dv, k_used);
    poison_rows(p.dout, p.dout_stride, c.h, c.dv, q_used);
  }

  void poison_outputs() {
    for (HostTensor* t : {&out, &lse, &dq, &dk, &dv, &dsink}) fill_poison(*t);
  }
};

/// Results of the oracle (or the same-precision naive run) as float64 mirrors.
/// The exp2 emulation share the CPU forward applies to this problem.
Exp2Emulation effective_exp2_emulation(const Problem& pr) {
  return pr.p.exp2_fraction_given ? pr.p.exp2_emulation : cpu::default_exp2_emulation(pr.p.dtype);
}

/// Runs forward (+ backward) of a case through the CPU FA4 implementation and checks every output
/// (tests/accuracy_check.h: the judgement `fa4 check` uses too).
std::vector<Accuracy> run_and_check(Problem& pr) {
  pr.poison_outputs();
  HostTensor out0 = pr.out, lse0 = pr.lse, dq0 = pr.dq, dk0 = pr.dk, dv0 = pr.dv, ds0 = pr.dsink;
  cpu::flash_forward(pr.p);
  if (pr.c.backward) cpu::flash_backward(pr.p);
  const OutputSet tested{&pr.out, &pr.lse, &pr.dq, &pr.dk, &pr.dv, &pr.dsink};
  const OutputSet poisoned{&out0, &lse0, &dq0, &dk0, &dv0, &ds0};
  const double vmax = max_abs_finite(pr.c.packed_qkv ? pr.qkv : pr.v);
  return check_outputs(pr.p, tested, poisoned, pr.c.backward, pr.c.sink, effective_exp2_emulation(pr), vmax);
}

void expect_all_ok(const std::string& name, const std::vector<Accuracy>& acc) {
  std::string line = "[accuracy] " + name;
  for (const Accuracy& a : acc) {
    EXPECT_TRUE(a.ok()) << name << " " << a.str();
    char buf[96];
    std::snprintf(buf, sizeof buf, " | %s %.2e/%.2e", a.name.c_str(), a.err, a.bound());
    line += buf;
  }
  std::printf("%s\n", line.c_str());
}

// ------------------------------------------------------------------------------------------------
// The matrix.

std::vector<Case> matrix() {
  std::vector<Case> v;
  auto add = [&](Case c) { v.push_back(std::move(c)); };
  const DType bf = DType::kBF16, hf = DType::kFP16, f32 = DType::kFP32;
  // Head dims, dtypes, MHA / GQA / MQA, seqlen_q != seqlen_k both ways.
  add({.name = "bf16_d64_mha_65", .dtype = bf, .h = 2, .hkv = 2});
  add({.name = "fp16_d32_mqa_17x113", .dtype = hf, .sq = 17, .sk = 113, .h = 3, .hkv = 1, .d = 32});
  add({.name = "fp32_d96_gqa_113x17", .dtype = f32, .sq = 113, .sk = 17, .d = 96});
  add({.name = "bf16_d128_gqa_causal_129", .dtype = bf, .sq = 129, .sk = 129, .d = 128, .causal = true});
  add({.name = "fp16_d256_63x127_window", .dtype = hf, .batch = 1, .sq = 63, .sk = 127, .h = 2,
       .hkv = 1, .d = 256, .wl = 16, .wr = 8});
  add({.name = "bf16_d192_dv128_causal_127", .dtype = bf, .batch = 1, .sq = 127, .sk = 127, .d = 192,
       .dv = 128, .causal = true});
  add({.name = "fp16_d64_dv128_129x65", .dtype = hf, .sq = 129, .sk = 65, .d = 64, .dv = 128});
  add({.name = "bf16_d128_dv64_65x129", .dtype = bf, .sq = 65, .sk = 129, .d = 128, .dv = 64});
  add({.name = "fp32_d72_causal_sq_gt_sk", .dtype = f32, .sq = 113, .sk = 17, .d = 72, .causal = true});
  add({.name = "bf16_d40_window00", .dtype = bf, .sq = 65, .sk = 65, .d = 40, .wl = 0, .wr = 0});
  add({.name = "fp16_d104_window_m1_0", .dtype = hf, .sq = 63, .sk = 129, .d = 104, .wl = -1, .wr = 0});
  add({.name = "bf16_d72_padded_out", .dtype = bf, .sq = 113, .sk = 113, .d = 72, .padded_out = true});
  add({.name = "fp32_d128_seq1", .dtype = f32, .sq = 1, .sk = 1, .d = 128});
  add({.name = "fp16_decode_1x1023_gqa", .dtype = hf, .batch = 2, .sq = 1, .sk = 1023, .h = 8,
       .hkv = 2, .d = 128});
  add({.name = "bf16_d128_causal_1023", .dtype = bf, .batch = 1, .sq = 1023, .sk = 1023, .h = 2,
       .hkv = 1, .d = 128, .causal = true});
  add({.name = "fp32_d64_1023", .dtype = f32, .batch = 1, .sq = 1023, .sk = 1023, .h = 1, .hkv = 1});
  // seqlen_k == 0: every row fully masked (with and without a sink).
  add({.name = "bf16_seqlen_k0", .dtype = bf, .sq = 17, .sk = 0});
  add({.name = "fp32_seqlen_k0_sink", .dtype = f32, .sq = 5, .sk = 0, .sink = true});
  // Softcap, sink, combinations.
  add({.name = "bf16_softcap", .dtype = bf, .sq = 127, .sk = 129, .softcap = 2.5f});
  add({.name = "fp32_softcap_scale1", .dtype = f32, .sq = 65, .sk = 113, .d = 32, .softcap = 5.0f,
       .scale = 1.0f});
  add({.name = "bf16_sink_causal", .dtype = bf, .sq = 129, .sk = 65, .h = 16, .hkv = 4, .causal = true,
       .sink = true});
  add({.name = "fp32_sink", .dtype = f32, .sq = 63, .sk = 129, .h = 16, .hkv = 2, .sink = true});
  add({.name = "fp16_sink_softcap_window", .dtype = hf, .sq = 113, .sk = 113, .h = 16, .wl = 20, .wr = 3,
       .softcap = 4.0f, .sink = true});
  // Varlen: zero-length and length-1 sequences, seqused_k, padding rows (C12, C13).
  add({.name = "bf16_varlen_causal_gqa", .dtype = bf, .h = 4, .hkv = 2, .causal = true,
       .lens_q = {0, 1, 17, 65, 129, 3}, .lens_k = {3, 1, 63, 65, 200, 0},
       .used_k = {3, 1, 50, 65, 129, 0}, .padded_out = true});
  add({.name = "fp16_varlen_window_sink", .dtype = hf, .h = 16, .hkv = 1, .d = 72, .wl = 30, .wr = 10,
       .sink = true, .lens_q = {113, 0, 1}, .lens_k = {127, 4, 1}});
  add({.name = "fp32_varlen_noncausal", .dtype = f32, .h = 3, .hkv = 1, .d = 40,
       .lens_q = {17, 1, 63}, .lens_k = {129, 0, 65}, .used_k = {100, 0, 65}});
  // C10, exact input: q lengths [0,1,0,1], k lengths [0,3,0,5], Hq=9, Hkv=3, D=64, causal, scale 1.
  add({.name = "C10_varlen_decode_gqa", .dtype = bf, .h = 9, .hkv = 3, .d = 64, .causal = true,
       .scale = 1.0f, .lens_q = {0, 1, 0, 1}, .lens_k = {0, 3, 0, 5}});
  // Strided inputs: q/k/v as views of one packed qkv tensor.
  add({.name = "bf16_packed_qkv", .dtype = bf, .sq = 129, .sk = 129, .packed_qkv = true});
  add({.name = "fp16_packed_qkv_varlen_causal", .dtype = hf, .h = 2, .hkv = 1, .causal = true,
       .lens_q = {65, 1, 113}, .lens_k = {65, 1, 113}, .packed_qkv = true});
  // Lazy rescaling threshold and exp2 emulation share: all settings must be correct.
  for (DType dt : {bf, f32}) {
    const std::string n = dt == bf ? "bf16" : "fp32";
    for (float tau : {0.0f, 8.0f})
      for (float frac : {0.0f, 0.125f, 1.0f})
        add({.name = n + "_tau" + std::to_string(int(tau)) + "_emu" + std::to_string(int(frac * 16)),
             .dtype = dt, .batch = 1, .sq = 129, .sk = 257, .h = 2, .hkv = 1, .causal = true,
             .tau = tau, .exp2_fraction = frac});
  }
  // C32: softmax_scale None / 1 / 0.01 / 10 (d = 72), forward and backward. fp32: with logits of
  // O(100) a 16-bit naive baseline (S rounded to the dtype) is so poor that the rule would say
  // little; the fp32 baseline keeps it tight.
  for (float s : {0.0f, 1.0f, 0.01f, 10.0f}) {
    Case c{.name = "C32_scale_" + std::to_string(s).substr(0, 4), .dtype = f32, .sq = 65, .sk = 129,
           .d = 72};
    if (s > 0) c.scale = s;
    for (char& ch : c.name)
      if (ch == '.') ch = 'p';
    add(c);
  }
  return v;
}

class Matrix : public ::testing::TestWithParam<Case> {};

TEST_P(Matrix, MatchesFloat64Reference) {
  Problem pr(GetParam());
  expect_all_ok(GetParam().name, run_and_check(pr));
}

INSTANTIATE_TEST_SUITE_P(Cpu, Matrix, ::testing::ValuesIn(matrix()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace fa4::test

namespace fa4::test {
namespace {

// ------------------------------------------------------------------------------------------------
// Targeted cases.

/// Element offset of (b, row, h, 0) of a tensor with strides s in problem pr.
int64_t at(const Problem& pr, const detail::RowStrides& s, int b, int64_t row, int h) {
  return cpu::naive::row_offset(pr.p, s, b, row, h);
}
void set_row(Problem& pr, const void* base, const detail::RowStrides& s, int b, int64_t row, int h,
             int width, const std::function<float(int)>& f) {
  for (int e = 0; e < width; ++e)
    detail::store_from_float(const_cast<void*>(base), pr.c.dtype, at(pr, s, b, row, h) + e, f(e));
}
bool row_bits_equal(const HostTensor& a, const HostTensor& b, int64_t off, int width) {
  for (int e = 0; e < width; ++e)
    if (!a.element_bits_equal(b, off + e)) return false;
  return true;
}
void run_flash(Problem& pr) {
  pr.poison_outputs();
  cpu::flash_forward(pr.p);
  if (pr.c.backward) cpu::flash_backward(pr.p);
}

// C03a: a NaN in a key (k and v rows) that a query does not see leaves that query's out, lse and
// dq bitwise unchanged — including queries in the same tile as queries that do see it — while the
// queries that see it get NaN.
TEST(CpuCases, C03a_MaskedNanKeyDoesNotLeak) {
  for (DType dt : {DType::kBF16, DType::kFP32}) {
    Problem pr({.name = "c03a", .dtype = dt, .batch = 1, .sq = 200, .sk = 200, .h = 2, .hkv = 1,
                .wl = 4, .wr = 4});
    run_flash(pr);
    const HostTensor out0 = pr.out, lse0 = pr.lse, dq0 = pr.dq;
    constexpr int kNanKey = 100;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    set_row(pr, pr.p.k, pr.p.k_stride, 0, kNanKey, 0, pr.c.d, [&](int) { return nan; });
    set_row(pr, pr.p.v, pr.p.v_stride, 0, kNanKey, 0, pr.c.dv, [&](int) { return nan; });
    run_flash(pr);
    int seen = 0, unseen = 0;
    for (int h = 0; h < pr.c.h; ++h) {
      for (int64_t i = 0; i < pr.c.sq; ++i) {
        const int64_t oo = at(pr, pr.p.out_stride, 0, i, h), qo = at(pr, pr.p.dq_stride, 0, i, h);
        const int64_t lo = cpu::naive::lse_offset(pr.p, 0, i, h);
        if (detail::key_visible(i, kNanKey, pr.c.sq, pr.c.sk, pr.p.mask)) {
          ++seen;
          EXPECT_TRUE(std::isnan(pr.out.get(oo))) << "row " << i << " sees the NaN key";
        } else {
          ++unseen;
          ASSERT_TRUE(row_bits_equal(pr.out, out0, oo, pr.c.dv)) << "out row " << i << " h " << h;
          ASSERT_TRUE(row_bits_equal(pr.lse, lse0, lo, 1)) << "lse row " << i;
          ASSERT_TRUE(row_bits_equal(pr.dq, dq0, qo, pr.c.d)) << "dq row " << i;
        }
      }
    }
    EXPECT_GT(seen, 0);
    EXPECT_GT(unseen, 0);
  }
}

// C03b: a query full of NaN is data, not a fully masked row: its out and lse are NaN.
TEST(CpuCases, C03b_NanQueryGivesNan) {
  Problem pr({.name = "c03b", .dtype = DType::kFP32, .batch = 2, .sq = 16, .sk = 16, .h = 4,
              .hkv = 4, .d = 8});
  fill_poison(pr.q);  // every q element NaN
  run_flash(pr);
  for (int64_t i = 0; i < pr.out.numel(); ++i) ASSERT_TRUE(std::isnan(pr.out.get(i))) << i;
  for (int64_t i = 0; i < pr.lse.numel(); ++i) ASSERT_TRUE(std::isnan(pr.lse.get(i))) << i;
}

// C01 / C06: causal with seqlen_q > seqlen_k (bottom-right): rows 0..2 of Sq=5, Sk=2 see no key:
// out exactly 0, lse exactly -inf (or exactly the sink), dq exactly 0, never NaN; rows 3 and 4
// see keys {0} and {0, 1} and match the reference (run_and_check).
TEST(CpuCases, C01_C06_FullyMaskedRows) {
  for (bool sink : {false, true}) {
    Problem pr({.name = "c06", .dtype = DType::kFP16, .batch = 1, .sq = 5, .sk = 2, .h = 2, .hkv = 1,
                .causal = true, .sink = sink});
    expect_all_ok(sink ? "C06_sink" : "C06", run_and_check(pr));
    for (int h = 0; h < pr.c.h; ++h) {
      for (int64_t i = 0; i < 3; ++i) {
        for (int e = 0; e < pr.c.dv; ++e) EXPECT_EQ(pr.out.get(at(pr, pr.p.out_stride, 0, i, h) + e), 0.0f);
        for (int e = 0; e < pr.c.d; ++e) EXPECT_EQ(pr.dq.get(at(pr, pr.p.dq_stride, 0, i, h) + e), 0.0f);
        const float lse = pr.lse.get(cpu::naive::lse_offset(pr.p, 0, i, h));
        if (sink) EXPECT_EQ(lse, pr.sink.get(h));
        else EXPECT_EQ(lse, -std::numeric_limits<float>::infinity());
      }
    }
  }
}

// C16: at d = 128, changing only channels >= 64 of q (or of k) changes the output.
TEST(CpuCases, C16_HighChannelsMatter) {
  for (bool change_k : {false, true}) {
    Problem pr({.name = "c16", .dtype = DType::kBF16, .batch = 1, .sq = 65, .sk = 65, .h = 2,
                .hkv = 2, .d = 128, .backward = false});
    run_flash(pr);
    const HostTensor out0 = pr.out;
    HostTensor& t = change_k ? pr.k : pr.q;
    const int64_t d = pr.c.d;
    HostTensor noise(t.dtype(), {t.numel()});
    fill_normal(noise);
    for (int64_t i = 0; i < t.numel(); ++i)
      if (i % d >= 64) t.set(i, noise.get(i));
    run_flash(pr);
    EXPECT_FALSE(pr.out.bitwise_equal(out0)) << (change_k ? "k" : "q") << " channels >= 64 ignored";
    expect_all_ok(change_k ? "C16_k" : "C16_q", run_and_check(pr));
  }
}

// C26 / C27: forward and backward are bitwise reproducible (GQA, causal, varlen).
TEST(CpuCases, C26_Deterministic) {
  Problem pr({.name = "c26", .dtype = DType::kBF16, .h = 8, .hkv = 2, .d = 64, .causal = true,
              .lens_q = {129, 1, 300}, .lens_k = {200, 7, 300}});
  run_flash(pr);
  const HostTensor out0 = pr.out, lse0 = pr.lse, dq0 = pr.dq, dk0 = pr.dk, dv0 = pr.dv;
  for (int rep = 0; rep < 3; ++rep) {
    run_flash(pr);
    EXPECT_TRUE(pr.out.bitwise_equal(out0));
    EXPECT_TRUE(pr.lse.bitwise_equal(lse0));
    EXPECT_TRUE(pr.dq.bitwise_equal(dq0));
    EXPECT_TRUE(pr.dk.bitwise_equal(dk0));
    EXPECT_TRUE(pr.dv.bitwise_equal(dv0));
  }
}

// C25: batch invariance. Changing sequence 0 (its data and its seqused_k) leaves every output row of
// sequences 1 and 2 bitwise unchanged.
TEST(CpuCases, C25_BatchInvariant) {
  Problem pr({.name = "c25", .dtype = DType::kBF16, .h = 4, .hkv = 2, .d = 64, .lens_q = {1, 1, 1},
              .lens_k = {900, 120, 500}, .used_k = {900, 120, 500}});
  run_flash(pr);
  const HostTensor out0 = pr.out, lse0 = pr.lse, dq0 = pr.dq, dk0 = pr.dk, dv0 = pr.dv;
  pr.used[0] = 800;
  for (int64_t j = 0; j < 800; ++j)
    for (int h = 0; h < pr.c.hkv; ++h)
      set_row(pr, pr.p.k, pr.p.k_stride, 0, j, h, pr.c.d, [&](int e) { return 0.01f * float(e + j % 7); });
  run_flash(pr);
  for (int b = 1; b < 3; ++b) {
    for (int h = 0; h < pr.c.h; ++h) {
      const int64_t row = pr.cu_q[b];
      EXPECT_TRUE(row_bits_equal(pr.out, out0, at(pr, pr.p.out_stride, b, row, h), pr.c.dv));
      EXPECT_TRUE(row_bits_equal(pr.lse, lse0, cpu::naive::lse_offset(pr.p, b, row, h), 1));
      EXPECT_TRUE(row_bits_equal(pr.dq, dq0, at(pr, pr.p.dq_stride, b, row, h), pr.c.d));
    }
    for (int64_t j = pr.cu_k[b]; j < pr.cu_k[b] + pr.used[b]; ++j)
      for (int h = 0; h < pr.c.hkv; ++h) {
        EXPECT_TRUE(row_bits_equal(pr.dk, dk0, at(pr, pr.p.dk_stride, b, j, h), pr.c.d));
        EXPECT_TRUE(row_bits_equal(pr.dv, dv0, at(pr, pr.p.dv_stride, b, j, h), pr.c.dv));
      }
  }
}

// Lazy rescaling (FA4 Sec. 3). Scores grow linearly along the keys: every query row's scaled logit
// at key j is slope * j (log2 units) plus a little noise, over 3 key tiles.
//  * slope * kCpuTileN > tau = 8: the max grows by more than tau from tile to tile, so tau = 8 must
//    rescale at EVERY tile exactly like tau = 0 — the two outputs are bitwise identical.
//  * slope * 3 * kCpuTileN < 8: tau = 8 never raises the first tile's max (P reaches ~2^6) while
//    tau = 0 rescales each tile: the outputs differ bitwise (the stale-max path ran), and both match
//    the float64 reference.
TEST(CpuCases, LazyRescalingTriggersExactly) {
  for (double slope : {0.1, 0.005}) {
    // Forward only: the rescaling is a forward mechanism, and the large key offsets built here
    // would make dQ hypersensitive to D = dO.O (the backward is covered by the matrix).
    Problem pr({.name = "lazy", .dtype = DType::kFP32, .batch = 1, .sq = 64, .sk = 3 * cpu::kCpuTileN,
                .h = 1, .hkv = 1, .d = 64, .tau = 0.0f, .exp2_fraction = 0.125f, .backward = false});
    const double per_key = slope / (kLog2e * pr.p.softmax_scale);  // q = e_0 => s_j = k_j[0]
    for (int64_t i = 0; i < pr.c.sq; ++i)
      set_row(pr, pr.p.q, pr.p.q_stride, 0, i, 0, pr.c.d, [&](int e) { return e == 0 ? 1.0f : 0.0f; });
    for (int64_t j = 0; j < pr.c.sk; ++j)
      set_row(pr, pr.p.k, pr.p.k_stride, 0, j, 0, pr.c.d, [&](int e) {
        return e == 0 ? float(per_key * double(j) + 0.01 * std::sin(double(j))) : 0.0f;
      });
    // The data really has the intended growth (log2 units) between consecutive key tiles.
    const double growth_per_tile = slope * cpu::kCpuTileN;
    const bool big = growth_per_tile > 8.0;
    if (!big) EXPECT_LT(growth_per_tile * 3, 8.0);
    HostTensor out_tau[2];
    for (int t = 0; t < 2; ++t) {
      pr.p.rescale_threshold = t == 0 ? 0.0f : 8.0f;
      expect_all_ok(std::string("lazy_") + (big ? "big" : "small") + "_tau" + (t ? "8" : "0"),
                    run_and_check(pr));
      out_tau[t] = pr.out;
    }
    if (big) EXPECT_TRUE(out_tau[0].bitwise_equal(out_tau[1])) << "tau=8 must rescale at every tile";
    else EXPECT_FALSE(out_tau[0].bitwise_equal(out_tau[1])) << "tau=8 never kept a stale max";
  }
}

// Backward's P <= 1 assertion (case C07): an lse that does not belong to the inputs is reported.
TEST(CpuCases, C07_BackwardRejectsForeignLse) {
  Problem pr({.name = "c07", .dtype = DType::kFP32, .batch = 1, .sq = 64, .sk = 192, .h = 4, .hkv = 2,
              .causal = true});
  run_flash(pr);
  for (int64_t i = 0; i < pr.lse.numel(); ++i)
    if (std::isfinite(pr.lse.get(i))) pr.lse.set(i, pr.lse.get(i) - 10.0f);  // P scaled by e^10
  EXPECT_THROW(cpu::flash_backward(pr.p), fa4::Error);
}

// C08, checked without core/mask.h (which the kernels and both oracles share): window (0, 0)
// lets query i see key i + seqlen_k - seqlen_q alone (bottom-right), so out[i] is that key's v
// row bitwise (P = exp2(0) = 1) and lse[i] its logit; rows with no such key give 0 and -inf.
TEST(CpuCases, C08_WindowZeroZeroIsTheDiagonalAlone) {
  constexpr int64_t d = 8, h = 2;
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{7, 7}, {5, 7}, {7, 5}}) {
    SCOPED_TRACE(std::to_string(sq) + "x" + std::to_string(sk));
    std::vector<float> q(sq * h * d), k(sk * h * d), v(sk * h * d), out(sq * h * d), lse(h * sq);
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.3f * float(i));
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = std::cos(0.7f * float(i));
      v[i] = std::sin(1.1f * float(i) + 0.2f);
    }
    std::fill(out.begin(), out.end(), std::nanf(""));
    std::fill(lse.begin(), lse.end(), std::nanf(""));
    AttentionOptions o;
    o.window_size_left = o.window_size_right = 0;
    o.softmax_scale = 0.5f;
    for (Backend be : {Backend::kCpu, Backend::kCpuReference}) {
      o.backend = be;
      forward(f32_view(q, {1, sq, h, d}), f32_view(k, {1, sk, h, d}), f32_view(v, {1, sk, h, d}),
              f32_view(out, {1, sq, h, d}), f32_view(lse, {1, h, sq}), o);
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t hh = 0; hh < h; ++hh) {
          const int64_t j = i + sk - sq;  // the one visible key
          const float* o_row = out.data() + (i * h + hh) * d;
          if (j < 0) {
            EXPECT_EQ(lse[hh * sq + i], -std::numeric_limits<float>::infinity()) << i;
            for (int64_t e = 0; e < d; ++e) EXPECT_EQ(o_row[e], 0.0f) << i;
            continue;
          }
          double logit = 0.0;
          for (int64_t e = 0; e < d; ++e) logit += double(q[(i * h + hh) * d + e]) * k[(j * h + hh) * d + e];
          EXPECT_NEAR(lse[hh * sq + i], 0.5 * logit, 1e-5) << i << " " << hh;
          for (int64_t e = 0; e < d; ++e)
            EXPECT_EQ(o_row[e], v[(j * h + hh) * d + e]) << i << " " << hh << " " << e;
        }
    }
  }
}

// Logits of 2.5e5 and 1e6 (fp32, scale 1): the forward's fp32 lse is then exact to only ~1e-2,
// which the recomputed P inherits (flash-attn's backward too). The backward must neither call that
// a foreign lse (the P <= 1 check allows for the lse's rounding) nor stray further: P = (1, 0),
// so dv = (dout, 0), and dS = P (dP - D) = 0 gives dq = dk = 0.
TEST(CpuCases, LargeLogitsBackwardWithinTheLseRounding) {
  for (float x : {500.0f, 1000.0f}) {
    SCOPED_TRACE(x);
    constexpr int64_t d = 8;
    std::vector<float> q(d, 0.0f), k(2 * d, 0.0f), v(2 * d, 0.0f), dout(d, 0.0f), out(d), lse(1),
        dq(d), dk(2 * d), dv(2 * d);
    q[0] = x;
    k[0] = x;          // key 0: logit x^2
    k[d] = x / 2;      // key 1: logit x^2 / 2
    for (int64_t e = 0; e < d; ++e) v[e] = 1.0f, v[d + e] = 2.0f, dout[e] = 1.0f;
    auto t4 = [](std::vector<float>& a, int64_t s) { return f32_view(a, {1, s, 1, d}); };
    BackwardOptions o;
    o.softmax_scale = 1.0f;
    o.backend = Backend::kCpu;
    const TensorView lse_v = f32_view(lse, {1, 1, 1});
    forward(t4(q, 1), t4(k, 2), t4(v, 2), t4(out, 1), lse_v, o);
    ASSERT_NEAR(lse[0], x * x, x * x * 1e-6f);
    for (std::vector<float>* g : {&dq, &dk, &dv}) std::fill(g->begin(), g->end(), std::nanf(""));
    ASSERT_NO_THROW(backward(t4(dout, 1), t4(q, 1), t4(k, 2), t4(v, 2), t4(out, 1), lse_v, t4(dq, 1),
                             t4(dk, 2), t4(dv, 2), o));
    for (int64_t e = 0; e < d; ++e) {
      EXPECT_NEAR(dv[e], 1.0f, 0.05f) << e;
      EXPECT_EQ(dv[d + e], 0.0f) << e;
      EXPECT_NEAR(dq[e], 0.0f, 1e-3f * x) << e;
      EXPECT_NEAR(dk[e], 0.0f, 1e-3f * x) << e;
      EXPECT_EQ(dk[d + e], 0.0f) << e;
    }
  }
}

// Logits up to 5e11 (fp32, scale 1/2): m * scale * log2(e) is then rounded by up to 2^15, more
// than exp2 takes before it overflows (128) and than the software exp2's domain (127). Such a row
// is one-hot on its largest logit: out is that key's v row and lse its logit, never NaN. The
// logits rise to the middle of the sequence (the running max is raised tile after tile) and fall
// after it; one query's logits are all negative (about -5e9).
TEST(CpuCases, HugeLogitsForwardIsOneHot) {
  constexpr int64_t d = 8, sk = 300, peak = 150;
  const std::vector<float> qs = {1e8f, 1e10f, 1e12f, -1e10f};
  const int64_t sq = int64_t(qs.size());
  std::vector<float> q(sq * d, 0.0f), k(sk * d, 0.0f), v(sk * d), out(sq * d), lse(sq);
  for (int64_t i = 0; i < sq; ++i) q[i * d] = qs[size_t(i)];
  for (int64_t j = 0; j < sk; ++j) {
    k[j * d] = 1.0f - 0.5f * float(std::abs(j - peak)) / float(sk);  // in (0.5, 1], 1 at the peak
    for (int64_t e = 0; e < d; ++e) v[j * d + e] = float(j) + 0.125f * float(e);
  }
  for (float fraction : {0.0f, 0.5f}) {
    for (Backend be : {Backend::kCpu, Backend::kCpuReference}) {
      SCOPED_TRACE(std::string(be == Backend::kCpu ? "cpu" : "reference") + " exp2 share " +
                   std::to_string(fraction));
      std::fill(out.begin(), out.end(), std::nanf(""));
      std::fill(lse.begin(), lse.end(), std::nanf(""));
      AttentionOptions o;
      o.softmax_scale = 0.5f;
      o.exp2_emulation_fraction = fraction;
      o.backend = be;
      forward(f32_view(q, {1, sq, 1, d}), f32_view(k, {1, sk, 1, d}), f32_view(v, {1, sk, 1, d}),
              f32_view(out, {1, sq, 1, d}), f32_view(lse, {1, 1, sq}), o);
      for (int64_t i = 0; i < sq; ++i) {
        int64_t jmax = 0;  // the largest logit q k_j (no ties: the gaps are >= |q| / 600)
        for (int64_t j = 1; j < sk; ++j)
          if (q[i * d] * k[j * d] > q[i * d] * k[jmax * d]) jmax = j;
        const double logit = 0.5 * double(q[i * d]) * double(k[jmax * d]);
        EXPECT_NEAR(lse[i], logit, std::fabs(logit) * 1e-6) << "query " << i;
        for (int64_t e = 0; e < d; ++e)
          EXPECT_EQ(out[i * d + e], v[jmax * d + e]) << "query " << i << " channel " << e;
      }
    }
  }
}

// Large logits whose max rises by one ulp per key tile: tile t (128 keys) holds the scores
// 1e6 + t/16 + i/32, i = 0..127 (fp32, exact: q = e0, k_j = s_j e0, scale 1), so with tau 0 the
// running max moves at every tile while every tile keeps about the same weight. Each tile's P
// must be taken against the shift the rescale factor assumes: with P = 2^(s*mult - round(m*mult))
// and the factor 2^((m_old - m_new)*mult), earlier tiles were weighted wrong by up to 2^(1/16).
// Against float64 softmax of the same scores: out within 1e-5 (v = the tile index), lse within
// 2 ulps.
TEST(CpuCases, RisingMaxAtLargeLogitsKeepsTheTilesWeights) {
  constexpr int64_t d = 8, sk = 512;
  std::vector<float> q(d, 0.0f), k(sk * d, 0.0f), v(sk * d), out(d), lse(1);
  q[0] = 1.0f;
  std::vector<double> w(sk);
  for (int64_t j = 0; j < sk; ++j) {
    k[j * d] = 1e6f + float(j / 128) / 16.0f + float(j % 128) / 32.0f;
    for (int64_t e = 0; e < d; ++e) v[j * d + e] = float(j / 128) + 0.125f * float(e);
  }
  double wmax = 0.0, wsum = 0.0;
  for (int64_t j = 0; j < sk; ++j) wmax = std::max(wmax, double(k[j * d]));
  for (int64_t j = 0; j < sk; ++j) wsum += (w[j] = std::exp(double(k[j * d]) - wmax));
  for (float tau : {0.0f, 8.0f}) {
    for (float fraction : {0.0f, 0.5f}) {
      SCOPED_TRACE("tau " + std::to_string(tau) + " exp2 share " + std::to_string(fraction));
      std::fill(out.begin(), out.end(), std::nanf(""));
      AttentionOptions o;
      o.softmax_scale = 1.0f;
      o.rescale_threshold = tau;
      o.exp2_emulation_fraction = fraction;
      o.backend = Backend::kCpu;
      forward(f32_view(q, {1, 1, 1, d}), f32_view(k, {1, sk, 1, d}), f32_view(v, {1, sk, 1, d}),
              f32_view(out, {1, 1, 1, d}), f32_view(lse, {1, 1, 1}), o);
      EXPECT_NEAR(lse[0], wmax + std::log(wsum), 2 * 0.0625);
      for (int64_t e = 0; e < d; ++e) {
        double ref = 0.0;
        for (int64_t j = 0; j < sk; ++j) ref += w[j] * v[j * d + e];
        // The software exp2's relative error (8.6e-5) weighs in where half the keys use it.
        EXPECT_NEAR(out[e], ref / wsum, fraction > 0 ? 1e-3 : 1e-5) << "channel " << e;
      }
    }
  }
}

}  // namespace
}  // namespace fa4::test

namespace fa4::test {
namespace {

// Through the public API (validation + dispatch): fa4::forward / fa4::backward with Backend::kCpu
// run exactly the CPU FA4 implementation (bitwise equal to calling it on hand-built params), and
// kCpuReference the float64 oracle.
TEST(CpuApi, PublicEntryPointsRunTheCpuImplementations) {
  const Case c{.name = "api", .dtype = DType::kBF16, .batch = 2, .sq = 65, .sk = 129, .h = 4, .hkv = 2,
               .d = 64, .causal = true, .sink = true, .exp2_fraction = 0.125f};
  Problem pr(c);
  // Every output of pr, copied; `same` checks that pr's outputs equal a copy bitwise.
  struct Outputs {
    HostTensor out, lse, dq, dk, dv, dsink;
    explicit Outputs(const Problem& p) : out(p.out), lse(p.lse), dq(p.dq), dk(p.dk), dv(p.dv), dsink(p.dsink) {}
    void same(const Problem& p, const char* what) const {
      EXPECT_TRUE(p.out.bitwise_equal(out)) << what;
      EXPECT_TRUE(p.lse.bitwise_equal(lse)) << what;
      EXPECT_TRUE(p.dq.bitwise_equal(dq)) << what;
      EXPECT_TRUE(p.dk.bitwise_equal(dk)) << what;
      EXPECT_TRUE(p.dv.bitwise_equal(dv)) << what;
      EXPECT_TRUE(p.dsink.bitwise_equal(dsink)) << what;
    }
  };
  run_flash(pr);
  const Outputs flash(pr);

  BackwardOptions o;
  o.causal = true;
  o.sink = pr.sink.view();
  o.exp2_emulation_fraction = 0.125f;
  for (Backend be : {Backend::kCpu, Backend::kCpuReference}) {
    o.backend = be;
    pr.poison_outputs();
    forward(pr.q.view(), pr.k.view(), pr.v.view(), pr.out.view(), pr.lse.view(), o);
    backward(pr.dout.view(), pr.q.view(), pr.k.view(), pr.v.view(), pr.out.view(), pr.lse.view(),
             pr.dq.view(), pr.dk.view(), pr.dv.view(), o, pr.dsink.view());
    if (be == Backend::kCpu) {
      flash.same(pr, "kCpu vs cpu::flash_forward / flash_backward");
    } else {
      const Outputs api(pr);
      pr.poison_outputs();
      cpu::reference_forward(pr.p);
      cpu::reference_backward(pr.p);
      api.same(pr, "kCpuReference vs cpu::reference_forward / reference_backward");
      // And the oracle is not the CPU FA4 implementation (a dispatch that ran kCpu would pass the
      // comparisons above only if the two agreed bitwise, which 16-bit rounding rules out here).
      EXPECT_FALSE(api.out.bitwise_equal(flash.out));
    }
  }
}

// C32 through the public API: softmax_scale unset is 1/sqrt(headdim of q and k), never of
// headdim_v: bitwise the call with that scale given, and not the one with 1/sqrt(headdim_v).
TEST(CpuApi, DefaultScaleIsOneOverSqrtOfTheQkHeaddim) {
  constexpr int64_t sq = 9, sk = 13, h = 2, d = 72, dv = 40;
  std::vector<float> q(sq * h * d), k(sk * h * d), v(sk * h * dv);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.13f * float(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.29f * float(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.71f * float(i) + 0.4f);
  auto run = [&](std::optional<float> scale) {
    std::vector<float> out(sq * h * dv, std::nanf("")), lse(h * sq, std::nanf(""));
    AttentionOptions o;
    o.backend = Backend::kCpu;
    o.softmax_scale = scale;
    forward(f32_view(q, {1, sq, h, d}), f32_view(k, {1, sk, h, d}), f32_view(v, {1, sk, h, dv}),
            f32_view(out, {1, sq, h, dv}), f32_view(lse, {1, h, sq}), o);
    out.insert(out.end(), lse.begin(), lse.end());
    return out;
  };
  const std::vector<float> by_default = run(std::nullopt);
  EXPECT_EQ(by_default, run(float(1.0 / std::sqrt(double(d)))));
  EXPECT_NE(by_default, run(float(1.0 / std::sqrt(double(dv)))));
}

// Accuracy::ok() needs the expected count of written elements: an output the oracle did not
// write either (say, after a regression in the shared sequence bounds) fails instead of passing
// with nothing checked.
TEST(CpuApi, AccuracyCheckNeedsTheExpectedElements) {
  HostTensor out(DType::kFP32, {4}), poisoned(DType::kFP32, {4});
  fill_poison(out);
  fill_poison(poisoned);
  const Mirror none(4);
  const Accuracy a = check_accuracy("out", out, poisoned, none, none, DType::kFP32, 0.0, 4);
  EXPECT_EQ(a.checked, 0);
  EXPECT_FALSE(a.ok()) << a.str();
  const Accuracy b = check_accuracy("out", out, poisoned, none, none, DType::kFP32, 0.0, 0);
  EXPECT_TRUE(b.ok()) << b.str();
}

}  // namespace
}  // namespace fa4::test
