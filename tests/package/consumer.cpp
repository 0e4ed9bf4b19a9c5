// tests/package/consumer.cpp — uses an installed fa4 through its public headers only: a small CPU
// forward, compared with the library's float64 reference, and an fa4::Error caught across the
// shared-library boundary. Exit status 0 = the package works.
#include <cmath>
#include <cstdio>
#include <vector>

#include <fa4/attention.h>

int main() {
  constexpr int64_t kBatch = 1, kSeq = 16, kHeads = 2, kDim = 32;
  // fp32 inputs: every exp2 on the CPU's exp2 (no polynomial share by default for fp32) and
  // float64 output accumulators, so fp32 rounding of the scores and probabilities is what differs
  // from the float64 reference: ~1e-7 for these O(1) values.
  constexpr double kTolerance = 1e-5;
  const int64_t n = kBatch * kSeq * kHeads * kDim;
  std::vector<float> q(n), k(n), v(n), out(n), ref(n);
  std::vector<float> lse(kBatch * kHeads * kSeq), ref_lse(lse.size());
  for (int64_t i = 0; i < n; ++i) {  // deterministic, non-zero, O(1) values
    q[i] = std::sin(0.37f * float(i));
    k[i] = std::cos(0.91f * float(i));
    v[i] = std::sin(1.3f * float(i) + 0.5f);
  }
  auto view = [](std::vector<float>& x, std::initializer_list<int64_t> shape) {
    return fa4::TensorView::contiguous(x.data(), fa4::DType::kFP32, shape);
  };
  const auto qv = view(q, {kBatch, kSeq, kHeads, kDim}), kv = view(k, {kBatch, kSeq, kHeads, kDim}),
             vv = view(v, {kBatch, kSeq, kHeads, kDim});
  fa4::AttentionOptions opt;
  opt.causal = true;
  fa4::forward(qv, kv, vv, view(out, {kBatch, kSeq, kHeads, kDim}), view(lse, {kBatch, kHeads, kSeq}), opt);
  opt.backend = fa4::Backend::kCpuReference;
  fa4::forward(qv, kv, vv, view(ref, {kBatch, kSeq, kHeads, kDim}), view(ref_lse, {kBatch, kHeads, kSeq}), opt);

  double err = 0;
  for (int64_t i = 0; i < n; ++i) err = std::fmax(err, std::fabs(double(out[i]) - ref[i]));
  for (size_t i = 0; i < lse.size(); ++i) err = std::fmax(err, std::fabs(double(lse[i]) - ref_lse[i]));
  if (!(err <= kTolerance)) {  // also catches NaN
    std::printf("FAIL: max |fa4 - reference| = %g > %g\n", err, kTolerance);
    return 1;
  }

  bool caught = false;
  try {
    fa4::AttentionOptions bad;
    bad.softcap = -1.0f;
    fa4::forward(qv, kv, vv, view(out, {kBatch, kSeq, kHeads, kDim}), view(lse, {kBatch, kHeads, kSeq}), bad);
  } catch (const fa4::Error& e) {
    caught = true;
    std::printf("caught fa4::Error as expected: %s\n", e.what());
  }
  if (!caught) {
    std::printf("FAIL: a negative softcap did not throw fa4::Error\n");
    return 1;
  }
  std::printf("PASS: installed fa4 works (max |fa4 - reference| = %.3g)\n", err);
  return 0;
}
