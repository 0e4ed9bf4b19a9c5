// tests/gpu/test_hopper_fwd.cu — the Hopper forward kernels against the GPU fp32 reference
// (gpu_reference.cuh) through the public fa4::forward (backend kCuda).
//
// Rule (project guide): max|out - ref| <= 2 * max|naive16 - ref| + atol, same for LSE; outputs are
// poisoned (NaN) before each run; rows outside every sequence must keep the poison; fully masked
// rows must be exactly O = 0 and LSE = -inf (or the sink); NaN only where the reference has NaN.
// Fused-attention cases covered: C01/C06 (fully masked rows), C03/C13 (tails, NaN past the keys),
// C08 (window sentinels), C10/C12 (varlen zero-length, untouched padding rows), C16 (every head dim
// uses all channels), C18/C20 (strided views, size-1 dims), C21 (GQA grouping), C27 (bitwise
// repeatability), C28 (empty problems), C32 (softmax_scale).
// Sanitizer subset: --gtest_filter='HopperFwd.Sanitize*' (see tests/gpu/README.md).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/validate.h"
#include "fa4/attention.h"
#include "core/constants.h"
#include "core/float16.h"
#include "hopper/fwd/tuning_fwd.h"
#include "hopper/hopper_api.h"
#include "hopper/shared/device_state.h"
#include "gpu/gpu_reference.cuh"

#include "gpu_test_util.cuh"
#include "test_util.h"

namespace {

using fa4::DType;
using fa4::TensorView;
using fa4::test::DevBuf;
using fa4::test::from16;
using fa4::test::to16;
using fa4::test::kAtolLse;
using fa4::test::kAtolO;
using fa4::test::kPoison16;




struct Case {
  DType dtype = DType::kBF16;
  int batch = 1, seqlen_q = 128, seqlen_k = 128, heads = 2, heads_kv = 2, d = 128, dv = 128;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool sink = false;
  std::optional<float> scale;
  std::optional<float> exp2_fraction;
  float tau = 8.f;
  // varlen: per-sequence lengths (batch = size); seqused_k optional
  std::vector<int> lens_q, lens_k, used_k;
  int pad_rows_q = 0;   // extra packed q/out rows after the last sequence (C12)
  bool packed_qkv = false;  // q/k/v are strided views of one (b, s, 3, h, d) buffer
  bool nan_past_k = false;   // fill memory past the last key row with NaN (C13)
  int out_offset = 0;        // out starts this many elements into its buffer (TMA-misaligned if % 8)
  bool nan_unused_k = false; // varlen: K/V rows between seqused_k and the sequence end are NaN
  // Batched only: scores rise by ramp_log2 (log2 units) from one key block (the bucket's tile_n
  // keys) to the one before it, i.e. at every step of the kernel's descending key loop, so the
  // running max keeps moving (q[.., 0] = 1 and k[j, 0] carries the ramp; other channels random).
  float ramp_log2 = 0.f;
  float qk_std = 1.f;  // standard deviation of q and k (v: 1), to keep large-scale logits O(1)
  uint32_t seed = 1;

  std::string name() const {
    return std::string(fa4::dtype_name(dtype)) + " b" + std::to_string(batch) + " sq" + std::to_string(seqlen_q) +
           " sk" + std::to_string(seqlen_k) + " h" + std::to_string(heads) + "/" + std::to_string(heads_kv) +
           " d" + std::to_string(d) + "x" + std::to_string(dv) + (causal ? " causal" : "") +
           " win(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")" +
           (softcap > 0 ? " softcap" : "") + (sink ? " sink" : "") + (lens_q.empty() ? "" : " varlen") +
           (out_offset ? " out+" + std::to_string(out_offset) : "");
  }
};

struct Result {
  std::vector<uint16_t> out;  // raw 16-bit
  std::vector<float> lse;
};



