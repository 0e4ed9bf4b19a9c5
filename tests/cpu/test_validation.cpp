// tests/cpu/test_validation.cpp — the bad-input matrix of fa4::forward / fa4::backward.
//
// Every rule of include/fa4/attention.h is broken once (one table row each) on an otherwise valid
// tiny problem. Each row asserts the fa4::Error code, that the message names the tensor/option and
// the rule, and that EVERY buffer of the call (outputs, inputs and a guard region after each) is
// byte-for-byte untouched. Also: the edge cases of the public failure list that are about
// argument handling (C08, C20, C21, C28, C32, C34, C35), forward_support, and TensorView helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/validate.h"
#include "fa4/attention.h"
#include "core/float16.h"

namespace {

using fa4::Backend;
using fa4::Device;
using fa4::DType;
using fa4::ErrorCode;
using fa4::TensorView;

constexpr uint8_t kSentinel = 0xA5;  // poison byte of outputs and guard regions
constexpr size_t kGuardBytes = 64;   // sentinel bytes after each tensor: catches neighbour writes

std::mt19937& rng() {
  static std::mt19937 g{std::random_device{}()};
  return g;
}

/// A tensor owning its memory plus a guard region. Copies share the memory.
struct Tensor {
  std::shared_ptr<std::vector<uint8_t>> mem;
  TensorView t;
};

/// Contiguous tensor; floating dtypes get random values in [-1, 1], int32 gets zeros.
Tensor make(DType dt, const std::vector<int64_t>& shape) {
  Tensor x;
  x.t.dtype = dt;
  x.t.ndim = static_cast<int32_t>(shape.size());
  int64_t n = 1;
  for (int d = x.t.ndim - 1; d >= 0; --d) {
    x.t.shape[d] = shape[d];
    x.t.stride[d] = n;
    n *= std::max<int64_t>(shape[d], 1);
  }
  const size_t bytes = static_cast<size_t>(n * fa4::dtype_size(dt));
  x.mem = std::make_shared<std::vector<uint8_t>>(bytes + kGuardBytes, kSentinel);
  x.t.data = x.mem->data();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  if (dt == DType::kBF16 || dt == DType::kFP16 || dt == DType::kFP32)
    for (int64_t i = 0; i < n; ++i) fa4::detail::store_from_float(x.t.data, dt, i, u(rng()));
  if (dt == DType::kInt32) std::memset(x.t.data, 0, bytes);
  return x;
}

Tensor make_int32(const std::vector<int32_t>& values) {
  Tensor x = make(DType::kInt32, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(x.t.data, values.data(), values.size() * sizeof(int32_t));
  return x;
}

void poison(Tensor& x) { std::fill(x.mem->begin(), x.mem->end(), kSentinel); }

/// Re-allocates x with a new shape (keeps dtype and device), as a caller would.
void reshape(Tensor& x, const std::vector<int64_t>& shape) {
  const Device dev = x.t.device;
  x = make(x.t.dtype, shape);
  x.t.device = dev;
}

/// A valid problem: batched (B, Sq, H, D) or varlen; GQA 4 query heads on 2 kv heads.
struct Problem {
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
  std::optional<Tensor> sink, dsink, cu_q, cu_k, used;
  fa4::BackwardOptions opt;

  std::vector<Tensor*> all() {
    std::vector<Tensor*> r{&q, &k, &v, &out, &lse, &dout, &dq, &dk, &dv};
    for (auto* o : {&sink, &dsink, &cu_q, &cu_k, &used})
      if (o->has_value()) r.push_back(&**o);
    return r;
  }
  void sync_options() {
    opt.sink = sink ? std::optional<TensorView>(sink->t) : std::nullopt;
    opt.cu_seqlens_q = cu_q ? std::optional<TensorView>(cu_q->t) : std::nullopt;
    opt.cu_seqlens_k = cu_k ? std::optional<TensorView>(cu_k->t) : std::nullopt;
    opt.seqused_k = used ? std::optional<TensorView>(used->t) : std::nullopt;
  }
  void forward() {
    sync_options();
    fa4::forward(q.t, k.t, v.t, out.t, lse.t, opt);
  }
  std::string support(std::string* kernel) {
    sync_options();
    return fa4::forward_support(q.t, k.t, v.t, out.t, lse.t, opt, kernel);
  }
  void backward() {
    sync_options();
    fa4::backward(dout.t, q.t, k.t, v.t, out.t, lse.t, dq.t, dk.t, dv.t, opt,
                  dsink ? std::optional<TensorView>(dsink->t) : std::nullopt);
  }
};

constexpr int64_t kB = 2, kSq = 3, kSk = 4, kH = 4, kHkv = 2, kD = 8, kDv = 8;

Problem batched(DType dt = DType::kBF16, int64_t B = kB, int64_t Sq = kSq, int64_t Sk = kSk,
                int64_t D = kD, int64_t Dv = kDv) {
  Problem p;
  p.q = make(dt, {B, Sq, kH, D});
  p.k = make(dt, {B, Sk, kHkv, D});
  p.v = make(dt, {B, Sk, kHkv, Dv});
  p.out = make(dt, {B, Sq, kH, Dv});
  p.lse = make(DType::kFP32, {B, kH, Sq});
  p.dout = make(dt, {B, Sq, kH, Dv});
  p.dq = make(dt, {B, Sq, kH, D});
  p.dk = make(dt, {B, Sk, kHkv, D});
  p.dv = make(dt, {B, Sk, kHkv, Dv});
  return p;
}

// Varlen: q lengths {2, 3}, k lengths {3, 4}; one spare packed row after each so that "last <=
// total rows" is exercised with rows that must stay untouched.
const std::vector<int32_t> kCuQ{0, 2, 5}, kCuK{0, 3, 7};
constexpr int64_t kTotalQ = 6, kTotalK = 8;

Problem varlen(DType dt = DType::kBF16) {
  Problem p;
  p.q = make(dt, {kTotalQ, kH, kD});
  p.k = make(dt, {kTotalK, kHkv, kD});
  p.v = make(dt, {kTotalK, kHkv, kDv});
  p.out = make(dt, {kTotalQ, kH, kDv});
  p.lse = make(DType::kFP32, {kH, kTotalQ});
  p.dout = make(dt, {kTotalQ, kH, kDv});
  p.dq = make(dt, {kTotalQ, kH, kD});
  p.dk = make(dt, {kTotalK, kHkv, kD});
  p.dv = make(dt, {kTotalK, kHkv, kDv});
  p.cu_q = make_int32(kCuQ);
  p.cu_k = make_int32(kCuK);
  p.opt.max_seqlen_q = 3;
  p.opt.max_seqlen_k = 4;
  return p;
}

std::vector<std::vector<uint8_t>> snapshot(Problem& p) {
  std::vector<std::vector<uint8_t>> s;
  for (Tensor* x : p.all()) s.push_back(*x->mem);
  return s;
}

void poison_outputs(Problem& p) {
  for (Tensor* x : {&p.out, &p.lse, &p.dq, &p.dk, &p.dv}) poison(*x);
  if (p.dsink) poison(*p.dsink);
}

// ------------------------------------------------------------------------------------------------
// The bad-input matrix.

enum class Call { kForward, kBackward };

struct BadCase {
  const char* name;
  Call call;
  bool varlen;
  std::function<void(Problem&)> mutate;
  ErrorCode code;
  std::vector<std::string> needles;  ///< substrings the message must contain
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.name; }

using F = Call;
constexpr ErrorCode kInv = ErrorCode::kInvalidArgument;
constexpr ErrorCode kUns = ErrorCode::kUnsupported;

void set_dtype4(Problem& p, DType dt) {
  for (Tensor* x : {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv}) x->t.dtype = dt;
}

std::vector<BadCase> bad_cases() {
  return {
      // ---- ranks / layout mode ----
      {"q_ndim3_batched", F::kForward, false, [](Problem& p) { reshape(p.q, {kB * kSq, kH, kD}); },
       kInv, {"q.ndim = 3", "must be 4"}},
      {"lse_ndim_wrong", F::kForward, false, [](Problem& p) { reshape(p.lse, {kB, kH * kSq}); },
       kInv, {"lse.ndim = 2", "(batch, num_heads, seqlen_q)"}},
      {"varlen_only_cu_q", F::kForward, false, [](Problem& p) { p.cu_q = make_int32({0, 3, 6}); },
       kInv, {"cu_seqlens_k is missing", "both"}},
      {"varlen_only_cu_k", F::kForward, true, [](Problem& p) { p.cu_q.reset(); },
       kInv, {"cu_seqlens_q is missing"}},
      {"varlen_q_4d", F::kForward, true, [](Problem& p) { reshape(p.q, {1, kTotalQ, kH, kD}); },
       kInv, {"q.ndim = 4", "varlen"}},
      // ---- dtypes ----
      {"fp8_rejected", F::kForward, false, [](Problem& p) { set_dtype4(p, DType::kFP8E4M3); },
       kUns, {"fp8_e4m3", "reserved"}},
      {"q_int32", F::kForward, false, [](Problem& p) { set_dtype4(p, DType::kInt32); },
       kInv, {"q.dtype = int32", "bf16, fp16 or fp32"}},
      {"k_dtype_mismatch", F::kForward, false, [](Problem& p) { p.k.t.dtype = DType::kFP16; },
       kInv, {"k.dtype = fp16", "must equal q.dtype = bf16"}},
      {"out_dtype_mismatch", F::kForward, false, [](Problem& p) { p.out.t.dtype = DType::kFP32; },
       kInv, {"out.dtype = fp32"}},
      {"lse_not_fp32", F::kForward, false, [](Problem& p) { p.lse.t.dtype = DType::kBF16; },
       kInv, {"lse.dtype = bf16", "fp32"}},
      // ---- devices, data, strides ----
      {"out_on_other_device", F::kForward, false,
       [](Problem& p) { p.out.t.device = Device::cuda(0); },
       kInv, {"out is on cuda:0", "q is on cpu", "same device"}},
      {"out_on_other_stream", F::kForward, false,
       [](Problem& p) {
         for (Tensor* x : p.all()) x->t.device = Device::cuda(0);
         p.out.t.device.stream = reinterpret_cast<void*>(0x10);
       },
       kInv, {"out.device.stream differs from q.device.stream", "same CUDA stream"}},
      {"lse_on_other_device", F::kForward, false,
       [](Problem& p) { p.lse.t.device = Device::cuda(1); }, kInv, {"lse is on cuda:1"}},
      {"q_null_data", F::kForward, false, [](Problem& p) { p.q.t.data = nullptr; },
       kInv, {"q.data is null"}},
      {"q_last_dim_not_contiguous", F::kForward, false,
       [](Problem& p) { p.q.t.stride[3] = 2; }, kInv, {"q.stride[3] = 2", "contiguous"}},
      {"out_stride0_aliases_rows", F::kForward, false, [](Problem& p) { p.out.t.stride[1] = 0; },
       kInv, {"out.stride[1] = 0", "two elements to one address"}},
      {"dk_stride0_aliases_heads", F::kBackward, false, [](Problem& p) { p.dk.t.stride[2] = 0; },
       kInv, {"dk.stride[2] = 0", "two elements to one address"}},
      {"out_misaligned_data", F::kForward, false,
       [](Problem& p) { p.out.t.data = static_cast<char*>(p.out.t.data) + 1; },
       kInv, {"out.data is not aligned", "2 bytes"}},
      {"v_last_dim_not_contiguous", F::kForward, false,
       [](Problem& p) { p.v.t.stride[3] = 0; }, kInv, {"v.stride[3] = 0", "contiguous"}},
      {"k_negative_stride", F::kForward, false, [](Problem& p) { p.k.t.stride[1] = -16; },
       kInv, {"k.stride[1] = -16", "negative"}},
      {"negative_extent", F::kForward, false, [](Problem& p) { p.q.t.shape[1] = -1; },
       kInv, {"q.shape[1] = -1", ">= 0"}},
      // ---- shape relations ----
      {"k_headdim_mismatch", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, kH, 64});
         reshape(p.k, {kB, kSk, kHkv, 72});
       },
       kInv, {"fa4::forward: k.shape[3] (headdim) = 72 must equal q.shape[3] = 64"}},
      {"k_batch_mismatch", F::kForward, false, [](Problem& p) { reshape(p.k, {3, kSk, kHkv, kD}); },
       kInv, {"k.shape[0] (batch) = 3 must equal q.shape[0] = 2"}},
      {"v_seqlen_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.v, {kB, kSk + 1, kHkv, kDv}); },
       kInv, {"v.shape[1] (seqlen_k) = 5 must equal k.shape[1] = 4"}},
      {"v_heads_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.v, {kB, kSk, 1, kDv}); },
       kInv, {"v.shape[2] (num_heads_kv) = 1 must equal k.shape[2] = 2"}},
      {"out_headdim_v_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.out, {kB, kSq, kH, 16}); },
       kInv, {"out.shape[3] (headdim_v) = 16 must equal v.shape[3] = 8"}},
      {"out_seqlen_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.out, {kB, kSq + 1, kH, kDv}); },
       kInv, {"out.shape[1] (seqlen_q)"}},
      {"lse_seqlen_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.lse, {kB, kH, kSq + 2}); },
       kInv, {"lse.shape[2] (seqlen_q) = 5 must equal q.shape[1] = 3"}},
      {"lse_batch_layout_swapped", F::kForward, false,
       [](Problem& p) { reshape(p.lse, {kB, kSq, kH}); }, kInv, {"lse.shape[1] (num_heads)"}},
      // ---- heads (C21, C28) and head dims (C34) ----
      {"C21_heads_not_multiple", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, 3, kD});
         reshape(p.out, {kB, kSq, 3, kDv});
         reshape(p.lse, {kB, 3, kSq});
       },
       kInv, {"num_heads = 3", "multiple of num_heads_kv = 2"}},
      {"C21_num_heads_kv_zero", F::kForward, false,
       [](Problem& p) {
         reshape(p.k, {kB, kSk, 0, kD});
         reshape(p.v, {kB, kSk, 0, kDv});
       },
       kInv, {"k.shape[2] (num_heads_kv) = 0", ">= 1"}},
      {"num_heads_zero", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, 0, kD});
         reshape(p.out, {kB, kSq, 0, kDv});
         reshape(p.lse, {kB, 0, kSq});
       },
       kInv, {"q.shape[2] (num_heads) = 0", ">= 1"}},
      {"C34_headdim_0", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, kH, 0});
         reshape(p.k, {kB, kSk, kHkv, 0});
       },
       kInv, {"q.shape[3] (headdim) = 0 must be >= 1"}},
      {"C34_headdim_300", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, kH, 300});
         reshape(p.k, {kB, kSk, kHkv, 300});
       },
       kUns, {"q.shape[3] (headdim) = 300", "maximum is 256"}},
      {"C34_headdim_v_300", F::kForward, false,
       [](Problem& p) {
         reshape(p.v, {kB, kSk, kHkv, 300});
         reshape(p.out, {kB, kSq, kH, 300});
       },
       kUns, {"v.shape[3] (headdim_v) = 300", "maximum is 256"}},
      // ---- options ----
      {"C32_scale_zero", F::kForward, false, [](Problem& p) { p.opt.softmax_scale = 0.0f; },
       kInv, {"options.softmax_scale = 0", "finite and > 0"}},
      {"C32_scale_negative", F::kForward, false, [](Problem& p) { p.opt.softmax_scale = -0.5f; },
       kInv, {"options.softmax_scale = -0.5"}},
      {"C32_scale_nan", F::kForward, false,
       [](Problem& p) { p.opt.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
       kInv, {"options.softmax_scale = nan"}},
      {"C32_scale_inf", F::kForward, false,
       [](Problem& p) { p.opt.softmax_scale = std::numeric_limits<float>::infinity(); },
       kInv, {"options.softmax_scale = inf"}},
      {"C32_scale_zero_backward", F::kBackward, false,
       [](Problem& p) { p.opt.softmax_scale = 0.0f; }, kInv, {"fa4::backward: options.softmax_scale"}},
      {"softcap_negative", F::kForward, false, [](Problem& p) { p.opt.softcap = -1.0f; },
       kInv, {"options.softcap = -1", ">= 0"}},
      {"softcap_nan", F::kForward, false,
       [](Problem& p) { p.opt.softcap = std::numeric_limits<float>::quiet_NaN(); },
       kInv, {"options.softcap = nan"}},
      {"C08_window_left_minus2", F::kForward, false,
       [](Problem& p) { p.opt.window_size_left = -2; p.opt.window_size_right = 0; },
       kInv, {"options.window_size_left = -2", "-1 (unbounded) or >= 0"}},
      {"window_right_minus5", F::kForward, false, [](Problem& p) { p.opt.window_size_right = -5; },
       kInv, {"options.window_size_right = -5"}},
      {"causal_with_window_right_3", F::kForward, false,
       [](Problem& p) { p.opt.causal = true; p.opt.window_size_right = 3; },
       kInv, {"options.causal", "window_size_right = 3"}},
      {"rescale_threshold_9", F::kForward, false, [](Problem& p) { p.opt.rescale_threshold = 9; },
       kInv, {"options.rescale_threshold = 9", "[0, 8]"}},
      {"rescale_threshold_negative", F::kForward, false,
       [](Problem& p) { p.opt.rescale_threshold = -1; }, kInv, {"options.rescale_threshold = -1"}},
      {"rescale_threshold_nan", F::kForward, false,
       [](Problem& p) { p.opt.rescale_threshold = std::nanf(""); },
       kInv, {"options.rescale_threshold = nan"}},
      {"exp2_fraction_0_3", F::kForward, false,
       [](Problem& p) { p.opt.exp2_emulation_fraction = 0.3f; },
       kInv, {"options.exp2_emulation_fraction = 0.3", "multiple of 1/16"}},
      {"exp2_fraction_above_1", F::kForward, false,
       [](Problem& p) { p.opt.exp2_emulation_fraction = 1.0625f; },
       kInv, {"options.exp2_emulation_fraction = 1.0625"}},
      {"exp2_fraction_negative", F::kForward, false,
       [](Problem& p) { p.opt.exp2_emulation_fraction = -0.0625f; },
       kInv, {"options.exp2_emulation_fraction = -0.0625"}},
      {"backend_cuda_on_cpu_tensors", F::kForward, false,
       [](Problem& p) { p.opt.backend = Backend::kCuda; }, kInv, {"kCuda", "cpu"}},
      {"backend_not_an_enum", F::kForward, false,
       [](Problem& p) { p.opt.backend = static_cast<Backend>(7); }, kInv, {"options.backend = 7"}},
      {"batched_seqused_k", F::kForward, false,
       [](Problem& p) { p.used = make_int32({1, 1}); }, kInv, {"seqused_k", "varlen"}},
      {"batched_max_seqlen_q_disagrees", F::kForward, false,
       [](Problem& p) { p.opt.max_seqlen_q = 7; }, kInv, {"options.max_seqlen_q = 7", "varlen"}},
      // ---- sink ----
      {"sink_wrong_dtype", F::kForward, false,
       [](Problem& p) { p.sink = make(DType::kBF16, {kH}); }, kInv, {"sink.dtype = bf16", "fp32"}},
      {"sink_wrong_size", F::kForward, false,
       [](Problem& p) { p.sink = make(DType::kFP32, {kH + 1}); },
       kInv, {"sink.shape[0] (num_heads) = 5 must equal q.shape[2] = 4"}},
      // ---- varlen structure and contents (C35) ----
      {"C35_cu_q_last_exceeds_total_q", F::kForward, true,
       [](Problem& p) { p.cu_q = make_int32({0, 2, kTotalQ + 1}); p.opt.max_seqlen_q = 5; },
       kInv, {"cu_seqlens_q[2] = 7 exceeds q.shape[0] (total_q) = 6"}},
      {"C35_cu_k_last_exceeds_total_k", F::kForward, true,
       [](Problem& p) { p.cu_k = make_int32({0, 4, kTotalK + 2}); p.opt.max_seqlen_k = 6; },
       kInv, {"cu_seqlens_k[2] = 10 exceeds k.shape[0] (total_k) = 8"}},
      {"C35_cu_q_start_not_zero", F::kForward, true,
       [](Problem& p) { p.cu_q = make_int32({1, 2, 5}); }, kInv, {"cu_seqlens_q[0] = 1 must be 0"}},
      {"C35_cu_k_decreasing", F::kForward, true,
       [](Problem& p) { p.cu_k = make_int32({0, 5, 3}); p.opt.max_seqlen_k = 5; },
       kInv, {"cu_seqlens_k[2] = 3 < cu_seqlens_k[1] = 5", "non-decreasing"}},
      {"C35_length_exceeds_max_seqlen_q", F::kForward, true,
       [](Problem& p) { p.opt.max_seqlen_q = 2; },
       kInv, {"sequence 1", "= 3 > options.max_seqlen_q = 2"}},
      {"C35_length_exceeds_max_seqlen_k", F::kForward, true,
       [](Problem& p) { p.opt.max_seqlen_k = 3; }, kInv, {"options.max_seqlen_k = 3"}},
      {"C35_seqused_k_too_long", F::kForward, true,
       [](Problem& p) { p.used = make_int32({3, 5}); },
       kInv, {"seqused_k[1] = 5 must be in [0, 4]"}},
      {"C35_seqused_k_negative", F::kForward, true,
       [](Problem& p) { p.used = make_int32({-1, 2}); }, kInv, {"seqused_k[0] = -1"}},
      {"C35_seqused_k_wrong_size", F::kForward, true,
       [](Problem& p) { p.used = make_int32({1, 1, 1}); },
       kInv, {"seqused_k.shape[0] = 3 must equal batch = 2"}},
      {"C35_cu_seqlens_sizes_differ", F::kForward, true,
       [](Problem& p) { p.cu_k = make_int32({0, 3, 6, 7}); },
       kInv, {"cu_seqlens_k.shape[0] = 4 must equal cu_seqlens_q.shape[0] = 3"}},
      {"C35_cu_seqlens_backward", F::kBackward, true,
       [](Problem& p) { p.cu_q = make_int32({0, 4, kTotalQ + 3}); p.opt.max_seqlen_q = 5; },
       kInv, {"fa4::backward: cu_seqlens_q[2] = 9 exceeds"}},
      {"varlen_cu_seqlens_fp32", F::kForward, true,
       [](Problem& p) { p.cu_q->t.dtype = DType::kFP32; },
       kInv, {"cu_seqlens_q.dtype = fp32", "int32"}},
      {"varlen_cu_seqlens_empty", F::kForward, true,
       [](Problem& p) { p.cu_q = make_int32({}); p.cu_k = make_int32({}); },
       kInv, {"cu_seqlens_q.shape[0] = 0"}},
      {"varlen_max_seqlen_q_zero", F::kForward, true,
       [](Problem& p) { p.opt.max_seqlen_q = 0; }, kInv, {"options.max_seqlen_q = 0", "> 0"}},
      {"varlen_lse_layout", F::kForward, true, [](Problem& p) { reshape(p.lse, {kTotalQ, kH}); },
       kInv, {"lse.shape[0] (num_heads) = 6 must equal q.shape[1] = 4"}},
      // ---- backward-only ----
      {"dsink_missing", F::kBackward, false,
       [](Problem& p) { p.sink = make(DType::kFP32, {kH}); }, kInv, {"dsink is missing"}},
      {"dsink_without_sink", F::kBackward, false,
       [](Problem& p) { p.dsink = make(DType::kFP32, {kH}); },
       kInv, {"dsink is given but options.sink is not set"}},
      {"dsink_wrong_size", F::kBackward, false,
       [](Problem& p) {
         p.sink = make(DType::kFP32, {kH});
         p.dsink = make(DType::kFP32, {2});
       },
       kInv, {"dsink.shape[0] = 2 must equal num_heads = 4"}},
      {"dq_shape_mismatch", F::kBackward, false,
       [](Problem& p) { reshape(p.dq, {kB, kSq, kH, kD + 1}); },
       kInv, {"dq.shape[3] = 9 must equal q.shape[3] = 8"}},
      {"dk_shape_mismatch", F::kBackward, false,
       [](Problem& p) { reshape(p.dk, {kB, kSk - 1, kHkv, kD}); }, kInv, {"dk.shape[1] = 3"}},
      {"dv_ndim", F::kBackward, false, [](Problem& p) { reshape(p.dv, {kB, kSk, kHkv * kDv}); },
       kInv, {"dv.ndim = 3", "v.ndim = 4"}},
      {"dout_shape_mismatch", F::kBackward, false,
       [](Problem& p) { reshape(p.dout, {kB, kSq, kH, kDv * 2}); },
       kInv, {"dout.shape[3] = 16 must equal out.shape[3] = 8"}},
      {"dout_dtype_mismatch", F::kBackward, false,
       [](Problem& p) { p.dout.t.dtype = DType::kFP16; }, kInv, {"dout.dtype = fp16"}},
      {"dk_last_dim_not_contiguous", F::kBackward, false,
       [](Problem& p) { p.dk.t.stride[3] = 3; }, kInv, {"dk.stride[3] = 3"}},
      {"dq_other_device", F::kBackward, false,
       [](Problem& p) { p.dq.t.device = Device::cuda(0); }, kInv, {"dq is on cuda:0"}},
      {"backward_forward_rules_apply", F::kBackward, false,
       [](Problem& p) { reshape(p.k, {kB, kSk, kHkv, kD + 8}); }, kInv, {"k.shape[3] (headdim)"}},
  };
}

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, ThrowsNamedErrorAndWritesNothing) {
  const BadCase& c = GetParam();
  Problem p = c.varlen ? varlen() : batched();
  c.mutate(p);
  poison_outputs(p);
  const auto before = snapshot(p);

  std::string message;
  ErrorCode code = ErrorCode::kOk;
  try {
    if (c.call == Call::kForward) p.forward(); else p.backward();
  } catch (const fa4::Error& e) {
    message = e.what();
    code = e.code();
  }
  ASSERT_FALSE(message.empty()) << "no fa4::Error thrown";
  EXPECT_EQ(code, c.code) << fa4::error_code_name(code) << ": " << message;
  const char* fn = c.call == Call::kForward ? "fa4::forward: " : "fa4::backward: ";
  EXPECT_EQ(message.rfind(fn, 0), 0u) << message;
  for (const std::string& n : c.needles)
    EXPECT_NE(message.find(n), std::string::npos) << "message: " << message << "\nmissing: " << n;

  const auto after = snapshot(p);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(before[i] == after[i]) << "buffer " << i << " of the call was modified";

  if (c.call == Call::kForward) {  // forward_support reports exactly what forward throws
    std::string kernel = "stale";
    EXPECT_EQ(p.support(&kernel), message);
    EXPECT_TRUE(kernel.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Validation, BadInput, ::testing::ValuesIn(bad_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// ------------------------------------------------------------------------------------------------
// Accepted inputs and resolved params.

TEST(Validation, ValidProblemsAreSupported) {
  for (bool vl : {false, true}) {
    Problem p = vl ? varlen() : batched();
    std::string kernel;
    EXPECT_EQ(p.support(&kernel), "");
    EXPECT_EQ(kernel, "cpu::flash_forward");
    p.opt.backend = Backend::kCpuReference;
    EXPECT_EQ(p.support(&kernel), "");
    EXPECT_EQ(kernel, "cpu::reference_forward");
    p.opt.backend = Backend::kCpu;
    EXPECT_EQ(p.support(nullptr), "");
  }
}

TEST(Validation, BatchedParamsResolved) {
  Problem p = batched(DType::kFP16, 2, 3, 5, 16, 4);
  const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_EQ(fp.dtype, DType::kFP16);
  EXPECT_EQ(fp.batch, 2);
  EXPECT_EQ(fp.seqlen_q, 3);
  EXPECT_EQ(fp.seqlen_k, 5);
  EXPECT_EQ(fp.num_heads, kH);
  EXPECT_EQ(fp.num_heads_kv, kHkv);
  EXPECT_EQ(fp.headdim, 16);
  EXPECT_EQ(fp.headdim_v, 4);
  EXPECT_EQ(fp.total_q, 6);
  EXPECT_EQ(fp.total_k, 10);
  EXPECT_FALSE(fp.is_varlen);
  // C32: the default scale uses the real head dim of q (16), never headdim_v (4).
  EXPECT_FLOAT_EQ(fp.softmax_scale, 0.25f);
  EXPECT_FLOAT_EQ(fp.softmax_scale_log2, 0.25f * 1.4426950408889634f);
  EXPECT_EQ(fp.q_stride.batch, 3 * kH * 16);
  EXPECT_EQ(fp.q_stride.row, kH * 16);
  EXPECT_EQ(fp.q_stride.head, 16);
  EXPECT_EQ(fp.lse_batch_stride, kH * 3);
  EXPECT_EQ(fp.lse_head_stride, 3);
  EXPECT_EQ(fp.lse_row_stride, 1);
  EXPECT_EQ(fp.mask.window_left, -1);
  EXPECT_EQ(fp.mask.window_right, -1);
  EXPECT_FALSE(fp.exp2_fraction_given);
  EXPECT_EQ(fp.q, p.q.t.data);
  EXPECT_EQ(fp.lse, p.lse.t.data);
  EXPECT_EQ(fp.kv_head(3), 1);  // C21: contiguous groups, h / (H / Hkv)
  EXPECT_EQ(fp.kv_head(1), 0);

  p.opt.softmax_scale = 10.0f;
  p.opt.softcap = 30.0f;
  p.opt.exp2_emulation_fraction = 0.25f;
  p.opt.rescale_threshold = 0.0f;
  const auto fp2 = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_EQ(fp2.softmax_scale, 10.0f);
  EXPECT_EQ(fp2.softcap, 30.0f);
  EXPECT_TRUE(fp2.exp2_fraction_given);
  EXPECT_EQ(fp2.exp2_emulation.period, 16);
  EXPECT_EQ(fp2.exp2_emulation.emulated, 4);
  EXPECT_EQ(fp2.rescale_threshold, 0.0f);
}

TEST(Validation, Exp2FractionEndpointsAccepted) {
  for (float f : {0.0f, 0.0625f, 1.0f}) {
    Problem p = batched();
    p.opt.exp2_emulation_fraction = f;
    const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
    EXPECT_EQ(fp.exp2_emulation.emulated, static_cast<int>(f * 16));
  }
}

TEST(Validation, BackwardParamsResolved) {
  Problem p = batched();
  p.sink = make(DType::kFP32, {kH});
  p.dsink = make(DType::kFP32, {kH});
  p.opt.deterministic = true;
  p.sync_options();
  const auto bp = fa4::detail::make_bwd_params(p.dout.t, p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t,
                                               p.dq.t, p.dk.t, p.dv.t, p.opt, p.dsink->t, "t");
  EXPECT_TRUE(bp.deterministic);
  EXPECT_EQ(bp.dsink, p.dsink->t.data);
  EXPECT_EQ(bp.sink, p.sink->t.data);
  EXPECT_EQ(bp.dq, p.dq.t.data);
  EXPECT_EQ(bp.dk_stride.row, kHkv * kD);
  EXPECT_EQ(bp.dout_stride.batch, kSq * kH * kDv);
}

TEST(Validation, VarlenParamsResolved) {
  Problem p = varlen();
  p.used = make_int32({2, 4});
  p.sync_options();
  const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_TRUE(fp.is_varlen);
  EXPECT_EQ(fp.batch, 2);
  EXPECT_EQ(fp.seqlen_q, 3);
  EXPECT_EQ(fp.seqlen_k, 4);
  EXPECT_EQ(fp.total_q, kTotalQ);
  EXPECT_EQ(fp.total_k, kTotalK);
  EXPECT_EQ(fp.q_stride.batch, 0);
  EXPECT_EQ(fp.q_stride.row, kH * kD);
  EXPECT_EQ(fp.lse_batch_stride, 0);
  EXPECT_EQ(fp.lse_head_stride, kTotalQ);
  EXPECT_EQ(fp.lse_row_stride, 1);
  EXPECT_EQ(fp.cu_seqlens_q, p.cu_q->t.data);
  EXPECT_EQ(fp.seqused_k, p.used->t.data);
  const auto s1 = fa4::detail::seq_info_host(fp, 1);
  EXPECT_EQ(s1.q_row0, 2);
  EXPECT_EQ(s1.k_row0, 3);
  EXPECT_EQ(s1.seqlen_q, 3);
  EXPECT_EQ(s1.seqlen_k, 4);
}

// C08: (-1, 0) + causal is causal; causal folds into window_right = 0; (S-1, 0) is accepted.
TEST(Validation, C08_WindowSentinels) {
  Problem p = batched();
  auto mask = [&] {
    return fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t").mask;
  };
  p.opt.causal = true;
  EXPECT_EQ(mask().window_left, -1);
  EXPECT_EQ(mask().window_right, 0);
  p.opt.window_size_left = -1;
  p.opt.window_size_right = 0;
  EXPECT_EQ(mask().window_right, 0);
  EXPECT_EQ(p.support(nullptr), "");
  p.opt.window_size_left = kSk - 1;
  EXPECT_EQ(mask().window_left, kSk - 1);
  p.opt.causal = false;
  p.opt.window_size_left = 0;
  p.opt.window_size_right = 0;
  EXPECT_EQ(mask().window_left, 0);
  EXPECT_EQ(mask().window_right, 0);
}

// lse may have any (non-negative) strides, e.g. a (batch, seqlen_q, num_heads) buffer transposed.
TEST(Validation, LseAnyStrides) {
  Problem p = batched();
  Tensor buf = make(DType::kFP32, {kB, kSq, kH});
  p.lse = buf;
  p.lse.t.shape[1] = kH;
  p.lse.t.shape[2] = kSq;
  p.lse.t.stride[1] = 1;
  p.lse.t.stride[2] = kH;
  const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_EQ(fp.lse_head_stride, 1);
  EXPECT_EQ(fp.lse_row_stride, kH);
}

// Device-resident tensors: CUDA backward is not implemented; a CPU-only build has no CUDA at all.
// Validation never dereferences q/k/v/out/lse, so host memory marked as CUDA is safe here.
TEST(Validation, CudaTensorsSelector) {
  Problem p = batched();
  for (Tensor* x : p.all()) x->t.device = Device::cuda(0);
  poison_outputs(p);
  const auto before = snapshot(p);
  try {
    p.backward();
    ADD_FAILURE() << "no error";
  } catch (const fa4::Error& e) {
#if FA4_WITH_CUDA
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA backward is not implemented"), std::string::npos);
#else
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice) << e.what();
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
#endif
  }
  p.opt.backend = Backend::kCpu;
  try {
    p.forward();
    ADD_FAILURE() << "no error";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("kCpu needs CPU tensors"), std::string::npos) << e.what();
  }
#if !FA4_WITH_CUDA
  p.opt.backend = Backend::kAuto;
  std::string kernel;
  const std::string why = p.support(&kernel);
  EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
  EXPECT_TRUE(kernel.empty());
#endif
  EXPECT_TRUE(before == snapshot(p));
}

// ------------------------------------------------------------------------------------------------
// C28: empty problems are no-ops (nothing read: null data is fine; nothing written), except that a
// backward with no queries but some keys writes its exactly-zero dk/dv.

TEST(Validation, C28_EmptyProblemsWriteNothing) {
  struct Empty { const char* name; std::function<Problem()> make; };
  const std::vector<Empty> cases = {
      {"batch0", [] { return batched(DType::kFP16, 0, 5, 3); }},
      {"seqlen_q0", [] { return batched(DType::kFP16, 2, 0, kSk); }},
      {"seqlen_q0_seqlen_k0", [] { return batched(DType::kFP16, 2, 0, 0); }},
      {"varlen_total_q0", [] {
         Problem p = varlen();
         p.cu_q = make_int32({0, 0, 0});
         reshape(p.q, {0, kH, kD});
         reshape(p.out, {0, kH, kDv});
         reshape(p.dout, {0, kH, kDv});
         reshape(p.dq, {0, kH, kD});
         reshape(p.lse, {kH, 0});
         return p;
       }},
      {"varlen_batch0", [] {
         Problem p = varlen();
         p.cu_q = make_int32({0});
         p.cu_k = make_int32({0});
         p.opt.max_seqlen_q = 0;
         p.opt.max_seqlen_k = 0;
         return p;
       }},
  };
  for (const Empty& c : cases) {
    for (Call call : {Call::kForward, Call::kBackward}) {
      for (Backend b : {Backend::kAuto, Backend::kCpuReference}) {
        SCOPED_TRACE(std::string(c.name) + (call == Call::kForward ? " fwd" : " bwd"));
        Problem p = c.make();
        p.opt.backend = b;
        poison_outputs(p);
        auto before = snapshot(p);
        EXPECT_NO_THROW(call == Call::kForward ? p.forward() : p.backward());
        // No queries but some keys: the backward's dk/dv gradient is exactly 0 and is written
        // (never left as garbage); everything else stays untouched.
        const std::string name = c.name;
        const bool zero_grads =
            call == Call::kBackward && (name == "seqlen_q0" || name == "varlen_total_q0");
        if (zero_grads) {
          const std::vector<Tensor*> bufs = p.all();
          for (size_t i = 0; i < bufs.size(); ++i) {
            if (bufs[i] != &p.dk && bufs[i] != &p.dv) continue;
            // Rows inside the key sequences become +0.0 (all bytes 0 in any float dtype); the
            // varlen padding row past cu_seqlens_k[batch] keeps its poison (case C12).
            const TensorView& g = bufs[i]->t;  // contiguous; a sentinel zone follows its data
            const size_t row_bytes = size_t(g.numel() / g.shape[0] * fa4::dtype_size(g.dtype));
            const size_t rows = name == "varlen_total_q0" ? size_t(kCuK.back()) : size_t(g.shape[0]);
            std::fill(before[i].begin(), before[i].begin() + rows * row_bytes, uint8_t(0));
          }
        }
        const auto after = snapshot(p);
        for (size_t i = 0; i < before.size(); ++i)
          EXPECT_TRUE(before[i] == after[i]) << "an empty problem wrote buffer " << i;
      }
    }
  }
  // Batch 0 with null data pointers everywhere: nothing may be dereferenced.
  Problem p = batched(DType::kBF16, 0);
  for (Tensor* x : p.all()) x->t.data = nullptr;
  EXPECT_NO_THROW(p.forward());
  EXPECT_NO_THROW(p.backward());
}

// C28: seqlen_k == 0 with seqlen_q > 0 -> fully masked rows: out = 0, lse = -inf (= sink_h with a
// sink), dq = 0. Needs the CPU implementations.
TEST(Validation, C28_SeqlenK0GivesFullyMaskedRows) {
  for (Backend b : {Backend::kCpu, Backend::kCpuReference}) {
    for (bool with_sink : {false, true}) {
      SCOPED_TRACE(std::string(b == Backend::kCpu ? "cpu" : "reference") +
                   (with_sink ? " sink" : ""));
      Problem p = batched(DType::kFP32, 2, 3, 0);
      p.opt.backend = b;
      if (with_sink) {
        p.sink = make(DType::kFP32, {kH});
        p.dsink = make(DType::kFP32, {kH});
      }
      poison_outputs(p);
      ASSERT_NO_THROW(p.forward());
      const auto* out = static_cast<const float*>(p.out.t.data);
      const auto* lse = static_cast<const float*>(p.lse.t.data);
      for (int64_t i = 0; i < p.out.t.numel(); ++i) ASSERT_EQ(out[i], 0.0f) << i;
      for (int64_t bi = 0; bi < 2; ++bi)
        for (int64_t h = 0; h < kH; ++h)
          for (int64_t i = 0; i < 3; ++i) {
            const float l = lse[(bi * kH + h) * 3 + i];
            if (with_sink)
              ASSERT_EQ(l, static_cast<const float*>(p.sink->t.data)[h]);
            else
              ASSERT_TRUE(std::isinf(l) && l < 0) << l;
          }
      for (Tensor* x : {&p.out, &p.lse})  // guard region after the buffer untouched
        for (size_t i = x->mem->size() - kGuardBytes; i < x->mem->size(); ++i)
          ASSERT_EQ((*x->mem)[i], kSentinel);
      ASSERT_NO_THROW(p.backward());
      const auto* dq = static_cast<const float*>(p.dq.t.data);
      for (int64_t i = 0; i < p.dq.t.numel(); ++i) ASSERT_EQ(dq[i], 0.0f) << i;
    }
  }
}

// C35 (valid side): varlen rows outside every cu_seqlens range, dk/dv rows past seqused_k, and the
// memory right after each buffer stay untouched; rows inside the ranges are written.
TEST(Validation, C35_VarlenRowsOutsideRangesUntouched) {
  auto row_is_sentinel = [](const Tensor& x, int64_t row) {
    const int64_t bytes = x.t.stride[0] * fa4::dtype_size(x.t.dtype);
    for (int64_t i = row * bytes; i < (row + 1) * bytes; ++i)
      if ((*x.mem)[i] != kSentinel) return false;
    return true;
  };
  auto guard_intact = [](const Tensor& x) {
    for (size_t i = x.mem->size() - kGuardBytes; i < x.mem->size(); ++i)
      if ((*x.mem)[i] != kSentinel) return false;
    return true;
  };
  for (Backend b : {Backend::kCpu, Backend::kCpuReference}) {
    SCOPED_TRACE(b == Backend::kCpu ? "cpu" : "reference");
    Problem p = varlen(DType::kFP32);
    p.used = make_int32({2, 3});  // k rows 2 (seq 0) and 6 (seq 1) are past seqused_k
    p.opt.backend = b;
    poison_outputs(p);
    ASSERT_NO_THROW(p.forward());
    ASSERT_NO_THROW(p.backward());
    const int64_t last_q = kCuQ.back();  // == 5: packed row 5 belongs to no sequence
    for (int64_t r = 0; r < kTotalQ; ++r) {
      EXPECT_EQ(row_is_sentinel(p.out, r), r >= last_q) << "out row " << r;
      EXPECT_EQ(row_is_sentinel(p.dq, r), r >= last_q) << "dq row " << r;
    }
    const auto* lse_bytes = p.lse.mem->data();
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t r = 0; r < kTotalQ; ++r) {
        bool poisoned = true;
        for (int byte = 0; byte < 4; ++byte)
          poisoned = poisoned && lse_bytes[(h * kTotalQ + r) * 4 + byte] == kSentinel;
        EXPECT_EQ(poisoned, r >= last_q) << "lse head " << h << " row " << r;
      }
    for (int64_t r = 0; r < kTotalK; ++r) {
      const bool outside = r == 2 || r == 6 || r >= kCuK.back();
      EXPECT_EQ(row_is_sentinel(p.dk, r), outside) << "dk row " << r;
      EXPECT_EQ(row_is_sentinel(p.dv, r), outside) << "dv row " << r;
    }
    for (Tensor* x : p.all()) EXPECT_TRUE(guard_intact(*x));
  }
}

// ------------------------------------------------------------------------------------------------
// C20: odd strides on size-1 dims are ignored; head dim 1 works (CPU supports [1, 256]).

TEST(Validation, C20_SizeOneDimsOddStridesAccepted) {
  // q (1, 2, 1, 1) as left by transposing a (1, 1, 2, 1)-ish buffer: last-dim stride 2.
  Tensor q = make(DType::kFP32, {1, 2, 1, 1});
  q.t.stride[0] = 7;
  q.t.stride[1] = 1;
  q.t.stride[2] = 0;
  q.t.stride[3] = 2;
  Tensor k = make(DType::kFP32, {1, 1, 1, 1});
  k.t.stride[0] = 5; k.t.stride[1] = 3; k.t.stride[2] = 0; k.t.stride[3] = 9;
  Tensor v = make(DType::kFP32, {1, 1, 1, 1});
  v.t.stride[0] = -4; v.t.stride[1] = 0; v.t.stride[2] = 11; v.t.stride[3] = -1;  // never moved
  fa4::detail::store_from_float(k.t.data, DType::kFP32, 0, 1.0f);
  fa4::detail::store_from_float(v.t.data, DType::kFP32, 0, 1.0f);
  Tensor out = make(DType::kFP32, {1, 2, 1, 1});
  Tensor lse = make(DType::kFP32, {1, 1, 2});
  const fa4::AttentionOptions opt;
  const auto fp = fa4::detail::make_fwd_params(q.t, k.t, v.t, out.t, lse.t, opt, "t");
  EXPECT_EQ(fp.headdim, 1);
  EXPECT_EQ(fp.q_stride.row, 1);  // the one dim of size > 1 keeps its stride
  EXPECT_GE(fp.k_stride.batch, 0);
  EXPECT_GE(fp.v_stride.batch, 0);
  std::string kernel;
  EXPECT_EQ(fa4::forward_support(q.t, k.t, v.t, out.t, lse.t, opt, &kernel), "");
  for (Backend b : {Backend::kCpu, Backend::kCpuReference}) {
    fa4::AttentionOptions o;
    o.backend = b;
    poison(out);
    ASSERT_NO_THROW(fa4::forward(q.t, k.t, v.t, out.t, lse.t, o));
    const auto* po = static_cast<const float*>(out.t.data);
    EXPECT_EQ(po[0], 1.0f);  // one visible key: P = 1, out = v
    EXPECT_EQ(po[1], 1.0f);
  }
}

// ------------------------------------------------------------------------------------------------
// TensorView helpers and names.

TEST(Validation, TensorViewHelpers) {
  float buf[24];
  const TensorView t = TensorView::contiguous(buf, DType::kFP32, {2, 3, 4});
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[1], 4);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.shape_string(), "(2, 3, 4)");
  EXPECT_FALSE(t.is_cuda());
  const TensorView z = TensorView::contiguous(nullptr, DType::kBF16, {0, 5});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.stride[0], 5);
  const TensorView s = TensorView::strided(buf, DType::kFP32, {3, 2}, {1, 3}, Device::cuda(1));
  EXPECT_EQ(s.stride[1], 3);
  EXPECT_TRUE(s.is_cuda());
  EXPECT_EQ(s.device.index, 1);
  EXPECT_THROW(TensorView::strided(buf, DType::kFP32, {3, 2}, {1}), fa4::Error);
  EXPECT_THROW(TensorView::contiguous(buf, DType::kFP32, {1, 1, 1, 1, 1}), fa4::Error);
  EXPECT_THROW(TensorView::contiguous(buf, DType::kFP32, {2, -1}), fa4::Error);
  EXPECT_STREQ(fa4::dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(fa4::dtype_name(DType::kFP8E4M3), "fp8_e4m3");
  EXPECT_STREQ(fa4::dtype_name(DType::kInt32), "int32");
  EXPECT_STREQ(fa4::error_code_name(ErrorCode::kUnsupported), "unsupported");
  EXPECT_STREQ(fa4::error_code_name(ErrorCode::kNoDevice), "no_device");
}

}  // namespace
