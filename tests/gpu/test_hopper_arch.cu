// tests/gpu/test_hopper_arch.cu — the raw-PTX layer of the Hopper kernels (src/hopper/arch/arch.cuh) on
// its own: ex2.approx against exp2, quad reductions, named barriers ordering two warp groups and
// three in round robin (with the per-warpgroup barrier ids), and setmaxnreg accepted in a
// warp-specialised kernel (384 threads with 24/240 registers, 512 with 24/160).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "hopper/arch/arch.cuh"

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
    named_barrier_arrive(NamedBarriers<2>::turn(0), 256);
  } else {
    named_barrier_sync(NamedBarriers<2>::turn(0), 256);
    flag_seen[threadIdx.x - 256] = flag;
    const int lane = threadIdx.x % 32;
    quad_out[2 * (threadIdx.x - 256)] = quad_max(float(lane));
    quad_out[2 * (threadIdx.x - 256) + 1] = quad_sum(float(lane));
  }
}

// 512 threads: three consumer warpgroups take turns through their turn barriers exactly as
// the d64 kernel's ping-pong does (warpgroup 0 pre-arrives on its own barrier; each waits on its
// own, 128 threads of its own + the previous one's 128-thread arrive, takes its turn and hands it
// on). The turn log must read 0, 1, 2, 0, 1, 2, ...
constexpr int kTurnRounds = 16;
__global__ void __launch_bounds__(512, 1) round_robin_kernel(int* order) {
  __shared__ volatile int log[3 * kTurnRounds];
  __shared__ int pos;  // next log slot, claimed atomically (each slot is written once)
  using namespace fa4::hopper::arch;
  if (threadIdx.x == 0) pos = 0;
  __syncthreads();
  const int wg = threadIdx.x / 128 - 1;  // consumer warpgroup 0..2; -1: the producer
  if (wg < 0) {
    warpgroup_reg_dealloc<24>();
    return;
  }
  warpgroup_reg_alloc<160>();
  if (wg == 0) named_barrier_arrive(NamedBarriers<3>::turn(0), 256);
  for (int r = 0; r < kTurnRounds; ++r) {
    named_barrier_sync(NamedBarriers<3>::turn(wg), 256);
    if (threadIdx.x % 128 == 0) log[atomicAdd(&pos, 1)] = wg;
    named_barrier_arrive(NamedBarriers<3>::turn((wg + 1) % 3), 256);
  }
  named_barrier_sync(NamedBarriers<3>::consumers(), 384);
  if (threadIdx.x == 128)
    for (int i = 0; i < 3 * kTurnRounds; ++i) order[i] = log[i];
}

// Barrier ids: distinct from each other and in 1..15 (0 is __syncthreads) for two and three
// warpgroups (two: with the backward's dQ staging ids), below kFirstFree; the two-warpgroup
// kernels keep the ids they were tuned with.
static_assert(fa4::hopper::arch::NamedBarriers<2>::turn(0) == 2 && fa4::hopper::arch::NamedBarriers<2>::turn(1) == 3);
static_assert(fa4::hopper::arch::NamedBarriers<2>::local(0) == 5 && fa4::hopper::arch::NamedBarriers<2>::local(1) == 6);
static_assert(fa4::hopper::arch::NamedBarriers<2>::dq_full(0, 0) == 7 && fa4::hopper::arch::NamedBarriers<2>::dq_empty(1, 1) == 14);
template <int kNumWG>
void expect_distinct_barrier_ids() {
  using B = fa4::hopper::arch::NamedBarriers<kNumWG>;
  std::vector<uint32_t> ids = {B::consumers()};
  for (int wg = 0; wg < kNumWG; ++wg) {
    ids.push_back(B::turn(wg));
    ids.push_back(B::local(wg));
    if constexpr (kNumWG == 2)  // the backward's dQ staging, two writer parities
      for (int w = 0; w < 2; ++w) {
        ids.push_back(B::dq_full(wg, w));
        ids.push_back(B::dq_empty(wg, w));
      }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_GE(ids[i], 1u);
    EXPECT_LT(ids[i], B::kFirstFree);
    EXPECT_LE(ids[i], 15u);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(ids[i], ids[j]) << kNumWG << " warpgroups: " << i << " " << j;
  }
}
TEST(HopperArch, BarrierIdsAreDistinct) {
  expect_distinct_barrier_ids<2>();
  expect_distinct_barrier_ids<3>();
}

TEST(HopperArch, ThreeWarpgroupRoundRobin) {
  REQUIRE_HOPPER();
  int* order;
  ASSERT_EQ(cudaMalloc(&order, 3 * kTurnRounds * 4), cudaSuccess);
  cudaMemset(order, 0xff, 3 * kTurnRounds * 4);  // poison: -1
  round_robin_kernel<<<1, 512>>>(order);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> h(3 * kTurnRounds);
  ASSERT_EQ(cudaMemcpy(h.data(), order, h.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(order);
  for (int i = 0; i < 3 * kTurnRounds; ++i) EXPECT_EQ(h[i], i % 3) << "turn " << i;
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