/// Runs one case: fa4 twice (C27: bitwise equal), the exact and naive16 references, and checks.
/// `first` (optional) receives the first run's raw output and LSE; `kernel` the selector's choice,
/// left empty where the case did not run: left out (its bucket not compiled in this build), or
/// stopped by a failed assertion before the selector answered.
void run_case_on(const Case& c, int repeats, Result* first, std::string& kernel) {
  kernel.clear();
  if (fa4::test::leave_out(c.d, c.dv, fa4::test::kFwd)) return;
  const bool varlen = !c.lens_q.empty();
  const int batch = varlen ? int(c.lens_q.size()) : c.batch;
  int64_t total_q = 0, total_k = 0;
  std::vector<int> cu_q{0}, cu_k{0};
  if (varlen) {
    for (int b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + c.lens_q[b]);
      cu_k.push_back(cu_k.back() + c.lens_k[b]);
    }
    total_q = cu_q.back() + c.pad_rows_q;
    total_k = cu_k.back();
  } else {
    total_q = int64_t(batch) * c.seqlen_q;
    total_k = int64_t(batch) * c.seqlen_k;
  }
  const int max_sq = varlen ? *std::max_element(c.lens_q.begin(), c.lens_q.end()) : c.seqlen_q;
  const int max_sk = varlen ? *std::max_element(c.lens_k.begin(), c.lens_k.end()) : c.seqlen_k;
  const int H = c.heads, HK = c.heads_kv;
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.f, 1.f);

  // Storage. packed_qkv: one (rows, 3, H, d) buffer (requires H == HK and d == dv).
  const int64_t kv_extra = c.nan_past_k ? 64 : 0;  // rows of garbage after the last key row
  const int64_t q_elems = total_q * H * c.d;
  const int64_t k_elems = (total_k + kv_extra) * HK * c.d;
  const int64_t v_elems = (total_k + kv_extra) * HK * c.dv;
  const int64_t packed_elems = total_q * 3 * H * c.d;
  std::vector<uint16_t> hq, hk, hv, hpacked;
  auto fill = [&](std::vector<uint16_t>& v, int64_t n, int64_t valid, float std_dev) {
    v.resize(n);
    for (int64_t i = 0; i < n; ++i) v[i] = i < valid ? to16(c.dtype, std_dev * nd(rng)) : kPoison16;
  };
  if (c.packed_qkv) {
    ASSERT_EQ(c.qk_std, 1.f) << "qk_std is for separate q/k/v";
    fill(hpacked, packed_elems, packed_elems, 1.f);
  } else {
    fill(hq, q_elems, q_elems, c.qk_std);
    fill(hk, k_elems, total_k * HK * c.d, c.qk_std);
    fill(hv, v_elems, total_k * HK * c.dv, 1.f);
  }
  if (c.ramp_log2 != 0.f) {
    ASSERT_TRUE(!varlen && !c.packed_qkv) << "ramp_log2 is for batched, separate q/k/v";
    const float scale_log2 = c.scale.value_or(1.f / std::sqrt(float(c.d))) * fa4::detail::kLog2e;
    const fa4::detail::HopperFwdConfig* bucket = fa4::detail::hopper_fwd_bucket(c.d, c.dv);
    ASSERT_NE(bucket, nullptr) << c.name();
    const int bn = bucket->tile_n;
    const int blocks = (c.seqlen_k + bn - 1) / bn;
    for (int64_t i = 0; i < total_q * H; ++i) hq[i * c.d] = to16(c.dtype, 1.f);
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < c.seqlen_k; ++j)
        for (int h = 0; h < HK; ++h)
          hk[((int64_t(b) * c.seqlen_k + j) * HK + h) * c.d] =
              to16(c.dtype, c.ramp_log2 * float(blocks - 1 - j / bn) / scale_log2);
  }
  if (c.nan_unused_k) {  // rows a sequence does not use must never reach its output (C12)
    for (int b = 0; b < batch; ++b)
      for (int64_t r = cu_k[b] + c.used_k[b]; r < cu_k[b + 1]; ++r) {
        std::fill(hk.begin() + r * HK * c.d, hk.begin() + (r + 1) * HK * c.d, kPoison16);
        std::fill(hv.begin() + r * HK * c.dv, hv.begin() + (r + 1) * HK * c.dv, kPoison16);
      }
  }
  DevBuf<uint16_t> dq(c.packed_qkv ? 0 : q_elems), dk(c.packed_qkv ? 0 : k_elems),
      dv(c.packed_qkv ? 0 : v_elems), dpk(c.packed_qkv ? packed_elems : 0);
  if (c.packed_qkv) dpk.upload(hpacked); else { dq.upload(hq); dk.upload(hk); dv.upload(hv); }
  constexpr int kOutTail = 64;  // guard elements after out: must keep the poison too
  DevBuf<uint16_t> dout(c.out_offset + total_q * H * c.dv + kOutTail);
  uint16_t* out_ptr = dout.ptr + c.out_offset;
  DevBuf<float> dlse(total_q * H);
  DevBuf<int> dcu_q(varlen ? cu_q.size() : 0), dcu_k(varlen ? cu_k.size() : 0), dused(c.used_k.size());
  if (varlen) { dcu_q.upload(cu_q); dcu_k.upload(cu_k); }
  if (!c.used_k.empty()) dused.upload(c.used_k);
  std::vector<float> hsink(H);
  for (auto& s : hsink) s = nd(rng);
  DevBuf<float> dsink(c.sink ? H : 0);
  if (c.sink) dsink.upload(hsink);

  const auto dev = fa4::Device::cuda(0);
  const DType t = c.dtype;
  TensorView q, k, v, out, lse;
  if (varlen) {
    q = TensorView::contiguous(dq.ptr, t, {total_q, H, c.d}, dev);
    k = TensorView::strided(dk.ptr, t, {total_k, HK, c.d}, {int64_t(HK) * c.d, c.d, 1}, dev);
    v = TensorView::strided(dv.ptr, t, {total_k, HK, c.dv}, {int64_t(HK) * c.dv, c.dv, 1}, dev);
    out = TensorView::contiguous(out_ptr, t, {total_q, H, c.dv}, dev);
    lse = TensorView::strided(dlse.ptr, DType::kFP32, {H, total_q}, {1, H}, dev);  // (H, total_q) view of (rows, H)
  } else if (c.packed_qkv) {
    const int64_t row = 3 * int64_t(H) * c.d;
    q = TensorView::strided(dpk.ptr, t, {batch, c.seqlen_q, H, c.d}, {c.seqlen_q * row, row, c.d, 1}, dev);
    k = TensorView::strided(dpk.ptr + H * c.d, t, {batch, c.seqlen_k, H, c.d}, {c.seqlen_k * row, row, c.d, 1}, dev);
    v = TensorView::strided(dpk.ptr + 2 * H * c.d, t, {batch, c.seqlen_k, H, c.d}, {c.seqlen_k * row, row, c.d, 1}, dev);
    out = TensorView::contiguous(out_ptr, t, {batch, c.seqlen_q, H, c.dv}, dev);
    lse = TensorView::strided(dlse.ptr, DType::kFP32, {batch, H, c.seqlen_q}, {int64_t(c.seqlen_q) * H, 1, H}, dev);
  } else {
    q = TensorView::contiguous(dq.ptr, t, {batch, c.seqlen_q, H, c.d}, dev);
    k = TensorView::contiguous(dk.ptr, t, {batch, c.seqlen_k, HK, c.d}, dev);
    v = TensorView::contiguous(dv.ptr, t, {batch, c.seqlen_k, HK, c.dv}, dev);
    out = TensorView::contiguous(out_ptr, t, {batch, c.seqlen_q, H, c.dv}, dev);
    lse = TensorView::strided(dlse.ptr, DType::kFP32, {batch, H, c.seqlen_q}, {int64_t(c.seqlen_q) * H, 1, H}, dev);
  }
  fa4::AttentionOptions o;
  o.backend = fa4::Backend::kCuda;
  o.causal = c.causal;
  o.window_size_left = c.window_left;
  o.window_size_right = c.window_right;
  o.softcap = c.softcap;
  o.softmax_scale = c.scale;
  o.exp2_emulation_fraction = c.exp2_fraction;
  o.rescale_threshold = c.tau;
  if (c.sink) o.sink = TensorView::contiguous(dsink.ptr, DType::kFP32, {H}, dev);
  if (varlen) {
    o.cu_seqlens_q = TensorView::contiguous(dcu_q.ptr, DType::kInt32, {batch + 1}, dev);
    o.cu_seqlens_k = TensorView::contiguous(dcu_k.ptr, DType::kInt32, {batch + 1}, dev);
    if (!c.used_k.empty()) o.seqused_k = TensorView::contiguous(dused.ptr, DType::kInt32, {batch}, dev);
    o.max_seqlen_q = std::max(max_sq, 1);  // an upper bound; must be > 0 even if every length is 0
    o.max_seqlen_k = std::max(max_sk, 1);
  }

  const std::string why = fa4::forward_support(q, k, v, out, lse, o, &kernel);
  ASSERT_EQ(why, "") << c.name();
  std::vector<Result> runs;
  for (int r = 0; r < repeats; ++r) {
    if (dout.n) CUDA_OK(cudaMemset(dout.ptr, 0xFF, dout.n * 2));
    if (dlse.n) CUDA_OK(cudaMemset(dlse.ptr, 0xFF, dlse.n * 4));
    fa4::forward(q, k, v, out, lse, o);
    CUDA_OK(cudaDeviceSynchronize());
    runs.push_back({dout.download(), dlse.download()});
    // Elements before and after out must keep the poison; then drop them.
    auto& ro = runs.back().out;
    for (int i = 0; i < c.out_offset; ++i) ASSERT_EQ(ro[i], kPoison16) << c.name() << ": wrote before out";
    for (size_t i = ro.size() - kOutTail; i < ro.size(); ++i)
      ASSERT_EQ(ro[i], kPoison16) << c.name() << ": wrote after out";
    ro.erase(ro.end() - kOutTail, ro.end());
    ro.erase(ro.begin(), ro.begin() + c.out_offset);
  }
  for (int r = 1; r < repeats; ++r) {  // C27: bitwise repeatable
    ASSERT_EQ(0, std::memcmp(runs[0].out.data(), runs[r].out.data(), runs[0].out.size() * 2)) << c.name();
    ASSERT_EQ(0, std::memcmp(runs[0].lse.data(), runs[r].lse.data(), runs[0].lse.size() * 4)) << c.name();
  }

  // References on the same validated params.
  const fa4::detail::FwdParams p = fa4::detail::make_fwd_params(q, k, v, out, lse, o, "test");
  ASSERT_LE(max_sk, fa4::test::kRefMaxSeqlenK);
  DevBuf<float> ref_o(total_q * H * c.dv), ref_l(total_q * H), nv_o(total_q * H * c.dv), nv_l(total_q * H);
  if (max_sq > 0 && batch > 0) {
    const dim3 grid(max_sq, H, batch);
    // Padded by 16 bytes past the last score: nvcc may read the score row with 16-byte vector
    // loads whose tail passes its end (compute-sanitizer memcheck flagged it).
    const size_t smem = (size_t(std::max(max_sk, 1) + 3) / 4 * 4 + 4) * sizeof(float);
    fa4::test::reference_attention_kernel<<<grid, fa4::test::kRefThreads, smem>>>(p, false, ref_o.ptr, ref_l.ptr);
    fa4::test::reference_attention_kernel<<<grid, fa4::test::kRefThreads, smem>>>(p, true, nv_o.ptr, nv_l.ptr);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
  }
  const auto ro = ref_o.download(), rl = ref_l.download(), no = nv_o.download(), nl = nv_l.download();
  const auto& fo = runs[0].out;
  const auto& fl = runs[0].lse;
  if (first) *first = runs[0];

  // Which packed rows belong to a sequence (varlen padding rows must keep the poison).
  std::vector<char> row_valid(total_q, 1);
  if (varlen) for (int64_t r = cu_q.back(); r < total_q; ++r) row_valid[r] = 0;
  double err = 0, nerr = 0, lerr = 0, nlerr = 0;
  int64_t bad_nan = 0, bad_masked = 0, bad_pad = 0;
  for (int64_t r = 0; r < total_q; ++r) {
    for (int h = 0; h < H; ++h) {
      const int64_t li = r * H + h;  // lse view is (rows, H) contiguous in memory for all layouts
      // batched lse layout (b, h, s) was given as strides (s*H, 1, H): element (b,h,i) at (b*s+i)*H+h.
      if (!row_valid[r]) {
        for (int d = 0; d < c.dv; ++d) bad_pad += fo[li * c.dv + d] != kPoison16;
        uint32_t bits; std::memcpy(&bits, &fl[li], 4);
        bad_pad += bits != 0xFFFFFFFFu;
        continue;
      }
      const float ref_lse = rl[li];
      if (std::isinf(ref_lse) && ref_lse < 0) {  // fully masked row: exact zeros and -inf
        bad_masked += !(std::isinf(fl[li]) && fl[li] < 0);
        for (int d = 0; d < c.dv; ++d) bad_masked += from16(t, fo[li * c.dv + d]) != 0.f;
        continue;
      }
      if (std::isnan(fl[li]) != std::isnan(ref_lse)) ++bad_nan;
      if (!std::isnan(ref_lse)) {
        lerr = std::max(lerr, double(std::fabs(fl[li] - ref_lse)));
        nlerr = std::max(nlerr, double(std::fabs(nl[li] - ref_lse)));
      }
      for (int d = 0; d < c.dv; ++d) {
        const float f = from16(t, fo[li * c.dv + d]);
        const float rv = ro[li * c.dv + d];
        if (std::isnan(f) != std::isnan(rv)) { ++bad_nan; continue; }
        if (std::isnan(rv)) continue;
        err = std::max(err, double(std::fabs(f - rv)));
        nerr = std::max(nerr, double(std::fabs(no[li * c.dv + d] - rv)));
      }
    }
  }
  EXPECT_EQ(bad_nan, 0) << c.name() << ": NaN placement differs from the reference";
  EXPECT_EQ(bad_masked, 0) << c.name() << ": fully masked rows must be O = 0, LSE = -inf";
  EXPECT_EQ(bad_pad, 0) << c.name() << ": rows outside every sequence were written";
  EXPECT_LE(err, 2 * nerr + kAtolO) << c.name() << " kernel " << kernel << ": O err " << err << " naive " << nerr;
  EXPECT_LE(lerr, 2 * nlerr + kAtolLse) << c.name() << ": LSE err " << lerr << " naive " << nlerr;
}

