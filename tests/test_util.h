// tests/test_util.h — shared test helpers: owning host tensors, random and poison fills, and the
// project's accuracy rule
//     max|out - ref64| <= 2 * max|naive_same_precision - ref64| + atol,   NaN never passes
// where ref64 is the float64 oracle and naive_same_precision is the same naive maths with every
// intermediate rounded to the input dtype (src/cpu/naive_attention.h). atol follows flash-attn's
// tests: the representation error of the reference values in the output dtype,
//     atol = 2 * max|fl(fl(ref + 0.3) - 0.3) - ref|,  fl = rounding to the output dtype,
// i.e. about one ulp of the dtype at the reference's magnitude (tiny for fp32, ~2^-9 for bf16).
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/float16.h"
#include "fa4/tensor.h"

namespace fa4::test {

/// Fresh seed per call: a base (env FA4_TEST_SEED, else std::random_device, printed once so a
/// failure can be replayed) plus a call counter.
inline uint64_t next_seed() {
  static const uint64_t base = [] {
    const char* env = std::getenv("FA4_TEST_SEED");
    const uint64_t b = env ? std::strtoull(env, nullptr, 10) : uint64_t(std::random_device{}());
    std::fprintf(stderr, "[fa4 test] FA4_TEST_SEED=%llu\n", static_cast<unsigned long long>(b));
    return b;
  }();
  static std::atomic<uint64_t> counter{0};
  return base * 0x9E3779B97F4A7C15ull + counter.fetch_add(1);
}

/// An owning, zero-initialised host buffer of `numel` elements of `dtype` plus view helpers.
class HostTensor {
 public:
  HostTensor() = default;
  /// Contiguous tensor of `shape`.
  HostTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    numel_ = n;
    bytes_.assign(size_t(std::max<int64_t>(n, 1) * dtype_size(dtype)), 0);
  }

  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  /// Bytes of the elements (0 for an empty tensor, whose buffer still holds one element).
  size_t nbytes() const { return size_t(numel_ * dtype_size(dtype_)); }
  const std::vector<int64_t>& shape() const { return shape_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }

  /// Row-major view of the whole buffer.
  TensorView view() const {
    std::vector<int64_t> st(shape_.size());
    int64_t inner = 1;
    for (int d = int(shape_.size()) - 1; d >= 0; --d) {
      st[d] = inner;
      inner *= shape_[d];
    }
    return view(0, shape_, st);
  }
  /// Strided view into this buffer starting at element `offset`.
  TensorView view(int64_t offset, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& stride) const {
    TensorView t;
    t.data = const_cast<uint8_t*>(bytes_.data()) + offset * dtype_size(dtype_);
    t.dtype = dtype_;
    t.ndim = int32_t(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) {
      t.shape[d] = shape[d];
      t.stride[d] = stride[d];
    }
    return t;
  }

  float get(int64_t i) const { return detail::load_as_float(bytes_.data(), dtype_, i); }
  void set(int64_t i, float x) { detail::store_from_float(bytes_.data(), dtype_, i, x); }
  bool bitwise_equal(const HostTensor& o) const { return bytes_ == o.bytes_; }
  /// Bitwise equality of element i with element i of `o` (same dtype).
  bool element_bits_equal(const HostTensor& o, int64_t i) const {
    const int64_t sz = dtype_size(dtype_);
    return std::memcmp(bytes_.data() + i * sz, o.bytes_.data() + i * sz, size_t(sz)) == 0;
  }

 private:
  DType dtype_ = DType::kFP32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<uint8_t> bytes_;
};

/// The bytes of t's elements (to compare results bitwise, with each other or with a device copy).
inline std::vector<char> tensor_bytes(const HostTensor& t) {
  const char* b = static_cast<const char*>(t.data());
  return std::vector<char>(b, b + t.nbytes());
}

/// Fills every element with N(mean, stddev^2) (rounded to the dtype), fresh seed per call.
inline void fill_normal(HostTensor& t, float mean = 0.0f, float stddev = 1.0f) {
  std::mt19937_64 rng(next_seed());
  std::normal_distribution<float> dist(mean, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
}

/// The poison value: a quiet NaN in every float dtype (an int32 buffer gets 0x7fc0dead).
inline void fill_poison(HostTensor& t) {
  if (t.dtype() == DType::kInt32) {
    auto* p = static_cast<int32_t*>(t.data());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = 0x7fc0dead;
    return;
  }
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, std::numeric_limits<float>::quiet_NaN());
}

