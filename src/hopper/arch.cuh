// src/hopper/arch.cuh — the ONE file of the Hopper kernels that holds raw PTX.
//
// Everything else goes through CuTe/CUTLASS. What is here has no CuTe wrapper with the exact
// semantics we need, or we want the id/count explicit:
//   * named barriers (bar.sync / bar.arrive) with our own ids: warpgroups synchronise in pairs
//     (a consumer WG and the one before it in the ping-pong of wgmma issue) or alone (a warpgroup's O
//     slice staged for the TMA store) without stalling the whole CTA as __syncthreads would;
//   * ex2.approx.ftz.f32: the MUFU exponential (2^x, ~2 ulp, flushes subnormals) that the FA4
//     softmax splits against the FMA-pipe polynomial fa4::exp2_emulated;
//   * setmaxnreg: moves registers from the producer warpgroup (which only issues TMA) to the two
//     consumer warpgroups (which hold S, P and O in registers). Needs sm_90a and a register cap at
//     kernel entry (__launch_bounds__(threads, 1)).
// Tested on its own by tests/gpu/test_hopper_arch.cu.
#pragma once

#include <cstdint>

namespace fa4::hopper::arch {

/// Named-barrier ids. 0 is __syncthreads(); CUTLASS reserves none of these in our kernels.
enum NamedBarrierId : uint32_t {
  kBarrierSchedulerWG1 = 2,    ///< ping-pong: consumer warpgroup 1 may issue its wgmmas
  kBarrierSchedulerWG2 = 3,    ///< ping-pong: consumer warpgroup 2 may issue its wgmmas
  kBarrierConsumers = 4,       ///< all consumer warpgroups (e.g. after zeroing a V tail in smem)
  kBarrierEpilogueWG1 = 5,     ///< one consumer warpgroup: its O slice is in smem, TMA may store it
  kBarrierEpilogueWG2 = 6,
  kBarrierSchedulerWG3 = 7,    ///< the third consumer warpgroup (tile_m 192) of the two kinds above
  kBarrierEpilogueWG3 = 8,
};

/// Id of consumer warpgroup `wg`'s barrier of one per-warpgroup kind: the first two are adjacent
/// (base + wg, as the two-warpgroup kernels have always numbered them, so their code is unchanged),
/// a third warpgroup's (tile_m 192) comes after the shared ids.
__host__ __device__ constexpr uint32_t per_warpgroup_barrier(uint32_t base, uint32_t third, int num_wg, int wg) {
  return num_wg == 3 && wg == 2 ? third : base + uint32_t(wg);
}
template <int kNumWarpGroups>
__host__ __device__ constexpr uint32_t scheduler_barrier(int wg) {
  return per_warpgroup_barrier(kBarrierSchedulerWG1, kBarrierSchedulerWG3, kNumWarpGroups, wg);
}
template <int kNumWarpGroups>
__host__ __device__ constexpr uint32_t epilogue_barrier(int wg) {
  return per_warpgroup_barrier(kBarrierEpilogueWG1, kBarrierEpilogueWG3, kNumWarpGroups, wg);
}

/// Blocks until `num_threads` threads (multiple of 32, whole warps) have arrived at barrier `id`.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

/// Counts this warp's threads at barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

/// 2^x on the MUFU unit. -inf -> +0, results below 2^-126 flush to 0 (irrelevant in a softmax whose
/// row maximum contributes 2^0 to the sum).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// setmaxnreg: must be executed by every thread of a warpgroup, with the same constant.
template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_reg_alloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <uint32_t kRegs>
__device__ __forceinline__ void warpgroup_reg_dealloc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

/// Quad reductions: the 4 lanes of a quad (lane/4 equal) hold one accumulator row of a wgmma.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace fa4::hopper::arch
