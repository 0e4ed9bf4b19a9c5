// src/hopper/arch/wgmma_raw.cuh — warpgroup MMA (wgmma) on plain register arrays and hand-built
// shared-memory descriptors, for a kernel that lays out its own shared memory: the decode kernel's
// wide tile (decode/kernel_decode.cuh), whose K/V rows arrive by cp.async from the page table, not
// by TMA. The forward and the backward derive their descriptors from CuTe layouts instead
// (shared/mma.cuh).
//
// Layout these descriptors describe: 128-byte swizzle, 1024-byte aligned tiles made of slabs of 64
// 16-bit columns; a slab holds its rows 128 bytes apart, 16-byte chunk c of row r at chunk
// c ^ (r % 8) (the hardware applies the XOR to address bits 4-6 from bits 7-9, hence the
// alignment). As a K-major operand (the contraction dimension along the row: Q and K of Q K^T)
// one k16 step is 32 bytes of the row; as an MN-major B operand (V of P V: rows are keys, the
// contraction dimension) one k16 step is 16 rows, and the slabs are consecutive 64-column groups
// of the N extent.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include <cute/arch/mma_sm90_gmma.hpp>

namespace fa4::hopper::arch {

/// The matrix descriptor of a 128-byte-swizzled operand starting at `smem` (PTX ISA "Matrix
/// Descriptor Format": start address, leading and stride byte offsets in 16-byte units, swizzle
/// mode 1 = 128 B in bits 62-63). K-major: stride = 1024 (8 rows), leading unused (16). MN-major:
/// stride = 1024 (8 rows of the contraction dimension), leading = the slab stride.
__device__ __forceinline__ uint64_t smem_desc_sw128(const void* smem, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return uint64_t((a & 0x3FFFFu) >> 4) | (uint64_t((leading_bytes >> 4) & 0x3FFFu) << 16) |
         (uint64_t((stride_bytes >> 4) & 0x3FFFu) << 32) | (uint64_t(1) << 62);
}
/// `desc` moved by `bytes` (a multiple of 16; the start address stays in shared memory's 256 KB).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }
/// k16 step ks of a K-major operand of kRows rows in the layout above (Q or K of Q K^T): 32 bytes
/// into the row per step, the next slab (64 columns x kRows rows) every 4 steps.
template <int kRows>
__device__ __forceinline__ uint64_t desc_kmajor_sw128(const void* tile, int ks) {
  return desc_advance(smem_desc_sw128(tile, 16, 1024), uint32_t((ks / 4) * (kRows * 128) + (ks % 4) * 32));
}
/// k16 step ks of an MN-major B operand of kCols columns whose kRows rows are the contraction
/// dimension (V of P V): 16 rows per step, its slabs of 64 columns kRows x 128 bytes apart (the
/// leading byte offset, 0 as CuTe sets it where one slab holds all the columns).
template <int kRows, int kCols>
__device__ __forceinline__ uint64_t desc_mnmajor_sw128(const void* tile, int ks) {
  return desc_advance(smem_desc_sw128(tile, kCols > 64 ? kRows * 128 : 0, 1024), uint32_t(ks * 16 * 128));
}

/// Makes this thread's generic-proxy writes to shared memory (st.shared, cp.async once waited for)
/// visible to the async proxy that wgmma reads through; before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The batch's fence, commit and wait are CuTe's (cute::warpgroup_arrive, warpgroup_commit_batch,
// warpgroup_wait<N>), as in shared/mma.cuh.
/// Pins registers across a wgmma's asynchronous accesses (cute::warpgroup_fence_operand on each:
/// accumulators, fp32, or A fragments, 16-bit pairs): the compiler may not move their reads or
/// writes over this point (use after the wait, and before the fence that precedes a batch).
template <class T, int kN>
__device__ __forceinline__ void fence_regs(T (&d)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) cute::warpgroup_fence_operand(d[j][e]);
}

namespace wgmma_detail {
using cute::SM90::GMMA::Major;
using cute::SM90::GMMA::ScaleOut;
template <bool kBF16>
using SS64 = std::conditional_t<kBF16, cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<Major::K, Major::K>,
                                cute::SM90::GMMA::MMA_64x64x16_F32F16F16_SS<Major::K, Major::K>>;
template <bool kBF16, int kN>
struct RS;
template <bool kBF16>
struct RS<kBF16, 64> {
  using type = std::conditional_t<kBF16, cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_RS<Major::K, Major::MN>,
                                  cute::SM90::GMMA::MMA_64x64x16_F32F16F16_RS<Major::K, Major::MN>>;
};
template <bool kBF16>
struct RS<kBF16, 128> {
  using type = std::conditional_t<kBF16, cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<Major::K, Major::MN>,
                                  cute::SM90::GMMA::MMA_64x128x16_F32F16F16_RS<Major::K, Major::MN>>;
};
template <class Op, int kN, size_t... I>
__device__ __forceinline__ void ss(uint64_t a, uint64_t b, float (&d)[kN][4], bool accumulate,
                                   std::index_sequence<I...>) {
  Op::fma(a, b, d[I / 4][I % 4]..., accumulate ? ScaleOut::One : ScaleOut::Zero);
}
template <class Op, int kN, size_t... I>
__device__ __forceinline__ void rs(const uint32_t (&a)[4], uint64_t b, float (&d)[kN][4], bool accumulate,
                                   std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], b, d[I / 4][I % 4]..., accumulate ? ScaleOut::One : ScaleOut::Zero);
}
}  // namespace wgmma_detail

/// One k16 step of D (+)= A B^T for 64 rows x 64 columns, A and B K-major in shared memory
/// (descriptors a, b), fp32 accumulators (accumulate = false: D = A B^T). d[j][e]: thread
/// (warp w, lane l) holds row 16 w + l / 4 + 8 (e / 2), column 8 j + 2 (l % 4) + e % 2 — the
/// mma.sync m16n8 accumulator layout of each warp's 16 rows. Issue between cute::warpgroup_arrive
/// and cute::warpgroup_commit_batch, in all four warps of the warpgroup.
template <bool kBF16>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[8][4], uint64_t a, uint64_t b, bool accumulate) {
  wgmma_detail::ss<wgmma_detail::SS64<kBF16>>(a, b, d, accumulate, std::make_index_sequence<32>{});
}
/// One k16 step of D (+)= A B for 64 rows x kN (64 or 128) columns: A from registers (a: the
/// mma.sync m16n8k16 A fragment of the warp's 16 rows), B MN-major in shared memory (descriptor
/// b); d as above, kN / 8 column groups.
template <bool kBF16, int kN>
__device__ __forceinline__ void wgmma_m64nk16_rs(float (&d)[kN / 8][4], const uint32_t (&a)[4], uint64_t b,
                                                 bool accumulate) {
  using Op = typename wgmma_detail::RS<kBF16, kN>::type;
  wgmma_detail::rs<Op>(a, b, d, accumulate, std::make_index_sequence<kN / 2>{});
}

}  // namespace fa4::hopper::arch