/// A contiguous fp32 CPU view of `x` with `shape` (x must outlive it): for tests that build small
/// inputs by hand.
inline TensorView f32_view(std::vector<float>& x, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(x.data(), DType::kFP32, shape);
}

/// Float64 mirror of a tensor buffer, filled by a naive:: writer; `written` marks the elements the
/// oracle wrote (everything else must stay untouched in the tested tensor).
struct Mirror {
  std::vector<double> v;
  std::vector<uint8_t> written;
  explicit Mirror(int64_t n = 0) : v(size_t(n), 0.0), written(size_t(n), 0) {}
  void put(int64_t off, double x) {
    v[size_t(off)] = x;
    written[size_t(off)] = 1;
  }
};

/// Writer for fa4::cpu::naive::forward/backward into mirrors (any may be null).
struct MirrorWriter {
  Mirror *o = nullptr, *l = nullptr, *gq = nullptr, *gk = nullptr, *gv = nullptr, *gs = nullptr;
  void out(int64_t off, double x) { o->put(off, x); }
  void lse(int64_t off, double x) { l->put(off, x); }
  void dq(int64_t off, double x) { gq->put(off, x); }
  void dk(int64_t off, double x) { gk->put(off, x); }
  void dv(int64_t off, double x) { gv->put(off, x); }
  void dsink(int32_t h, double x) { gs->put(h, x); }
};

/// Outcome of one accuracy check.
struct Accuracy {
  std::string name;
  double err = 0, naive_err = 0, atol = 0, extra = 0;  // extra: documented algorithmic slack
  int64_t checked = 0, bad_nonfinite = 0, touched_outside = 0, naive_nonfinite = 0;
  /// Elements the problem's shape says the call writes, counted from the shapes and indices on
  /// their own (not from the oracle); -1: not given. A check where the oracle wrote fewer (say,
  /// none) would otherwise pass on an output that was never written.
  int64_t expected = -1;
  double bound() const { return 2.0 * naive_err + atol + extra; }
  bool ok() const {
    return bad_nonfinite == 0 && touched_outside == 0 && naive_nonfinite == 0 && err <= bound() &&
           (expected < 0 || checked == expected);
  }
  std::string str() const {
    std::ostringstream s;
    s << name << ": err " << err << " naive " << naive_err << " atol " << atol << " extra " << extra
      << " bound " << bound() << " (n=" << checked << (expected >= 0 && checked != expected ? " of expected " : "")
      << (expected >= 0 && checked != expected ? std::to_string(expected) : std::string()) << ", nonfinite " << bad_nonfinite
      << ", touched outside " << touched_outside << ", naive nonfinite " << naive_nonfinite << ")";
    return s.str();
  }
};

/// Applies the rule to `out` (the tested tensor) against ref64 and the same-precision naive run.
/// Elements the oracle did not write must still equal `poisoned` bitwise (untouched). Where ref64
/// is NaN the output must be NaN; where it is +-inf the output must equal it exactly. expected:
/// the count of elements the call must write (Accuracy::expected), -1 if not given.
inline Accuracy check_accuracy(const std::string& name, const HostTensor& out,
                               const HostTensor& poisoned, const Mirror& ref, const Mirror& naive,
                               DType out_dtype, double extra = 0.0, int64_t expected = -1) {
  Accuracy a;
  a.name = name;
  a.extra = extra;
  a.expected = expected;
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (!ref.written[size_t(i)]) {
      if (!out.element_bits_equal(poisoned, i)) ++a.touched_outside;
      continue;
    }
    ++a.checked;
    const double r = ref.v[size_t(i)], x = out.get(i), n = naive.v[size_t(i)];
    if (std::isnan(r)) {
      if (!std::isnan(x)) ++a.bad_nonfinite;
      continue;
    }
    if (std::isinf(r)) {
      if (x != r) ++a.bad_nonfinite;
      continue;
    }
    if (!std::isfinite(x)) {
      ++a.bad_nonfinite;
      continue;
    }
    if (!std::isfinite(n)) {
      ++a.naive_nonfinite;
      continue;
    }
    a.err = std::max(a.err, std::abs(x - r));
    a.naive_err = std::max(a.naive_err, std::abs(n - r));
    const float rf = float(r);
    const float shifted = detail::round_to(out_dtype, detail::round_to(out_dtype, rf + 0.3f) - 0.3f);
    a.atol = std::max(a.atol, 2.0 * std::abs(double(shifted) - r));
  }
  return a;
}

}  // namespace fa4::test