/// run_case_on with the selector's kernel; where that is the decode kernel (a small-query forward,
/// hopper_api.cu small_q_on_decode), once more on the forward kernel, so both stay tested. False
/// where the case did not run (see run_case_on's `kernel`): `first` holds nothing to compare.
bool run_case(const Case& c, int repeats = 2, Result* first = nullptr) {
  std::string kernel;
  run_case_on(c, repeats, first, kernel);
  if (kernel.empty()) return false;
  if (kernel.find("small-query") != std::string::npos) {
    fa4::test::ScopedOverride fwd("small_q", "fwd");
    run_case_on(c, 1, nullptr, kernel);
    EXPECT_EQ(kernel.find("small-query"), std::string::npos) << c.name() << ": override small_q = fwd ignored";
  }
  return true;
}

// ---- the option matrix ------------------------------------------------------------------------

TEST(HopperFwd, SeqlenSweepD64D128) {  // C13: every tail length, Sq = Sk and Sq = 1
  REQUIRE_HOPPER();
  // Around the 128-key and 128-row (d128) / 192-row (d64) tile edges.
  for (DType t : {DType::kBF16, DType::kFP16})
    for (int d : {64, 128})
      for (bool causal : {false, true})
        for (int s : {1, 17, 63, 65, 113, 127, 129, 191, 192, 193, 383, 385, 1023}) {
          Case c; c.dtype = t; c.d = c.dv = d; c.causal = causal; c.seqlen_q = c.seqlen_k = s;
          run_case(c);
          c.seqlen_q = 1; run_case(c, 1);
        }
}

