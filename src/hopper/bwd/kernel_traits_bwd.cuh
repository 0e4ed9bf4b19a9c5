// src/hopper/bwd/kernel_traits_bwd.cuh — compile-time shapes, shared-memory layouts, wgmma atoms, TMA
// types and the by-value parameter block of one (dtype, headdim, headdim_v) backward instantiation.
//
// The five products of a step (one query block of tile_m rows against the CTA's tile_n keys), per
// consumer warpgroup wg (FlashAttention-3's "SdP swapAB" form: keys on M, so P^T and dS^T come out
// of the accumulators as the A operands of dV and dK). Rows with 64 keys per warpgroup (d <= 128):
//   S^T  = K_wg Q^T        SS   (64 x tile_m, k = d)    -> P^T = exp2(S^T * scale_log2 - lse_log2)
//   dP^T = V_wg dO^T       SS   (64 x tile_m, k = dv)   -> dS^T = P^T (dP^T - D)
//   dV  += P^T dO          RS   (64 x dv, k = tile_m)   P^T from registers
//   dK  += dS^T Q          RS   (64 x d,  k = tile_m)   dS^T from registers
//   dQ   = dS K            SS   (k = tile_n): dS from smem (both warpgroups' dS^T written there);
//                               per warpgroup 64 x d/2 (tile_m 64: half of d's columns) or
//                               64 x d (tile_m 128: half of the rows)
// Rows with shared keys (tuning_bwd.h shared_keys, above d128): both warpgroups hold all 64 keys,
// and
//   S^T, dP^T              SS   (64 x tile_m/2: the warpgroup's half of the query block)
//   dV  += P^T dO_wg       SS   (64 x dv/2, k = tile_m): P^T of both warpgroups from smem
//   dK  += dS^T Q_wg       SS   (64 x d/2,  k = tile_m): dS^T from smem
//   dQ   = dS K_wg         SS   (tile_m x d/2/dq_parts, k = tile_n), tuning_bwd.h dq_parts parts per
//                               warpgroup (padding-only parts skipped: dq_part_real; a part with
//                               fewer real columns runs narrower: dq_part_cols, kDqNarrowCols)
// The transposed operands (Q^T, dO^T, K^T, dS, and with shared keys P^T, dS^T as A) are views of
// the same swizzled smem: a K-major 128-byte-swizzled tile read along its other mode is the MN-major
// canonical wgmma layout.
#pragma once

#include <algorithm>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "core/mask.h"
#include "hopper/bwd/geometry_bwd.cuh"
#include "hopper/bwd/schedule_bwd.h"
#include "hopper/bwd/tuning_bwd.h"
#include "hopper/fwd/tuning_fwd.h"

