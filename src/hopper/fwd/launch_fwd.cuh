// src/hopper/fwd/launch_fwd.cuh — host side of one instantiation: FwdParams -> kernel Params (TMA
// descriptors, tile order), then the persistent launch. Preconditions (alignment, strides, device)
// were checked by hopper::forward_support, which fa4::forward's selector calls first.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <string>

#include "fa4/error.h"
#include "hopper/shared/device_state.h"
#include "hopper/shared/launch_common.cuh"
#include "hopper/shared/tma_view.cuh"
#include "hopper/fwd/kernel_fwd.cuh"
#include "hopper/fwd/kernel_traits_fwd.cuh"
#include "hopper/fwd/launch_fwd.h"

namespace fa4::hopper {

/// One forward launch of the kernel of traits Kt.
template <class Kt>
void launch_fwd(const detail::FwdParams& fp, const LaunchContext& ctx) {
  using namespace cute;
  using Element = typename Kt::Element;
  constexpr int kHeadDim = Kt::kHeadDim, kHeadDimV = Kt::kHeadDimV;
  using Params = typename Kt::Params;
  constexpr int64_t kElem = sizeof(Element);

  const int32_t batch_t = fp.is_varlen ? 1 : fp.batch;  // TMA batch extent
  const int32_t rows_q = int32_t(std::max<int64_t>(1, fp.is_varlen ? fp.total_q : fp.seqlen_q));
  // A paged KV cache: K / V are the page pool, (num_pages, page_size, heads_kv, d), seen by TMA
  // as (page rows, d, head, page) (the gathering kernel addresses the pool itself).
  const bool paged = ctx.page_table != nullptr;
  const int32_t rows_k = paged ? ctx.page_size : int32_t(std::max<int64_t>(1, fp.is_varlen ? fp.total_k : fp.seqlen_k));
  const int32_t batch_kv = paged ? ctx.num_pages : batch_t;
  // Spans in elements; the row span uses the padded bucket width (a multiple of 8 elements).
  auto strides = [&](const detail::RowStrides& s, int32_t rows, int32_t heads, int32_t batch) {
    return tma_view_stride<std::max(kHeadDim, kHeadDimV)>(s, rows, heads, batch, fp.is_varlen);
  };
  auto shape_k = make_shape(rows_k, fp.headdim, fp.num_heads_kv, batch_kv);
  auto shape_vt = make_shape(fp.headdim_v, rows_k, fp.num_heads_kv, batch_kv);
  auto sq = strides(fp.q_stride, rows_q, fp.num_heads, batch_t);
  auto sk = strides(fp.k_stride, rows_k, fp.num_heads_kv, batch_kv);
  auto sv = strides(fp.v_stride, rows_k, fp.num_heads_kv, batch_kv);
  auto svt = make_stride(_1{}, get<0>(sv), get<2>(sv), get<3>(sv));

  // No keys at all (seqlen_k = 0): K/V may be null views. Their descriptors are never used then
  // (every tile takes the no-key path), but the encoder wants a real address: q's stands in.
  const void* k_base = fp.k ? fp.k : fp.q;
  const void* v_base = fp.v ? fp.v : fp.q;
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<const Element*>(k_base)), shape_k, sk);
  Tensor mVt = make_tensor(make_gmem_ptr(static_cast<const Element*>(v_base)), shape_vt, svt);
  // O through TMA (epilogue_fwd.cuh): hopper_api.cu decided it (batched, TMA-aligned out).
  auto shape_o = make_shape(rows_q, fp.headdim_v, fp.num_heads, batch_t);
  auto so = strides(fp.out_stride, rows_q, fp.num_heads, batch_t);
  const bool out_tma = ctx.tma_epilogue;
  // Without out_tma the descriptor is never used; it is still encoded (Params holds one), so give
  // the encoder a valid 1-row view: 16-byte aligned address and strides.
  auto* o_ptr = static_cast<Element*>(out_tma ? fp.out : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(fp.out) & ~uintptr_t(15)));
  Tensor mO = out_tma ? make_tensor(make_gmem_ptr(o_ptr), shape_o, so)
                      : make_tensor(make_gmem_ptr(o_ptr), make_shape(1, fp.headdim_v, 1, 1),
                                    make_stride(int64_t(kHeadDimV), _1{}, int64_t(kHeadDimV), int64_t(kHeadDimV)));

  // Q: one 4-D TMA view of q as (d, query heads, rows, batch), read in boxes of (W columns, heads
  // per tile, tokens per tile, 1) per W-column chunk of the Q buffer (mainloop_fwd_load.cuh
  // load_q): one head's kBlockM tokens, or with pack-GQA (hopper_api.cu forward_context,
  // launch_fwd.h fwd_packs_gqa; the gathering kernels, Kt::kPackGqa) the group's heads of
  // kBlockM / group tokens: tiles of (token, head) rows of one KV head's group. Should the driver
  // refuse the packed box, the tiles stay one query head each (O is stored directly either way).
  const int32_t group = fp.num_heads / fp.num_heads_kv;
  if (ctx.pack_gqa && (!Kt::kPackGqa || !fwd_pack_gqa_fits(Kt::kBlockM, fp.num_heads, fp.num_heads_kv) ||
                       ctx.tma_epilogue))
    throw Error(ErrorCode::kInternal, std::string(ctx.fn) + " (hopper): pack-GQA needs the gathering kernel, a group "
                                                            "that divides the row tile and O stored directly");
  cute::TmaDescriptor q_desc{};
  auto encode_q = [&](int32_t heads_per_tile) {
    constexpr int kW = Kt::kQChunkCols;
    constexpr CUtensorMapSwizzle kSwizzle = Kt::kQSwizzleBytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                            : Kt::kQSwizzleBytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                            : Kt::kQSwizzleBytes == 32 ? CU_TENSOR_MAP_SWIZZLE_32B
                                                                       : CU_TENSOR_MAP_SWIZZLE_NONE;
    // sq: the (row, 1, head, batch) strides in elements, extent-1 ones replaced by valid ones.
    const cuuint64_t dims[4] = {cuuint64_t(fp.headdim), cuuint64_t(fp.num_heads), cuuint64_t(rows_q), cuuint64_t(batch_t)};
    const cuuint64_t strides_bytes[3] = {cuuint64_t(get<2>(sq) * kElem), cuuint64_t(get<0>(sq) * kElem),
                                         cuuint64_t(get<3>(sq) * kElem)};
    const cuuint32_t box[4] = {cuuint32_t(kW), cuuint32_t(heads_per_tile), cuuint32_t(Kt::kBlockM / heads_per_tile), 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    return CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
        &q_desc, TMA::to_CUtensorMapDataType<Element>(), 4, const_cast<void*>(fp.q), dims, strides_bytes, box,
        elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, kSwizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  const bool pack = ctx.pack_gqa && encode_q(group) == CUDA_SUCCESS;
  if (!pack) {
    const CUresult r = encode_q(1);
    if (r != CUDA_SUCCESS)
      throw Error(ErrorCode::kCudaError, std::string(ctx.fn) + " (hopper): cuTensorMapEncodeTiled(q) failed with " +
                                             std::to_string(int(r)));
  }
  const int32_t tile_queries = pack ? Kt::kBlockM / group : Kt::kBlockM;
  const int32_t tile_heads = pack ? fp.num_heads_kv : fp.num_heads;

  Params p{
      make_tma_copy(SM90_TMA_LOAD{}, mK, take<0, 2>(typename Kt::SmemLayoutK{}),
                    Shape<Int<Kt::kBlockN>, Int<kHeadDim>>{}, _1{}),
      make_tma_copy(SM90_TMA_LOAD{}, mVt, take<0, 2>(typename Kt::SmemLayoutVt{}),
                    Shape<Int<kHeadDimV>, Int<Kt::kBlockN>>{}, _1{}),
      // A placeholder descriptor when out_tma is false (never used by the kernel then).
      make_tma_copy(SM90_TMA_STORE{}, mO, typename Kt::SmemLayoutOSlice{}, Shape<_64, Int<kHeadDimV>>{}, _1{}),
      shape_k, shape_vt, shape_o};
  p.out = fp.out;
  p.out_batch_stride = fp.out_stride.batch;
  p.out_row_stride = fp.out_stride.row;
  p.out_head_stride = fp.out_stride.head;
  p.out_tma = out_tma;
  p.out_aligned_pairs = aligned_pairs(fp.out, fp.out_stride, fp.is_varlen, fp.batch, kElem);
  p.lse = fp.lse;
  p.lse_batch_stride = fp.lse_batch_stride;
  p.lse_head_stride = fp.lse_head_stride;
  p.lse_row_stride = fp.lse_row_stride;
  p.batch = fp.batch;
  p.num_heads = tile_heads;
  p.num_heads_kv = fp.num_heads_kv;
  p.group_size = group;
  p.pack_gqa = pack;
  p.tile_queries = tile_queries;
  p.tma_q = q_desc;
  p.seqlen_q = fp.seqlen_q;
  p.seqlen_k = fp.seqlen_k;
  p.headdim_v = fp.headdim_v;
  p.is_varlen = fp.is_varlen;
  p.cu_seqlens_q = fp.cu_seqlens_q;
  p.cu_seqlens_k = fp.cu_seqlens_k;
  p.seqused_k = fp.is_varlen ? fp.seqused_k : ctx.cache_seqlens;
  p.seqlen_new = ctx.seqlen_new;
  p.page_table = ctx.page_table;
  p.page_table_batch_stride = ctx.page_table_batch_stride;
  p.page_size = ctx.page_size;
  p.num_pages = ctx.num_pages;
  const FwdPagedLoad paged_load = paged ? fwd_paged_load(ctx.page_size, Kt::kBlockN) : FwdPagedLoad::kNone;
  if (paged_load != (Kt::kGather ? FwdPagedLoad::kGather : paged ? FwdPagedLoad::kTmaBox : FwdPagedLoad::kNone))
    throw Error(ErrorCode::kInternal, std::string(ctx.fn) + " (hopper): this page size (" +
                                          std::to_string(ctx.page_size) + ") is not this forward kernel's");
  if constexpr (Kt::kGather) {  // (the TMA views of K / V above are encoded, never used)
    p.k_pool = static_cast<const Element*>(fp.k);
    p.v_pool = static_cast<const Element*>(fp.v);
    p.k_pool_stride = fp.k_stride;
    p.v_pool_stride = fp.v_stride;
    p.page_shift = std::countr_zero(uint32_t(ctx.page_size));  // (a power of two: fwd_paged_load)
  }
  p.total_q = int32_t(fp.total_q);  // varlen: common_support allows at most kMaxRows (unused batched)
  p.total_k = int32_t(fp.total_k);
  p.async_error = ctx.async_error;
  p.sink = fp.sink;
  p.has_softcap = fp.softcap > 0.f;
  // Under softcap the kernel turns raw q.k into tanh(q.k * scale / softcap); the log2-unit logit
  // is then softcap * log2(e) * tanh(.).
  p.score_scale_log2 = p.has_softcap ? float(double(fp.softcap) * detail::kLog2eF64) : fp.softmax_scale_log2;
  p.softcap_inv_scale = p.has_softcap ? fp.softmax_scale / fp.softcap : 0.f;
  p.rescale_threshold = fp.rescale_threshold;
  p.rescale_sum_limit = std::exp2(fp.rescale_threshold);
  p.mask = fp.mask;
  p.exp2_emulation = fp.exp2_emulation;
  p.exp2_runtime = fp.exp2_fraction_given &&
                   !(fp.exp2_emulation.period == Kt::kExp2Period && fp.exp2_emulation.emulated == Kt::kExp2Emulated);

  // Varlen: no sequence is longer than the packed rows (fwd_query_rows), so a larger max_seqlen_q
  // adds no tiles; in int64, as the selector counted them.
  const int64_t m_blocks = (fwd_query_rows(fp) + tile_queries - 1) / tile_queries;
  const int64_t num_tiles = m_blocks * tile_heads * fp.batch;
  if (num_tiles == 0) {
    if (ctx.before_kernel) ctx.before_kernel(ctx.before_kernel_arg);
    return;
  }
  if (num_tiles > kMaxTiles)
    throw Error(ErrorCode::kUnsupported, std::string(ctx.fn) + " (hopper): more than 2^31 - 2^16 tiles");
  p.num_m_blocks = int32_t(m_blocks);
  p.num_tiles = int32_t(num_tiles);
  p.lpt = ctx.lpt;
  // L2 section: heads whose K+V (all of seqlen_k) together fill about half the L2.
  const int64_t kv_bytes_per_head =
      std::max<int64_t>(1, int64_t(fp.seqlen_k) * (fp.headdim + fp.headdim_v) * kElem);
  const int64_t bh = int64_t(tile_heads) * fp.batch;
  p.heads_per_section = int32_t(std::clamp<int64_t>(ctx.l2_bytes / 2 / kv_bytes_per_head, 1, bh));

  auto kernel = fwd_kernel<Kt>;
  check_cuda(raise_smem_limit_once<Kt>(kernel, Kt::kSmemBytes, fp.device.index), ctx.fn,
             "cudaFuncSetAttribute(max dynamic smem)");
  const cudaStream_t stream = static_cast<cudaStream_t>(fp.device.stream);
  const int32_t blocks_per_tile = int32_t((int64_t(fp.seqlen_k) + Kt::kBlockN - 1) / Kt::kBlockN);
  // Whole tiles on min(tiles, SMs) CTAs: the plain launch, and the fallback when the cooperative
  // launch the split needs is refused.
  const detail::StreamKPlan whole_tiles = detail::plan_stream_k(num_tiles, ctx.num_sms, blocks_per_tile, 0);
  const bool dynamic = ctx.dynamic_schedule && num_tiles > whole_tiles.grid;
  // Stream-K tail (core/stream_k.h): tiles planned at every key block, in the static order.
  const bool sk_eligible = fwd_key_split_eligible(fp, m_blocks, tile_queries, Kt::kBlockN) && !dynamic;
  p.sk = sk_eligible ? detail::plan_stream_k(num_tiles, ctx.num_sms, blocks_per_tile, ctx.stream_k,
                                                  ctx.stream_k_min_share)
                      : whole_tiles;

  // Device scratch (device_state.h): the dynamic schedule's claim counter or the stream-K flags,
  // zero when a launch starts and left zero by the kernel (the last claim resets the counter, each
  // combiner the flags it consumed), sized for every CTA and the most consumer warpgroups a kernel
  // has; and the stream-K partials, in a buffer of their own (every split launch overwrites them).
  constexpr int64_t kMaxMmaWarpGroups = 3;
  const size_t flag_bytes = size_t(ctx.num_sms * kMaxMmaWarpGroups * int64_t(sizeof(int32_t)) + 255) / 256 * 256;
  static_assert(Kt::kNumMmaWarpGroups <= kMaxMmaWarpGroups);
  ScratchHold flags(stream), partials(stream);
  if (dynamic || p.sk.tail_ctas > 0) flags.hold(acquire_scratch(fp.device.index, stream, flag_bytes, flag_bytes));
  if (dynamic) {
    p.tile_counter = reinterpret_cast<int32_t*>(flags.ptr());
  } else if (p.sk.tail_ctas > 0) {
    partials.hold(acquire_scratch(fp.device.index, stream, size_t(StreamK<Kt>::workspace_bytes(p.sk.tail_ctas)), 0,
                                  ScratchKind::kForwardPartials));
    p.sk_flags = reinterpret_cast<int32_t*>(flags.ptr());
    p.sk_partial = reinterpret_cast<float*>(partials.ptr());
  }

  if (ctx.before_kernel) ctx.before_kernel(ctx.before_kernel_arg);
  cudaError_t launched = cudaSuccess;
  if (p.sk.tail_ctas > 0) {
    // A combiner waits for other CTAs' partials: launched cooperatively, all CTAs are co-resident
    // (one per SM), so those CTAs are running, never queued behind the waiting one.
    launched = launch_with_attribute(kernel, dim3(unsigned(p.sk.grid)), dim3(unsigned(Kt::kNumThreads)),
                                     size_t(Kt::kSmemBytes), stream, cooperative_attribute(), p);
    if (launched != cudaSuccess) cudaGetLastError();  // not reported again by a later check
    if (launched == cudaErrorCooperativeLaunchTooLarge) {  // fewer SMs usable (MPS, green contexts)
      p.sk = whole_tiles;
      p.sk_flags = nullptr;
      p.sk_partial = nullptr;
      launched = cudaSuccess;
    }
  }
  if (p.sk.tail_ctas == 0) {
    kernel<<<p.sk.grid, Kt::kNumThreads, Kt::kSmemBytes, stream>>>(p);
    launched = cudaGetLastError();
  }
  check_cuda(launched, ctx.fn, "kernel launch");  // (a refused launch: the holds release the scratch)
  if (dynamic) count_fwd_dynamic_launch();
  if (pack) count_fwd_pack_gqa_launch();
  partials.release();
  flags.release();
}

template <int kDType>
using FwdElement = std::conditional_t<kDType == int(DType::kBF16), cutlass::bfloat16_t, cutlass::half_t>;

template <int kDType, int kHeadDim, int kHeadDimV>
void run_fwd_local(const detail::FwdParams& fp, const LaunchContext& ctx) {
  launch_fwd<FwdKernelTraits<FwdElement<kDType>, kHeadDim, kHeadDimV, /*kLocal=*/true>>(fp, ctx);
}

template <int kDType, int kHeadDim, int kHeadDimV>
void run_fwd_gather(const detail::FwdParams& fp, const LaunchContext& ctx) {
  launch_fwd<FwdKernelTraits<FwdElement<kDType>, kHeadDim, kHeadDimV, /*kLocal=*/false, /*kGather=*/true>>(fp, ctx);
}

template <int kDType, int kHeadDim, int kHeadDimV>
void run_fwd(const detail::FwdParams& fp, const LaunchContext& ctx) {
  constexpr detail::HopperFwdConfig kConfig = detail::hopper_fwd_config(kHeadDim, kHeadDimV);
  if constexpr (kConfig.gather_kernel) {  // (elsewhere there is no gathering kernel to instantiate)
    if (ctx.page_table && fwd_runs_gather_kernel(kConfig, ctx.page_size))
      return run_fwd_gather<kDType, kHeadDim, kHeadDimV>(fp, ctx);
  }
  if constexpr (kConfig.local_kernel) {  // (elsewhere there is no local kernel to instantiate)
    if (fwd_runs_local_kernel(kConfig, fp)) return run_fwd_local<kDType, kHeadDim, kHeadDimV>(fp, ctx);
  }
  launch_fwd<FwdKernelTraits<FwdElement<kDType>, kHeadDim, kHeadDimV>>(fp, ctx);
}

}  // namespace fa4::hopper