TEST(HopperFwd, LongSequence4096) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Case c; c.seqlen_q = c.seqlen_k = 4096; c.causal = causal; c.heads = c.heads_kv = 2;
    run_case(c, 3);
  }
}

TEST(HopperFwd, AllHeadDims) {  // C16 / C14 / C32: every bucket and padded dims
  REQUIRE_HOPPER();
  const int dims[][2] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256}, {192, 128},
                         {40, 40}, {72, 72}, {104, 104}, {160, 160}, {136, 128}, {8, 8}};
  for (DType t : {DType::kBF16, DType::kFP16})
    for (auto& dd : dims)
      for (bool causal : {false, true}) {
        Case c; c.dtype = t; c.d = dd[0]; c.dv = dd[1]; c.causal = causal; c.seqlen_q = 200; c.seqlen_k = 333;
        run_case(c, 1);
      }
}

TEST(HopperFwd, SeqlenQNotSeqlenK) {  // C06: bottom-right causal, fully masked rows
  REQUIRE_HOPPER();
  const int shapes[][2] = {{2, 5}, {5, 2}, {300, 129}, {129, 700}, {1000, 64}, {64, 1000}};
  for (auto& s : shapes)
    for (bool causal : {false, true}) {
      Case c; c.seqlen_q = s[0]; c.seqlen_k = s[1]; c.causal = causal; c.d = c.dv = 64;
      run_case(c, 1);
    }
}

// d64 too: its windows with a right edge run the local kernel (per-warpgroup key ranges), the
// others its plain one.
TEST(HopperFwd, WindowsSoftcapSink) {  // C08 window sentinels, softcap, learnable sink
  REQUIRE_HOPPER();
  const int wins[][2] = {{-1, 0}, {0, 0}, {127, 0}, {64, 64}, {0, -1}, {300, 5}, {1, 1000}};
  for (int d : {128, 64}) {
    for (auto& w : wins) {
      Case c; c.seqlen_q = 333; c.seqlen_k = 517; c.window_left = w[0]; c.window_right = w[1];
      c.d = c.dv = d;
      run_case(c, 1);
    }
    Case c; c.seqlen_q = c.seqlen_k = 700; c.softcap = 15.f; c.causal = true; c.d = c.dv = d; run_case(c, 1);
    c.softcap = 0; c.sink = true; run_case(c, 1);
    c.seqlen_q = 300; c.seqlen_k = 100; run_case(c, 1);  // fully masked rows with a sink: LSE = sink
  }
}

TEST(HopperFwd, SoftmaxScaleAndFa4Knobs) {  // C32; exp2 emulation share and lazy-rescaling knobs
  REQUIRE_HOPPER();
  for (float s : {1.0f, 0.01f, 1.f / 128, 10.f}) {
    Case c; c.seqlen_q = c.seqlen_k = 513; c.scale = s; c.causal = true;
    // From scale 1 the logits of unit q and k (std s sqrt(d): 11 to 113) leave bf16's rounding of
    // S in the naive bound at up to the output's own size; q and k of std sqrt(3 / (s sqrt(d)))
    // keep them near std 3, where a wrongly applied scale still changes every row.
    if (s >= 1.f) c.qk_std = std::sqrt(3.f / (s * std::sqrt(float(c.d))));
    run_case(c, 1);
  }
  for (float f : {0.f, 0.125f, 0.5f, 1.f})
    for (float tau : {0.f, 8.f})
      for (int d : {64, 128}) {
        Case c; c.seqlen_q = c.seqlen_k = 777; c.d = c.dv = d; c.exp2_fraction = f; c.tau = tau;
        run_case(c, 1);
      }
}

TEST(HopperFwd, GqaMqa) {  // C21: kv_head = h / (H / Hkv)
  REQUIRE_HOPPER();
  for (int hk : {1, 2, 3}) {
    Case c; c.heads = 6; c.heads_kv = hk; c.seqlen_q = 257; c.seqlen_k = 300; c.causal = hk == 2;
    run_case(c, 1);
  }
}

TEST(HopperFwd, Varlen) {  // C10, C12 (padding rows untouched), seqused_k
  REQUIRE_HOPPER();
  {
    Case c; c.lens_q = {0, 1, 0, 1}; c.lens_k = {0, 3, 0, 5}; c.heads = 9; c.heads_kv = 3; c.d = c.dv = 64;
    c.causal = true; c.scale = 1.0f; run_case(c);
  }
  {
    Case c; c.lens_q = {3, 4}; c.lens_k = {3, 4}; c.pad_rows_q = 3; c.d = c.dv = 64; run_case(c);
  }
  for (bool causal : {false, true}) {
    Case c; c.lens_q = {100, 0, 513, 129, 1}; c.lens_k = {300, 7, 400, 129, 1000}; c.causal = causal;
    run_case(c);
    c.used_k = {250, 0, 399, 1, 999}; run_case(c, 1);
    c.nan_unused_k = true; run_case(c, 1);  // the smem V-tail zeroing and the key mask
  }
}

