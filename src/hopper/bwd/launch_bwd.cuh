// src/hopper/bwd/launch_bwd.cuh — host side of one backward instantiation: BwdParams -> the workspace,
// the TMA descriptors and the three launches. Preconditions (dtype, bucket, TMA alignment, device)
// were checked by hopper::backward_support, which fa4::backward's selector calls first.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "fa4/error.h"
#include "hopper/bwd/kernel_bwd.cuh"
#include "hopper/bwd/kernel_traits_bwd.cuh"
#include "hopper/bwd/launch_bwd.h"
#include "hopper/bwd/pre_post_bwd.cuh"
#include "hopper/shared/device_state.h"
#include "hopper/shared/launch_common.cuh"
#include "hopper/shared/tma_view.cuh"

namespace fa4::hopper {

namespace {
constexpr const char* kBwd = "fa4::backward";
}  // namespace

template <int kDType, int kBucketD, int kBucketDV>
void run_bwd(const detail::BwdParams& fp, const LaunchContext& ctx) {
  using namespace cute;
  using Element = std::conditional_t<kDType == int(DType::kBF16), cutlass::bfloat16_t, cutlass::half_t>;
  using Kt = BwdKernelTraits<Element, kBucketD, kBucketDV>;
  // The tiles' columns (kernel_traits_bwd.cuh: rounded up with shared keys).
  constexpr int kHeadDim = Kt::kHeadDim, kHeadDimV = Kt::kHeadDimV;
  using Params = typename Kt::Params;
  constexpr int64_t kElem = sizeof(Element);

  const cudaStream_t stream = static_cast<cudaStream_t>(fp.device.stream);
  const int32_t batch_t = fp.is_varlen ? 1 : fp.batch;
  const int32_t rows_q = int32_t(std::max<int64_t>(1, fp.is_varlen ? fp.total_q : fp.seqlen_q));
  const int32_t rows_k = int32_t(std::max<int64_t>(1, fp.is_varlen ? fp.total_k : fp.seqlen_k));
  auto strides = [&](const detail::RowStrides& s, int32_t rows, int32_t heads) {
    return tma_view_stride<std::max(kHeadDim, kHeadDimV)>(s, rows, heads, batch_t, fp.is_varlen);
  };
  auto shape_q = make_shape(rows_q, fp.headdim, fp.num_heads, batch_t);
  auto shape_do = make_shape(rows_q, fp.headdim_v, fp.num_heads, batch_t);
  auto shape_k = make_shape(rows_k, fp.headdim, fp.num_heads_kv, batch_t);
  auto shape_v = make_shape(rows_k, fp.headdim_v, fp.num_heads_kv, batch_t);
  // No queries (seqlen_q = 0): q/dout may be null views; the descriptors are then never used (no
  // tile has a step), but the encoder wants a real address: k's stands in (and q's for k).
  const void* q_base = fp.q ? fp.q : fp.k;
  const void* do_base = fp.dout ? fp.dout : q_base;
  const void* k_base = fp.k ? fp.k : q_base;
  const void* v_base = fp.v ? fp.v : k_base;
  Tensor mQ = make_tensor(make_gmem_ptr(static_cast<const Element*>(q_base)), shape_q, strides(fp.q_stride, rows_q, fp.num_heads));
  Tensor mdO = make_tensor(make_gmem_ptr(static_cast<const Element*>(do_base)), shape_do, strides(fp.dout_stride, rows_q, fp.num_heads));
  Tensor mK = make_tensor(make_gmem_ptr(static_cast<const Element*>(k_base)), shape_k, strides(fp.k_stride, rows_k, fp.num_heads_kv));
  Tensor mV = make_tensor(make_gmem_ptr(static_cast<const Element*>(v_base)), shape_v, strides(fp.v_stride, rows_k, fp.num_heads_kv));

  // dK / dV through TMA stores (hopper_api.cu decided it: TMA-aligned); otherwise the
  // descriptors are never used but still encoded (Params holds them): a valid 1-row view then.
  const bool dkv_tma = ctx.tma_epilogue && !Kt::kSharedKeys;
  auto out_view = [&](void* ptr, const detail::RowStrides& s, auto shape, int32_t d) {
    auto* base = static_cast<Element*>(dkv_tma ? ptr : reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(ptr ? ptr : k_base) & ~uintptr_t(15)));
    return dkv_tma ? make_tensor(make_gmem_ptr(base), shape, strides(s, rows_k, fp.num_heads_kv))
                   : make_tensor(make_gmem_ptr(base), make_shape(1, d, 1, 1), make_stride(int64_t(d), _1{}, int64_t(d), int64_t(d)));
  };
  Tensor mdK = out_view(fp.dk, fp.dk_stride, shape_k, int32_t(kHeadDim));
  Tensor mdV = out_view(fp.dv, fp.dv_stride, shape_v, int32_t(kHeadDimV));

