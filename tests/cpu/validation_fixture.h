// tests/cpu/validation_fixture.h — the tiny problems the validation suites break or edge: tensors
// owning their memory plus a sentinel guard region (so a write past a tensor shows), batched and
// varlen problems, snapshots of every buffer, and poisoned outputs.
#pragma once

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

namespace fa4::test::validation {

using fa4::Backend;
using fa4::Device;
using fa4::DType;
using fa4::ErrorCode;
using fa4::TensorView;

constexpr uint8_t kSentinel = 0xA5;  // poison byte of outputs and guard regions
constexpr size_t kGuardBytes = 64;   // sentinel bytes after each tensor: catches neighbour writes

inline std::mt19937& rng() {
  static std::mt19937 g{std::random_device{}()};
  return g;
}

/// A tensor owning its memory plus a guard region. Copies share the memory.
struct Tensor {
  std::shared_ptr<std::vector<uint8_t>> mem;
  TensorView t;
};

/// Contiguous tensor; floating dtypes get random values in [-1, 1], int32 gets zeros.
inline Tensor make(DType dt, const std::vector<int64_t>& shape) {
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

inline Tensor make_int32(const std::vector<int32_t>& values) {
  Tensor x = make(DType::kInt32, {static_cast<int64_t>(values.size())});
  if (!values.empty()) std::memcpy(x.t.data, values.data(), values.size() * sizeof(int32_t));
  return x;
}

inline void poison(Tensor& x) { std::fill(x.mem->begin(), x.mem->end(), kSentinel); }

/// Re-allocates x with a new shape (keeps dtype and device), as a caller would.
inline void reshape(Tensor& x, const std::vector<int64_t>& shape) {
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

inline Problem batched(DType dt = DType::kBF16, int64_t B = kB, int64_t Sq = kSq, int64_t Sk = kSk,
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

inline Problem varlen(DType dt = DType::kBF16) {
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

inline std::vector<std::vector<uint8_t>> snapshot(Problem& p) {
  std::vector<std::vector<uint8_t>> s;
  for (Tensor* x : p.all()) s.push_back(*x->mem);
  return s;
}

inline void poison_outputs(Problem& p) {
  for (Tensor* x : {&p.out, &p.lse, &p.dq, &p.dk, &p.dv}) poison(*x);
  if (p.dsink) poison(*p.dsink);
}

/// Which entry point a case calls.
enum class Call { kForward, kBackward };

#if FA4_WITH_CUDA
/// The refusal of an fp32 call on cuda:0 (no Hopper kernel takes fp32, so nothing runs on the host
/// memory marked as CUDA): without a GPU (CI) NO_DEVICE naming the device, with one UNSUPPORTED
/// naming the dtype rule.
inline void expect_fp32_cuda_refusal(const fa4::Error& e) {
  const std::string what = e.what();
  if (what.find("does not exist") != std::string::npos) {
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice) << what;
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
  } else {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << what;
    EXPECT_NE(what.find("bf16 and fp16 only"), std::string::npos) << what;
  }
}
#endif

}  // namespace fa4::test::validation
