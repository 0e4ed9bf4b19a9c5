// tests/gpu/fwd_case.cuh — the forward test case of the Hopper forward suites (test_hopper_fwd.cu,
// test_hopper_fwd_schedule.cu): a batched or varlen problem built from a Case (poisoned outputs,
// optional NaN past the keys, strided or packed views), fa4::forward run on it `repeats` times
// (bitwise equal), and run_case's checks against the GPU fp32 reference (gpu_reference.cuh): out
// and LSE within 2 x the naive same-precision implementation's error + atol, rows outside every
// sequence untouched, fully masked rows O = 0 and LSE = -inf (or the sink), NaN only where the
// reference has one.
#pragma once

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
    CUDA_OK(fa4::test::launch_reference(grid, max_sk, p, false, ref_o.ptr, ref_l.ptr));
    CUDA_OK(fa4::test::launch_reference(grid, max_sk, p, true, nv_o.ptr, nv_l.ptr));
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

}  // namespace
