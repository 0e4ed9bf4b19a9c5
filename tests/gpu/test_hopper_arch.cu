// tests/gpu/test_hopper_arch.cu — the raw-PTX layer of the Hopper kernels (src/hopper/arch.cuh) on
// its own: ex2.approx against exp2, quad reductions, named barriers ordering two warp groups, and
// setmaxnreg accepted in a warp-specialised kernel.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hopper/arch.cuh"

#include "gpu_test_util.cuh"

namespace {


__global__ void ex2_kernel(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fa4::hopper::arch::ex2_approx(x[i]);
}

// 384 threads: warpgroup 0 gives registers away, 1-2 take them (as the kernel does). Warpgroup 1
// writes a value, arrives on a named barrier; warpgroup 2 syncs on it and must see the value.
// Quad reductions are checked on lane-dependent values.
__global__ void __launch_bounds__(384, 1) barrier_kernel(int* flag_seen, float* quad_out) {
  __shared__ volatile int flag;
  using namespace fa4::hopper::arch;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    warpgroup_reg_dealloc<24>();
    return;
  }
  warpgroup_reg_alloc<240>();
  if (wg == 1) {
    if (threadIdx.x == 128) flag = 42;
    __threadfence_block();
    named_barrier_arrive(kBarrierSchedulerWG1, 256);
  } else {
    named_barrier_sync(kBarrierSchedulerWG1, 256);
    flag_seen[threadIdx.x - 256] = flag;
    const int lane = threadIdx.x % 32;
    quad_out[2 * (threadIdx.x - 256)] = quad_max(float(lane));
    quad_out[2 * (threadIdx.x - 256) + 1] = quad_sum(float(lane));
  }
}

TEST(HopperArch, Ex2ApproxMatchesExp2) {
  REQUIRE_HOPPER();
  std::vector<float> x;
  for (float v = -130.f; v <= 8.f; v += 0.0137f) x.push_back(v);
  x.push_back(-INFINITY);
  const int n = int(x.size());
  float *dx, *dy;
  cudaMalloc(&dx, n * 4);
  cudaMalloc(&dy, n * 4);
  cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
  ex2_kernel<<<(n + 255) / 256, 256>>>(dx, dy, n);
  std::vector<float> y(n);
  ASSERT_EQ(cudaMemcpy(y.data(), dy, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dx);
  cudaFree(dy);
  for (int i = 0; i < n; ++i) {
    const double ref = std::exp2(double(x[i]));
    if (ref < 0x1p-126) {  // ftz: subnormal results flush to zero
      EXPECT_LE(y[i], 0x1p-126f) << x[i];
      continue;
    }
    EXPECT_LE(std::fabs(y[i] - ref) / ref, 4e-7) << x[i];  // ~2 ulp
  }
  EXPECT_EQ(y[n - 1], 0.f);  // -inf -> +0
}

TEST(HopperArch, NamedBarrierOrdersWarpgroupsAndQuadReductions) {
  REQUIRE_HOPPER();
  int* seen;
  float* quad;
  cudaMalloc(&seen, 128 * 4);
  cudaMalloc(&quad, 256 * 4);
  barrier_kernel<<<1, 384>>>(seen, quad);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> s(128);
  std::vector<float> q(256);
  ASSERT_EQ(cudaMemcpy(s.data(), seen, 128 * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaMemcpy(q.data(), quad, 256 * 4, cudaMemcpyDeviceToHost);
  cudaFree(seen);
  cudaFree(quad);
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(s[i], 42) << i;
    const int base = (i % 32) / 4 * 4;
    EXPECT_EQ(q[2 * i], float(base + 3));
    EXPECT_EQ(q[2 * i + 1], float(4 * base + 6));
  }
}

}  // namespace