  Params p{make_tma_copy(SM90_TMA_LOAD{}, mQ, take<0, 2>(typename Kt::SmemLayoutQ{}),
                         Shape<Int<Kt::kBlockM>, Int<kHeadDim>>{}, _1{}),
           make_tma_copy(SM90_TMA_LOAD{}, mdO, take<0, 2>(typename Kt::SmemLayoutdO{}),
                         Shape<Int<Kt::kBlockM>, Int<kHeadDimV>>{}, _1{}),
           make_tma_copy(SM90_TMA_LOAD{}, mK, typename Kt::SmemLayoutK{}, Shape<Int<Kt::kBlockN>, Int<kHeadDim>>{}, _1{}),
           make_tma_copy(SM90_TMA_LOAD{}, mV, typename Kt::SmemLayoutV{}, Shape<Int<Kt::kBlockN>, Int<kHeadDimV>>{}, _1{}),
           make_tma_copy(SM90_TMA_STORE{}, mdK, typename Kt::SmemLayoutK{}, Shape<Int<Kt::kBlockN>, Int<kHeadDim>>{}, _1{}),
           make_tma_copy(SM90_TMA_STORE{}, mdV, typename Kt::SmemLayoutV{}, Shape<Int<Kt::kBlockN>, Int<kHeadDimV>>{}, _1{}),
           shape_q, shape_do, shape_k, shape_v};
  p.dkv_tma = dkv_tma;
  p.dk = fp.dk;
  p.dv = fp.dv;
  p.dk_batch_stride = fp.dk_stride.batch;
  p.dk_row_stride = fp.dk_stride.row;
  p.dk_head_stride = fp.dk_stride.head;
  p.dv_batch_stride = fp.dv_stride.batch;
  p.dv_row_stride = fp.dv_stride.row;
  p.dv_head_stride = fp.dv_stride.head;
  p.dk_aligned_pairs = aligned_pairs(fp.dk, fp.dk_stride, fp.is_varlen, fp.batch, kElem);
  p.dv_aligned_pairs = aligned_pairs(fp.dv, fp.dv_stride, fp.is_varlen, fp.batch, kElem);
  p.batch = fp.batch;
  p.num_heads = fp.num_heads;
  p.num_heads_kv = fp.num_heads_kv;
  p.group_size = fp.num_heads / fp.num_heads_kv;
  constexpr detail::HopperBwdConfig kRow = detail::hopper_bwd_config(kBucketD, kBucketDV);
  static_assert(kRow.tile_m == Kt::kBlockM && kRow.tile_n == Kt::kBlockN && bwd_tile_headdim(kRow) == kHeadDim &&
                    kRow.tile_claims == Kt::kTileClaims,
                "bwd_launch_shape (launch_bwd.h) sizes the workspace from the tuning row as the kernel traits do");
  const BwdLaunchShape shape = bwd_launch_shape(kRow, fp, ctx);
  p.seqlen_q = shape.seqlen_q;
  p.seqlen_k = shape.seqlen_k;
  p.headdim = fp.headdim;
  p.headdim_v = fp.headdim_v;
  p.is_varlen = fp.is_varlen;
  p.cu_seqlens_q = fp.cu_seqlens_q;
  p.cu_seqlens_k = fp.cu_seqlens_k;
  p.seqused_k = fp.seqused_k;
  p.total_q = int32_t(fp.total_q);
  p.total_k = int32_t(fp.total_k);
  p.async_error = ctx.async_error;
  p.has_softcap = fp.softcap > 0.f;
  p.score_scale_log2 = p.has_softcap ? float(double(fp.softcap) * detail::kLog2eF64) : fp.softmax_scale_log2;
  p.softcap_inv_scale = p.has_softcap ? fp.softmax_scale / fp.softcap : 0.f;
  p.softmax_scale = fp.softmax_scale;
  p.mask = fp.mask;
  p.deterministic = fp.deterministic;
  p.num_m_blocks = shape.num_m_blocks;
  p.num_n_blocks = shape.num_n_blocks;
  p.lpt = ctx.lpt;
  // A band wider than the key blocks is one band (and keeps band * pairs within int32).
  p.lpt_band = std::max(1, std::min(ctx.bwd_lpt_band, p.num_n_blocks));
  p.descending = ctx.bwd_descending;
  p.chunks = int32_t(shape.chunks);
  p.num_tiles = int32_t(shape.num_tiles);
  const int grid = shape.grid;
  const bool has_rows = shape.has_rows;
  const bool dynamic = shape.dynamic;