// A persistent CTA runs many tiles in a row through the same Q/K/V stage rings, tile-index ring
// and softmax state. These shapes give every CTA several consecutive tiles (>= 2x the 132 SMs)
// with what can differ between neighbours: key-block counts (causal), tiles without keys in
// between (seqlen_q > seqlen_k, bottom-right causal), varlen V tails zeroed in smem (NaN in unused
// K/V rows), the sink, softcap and windows; d64 has two Q buffers, d128 and d256 one; d64/d128
// stage O in their own O buffer, d256 in the tile's Q buffer (freed only after the TMA store).
TEST(HopperFwd, TileChainsAcrossBoundaries) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 256}) {
    Case c; c.d = c.dv = d; c.batch = 4; c.heads = c.heads_kv = 40; c.seqlen_q = c.seqlen_k = 300;
    run_case(c, 1);  // d128: 480 tiles of 3 key blocks (d64: 320 tiles of 192 rows)
    c.causal = true; c.heads_kv = 8; run_case(c, 1);
    c.seqlen_q = 700; c.seqlen_k = 300; c.batch = 2; c.sink = true; run_case(c, 1);  // keyless m-blocks
    c.sink = false; c.softcap = 20.f; c.causal = false; c.window_left = 100; c.window_right = 30;
    c.dtype = DType::kFP16; run_case(c, 1);
  }
  Case v; v.heads = 24; v.heads_kv = 8; v.causal = true;
  std::mt19937 rng(7);
  for (int b = 0; b < 24; ++b) {
    v.lens_q.push_back(int(rng() % 400));
    v.lens_k.push_back(v.lens_q.back() + int(rng() % 300));
  }
  v.used_k = v.lens_k;
  for (int& u : v.used_k) u = u > 0 ? u - int(rng() % u) / 2 : 0;
  v.nan_unused_k = true;
  for (int d : {64, 128}) {
    v.d = v.dv = d;
    run_case(v, 1);
  }
}

// C28 on the GPU: empty problems write nothing; seqlen_k = 0 makes every row fully masked.
TEST(HopperFwd, EmptyProblemsAndNoKeys) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Case c; c.causal = causal;
    c.seqlen_q = 300; c.seqlen_k = 0; run_case(c, 1);  // O = 0, LSE = -inf everywhere
    c.seqlen_q = 0; c.seqlen_k = 50; run_case(c, 1);
    c.batch = 0; c.seqlen_q = 64; run_case(c, 1);
  }
  Case v; v.lens_q = {0, 0}; v.lens_k = {0, 5}; v.pad_rows_q = 4; run_case(v, 1);  // padding keeps poison
  Case w; w.lens_q = {130, 3}; w.lens_k = {0, 0}; w.causal = true; run_case(w, 1);
}

TEST(HopperFwd, StridedPackedQkvAndNaNPastKeys) {  // C18/C20 strided views; C03/C13 garbage past K
  REQUIRE_HOPPER();
  Case c; c.packed_qkv = true; c.seqlen_q = c.seqlen_k = 300; c.heads = c.heads_kv = 3; c.batch = 2;
  run_case(c);
  c.causal = true; run_case(c, 1);
  Case n; n.nan_past_k = true; n.seqlen_q = 100; n.seqlen_k = 77; n.batch = 1; run_case(n, 1);
}

// O leaves through smem + TMA when out is 16-byte aligned (batched layouts), else through direct
// stores: 4-byte pairs (out 4-byte aligned) or single elements. Every path, with row tails.
TEST(HopperFwd, OutputStorePaths) {
  REQUIRE_HOPPER();
  for (int off : {0, 1, 2, 8})
    for (int d : {64, 128}) {
      Case c; c.batch = 2; c.heads = c.heads_kv = 3; c.seqlen_q = 200; c.seqlen_k = 300; c.d = c.dv = d;
      c.causal = d == 128; c.out_offset = off; run_case(c, 1);
    }
  Case p; p.d = 192; p.dv = 128; p.seqlen_q = 77; p.seqlen_k = 500; p.out_offset = 2; run_case(p, 1);
  p.out_offset = 0; run_case(p, 1);
  // The TMA and the direct store of the same O must agree bitwise (override epilogue = direct
  // forces the direct path where TMA would run); each run counted on the path it should take.
  for (int d : {64, 128, 256}) {
    Case c; c.batch = 2; c.heads = c.heads_kv = 2; c.seqlen_q = 333; c.seqlen_k = 257; c.d = c.dv = d; c.causal = true;
    Result tma, direct;
    const uint64_t before = fa4::hopper::fwd_tma_epilogue_calls();
    if (!run_case(c, 1, &tma)) continue;  // left out: nothing to compare
    EXPECT_EQ(fa4::hopper::fwd_tma_epilogue_calls() - before, 1u) << c.name() << ": the TMA path";
    {
      fa4::test::ScopedOverride direct_store("epilogue", "direct");
      const uint64_t before_direct = fa4::hopper::fwd_tma_epilogue_calls();
      run_case(c, 1, &direct);
      EXPECT_EQ(fa4::hopper::fwd_tma_epilogue_calls(), before_direct) << c.name() << ": the direct path";
    }
    EXPECT_EQ(0, std::memcmp(tma.out.data(), direct.out.data(), tma.out.size() * 2)) << c.name();
  }
}

