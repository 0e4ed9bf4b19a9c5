// src/hopper/shared/mma.cuh — the wgmma helpers every Hopper kernel uses (CuTe): one fenced batch
// of k-steps, the accumulator -> RS A-operand register view, and the fp32 pair -> 16-bit word
// conversion. The forward converts its P with them, the backward its P^T and dS^T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

namespace fa4::hopper {

/// One wgmma batch: fence the accumulators, issue the k-steps, commit; optionally wait.
/// kKSteps: issue only the first kKSteps k-steps (-1: all of them), for operands whose last
/// k-steps hold zeros (a head dim padded in shared memory by TMA zero fill adds nothing there).
template <bool kZeroInit, int kWait, int kKSteps = -1, class TiledMma, class TA, class TB, class TC>
__device__ __forceinline__ void wgmma(TiledMma& mma, const TA& a, const TB& b, TC& c) {
  using namespace cute;
  constexpr bool kIsRS = !cute::is_base_of<GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  constexpr int kAllSteps = decltype(size<2>(a))::value;
  constexpr int kSteps = kKSteps < 0 ? kAllSteps : kKSteps;
  static_assert(kSteps > 0 && kSteps <= kAllSteps, "wgmma: kKSteps outside the operands' k-steps");
  if constexpr (kIsRS) warpgroup_fence_operand(const_cast<TA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) mma.accumulate_ = GMMA::ScaleOut::Zero;
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    cute::gemm(mma, a(_, _, k), b(_, _, k), c);
    mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  if constexpr (kWait >= 0) warpgroup_wait<kWait>();
  warpgroup_fence_operand(c);
  if constexpr (kIsRS) warpgroup_fence_operand(const_cast<TA&>(a));
}

/// Accumulator layout ((2,2,N/8),M,N) -> RS A-operand layout ((2,2,2),M,(N/16)): the same registers
/// in the same order (a k16 slice of A is two adjacent 8-column accumulator groups).
template <class Layout>
__device__ __forceinline__ auto acc_to_a_layout(Layout l) {
  using namespace cute;
  auto l2 = logical_divide(get<0, 2>(l), Tile<_2>{});
  return make_layout(make_layout(get<0, 0>(l), get<0, 1>(l), get<0, 0>(l2)), get<1>(l),
                     coalesce(make_layout(get<0, 1>(l2), get<2>(l))));
}

/// Two floats -> one 32-bit word of two 16-bit values (round to nearest even; low half = a).
template <class Element>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  if constexpr (std::is_same_v<Element, cutlass::bfloat16_t>) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return reinterpret_cast<uint32_t&>(h);
  } else {
    __half2 h = __floats2half2_rn(a, b);
    return reinterpret_cast<uint32_t&>(h);
  }
}

/// Writes a wgmma accumulator to shared memory in 16 bits for a TMA store: value pair i of the
/// thread's fragment acc (fp32) times scale(i), packed in the accumulator's register order, then
/// stored with the copy atom CopyAtom (stmatrix) tiled like TiledMma's C into the smem tensor s.
/// `thread` is the thread's index in TiledMma. The forward's O epilogue and the backward's dK / dV
/// epilogue stage through this.
template <class Element, class CopyAtom, class TiledMma, class Frag, class SmemTensor, class Scale>
__device__ __forceinline__ void stage_accumulator(int thread, const Frag& acc, SmemTensor&& s, Scale scale) {
  using namespace cute;
  Tensor r = make_tensor<Element>(acc.layout());
  Tensor r32 = recast<uint32_t>(r);
#pragma unroll
  for (int i = 0; i < size(acc) / 2; ++i) {
    const float f = scale(i);
    r32(i) = pack2<Element>(acc(2 * i) * f, acc(2 * i + 1) * f);
  }
  TiledMma mma;
  auto copy_c = make_tiled_copy_C(CopyAtom{}, mma);
  auto thr = copy_c.get_thread_slice(thread);
  cute::copy(copy_c, thr.retile_S(r), thr.partition_D(s));
}

}  // namespace fa4::hopper