  // Workspace (launch_bwd.h BwdLaunchShape): dq_accum | lse_log2 | dpsum | semaphores | claim
  // counter (geometry_bwd.cuh), the caller's (checked here, before anything is written) or the
  // device state's.
  const size_t acc_bytes = size_t(shape.acc_bytes), stat_bytes = size_t(shape.stat_bytes);
  const size_t sem_bytes = size_t(shape.sem_bytes);
  const size_t ws_bytes = size_t(shape.workspace_bytes());
  ScratchHold ws(stream);
  char* ws_ptr = nullptr;
  if (fp.has_workspace) {
    if (size_t(fp.workspace_bytes) < ws_bytes)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(kBwd) + ": options.workspace holds " + std::to_string(fp.workspace_bytes) +
                      " bytes; this backward needs " + std::to_string(ws_bytes) +
                      " (fa4::backward_workspace_size)");
    ws_ptr = static_cast<char*>(fp.workspace);
  } else if (ws_bytes > 0) {
    ws_ptr = ws.hold(acquire_scratch(fp.device.index, stream, ws_bytes, 0, ScratchKind::kBackward));
  }
  p.dq_accum = reinterpret_cast<float*>(ws_ptr);
  // Row statistics: the preprocess writes them (BwdAuxParams), the main kernel reads them.
  float* const lse_log2 = reinterpret_cast<float*>(ws_ptr + acc_bytes);
  float* const dpsum = reinterpret_cast<float*>(ws_ptr + acc_bytes + stat_bytes);
  p.lse_log2 = lse_log2;
  p.dpsum = dpsum;
  p.dq_semaphore = fp.deterministic ? reinterpret_cast<int32_t*>(ws_ptr + acc_bytes + 2 * stat_bytes) : nullptr;
  p.tile_counter = dynamic ? reinterpret_cast<int32_t*>(ws_ptr + acc_bytes + 2 * stat_bytes + sem_bytes) : nullptr;

  BwdAuxParams a;
  a.out = fp.out;
  a.dout = fp.dout;
  a.lse = fp.lse;
  a.dq = fp.dq;
  a.sink = fp.sink;
  a.dsink = fp.dsink;
  a.out_batch_stride = fp.out_stride.batch;
  a.out_row_stride = fp.out_stride.row;
  a.out_head_stride = fp.out_stride.head;
  a.dout_batch_stride = fp.dout_stride.batch;
  a.dout_row_stride = fp.dout_stride.row;
  a.dout_head_stride = fp.dout_stride.head;
  a.dq_batch_stride = fp.dq_stride.batch;
  a.dq_row_stride = fp.dq_stride.row;
  a.dq_head_stride = fp.dq_stride.head;
  a.lse_batch_stride = fp.lse_batch_stride;
  a.lse_head_stride = fp.lse_head_stride;
  a.lse_row_stride = fp.lse_row_stride;
  a.dq_aligned_pairs = aligned_pairs(fp.dq, fp.dq_stride, fp.is_varlen, fp.batch, kElem);
  a.dq_vec8 = aligned_vec8(fp.dq, fp.dq_stride, fp.is_varlen, fp.batch, kElem);
  a.rows_vec8 = aligned_vec8(fp.out, fp.out_stride, fp.is_varlen, fp.batch, kElem) &&
                aligned_vec8(fp.dout, fp.dout_stride, fp.is_varlen, fp.batch, kElem);
  a.batch = fp.batch;
  a.num_heads = fp.num_heads;
  a.headdim = fp.headdim;
  a.headdim_v = fp.headdim_v;
  a.seqlen_q = p.seqlen_q;
  a.seqlen_k = p.seqlen_k;
  a.is_varlen = fp.is_varlen;
  a.cu_seqlens_q = fp.cu_seqlens_q;
  a.cu_seqlens_k = fp.cu_seqlens_k;
  a.seqused_k = fp.seqused_k;
  a.total_q = p.total_q;
  a.total_k = p.total_k;
  a.async_error = ctx.async_error;
  a.softmax_scale = fp.softmax_scale;
  a.dq_accum = p.dq_accum;
  a.lse_log2 = lse_log2;
  a.dpsum = dpsum;
  a.dq_semaphore = p.dq_semaphore;
  a.tile_counter = p.tile_counter;
  a.chunks = p.chunks;
  a.num_m_blocks = p.num_m_blocks;

  cudaError_t launched = cudaSuccess;
  const dim3 aux_grid(unsigned(p.num_m_blocks), unsigned(fp.num_heads), unsigned(fp.batch));
  // The preprocess's 16-byte path reads kHeadDim columns of O and dO (headdim_v's): a bucket
  // with dv > d would need it templated on dv.
  static_assert(kHeadDimV <= kHeadDim, "bwd_preprocess_kernel covers kHeadDim columns of O / dO");
  if (has_rows) {
    bwd_preprocess_kernel<Element, kHeadDim, Kt::kBlockM><<<aux_grid, kBwdAuxThreads, 0, stream>>>(a);
    launched = cudaGetLastError();
  }
  if (launched == cudaSuccess && shape.num_tiles > 0) {
    auto kernel = bwd_kernel<Kt>;
    launched = raise_smem_limit_once<Kt>(kernel, Kt::kSmemBytes, fp.device.index);
    if (launched == cudaSuccess) {
      if (fp.deterministic) {
        // A key block's dQ writer waits for the blocks before it (mainloop_bwd_load.cuh): that is
        // deadlock-free only if every CTA is resident, which a cooperative launch guarantees (or
        // refuses, e.g. with fewer usable SMs under MPS or green contexts).
        launched = launch_with_attribute(kernel, dim3(unsigned(grid)), dim3(unsigned(Kt::kNumThreads)),
                                         size_t(Kt::kSmemBytes), stream, cooperative_attribute(), p);
        if (launched != cudaSuccess) cudaGetLastError();
      } else {
        kernel<<<grid, Kt::kNumThreads, Kt::kSmemBytes, stream>>>(p);
        launched = cudaGetLastError();
      }
    }
  }
  if (launched == cudaSuccess && has_rows) {
    // Programmatic dependent of the main kernel (or, without tiles, of the preprocess): it waits
    // for that grid before it reads the dQ accumulator, but its launch overlaps that grid's tail.
    // (The main kernel is launched plainly: as the preprocess's dependent, loading K, V, Q and dO
    // under its tail, it measured 2% faster at 512 keys and 1-3% slower at 8k, bwd/README.md.)
    launched = launch_programmatic(bwd_postprocess_kernel<Element, kHeadDim, Kt::kBlockM>, aux_grid,
                                   dim3(unsigned(kBwdAuxThreads)), 0, stream, a);
  }
  if (launched == cudaSuccess && fp.dsink) {
    bwd_dsink_kernel<Element, Kt::kBlockM><<<unsigned(fp.num_heads), kBwdAuxThreads, 0, stream>>>(a);
    launched = cudaGetLastError();
  }
  if (launched == cudaErrorCooperativeLaunchTooLarge) {
    // (a refused launch may have invalidated a capture: the refusal is what to report, and ws's
    // destructor releases the scratch, dropping that error)
    throw Error(ErrorCode::kUnsupported,
                "fa4::backward (hopper): deterministic = true needs every CTA of the backward resident at once "
                "(a cooperative launch), which this device or context refused (fewer usable SMs, e.g. MPS); "
                "dq/dk/dv were not written");
  }
  check_cuda(launched, kBwd, "kernel launch");  // (a refused launch: the hold releases the scratch)
  ws.release();
}

}  // namespace fa4::hopper