// C03(b): a NaN in one query row's data comes out as that row's out and lse, and nowhere else.
// out and lse start as finite sentinels (a row the kernel skipped would keep them), bf16 and fp16,
// three buckets, causal and not.
TEST(HopperFwd, NaNInQueryPropagates) {
  REQUIRE_HOPPER();
  const int S = 200, H = 2;
  const float kOutSentinel = 1000.f, kLseSentinel = -12345.f;
  for (DType t : {DType::kBF16, DType::kFP16})
    for (int D : {64, 128, 256})
      for (bool causal : {false, true}) {
        if (fa4::test::leave_out(D, D, fa4::test::kFwd)) continue;
        SCOPED_TRACE(std::string(t == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(D) +
                     (causal ? " causal" : ""));
        std::vector<uint16_t> hq(S * H * D), hk(S * H * D), hv(S * H * D);
        std::mt19937 rng(fa4::test::next_seed());
        std::normal_distribution<float> nd;
        for (auto* v : {&hq, &hk, &hv}) for (auto& x : *v) x = fa4::test::to16(t, nd(rng));
        for (int d = 0; d < D; ++d) hq[(5 * H + 1) * D + d] = kPoison16;  // query row 5, head 1 is NaN
        DevBuf<uint16_t> q(hq.size()), k(hk.size()), v(hv.size()), o(hq.size());
        DevBuf<float> l(S * H);
        q.upload(hq); k.upload(hk); v.upload(hv);
        o.upload(std::vector<uint16_t>(hq.size(), fa4::test::to16(t, kOutSentinel)));
        l.upload(std::vector<float>(S * H, kLseSentinel));
        const auto dev = fa4::Device::cuda(0);
        fa4::AttentionOptions opt;
        opt.backend = fa4::Backend::kCuda;
        opt.causal = causal;
        fa4::forward(TensorView::contiguous(q.ptr, t, {1, S, H, D}, dev), TensorView::contiguous(k.ptr, t, {1, S, H, D}, dev),
                     TensorView::contiguous(v.ptr, t, {1, S, H, D}, dev), TensorView::contiguous(o.ptr, t, {1, S, H, D}, dev),
                     TensorView::contiguous(l.ptr, DType::kFP32, {1, H, S}, dev), opt);
        CUDA_OK(cudaDeviceSynchronize());
        const auto ho = o.download();
        const auto hl = l.download();
        for (int i = 0; i < S; ++i)
          for (int h = 0; h < H; ++h) {
            const bool nan_row = i == 5 && h == 1;
            ASSERT_EQ(std::isnan(hl[h * S + i]), nan_row) << "lse " << i << " " << h << ": " << hl[h * S + i];
            ASSERT_NE(hl[h * S + i], kLseSentinel) << "lse " << i << " " << h << " unwritten";
            for (int d = 0; d < D; ++d) {
              const float x = fa4::test::from16(t, ho[(i * H + h) * D + d]);
              ASSERT_EQ(std::isnan(x), nan_row) << "out " << i << " " << h << " " << d << ": " << x;
              ASSERT_NE(x, kOutSentinel) << "out " << i << " " << h << " " << d << " unwritten";
            }
          }
      }
}

TEST(HopperFwd, MisalignedStrideIsAClearError) {
  REQUIRE_HOPPER();
  DevBuf<uint16_t> buf(4 * 100 * 2 * 72), obuf(100 * 2 * 64), lbuf(2 * 2 * 100);
  const auto dev = fa4::Device::cuda(0);
  // Row stride 2*68+4 = 140 elements = 280 bytes: not a multiple of 16 -> TMA cannot load it.
  // (out and lse in buffers of their own: outputs must not overlap another tensor.)
  auto q = TensorView::strided(buf.ptr, DType::kBF16, {1, 100, 2, 64}, {100 * 140, 140, 68, 1}, dev);
  auto out = TensorView::contiguous(obuf.ptr, DType::kBF16, {1, 100, 2, 64}, dev);
  auto lse = TensorView::contiguous(lbuf.ptr, DType::kFP32, {1, 2, 100}, dev);
  fa4::AttentionOptions opt; opt.backend = fa4::Backend::kCuda;
  const std::string why = fa4::forward_support(q, q, q, out, lse, opt);
  EXPECT_NE(why.find("16 bytes"), std::string::npos) << why;
  try {
    fa4::forward(q, q, q, out, lse, opt);
    FAIL() << "expected fa4::Error";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kUnsupported);
  }
}

// An explicit exp2 share the 16-group rule cannot give on a key tile that is not a multiple of 128
// columns (d >= 192 buckets) is refused, never silently changed; 0 stays supported.
TEST(HopperFwd, Exp2FractionOnNon128KeyTileIsAClearError) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(256, 256, fa4::test::kFwd);  // without it the answer is "not compiled"
  DevBuf<uint16_t> buf(64 * 2 * 256), obuf(64 * 2 * 256);
  DevBuf<float> lbuf(2 * 64);
  const auto dev = fa4::Device::cuda(0);
  auto x = TensorView::contiguous(buf.ptr, DType::kBF16, {1, 64, 2, 256}, dev);
  auto out = TensorView::contiguous(obuf.ptr, DType::kBF16, {1, 64, 2, 256}, dev);
  auto lse = TensorView::contiguous(lbuf.ptr, DType::kFP32, {1, 2, 64}, dev);
  fa4::AttentionOptions opt;
  opt.backend = fa4::Backend::kCuda;
  opt.exp2_emulation_fraction = 0.25f;
  const std::string why = fa4::forward_support(x, x, x, out, lse, opt);
  EXPECT_NE(why.find("exp2_emulation_fraction"), std::string::npos) << why;
  opt.exp2_emulation_fraction = 0.0f;
  EXPECT_EQ(fa4::forward_support(x, x, x, out, lse, opt), "");
}

// A device index that does not exist is a clear error (not a crash or a cache overrun).
TEST(HopperFwd, MissingDeviceIsAClearError) {
  REQUIRE_HOPPER();
  DevBuf<uint16_t> buf(16 * 64), obuf(16 * 64);
  DevBuf<float> lbuf(16);
  const auto dev = fa4::Device::cuda(4096);
  auto x = TensorView::contiguous(buf.ptr, DType::kBF16, {1, 16, 1, 64}, dev);
  auto out = TensorView::contiguous(obuf.ptr, DType::kBF16, {1, 16, 1, 64}, dev);
  auto lse = TensorView::contiguous(lbuf.ptr, DType::kFP32, {1, 1, 16}, dev);
  const std::string why = fa4::forward_support(x, x, x, out, lse, {});
  EXPECT_NE(why.find("does not exist"), std::string::npos) << why;
}

// The tile schedule (static stride or dynamic claim counter; LPT order or plain) decides only
// which CTA computes a tile, so every schedule must give bitwise the same O and LSE. The shapes have
// more tiles than the GPU has SMs, so the dynamic path really runs (it is skipped otherwise).
TEST(HopperFwd, SchedulesAgreeBitwise) {
  REQUIRE_HOPPER();
  struct Choice {
    const char* sched;
    const char* lpt;
  };
  const Choice choices[] = {{"static", "0"}, {"static", "1"}, {"dynamic", "1"}, {"dynamic", "0"}};
  std::vector<Case> cases;
  {
    Case c; c.batch = 3; c.heads = c.heads_kv = 8; c.seqlen_q = c.seqlen_k = 1024; c.causal = true;
    cases.push_back(c);  // 192 tiles of 1..8 key blocks
    c.heads_kv = 2; c.window_left = 200; c.window_right = 0; c.dtype = DType::kFP16; c.d = c.dv = 64;
    cases.push_back(c);
  }
  {
    Case c; c.heads = 12; c.heads_kv = 4; c.causal = true;
    c.lens_q = {1000, 1, 0, 700, 129, 1023, 64, 513};
    c.lens_k = {1000, 900, 5, 700, 300, 1023, 64, 600};
    cases.push_back(c);  // varlen: unequal tiles, empty and one-row sequences
  }
  for (const Case& c : cases) {
    Result ref;
    for (size_t e = 0; e < sizeof(choices) / sizeof(choices[0]); ++e) {
      fa4::test::ScopedOverride sched("schedule", choices[e].sched), lpt("lpt", choices[e].lpt);
      Result r;
      const uint64_t dynamic_before = fa4::hopper::fwd_dynamic_launches();
      if (!run_case(c, 1, &r)) break;  // left out (every choice alike): nothing to compare
      EXPECT_EQ(fa4::hopper::fwd_dynamic_launches() > dynamic_before, std::strcmp(choices[e].sched, "dynamic") == 0)
          << c.name() << " sched=" << choices[e].sched << ": the forward's schedule is not the one asked for";
      if (e == 0) { ref = r; continue; }
      EXPECT_EQ(0, std::memcmp(ref.out.data(), r.out.data(), r.out.size() * 2))
          << c.name() << " sched=" << choices[e].sched << " lpt=" << choices[e].lpt;
      EXPECT_EQ(0, std::memcmp(ref.lse.data(), r.lse.data(), r.lse.size() * 4))
          << c.name() << " sched=" << choices[e].sched << " lpt=" << choices[e].lpt;
    }
  }
}

