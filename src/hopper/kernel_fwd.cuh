// src/hopper/kernel_fwd.cuh — the persistent, warp-specialised forward kernel.
//
// CTA = 3 warpgroups (384 threads), one CTA per SM, grid = min(tiles, SMs):
//   warpgroup 0  producer: setmaxnreg down to 24 registers; warp 0 issues the TMA loads
//                (mainloop_load.cuh); warps 1-3 exit.
//   warpgroups 1, 2  consumers: setmaxnreg up to 240; each owns 64 of the tile's 128 query rows and
//                runs QK^T / softmax / PV (mainloop_mma.cuh) and the epilogue (epilogue.cuh).
// Everyone walks the same tile order (tile_scheduler.cuh); shared memory is one Q buffer (mbarrier
// with a phase per Q load, freed by a named barrier) and two TMA stage rings for K and V.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "fa4/detail/constants.h"
#include "hopper/arch.cuh"
#include "hopper/epilogue.cuh"
#include "hopper/kernel_traits.cuh"
#include "hopper/mainloop_load.cuh"
#include "hopper/mainloop_mma.cuh"
#include "hopper/softmax.cuh"
#include "hopper/tile_info.cuh"

namespace fa4::hopper {

template <class Kt>
__global__ void __launch_bounds__(Kt::kNumThreads, 1)
    fwd_kernel(CUTE_GRID_CONSTANT const typename Kt::Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using Pipeline = typename Kt::MainloopPipeline;
  using SharedStorage = typename Kt::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warp_group = threadIdx.x / cutlass::NumThreadsPerWarpGroup;
  if (warp_idx == 0 && cute::elect_one_sync()) {
    ss.barrier_q.init(/*arrive_count=*/1);
  }
  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;  // the lane that issues the TMAs
  pp.num_consumers = Kt::kNumMmaThreads;
  pp.transaction_bytes = Kt::kTmaBytesK;
  Pipeline pipe_k(ss.pipeline_k, pp, Shape<_1, _1, _1>{});
  pp.transaction_bytes = Kt::kTmaBytesV;
  Pipeline pipe_v(ss.pipeline_v, pp, Shape<_1, _1, _1>{});
  __syncthreads();  // barrier inits visible to everyone

  if (warp_group == 0) {
    arch::warpgroup_reg_dealloc<Kt::kConfig.producer_regs>();
    if (warp_idx == 0) MainloopLoad<Kt>::run(p, ss, pipe_k, pipe_v);
    return;
  }
  arch::warpgroup_reg_alloc<Kt::kConfig.consumer_regs>();
  const int tid = threadIdx.x - cutlass::NumThreadsPerWarpGroup;  // 0..255
  const int wg = tid / 128;
  using Mma = MainloopMma<Kt>;
  Mma::scheduler_init(wg);

  typename Kt::TiledMmaPV mma_pv;
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<Kt::kBlockM>, Int<Kt::kHeadDimV>>{});
  OnlineSoftmax<Mma::kFragS> softmax;
  typename Kt::PipelineState rd;  // consumer start state: stage 0, phase 0
  uint32_t q_phase = 0;

  for (int32_t t = blockIdx.x; t < p.num_tiles; t += gridDim.x) {
    const TileInfo ti = make_tile_info<Kt::kBlockM, Kt::kBlockN>(p, t);
    if (!ti.has_rows) continue;
    const float sink_log2 = p.sink ? p.sink[ti.c.head] * detail::kLog2e : -INFINITY;
    float o_scale[2], lse[2];
    if (!ti.has_keys()) {  // no key visible to any row: O = 0, LSE = -inf (or the sink)
      clear(tOrO);
      softmax.init();
    } else {
      Mma::run(p, ss, pipe_k, pipe_v, rd, q_phase, ti, tid, tOrO, softmax);
      q_phase ^= 1;
    }
    softmax.finalize(p.softmax_scale_log2, sink_log2, o_scale, lse);
    Epilogue<Kt>::store(p, ti, tid, tOrO, o_scale, lse);
  }
#endif
}

}  // namespace fa4::hopper