namespace fa4::hopper {

using namespace cute;

template <class Element_, int kHeadDim_, int kHeadDimV_>
struct BwdKernelTraits {
  using Element = Element_;
  using ElementAccum = float;
  static constexpr detail::HopperBwdConfig kConfig = detail::hopper_bwd_config(kHeadDim_, kHeadDimV_);
  /// Both warpgroups hold all the keys (tuning_bwd.h shared_keys) and split queries / columns.
  static constexpr bool kSharedKeys = kConfig.shared_keys;
  static constexpr bool kTileClaims = kConfig.tile_claims;  // tuning_bwd.h tile_claims
  /// Columns of the q/k and v/dO tiles: the bucket's, rounded up to a multiple of 128 with shared
  /// keys, where each warpgroup's half of the columns must be whole 64-column swizzle atoms (a
  /// 96-column half would start inside one). TMA zero-fills the added columns and no store
  /// reaches them (Params headdim / headdim_v are the real dims): the d192 bucket runs on 256 x 256
  /// tiles, 192 x 128 on 256 x 128.
  static constexpr int kHeadDim = kSharedKeys ? (kHeadDim_ + 127) / 128 * 128 : kHeadDim_;
  static constexpr int kHeadDimV = kSharedKeys ? (kHeadDimV_ + 127) / 128 * 128 : kHeadDimV_;
  /// k-steps (16 columns) of S^T = K Q^T and dP^T = V dO^T over the bucket's columns: past them
  /// the tiles hold TMA's zero fill, whose products would add exact zeros (the d192 row skips 4 of
  /// 16 in both, 192 x 128 4 of 16 in S^T).
  static constexpr int kSKSteps = kHeadDim_ / 16;
  static constexpr int kdPKSteps = kHeadDimV_ / 16;
  static constexpr int kBlockM = kConfig.tile_m;  // query rows per step
  static constexpr int kBlockN = kConfig.tile_n;  // keys per CTA
  static constexpr int kStages = kConfig.q_stages;      // Q / lse_log2 ring
  static constexpr int kStagesdO = kConfig.do_stages;   // dO / D ring
  /// dO and D in a ring of their own (fewer stages than Q's), else in Q's stages.
  static constexpr bool kSplitdO = kStagesdO != kStages;
  static_assert(kStagesdO >= 1 && kStagesdO <= kStages, "dO needs no more stages than Q (it is released first)");
  static constexpr int kNumMmaWarpGroups = 2;
  static constexpr int kNumMmaThreads = kNumMmaWarpGroups * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kNumThreads = kNumMmaThreads + cutlass::NumThreadsPerWarpGroup;
  static_assert(kBlockN == (kSharedKeys ? 64 : 64 * kNumMmaWarpGroups),
                "a consumer warpgroup's key rows are one wgmma M-extent (64)");
  static_assert(kBlockM == 64 || (kBlockM == 128 && !kSharedKeys),
                "query blocks of 64 rows, or 128 (one wgmma M-extent of dQ per warpgroup)");
  /// dQ of a step (tile_m x d) in parts of 64 rows (one wgmma M-extent) x kDqCols columns: with
  /// tile_m = 128 (kDqSplitRows) each warpgroup takes 64 of the rows and all d columns (at d64 a
  /// 64-column product, not a 32-column one whose smem operands would be read faster than the
  /// tensor cores use them); with 64 rows each takes half of d's columns; with shared keys
  /// tuning_bwd.h dq_parts parts of its half, each whole 128-byte swizzle atoms of K^T (d256 and
  /// d192: two of 64 columns, whose 32 accumulators fit beside dK and dV's 128; 192 x 128: one of
  /// 128, 64 accumulators beside 96). kDqParts products per warpgroup and step.
  static constexpr bool kDqSplitRows = dq_split_rows<kBlockM>;  // the postprocess's order too
  static constexpr int kDqParts = kSharedKeys ? kConfig.dq_parts : 1;  // tuning_bwd.h dq_parts
  static_assert(kSharedKeys || kConfig.dq_parts == 1, "dq_parts: 1 without shared keys");
  static constexpr int kDqCols = kSharedKeys ? (kHeadDim / 2) / kDqParts : kDqSplitRows ? kHeadDim : kHeadDim / 2;
  static_assert(!kSharedKeys || (kDqCols % 64 == 0 && kDqCols * kDqParts == kHeadDim / 2),
                "shared keys: dQ parts of whole 64-column swizzle atoms of K^T");
  /// Parts a warpgroup's staging holds (tuning_bwd.h dq_staged_parts): with fewer than
  /// kDqParts, a part waits until the writer has read the previous one.
  static constexpr int kDqStagedParts = kConfig.dq_staged_parts;
  static_assert(kDqStagedParts >= 1 && kDqParts % kDqStagedParts == 0, "dQ parts staged in equal rounds");
  /// Whether part `part` of warpgroup wg holds columns of the bucket (kHeadDim_), not only the
  /// padding up to kHeadDim: with two parts per warpgroup the d192 bucket's warpgroup 1 computes,
  /// stages and reduce-adds one part, not two (its dQ accumulator columns 192..255 stay the
  /// preprocess's zeros).
  static constexpr bool dq_part_real(int wg, int part) { return dq_part_cols(wg, part) > 0; }
  /// The bucket's columns in part `part` of warpgroup wg: kDqCols, 0 (padding only), or fewer in
  /// the one part that holds the bucket's last column (kDqNarrowCols; 192 x 128 with one part per
  /// warpgroup: warpgroup 1's 64 of 128). That part runs as a narrower wgmma into the first
  /// registers of the accumulator (mainloop_bwd_mma.cuh dq_narrow), stages and reduce-adds only those columns.
  static constexpr int dq_part_cols(int wg, int part) {
    if (kHeadDim == kHeadDim_) return kDqCols;  // no padding (and with kDqSplitRows no column split)
    const int first = wg * (kHeadDim / 2) + part * kDqCols;
    return kHeadDim_ >= first + kDqCols ? kDqCols : kHeadDim_ > first ? kHeadDim_ - first : 0;
  }
  /// Bytes of warpgroup wg's staging that round `round` fills (its kDqStagedParts parts of 64 rows
  /// x their bucket columns): what the dQ writer reduce-adds.
  static constexpr uint32_t dq_round_bytes(int wg, int round) {
    uint32_t bytes = 0;
    for (int i = 0; i < kDqStagedParts; ++i) bytes += uint32_t(64 * dq_part_cols(wg, round * kDqStagedParts + i) * 4);
    return bytes;
  }
  static constexpr int kDqNarrowCols = kHeadDim == kHeadDim_ ? 0 : kHeadDim_ % kDqCols;  // 0: none
  static constexpr int kDqNarrowFirst = kHeadDim_ - kDqNarrowCols;  // its first column
  static constexpr int kDqNarrowWg = kDqNarrowFirst / (kHeadDim / 2);
  static constexpr int kDqNarrowPart = kDqNarrowFirst % (kHeadDim / 2) / kDqCols;
  static_assert(kDqNarrowCols % 64 == 0 && (kDqNarrowCols == 0 || kDqStagedParts == 1),
                "a narrow dQ part is whole swizzle atoms, staged on its own");
  static_assert(kDqNarrowCols == 0 || kSharedKeys, "a narrow dQ part only on the shared-key rows");
  static constexpr bool dq_rounds_whole() {
    for (int wg = 0; wg < kNumMmaWarpGroups; ++wg)
      for (int part = 0; part < kDqParts; part += kDqStagedParts)
        for (int i = 1; i < kDqStagedParts; ++i)
          if (dq_part_real(wg, part + i) != dq_part_real(wg, part)) return false;
    return true;
  }
  static_assert(dq_part_real(0, 0) && dq_part_real(1, 0) && dq_rounds_whole(),
                "a warpgroup's padded dQ parts are whole rounds after at least one real part");
  /// Warpgroups one dQ product spans: both (stacked along the rows, or side by side along d), or
  /// with shared keys each its own.
  static constexpr int kDqMmaWarpGroups = kSharedKeys ? 1 : kNumMmaWarpGroups;
  static_assert(!kSharedKeys || (kHeadDim % 128 == 0 && kHeadDimV % 128 == 0),
                "shared keys: each warpgroup's half of d and dv is whole 64-column swizzle atoms");
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "dQ splits d over two warpgroups (multiples of 8)");
  static_assert(kNumMmaThreads * kConfig.consumer_regs + cutlass::NumThreadsPerWarpGroup * kConfig.producer_regs <=
                    detail::hopper_cta_registers(kNumThreads),
                "setmaxnreg split over the registers the CTA holds (tuning_fwd.h hopper_cta_registers)");