// Stream-K tail (core/stream_k.h, src/hopper/shared/stream_k.cuh), forced on: tiles cut into pieces
// of ~8 key blocks across 2-32 CTAs, the combiner merging partials whose maxima differ (rising
// scores, so every piece has its own max), masked tail keys in the combiner's first block, sink,
// softcap, GQA, fp16, every bucket, causal and right-windowed chunks of one query tile per head.
// Each case is checked against the references by run_case (and run twice: the merge order is
// fixed, so the split is deterministic). The same random-input case without the split must give a
// different rounding somewhere, or the split did not run.
TEST(HopperFwd, StreamKTailMatchesReference) {
  REQUIRE_HOPPER();
  fa4::test::ScopedOverride fwd_kernel("small_q", "fwd");  // the split is the forward kernel's
  std::vector<Case> cases;
  for (int d : {64, 96, 128, 192, 256}) {
    Case c; c.heads = 3; c.heads_kv = 1; c.seqlen_q = 200; c.seqlen_k = 5000; c.d = c.dv = d;
    cases.push_back(c);  // 6 tiles of 40-63 blocks on many CTAs: pieces of ~8 blocks
  }
  {
    Case c; c.heads = 2; c.seqlen_q = 256; c.seqlen_k = 3000; c.sink = true; c.dtype = DType::kFP16;
    cases.push_back(c);
    c.sink = false; c.softcap = 30.f; c.d = 192; c.dv = 128; c.dtype = DType::kBF16;
    cases.push_back(c);
    Case r; r.heads = 2; r.seqlen_q = 128; r.seqlen_k = 4096; r.ramp_log2 = 20.f;
    cases.push_back(r);  // every block moves the max: pieces carry different maxima
    r.ramp_log2 = 300.f;
    cases.push_back(r);  // partials 2^300 apart: the merge must rescale, not overflow
    // More tiles than SMs: whole-tile rounds first, then the tail (batch 2 x 70 heads = 140 tiles).
    Case m; m.batch = 2; m.heads = 70; m.heads_kv = 14; m.seqlen_q = 100; m.seqlen_k = 1500; m.d = m.dv = 64;
    cases.push_back(m);
  }
  // Masks with a right edge where a head's queries are one tile (a causal chunk against a long
  // cache): every tile still walks all key blocks, and the pieces holding the diagonal mask their
  // keys per row as the whole tile does; rows that see none of a piece's keys give it weight 0.
  // d64's tiles of 192 rows run its local kernel, whose warpgroups past the chunk's rows pass every
  // piece through (seqlen_q 100: the third has no rows, 150: the third has 22).
  for (int d : {64, 96, 128, 192, 256}) {
    Case c; c.heads = 3; c.heads_kv = 1; c.seqlen_q = 100; c.seqlen_k = 5000; c.d = c.dv = d; c.causal = true;
    c.seed = 30 + d;
    cases.push_back(c);
  }
  {
    Case c; c.heads = 2; c.seqlen_q = 150; c.seqlen_k = 4000; c.d = c.dv = 64; c.causal = true; c.sink = true;
    cases.push_back(c);
    // A right window of 10 keys: row i sees keys up to 2946 + i, so the chunk's last block is
    // masked per row (d64's local kernel and d128).
    for (int d : {64, 128}) {
      Case w; w.heads = 4; w.heads_kv = 2; w.seqlen_q = 64; w.seqlen_k = 3000; w.window_right = 10;
      w.softcap = 20.f; w.dtype = DType::kFP16; w.d = w.dv = d; w.seed = 60 + d;
      cases.push_back(w);
    }
    Case r; r.heads = 2; r.seqlen_q = 128; r.seqlen_k = 4096; r.causal = true; r.ramp_log2 = 300.f;
    cases.push_back(r);  // partials 2^300 apart, diagonal piece first
  }
  for (const Case& c : cases) {
    Result split, whole;
    bool ran;
    {
      fa4::test::ScopedOverride on("stream_k", "1");
      ran = run_case(c, 2, &split);
    }
    if (!ran) continue;  // left out: nothing to compare
    {
      fa4::test::ScopedOverride off("stream_k", "0");
      run_case(c, 1, &whole);
    }
    // (Rising scores put every row's mass in the combiner's own first block: the other pieces add
    // below bf16 rounding there, so those two cases may round identically.)
    if (c.ramp_log2 == 0.f)
      EXPECT_NE(0, std::memcmp(split.out.data(), whole.out.data(), split.out.size() * 2))
          << c.name() << ": bitwise equal with and without the split; did the split run?";
  }
}

