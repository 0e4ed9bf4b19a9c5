// tests/gpu/test_hopper_in_place.cu — the in-place calls include/fa4/attention.h allows (out may be
// q itself in the forward, dq may be q itself in the backward: the same view) on the Hopper
// kernels: bitwise the results of the same calls into separate buffers, for every bucket with
// headdim_v == headdim, causal and not, with stream-K split tiles (fewer tiles than SMs), the
// small-query route (the decode kernel with split partials), and the deterministic backward.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../tools/cli_case.h"
#include "../tools/cli_device.h"
#include "gpu_test_util.cuh"
#include "test_util.h"

namespace {

using fa4::cli::CaseSpec;
using fa4::cli::DeviceProblem;
using fa4::cli::Problem;

/// Forward and deterministic backward into separate buffers, then the forward with out = (a copy
/// of) q and the backward with dq = (another copy of) q: bitwise equal. `route`: a substring the
/// forward's kernel name must hold ("" for any).
void check_in_place(CaseSpec s, const char* route) {
  if (fa4::test::leave_out(s.headdim, s.headdim, fa4::test::kFwd | fa4::test::kBwd | fa4::test::kDecode)) return;
  s.device = "cuda";
  s.backward = true;
  s.deterministic = true;
  s.seed = fa4::test::next_seed();
  Problem p = Problem::make(s);
  DeviceProblem dp(p, nullptr);
  const fa4::cli::Placement apart = dp.placement();
  fa4::cli::run_forward(p, apart, fa4::Backend::kCuda);
  fa4::cli::run_backward(p, apart, fa4::Backend::kCuda);
  dp.download_outputs();
  const std::vector<char> out = tensor_bytes(p.out), lse = tensor_bytes(p.lse), dq = tensor_bytes(p.dq);
  const std::vector<char> dk = tensor_bytes(p.dk), dv = tensor_bytes(p.dv);

  fa4::test::DevBuf<char> q_out(p.q.nbytes());
  ASSERT_NE(q_out.ptr, nullptr);
  ASSERT_EQ(cudaMemcpy(q_out.ptr, apart.q, q_out.n, cudaMemcpyDeviceToDevice), cudaSuccess);
  fa4::cli::Placement at = apart;
  at.q = at.out = q_out.ptr;
  const std::string kernel = fa4::cli::forward_kernel_name(p, at);
  EXPECT_NE(kernel.find(route), std::string::npos) << kernel << ": " << s.describe();
  ASSERT_EQ(cudaMemset(apart.lse, 0xFF, p.lse.nbytes()), cudaSuccess);
  fa4::cli::run_forward(p, at, fa4::Backend::kCuda);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(q_out.download() == out) << "out written over q (" << kernel << "): " << s.describe();
  dp.download_outputs();
  EXPECT_TRUE(tensor_bytes(p.lse) == lse) << "lse of the in-place forward: " << s.describe();

  fa4::test::DevBuf<char> q_dq(p.q.nbytes());
  ASSERT_NE(q_dq.ptr, nullptr);
  ASSERT_EQ(cudaMemcpy(q_dq.ptr, apart.q, q_dq.n, cudaMemcpyDeviceToDevice), cudaSuccess);
  at = apart;
  at.q = at.dq = q_dq.ptr;
  for (void* g : {apart.dk, apart.dv})
    ASSERT_EQ(cudaMemset(g, 0xFF, g == apart.dk ? p.dk.nbytes() : p.dv.nbytes()), cudaSuccess);
  fa4::cli::run_backward(p, at, fa4::Backend::kCuda);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(q_dq.download() == dq) << "dq written over q: " << s.describe();
  dp.download_outputs();
  EXPECT_TRUE(tensor_bytes(p.dk) == dk && tensor_bytes(p.dv) == dv) << "dk/dv of the in-place backward: " << s.describe();
}

TEST(HopperInPlace, OutOverQAndDqOverQ) {
  REQUIRE_HOPPER();
  for (int d : {64, 96, 128, 192, 256})
    for (bool causal : {false, true}) {
      CaseSpec s;
      s.batch = 2;
      s.seqlen_q = s.seqlen_k = 517;  // tails; few tiles: dense calls split tiles by stream-K
      s.num_heads = 4;
      s.num_heads_kv = 2;
      s.headdim = d;
      s.causal = causal;
      s.dtype = causal ? "fp16" : "bf16";
      {
        const fa4::test::ScopedOverride split("stream_k", causal ? "auto" : "1");
        check_in_place(s, "hopper::fwd_");
      }
      // A few queries per KV head over many keys: the decode kernel's split partials and merge.
      s.batch = 1;
      s.seqlen_q = 4;
      s.seqlen_k = 3000;
      s.num_heads = 32;
      s.num_heads_kv = 8;
      const fa4::test::ScopedOverride small_q("small_q", "decode");
      check_in_place(s, "small-query");
    }
}

}  // namespace
