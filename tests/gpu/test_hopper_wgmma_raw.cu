// tests/gpu/test_hopper_wgmma_raw.cu — the hand-built wgmma descriptors of src/hopper/arch/wgmma_raw.cuh
// (the decode kernel's wide tile) against the ones CuTe derives for the same operands: Q and K of
// S = Q K^T as K-major tiles of 64 rows x d, V of O = P V as the MN-major B operand (64 keys x d),
// d = 64 (one 64-column slab) and 128 (two), every k16 step, at a 1024-byte aligned smem address.
// The layouts themselves are CuTe's (tile_to_shape of its SW128 atoms, as the forward builds them);
// the wide tile's element offsets (decode/kernel_decode.cuh swz_slab) are checked against them too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>

#include "hopper/arch/wgmma_raw.cuh"
#include "hopper/decode/kernel_decode.cuh"

#include "gpu_test_util.cuh"

// A named namespace: nvcc's host stubs of __global__ templates in an anonymous namespace that
// pulls in `using namespace cute` refer to the namespace ambiguously.
namespace wgmma_raw_test {

using Elem = cutlass::bfloat16_t;
namespace gcd = cutlass::gemm::collective::detail;

template <int kD>
using LayoutK = decltype(cute::tile_to_shape(
    gcd::ss_smem_selector<cute::GMMA::Major::K, Elem, cute::_64, cute::Int<kD>>(),
    cute::Shape<cute::_64, cute::Int<kD>>{}));
template <int kD>
using LayoutVt = decltype(cute::tile_to_shape(
    gcd::ss_smem_selector<cute::GMMA::Major::MN, Elem, cute::Int<kD>, cute::_64>(),
    cute::Shape<cute::Int<kD>, cute::_64>{}, cute::Step<cute::_2, cute::_1>{}));

constexpr int kMaxSteps = 128 / 16 * 2 + 4;  // S: A and B per k-step at d128; P V: 4 k-steps

/// out[0..n): CuTe's descriptors, out[kMaxSteps..): ours, in the same order (S: A, B per k-step;
/// then P V's B per k-step). bad: elements whose swz_slab offset differs from CuTe's layout.
template <int kD>
__global__ void __launch_bounds__(128) desc_kernel(uint64_t* out, int* bad) {
  using namespace cute;
  extern __shared__ __align__(128) char smem_raw[];
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(smem_raw));
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw + ((1024u - (addr & 1023u)) & 1023u));
  Elem* sK = sQ + 64 * kD;
  Elem* sV = sK + 64 * kD;
  auto tQ = make_tensor(make_smem_ptr(sQ), LayoutK<kD>{});
  auto tK = make_tensor(make_smem_ptr(sK), LayoutK<kD>{});
  auto tVt = make_tensor(make_smem_ptr(sV), LayoutVt<kD>{});
  auto mma_qk = make_tiled_mma(GMMA::ss_op_selector<Elem, Elem, float, Shape<_64, _64, Int<kD>>>());
  auto mma_pv = make_tiled_mma(
      GMMA::rs_op_selector<Elem, Elem, float, Shape<_64, Int<kD>, _64>, GMMA::Major::K, GMMA::Major::MN>());
  auto thr_qk = mma_qk.get_thread_slice(threadIdx.x);
  auto fq = thr_qk.partition_fragment_A(tQ);
  auto fk = thr_qk.partition_fragment_B(tK);
  auto fv = mma_pv.get_thread_slice(threadIdx.x).partition_fragment_B(tVt);
  if (threadIdx.x == 0) {
    int n = 0;
    for (int ks = 0; ks < kD / 16; ++ks) {
      out[n] = fq(0, 0, ks).desc_;
      out[kMaxSteps + n++] = fa4::hopper::arch::desc_kmajor_sw128<64>(sQ, ks);
      out[n] = fk(0, 0, ks).desc_;
      out[kMaxSteps + n++] = fa4::hopper::arch::desc_kmajor_sw128<64>(sK, ks);
    }
    for (int ks = 0; ks < 4; ++ks) {
      out[n] = fv(0, 0, ks).desc_;
      out[kMaxSteps + n++] = fa4::hopper::arch::desc_mnmajor_sw128<64, kD>(sV, ks);
    }
  }
  // Element offsets: K-major (row, column) and the V^T view (column, row) against swz_slab.
  int mismatches = 0;
  for (int i = threadIdx.x; i < 64 * kD; i += blockDim.x) {
    const int r = i / kD, col = i % kD;
    const int mine = fa4::hopper::decode::swz_slab<64>(r, col / 8) + col % 8;
    mismatches += int(&tK(r, col) - sK != mine) + int(&tVt(col, r) - sV != mine);
  }
  atomicAdd(bad, mismatches);
}

template <int kD>
void expect_descriptors_match() {
  uint64_t* d_out;
  int* d_bad;
  ASSERT_EQ(cudaMalloc(&d_out, 2 * kMaxSteps * sizeof(uint64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_bad, sizeof(int)), cudaSuccess);
  cudaMemset(d_out, 0xff, 2 * kMaxSteps * sizeof(uint64_t));  // poison
  cudaMemset(d_bad, 0, sizeof(int));
  const int smem = 3 * 64 * kD * int(sizeof(Elem)) + 1024;
  ASSERT_EQ(cudaFuncSetAttribute(desc_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), cudaSuccess);
  desc_kernel<kD><<<1, 128, smem>>>(d_out, d_bad);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<uint64_t> h(2 * kMaxSteps);
  int bad = -1;
  ASSERT_EQ(cudaMemcpy(h.data(), d_out, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&bad, d_bad, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_out);
  cudaFree(d_bad);
  const int n = kD / 16 * 2 + 4;
  for (int i = 0; i < n; ++i) {
    EXPECT_NE(h[i], ~uint64_t(0)) << "d" << kD << " descriptor " << i << " not written";
    EXPECT_EQ(h[kMaxSteps + i], h[i]) << "d" << kD << " descriptor " << i << " (S: A, B per k-step, then V)";
  }
  EXPECT_EQ(bad, 0) << "d" << kD << ": elements whose swz_slab offset is not CuTe's";
}

}  // namespace wgmma_raw_test

namespace {

TEST(HopperArch, WgmmaDescriptorsMatchCute) {
  REQUIRE_HOPPER();
  wgmma_raw_test::expect_descriptors_match<64>();
  wgmma_raw_test::expect_descriptors_match<128>();
}

}  // namespace