// Random inputs move a row's running max almost only in the first key block, so the lazy-rescaling
// paths (a warp votes to rescale O and l mid-tile) barely run elsewhere. Here the scores rise from
// each key block to the one before it, i.e. at every step of the descending key loop, by:
//   * 7 log2 units: below tau = 8, so no max moves, but a thread's sum of P passes 2^8 and takes
//     step_from_running_max's read-off path, which must then leave m alone;
//   * 20: a rescale at every block;
//   * 100: the block max read off exponentials up to 2^100;
//   * 124: exponentials past 2^120 count as overflowed; their scores are recomputed from smem
//     (rescale_after_overflow);
//   * 300: MUFU gives +inf and the emulated exp2 is capped at 2^127: the same recompute. 2^300
//     overflows fp32, so a missed rescale would give inf/NaN.
// Each with tau = 8 and tau = 0, both exp2 paths and every exponential emulated (the 127 cap
// alone must flag the overflow), and rows whose keys start only in a later block (causal,
// seqlen_q < seqlen_k). Also: d96 and d192x128 (other smem layouts for the recompute), head dim 112
// on the 128 bucket (zero-filled columns), a left window (masked entries inside the key loop) and
// d256 (80-key tiles, the max-first loop of the MMA-bound buckets).
TEST(HopperFwd, RisingScoresMoveTheMax) {
  REQUIRE_HOPPER();
  for (float ramp : {20.f, 300.f}) {
    Case c; c.d = c.dv = 256; c.seqlen_q = 200; c.seqlen_k = 500; c.ramp_log2 = ramp; c.causal = true;
    run_case(c, 1);
  }
  for (int d : {64, 128})
    for (float ramp : {7.f, 20.f, 100.f, 124.f, 300.f}) {
      Case c; c.d = c.dv = d; c.seqlen_q = 300; c.seqlen_k = 600; c.ramp_log2 = ramp; c.seed = 11 + d;
      run_case(c, 1);
      c.causal = true; c.dtype = DType::kFP16; run_case(c, 1);
      c.tau = 0.f; c.exp2_fraction = 0.5f; run_case(c, 1);
      c.tau = 8.f; c.exp2_fraction = 1.f; run_case(c, 1);
    }
  for (float ramp : {100.f, 300.f}) {
    Case c; c.seqlen_q = 300; c.seqlen_k = 600; c.ramp_log2 = ramp;
    c.d = c.dv = 96; run_case(c, 1);
    c.d = 192; c.dv = 128; c.causal = true; run_case(c, 1);
    c.d = c.dv = 112; c.causal = false; run_case(c, 1);
    c.d = c.dv = 128; c.window_left = 300; c.window_right = 0; run_case(c, 1);
  }
}

// Batched forwards with few query rows per KV head run on the decode kernel (pack-GQA rows, keys
// split over CTAs): one 16-row tile always, up to 128 rows where the forward kernel's tiles would
// not fill the GPU; never with an explicit exp2 emulation share (the decode kernel has none), and
// not where the decode kernel's alignment rules fail (out 4-byte aligned only).
TEST(HopperFwd, SmallQueryForwardsRunOnTheDecodeKernel) {
  REQUIRE_HOPPER();
  struct Route {
    Case c;
    bool decode;
  };
  std::vector<Route> routes;
  {
    Case c; c.seqlen_q = 1; c.seqlen_k = 1000; c.heads = 32; c.heads_kv = 8; routes.push_back({c, true});
    c.batch = 64; routes.push_back({c, true});                        // one row tile: any batch
    c.batch = 1; c.seqlen_q = 4; c.causal = true; c.sink = true; routes.push_back({c, true});
    c.seqlen_q = 128; c.heads = c.heads_kv = 8; c.d = c.dv = 64; routes.push_back({c, true});  // 8 tiles
    c.batch = 32; routes.push_back({c, false});                       // 256 forward tiles: fill the GPU
    c.batch = 1; c.seqlen_q = 129; routes.push_back({c, false});      // more than 128 rows
    c.d = c.dv = 128; c.seqlen_q = 16; c.exp2_fraction = 0.5f; routes.push_back({c, false});
    c.exp2_fraction.reset(); c.out_offset = 2; routes.push_back({c, false});  // decode needs 16-byte rows
    c.out_offset = 0; c.softcap = 10.f; c.window_left = 5; c.window_right = 0; routes.push_back({c, true});
    // Few forward tiles that walk every key: the forward splits its keys over the idle SMs (stream-K),
    // and the decode kernel's 128 narrow tiles (8 per KV head, each re-reading its keys) are more
    // than twice the forward's 16 (launch_decode.h small_q_decode_beats_split_forward).
    Case f; f.seqlen_q = 128; f.seqlen_k = 8192; f.heads = f.heads_kv = 16; routes.push_back({f, false});
    f.causal = true; routes.push_back({f, false});  // a causal chunk of one tile per head splits as well
  }
  for (const Route& r : routes) {
    Result res;
    std::string kernel;
    run_case_on(r.c, 2, &res, kernel);
    if (kernel.empty()) continue;  // left out: its bucket not compiled in this build
    EXPECT_EQ(kernel.find("small-query") != std::string::npos, r.decode) << r.c.name() << ": " << kernel;
    if (r.decode) {  // and the forward kernel's answer passes the same checks
      fa4::test::ScopedOverride fwd("small_q", "fwd");
      run_case_on(r.c, 1, nullptr, kernel);
      EXPECT_EQ(kernel.find("small-query"), std::string::npos) << r.c.name();
    }
  }
}

// ---- sanitizer subset (small, every code path once) ----------------------------------------------
TEST(HopperFwd, SanitizeSmall) {
  REQUIRE_HOPPER();
  Case c; c.seqlen_q = 200; c.seqlen_k = 333; c.causal = true; c.d = c.dv = 64; run_case(c, 1);
  Case s; s.seqlen_q = 3; s.seqlen_k = 333; s.heads = 8; s.heads_kv = 2; s.causal = true; run_case(s, 1);
  Case v; v.lens_q = {100, 0, 200}; v.lens_k = {50, 7, 300}; v.d = v.dv = 128; run_case(v, 1);
  // More tiles than SMs with a causal mask: the dynamic tile counter and the tile-index ring.
  Case d; d.batch = 2; d.heads = d.heads_kv = 80; d.seqlen_q = d.seqlen_k = 129; d.causal = true;
  d.d = d.dv = 64; run_case(d, 1);
  // Two tiles or more per CTA with the TMA epilogue: d128 stages O in its O buffer (the next Q
  // loads before the store), d256 in the tile's Q buffer (the next Q loads after it), d64 from
  // three warpgroups (two full 192-row tiles and a 16-row one per head).
  Case f; f.heads = f.heads_kv = 140; f.seqlen_q = f.seqlen_k = 200; run_case(f, 1);
  f.d = f.dv = 256; run_case(f, 1);
  f.d = f.dv = 64; f.seqlen_q = f.seqlen_k = 400; run_case(f, 1);
  // A causal chunk's keys split over CTAs (stream-K): partials, flags and the combiner's merge, on
  // d64's local kernel (a warpgroup past the chunk's rows passes every piece through) and on d128.
  fa4::test::ScopedOverride split("stream_k", "1"), fwd_kernel("small_q", "fwd");
  Case k; k.seqlen_q = 100; k.seqlen_k = 2000; k.causal = true; k.d = k.dv = 64; run_case(k, 1);
  k.d = k.dv = 128; run_case(k, 1);
}

}  // namespace