  // Rows with 64 keys per warpgroup: the warpgroups stacked along the keys (M); with shared keys,
  // side by side along N (queries of S^T / dP^T, columns of dK / dV).
  using AtomKeys = Layout<Shape<Int<kNumMmaWarpGroups>, _1, _1>>;
  using AtomCols = Layout<Shape<_1, Int<kNumMmaWarpGroups>, _1>>;
  using AtomSdP = std::conditional_t<kSharedKeys, AtomCols, AtomKeys>;
  static constexpr int kSdPCols = kSharedKeys ? kBlockM / kNumMmaWarpGroups : kBlockM;  // per warpgroup
  static constexpr int kDkvSplit = kSharedKeys ? kNumMmaWarpGroups : 1;  // dK / dV column parts
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<Int<kBlockN>, Int<kSdPCols>, Int<kHeadDim>>>(),
      AtomSdP{}));
  using TiledMmadP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<Int<kBlockN>, Int<kSdPCols>, Int<kHeadDimV>>>(),
      AtomSdP{}));
  template <int kCols>
  using MmaDkv = std::conditional_t<
      kSharedKeys,
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<Int<kBlockN>, Int<kCols / 2>, Int<kBlockM>>,
                                                   GMMA::Major::MN, GMMA::Major::MN>(),
                              AtomCols{})),
      decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, ElementAccum, Shape<Int<kBlockN>, Int<kCols>, Int<kBlockM>>,
                                                   GMMA::Major::K, GMMA::Major::MN>(),
                              AtomKeys{}))>;
  using TiledMmadV = MmaDkv<kHeadDimV>;
  using TiledMmadK = MmaDkv<kHeadDim>;
  /// Shared keys: how many of warpgroup 1's dK (dV) columns are the bucket's; the rest of its half
  /// is TMA's zero fill (d192 on the 256 tile: 64 of 128). Fewer than the half: its dK (dV) product
  /// is one warpgroup's narrower wgmma over those columns, into the first registers of its
  /// accumulator (a 64 x n fragment's first n/8 column groups are those of 64 x n/2), and the
  /// padding columns' accumulators stay 0 and are never stored.
  static constexpr int kDkRealCols1 = kSharedKeys ? std::min(kHeadDim / 2, kHeadDim_ - kHeadDim / 2) : kHeadDim;
  static constexpr int kDvRealCols1 = kSharedKeys ? std::min(kHeadDimV / 2, kHeadDimV_ - kHeadDimV / 2) : kHeadDimV;
  static_assert(kDkRealCols1 > 0 && kDkRealCols1 % 64 == 0 && kDvRealCols1 > 0 && kDvRealCols1 % 64 == 0,
                "warpgroup 1's real dK / dV columns are whole 64-column swizzle atoms");
  template <int kCols>
  using MmaDkvPart = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<Int<kBlockN>, Int<kCols>, Int<kBlockM>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  // dQ: k = all tile_n keys; the two warpgroups stacked along the rows (tile_m = 128: 64 x d each)
  // or side by side along d (64 x d/2 each); with shared keys one warpgroup's atom, run per
  // part (kDqCols columns) on a slice of K^T.
  using AtomDq = std::conditional_t<kDqSplitRows, Layout<Shape<Int<kDqMmaWarpGroups>, _1, _1>>,
                                    Layout<Shape<_1, Int<kDqMmaWarpGroups>, _1>>>;
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kDqCols>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomDq{}));
  /// The (rows, columns) tile of one dQ product over the warpgroups it spans.
  using DqTile = Shape<Int<kBlockM>, Int<kDqSplitRows ? kDqCols : kDqCols * kDqMmaWarpGroups>>;
  /// The narrow dQ part's product (kDqNarrowCols; one warpgroup's atom).
  template <int kCols>
  using MmaDqPart = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, ElementAccum, Shape<_64, Int<kCols>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  static_assert(size<1>(typename TiledMmaS::AtomShape_MNK{}) == kSdPCols, "S^T atom narrower than the warpgroup's queries");
  static_assert(size<1>(typename TiledMmadV::AtomShape_MNK{}) == kHeadDimV / kDkvSplit, "dV atom narrower than dv");
  static_assert(size<1>(typename TiledMmadK::AtomShape_MNK{}) == kHeadDim / kDkvSplit, "dK atom narrower than d");
  static_assert(size<1>(typename TiledMmadQ::AtomShape_MNK{}) == kDqCols, "dQ atom narrower than its part");

  template <int kRows, int kCols>
  using KMajorAtom = decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, Int<kRows>, Int<kCols>>());

  // (rows, cols[, stage]) K-major tiles as TMA writes them.
  using SmemLayoutQ = decltype(tile_to_shape(KMajorAtom<kBlockM, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>, Int<kStages>>{}));
  using SmemLayoutdO = decltype(tile_to_shape(KMajorAtom<kBlockM, kHeadDimV>{}, Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kStagesdO>>{}));
  using SmemLayoutK = decltype(tile_to_shape(KMajorAtom<kBlockN, kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  using SmemLayoutV = decltype(tile_to_shape(KMajorAtom<kBlockN, kHeadDimV>{}, Shape<Int<kBlockN>, Int<kHeadDimV>>{}));
  // dS (query, key), key contiguous: the A operand of dQ; two buffers (step parity), so a
  // warpgroup writing the next step's dS^T never races the other one's dQ product of this step.
  // Shared keys: buffers 2 and 3 hold P (same layout), whose transposed view is dV's A operand.
  static constexpr int kDsBuffers = kSharedKeys ? 4 : 2;
  static constexpr int kPBuffer0 = 2;  // shared keys: P of step parity b in buffer kPBuffer0 + b
  // The consumers' dS buffer index (dS^T of step parity b in buffer b) is also the step parity
  // that picks the dQ writer and its barriers (mainloop_bwd_mma.cuh ds_buf, BwdDqWriter): more
  // dS buffers would need a parity of its own.
  using SmemLayoutdS = decltype(tile_to_shape(KMajorAtom<kBlockM, kBlockN>{}, Shape<Int<kBlockM>, Int<kBlockN>, Int<kDsBuffers>>{}));

  // Transposed views (same bytes).
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockM>, Int<kStages>>{},
                                 Stride<Int<kBlockM>, _1, Int<kBlockM * kHeadDim>>{})));
  using SmemLayoutdOt = decltype(composition(
      SmemLayoutdO{}, make_layout(Shape<Int<kHeadDimV>, Int<kBlockM>, Int<kStagesdO>>{},
                                  Stride<Int<kBlockM>, _1, Int<kBlockM * kHeadDimV>>{})));
  using SmemLayoutKt = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_layout(Shape<Int<kBlockN>, Int<kBlockM>, Int<kDsBuffers>>{},
                                  Stride<Int<kBlockM>, _1, Int<kBlockM * kBlockN>>{})));

  // dQ staging: kDqStagedParts of the kDqParts parts (64 rows x kDqCols each) of each warpgroup's
  // tile_m x d / 2 fp32 accumulators, in fragment order (schedule_bwd.h dq_chunk_index),
  // reduce-added to the fp32 dQ accumulator in one bulk copy per warpgroup and round of
  // kDqStagedParts parts (the postprocess knows the order).
  static constexpr int kDqChunkFloats = kBlockM * kHeadDim / 2;  // per warpgroup
  static_assert(kDqChunkFloats == 64 * kDqCols * kDqParts, "a warpgroup's dQ parts fill its half of the chunk");
  static constexpr int kDqStageFloats = 64 * kDqCols * kDqStagedParts;  // a warpgroup's staging
  static_assert(dq_round_bytes(0, 0) == kDqStageFloats * 4, "warpgroup 0's first round fills its staging");

  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;  // (rows, d, head, batch)
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  template <class SmemLayout, int kRows, int kCols>
  using TmaLoad = decltype(make_tma_copy(
      SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayout{}, Shape<Int<kRows>, Int<kCols>>{}, _1{}));
  using TMA_Q = TmaLoad<decltype(take<0, 2>(SmemLayoutQ{})), kBlockM, kHeadDim>;
  using TMA_dO = TmaLoad<decltype(take<0, 2>(SmemLayoutdO{})), kBlockM, kHeadDimV>;
  using TMA_K = TmaLoad<SmemLayoutK, kBlockN, kHeadDim>;
  using TMA_V = TmaLoad<SmemLayoutV, kBlockN, kHeadDimV>;
  // dK / dV out: the tile's kBlockN rows staged in the dS buffers (free at a tile's end) in K's and
  // V's layouts, one TMA store each (bwd/mainloop_bwd_mma.cuh store_dkdv_tma).
  template <class SmemLayout, int kRows, int kCols>
  using TmaStore = decltype(make_tma_copy(
      SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(static_cast<Element*>(nullptr)), ShapeQKV{}, StrideQKV{}),
      SmemLayout{}, Shape<Int<kRows>, Int<kCols>>{}, _1{}));
  using TMA_dK = TmaStore<SmemLayoutK, kBlockN, kHeadDim>;
  using TMA_dV = TmaStore<SmemLayoutV, kBlockN, kHeadDimV>;
  using SmemCopyAtomdKV = Copy_Atom<SM90_U32x4_STSM_N, Element>;
  static_assert(kSharedKeys || (cute::cosize_v<SmemLayoutK> <= cute::cosize_v<SmemLayoutdS> &&
                                cute::cosize_v<SmemLayoutV> <= cute::cosize_v<SmemLayoutdS>),
                "dK / dV staging must fit in the dS buffers");

  static constexpr uint32_t kTmaBytesQ = uint32_t(kBlockM * kHeadDim * sizeof(Element));
  static constexpr uint32_t kTmaBytesdO = uint32_t(kBlockM * kHeadDimV * sizeof(Element));
  static constexpr uint32_t kRowStatBytes = uint32_t(kBlockM * sizeof(float));  // lse_log2 or D of a block
  static constexpr uint32_t kTmaBytesK = uint32_t(kBlockN * kHeadDim * sizeof(Element));
  static constexpr uint32_t kTmaBytesV = uint32_t(kBlockN * kHeadDimV * sizeof(Element));

  using PipelineQ = cutlass::PipelineTmaAsync<kStages>;  // Q, lse_log2 (and dO, D unless kSplitdO) of a query block
  using PipelineStateQ = cutlass::PipelineState<kStages>;
  using PipelinedO = cutlass::PipelineTmaAsync<kStagesdO>;  // kSplitdO: dO, D of a query block
  using PipelineStatedO = cutlass::PipelineState<kStagesdO>;
  using PipelineKV = cutlass::PipelineTmaAsync<1>;        // the CTA's K and V
  using PipelineStateKV = cutlass::PipelineState<1>;

  struct SharedStorage {
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> smem_q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdO>, 1024> smem_do;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutK>, 1024> smem_k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutV>, 1024> smem_v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdS>, 1024> smem_ds;
    cute::array_aligned<float, kDqStageFloats * kNumMmaWarpGroups, 128> smem_dq;
    cute::array_aligned<float, kBlockM * kStages, 128> smem_lse;  // lse in log2 units
    cute::array_aligned<float, kBlockM * kStagesdO, 128> smem_d;  // D = rowsum(dO * O)
    alignas(16) typename PipelineQ::SharedStorage pipeline_q;
    alignas(16) typename PipelinedO::SharedStorage pipeline_do;  // used with kSplitdO only
    alignas(16) typename PipelineKV::SharedStorage pipeline_kv;
    // With tile claims: the CTA's tiles, from the TMA warp to the other roles (geometry_bwd.cuh).
    [[no_unique_address]] std::conditional_t<kTileClaims, BwdTileRingStorage, BwdNoTileRing> tile_ring;
  };
  /// Threads that receive each tile from the TMA warp (with tile claims): the consumers and the
  /// two dQ writer warps.
  static constexpr uint32_t kTileReceivers = kNumMmaThreads + 2 * 32;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "shared memory over the sm_90 per-CTA limit");

  /// Everything the main kernel reads (a __grid_constant__: TMA descriptors need param space).
  struct Params {
    TMA_Q tma_q;
    TMA_dO tma_do;
    TMA_K tma_k;
    TMA_V tma_v;
    TMA_dK tma_dk;  // valid only if dkv_tma
    TMA_dV tma_dv;
    ShapeQKV shape_q, shape_do, shape_k, shape_v;
    bool dkv_tma{};  // dK / dV through smem + TMA store (TMA-aligned; not with shared keys)

    void* dk{};
    void* dv{};
    int64_t dk_batch_stride{}, dk_row_stride{}, dk_head_stride{};
    int64_t dv_batch_stride{}, dv_row_stride{}, dv_head_stride{};
    bool dk_aligned_pairs{}, dv_aligned_pairs{};  // two adjacent elements form an aligned 4-byte word

    int32_t batch{}, num_heads{}, num_heads_kv{}, group_size{};
    int32_t seqlen_q{}, seqlen_k{};  // batched: lengths; varlen: maxima
    int32_t headdim{}, headdim_v{};  // real dims: no store at or past them
    bool is_varlen{};
    const int32_t* cu_seqlens_q{};
    const int32_t* cu_seqlens_k{};
    const int32_t* seqused_k{};
    int32_t total_q{}, total_k{};
    uint8_t* async_error{};

    float score_scale_log2{};   // raw q.k (or tanh(.) under softcap) -> log2 units
    float softcap_inv_scale{};  // softmax_scale / softcap (0 when off)
    bool has_softcap{};
    float softmax_scale{};      // dK = softmax_scale * dS^T Q (dS here is d(logit), softcap's factor folded)
    detail::MaskSpec mask{};

    // Workspace (geometry_bwd.cuh; sized in launch_bwd.cuh): per (query head, query chunk of tile_m rows).
    float* dq_accum{};          // fp32, fragment order per chunk
    const float* lse_log2{};    // per row of a chunk; +inf for rows without keys or past the sequence
    const float* dpsum{};       // D per row
    int32_t* dq_semaphore{};    // deterministic: reduce-adds done on each chunk
    int32_t chunks{};           // chunks per head (schedule_bwd.h bwd_num_chunks)
    int32_t num_m_blocks{};     // batched: ceil(seqlen_q / tile_m)
    bool deterministic{};

    int32_t num_n_blocks{};     // ceil(seqlen_k / tile_n) (varlen: of max_seqlen_k)
    bool lpt{};                 // longest tiles first, snake rounds (schedule_bwd.h; tuning_bwd.h bwd_order)
    int32_t lpt_band{1};        // lpt: key blocks of a head next to each other (schedule_bwd.h bwd_tile_coord)
    bool descending{};          // query blocks walked from the last down (schedule_bwd.h bwd_step_block)
    int32_t num_tiles{};        // num_n_blocks * num_heads_kv * batch
    // Last (the other fields keep their offsets whether a row has claims or not).
    int32_t* tile_counter{};    // dynamic schedule (kTileClaims): claim counter zeroed by the preprocess; else nullptr
  };
};

}  // namespace fa4::hopper
