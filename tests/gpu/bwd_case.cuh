// tests/gpu/bwd_case.cuh — what the Hopper backward suites share (test_hopper_bwd.cu,
// test_hopper_bwd_options.cu): one case forward + backward on the GPU judged by `fa4 check`'s rule
// (tools/cli_case.cpp: float64 oracle, same-precision naive baseline, stored-O term, poisoned
// outputs, fresh seeds), the base shape, and the helpers of the bitwise tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../tools/cli_case.h"
#include "../tools/cli_device.h"
#include "gpu_test_util.cuh"
#include "test_util.h"

// Internal linkage: each suite has its own copy.
namespace {

using fa4::cli::CaseSpec;
using fa4::cli::DeviceProblem;
using fa4::cli::Problem;

/// Forward + backward on the GPU for a fresh draw of `spec`; every output checked. Nothing where
/// the case is left out (a bucket it needs not compiled in this build).
void check_case(CaseSpec spec) {
  if (fa4::test::leave_out(spec.headdim, spec.dim_v(), fa4::test::kFwd | fa4::test::kBwd)) return;
  spec.device = "cuda";
  spec.backward = true;
  spec.seed = fa4::test::next_seed();
  Problem test = Problem::make(spec);
  Problem untouched = test;
  {
    DeviceProblem dp(test, nullptr);
    fa4::cli::run_forward(test, dp.placement(), fa4::Backend::kCuda);
    fa4::cli::run_backward(test, dp.placement(), fa4::Backend::kCuda);
    dp.download_outputs();
  }
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (const fa4::test::Accuracy& a : fa4::cli::check_outputs(test, untouched))
    EXPECT_TRUE(a.ok()) << spec.describe() << "\n  " << a.str();
}

CaseSpec base(int d, const char* dtype = "bf16") {
  CaseSpec s;
  s.batch = 2;
  s.seqlen_q = s.seqlen_k = 256;
  s.num_heads = 4;
  s.headdim = d;
  s.dtype = dtype;
  return s;
}

/// Fills the device dq, dk and dv with 0xFF (NaN) before a backward run: a row the run leaves
/// unwritten then shows as NaN, not as an earlier run's values.
void poison_gradients(const DeviceProblem& dp, const Problem& p) {
  for (auto [ptr, t] : {std::pair{dp.placement().dq, &p.dq}, {dp.placement().dk, &p.dk}, {dp.placement().dv, &p.dv}})
    ASSERT_EQ(cudaMemset(ptr, 0xFF, t->nbytes()), cudaSuccess);
}

/// A deterministic-mode CUDA backward of bucket d x dv (base's shape; the test sets the rest).
CaseSpec deterministic_case(int d, int dv, bool causal) {
  CaseSpec s = base(d);
  s.headdim_v = dv;
  s.device = "cuda";
  s.backward = true;
  s.deterministic = true;
  s.causal = causal;
  return s;
}

/// Ten deterministic backward runs of a fresh draw of `s` (deterministic_case) on one forward's
/// out and lse, each onto poisoned gradients (dsink too): bitwise-equal dq, dk, dv, dsink, and the
/// first run within the accuracy rule.
void check_deterministic_runs(CaseSpec s) {
  s.seed = fa4::test::next_seed();
  Problem p = Problem::make(s);
  Problem untouched = p;
  DeviceProblem dp(p, nullptr);
  fa4::cli::run_forward(p, dp.placement(), fa4::Backend::kCuda);
  std::vector<std::vector<char>> first;
  for (int run = 0; run < 10; ++run) {
    poison_gradients(dp, p);
    if (s.sink) ASSERT_EQ(cudaMemset(dp.placement().dsink, 0xFF, size_t(p.dsink.numel()) * 4), cudaSuccess);
    fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
    dp.download_outputs();
    std::vector<std::vector<char>> now{tensor_bytes(p.dq), tensor_bytes(p.dk), tensor_bytes(p.dv)};
    if (s.sink) now.push_back(tensor_bytes(p.dsink));
    if (run == 0) {
      first = now;
      for (const fa4::test::Accuracy& a : fa4::cli::check_outputs(p, untouched))
        EXPECT_TRUE(a.ok()) << s.describe() << "\n  " << a.str();
    } else {
      for (size_t i = 0; i < now.size(); ++i)
        EXPECT_TRUE(now[i] == first[i]) << "run " << run << " tensor " << i << " (dq, dk, dv, dsink): " << s.describe();
    }
  }
}

}  // namespace
