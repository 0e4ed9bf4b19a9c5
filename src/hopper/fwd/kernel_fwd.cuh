// src/hopper/fwd/kernel_fwd.cuh — the persistent, warp-specialised forward kernel.
//
// CTA = 3 warpgroups (384 threads; d64: 4 warpgroups, 512 threads), one CTA per SM, grid =
// min(tiles, SMs) (or, with the stream-K split of core/stream_k.h, up to SMs CTAs for fewer
// tiles):
//   warpgroup 0  producer: setmaxnreg down to 24 registers; warp 0 issues the TMA loads
//                (mainloop_fwd_load.cuh); warps 1-3 exit (the gathering kernel, kGather: warp 0
//                loads Q, warps 1-3 copy the K/V rows of a paged cache with cp.async).
//   warpgroups 1..  consumers (tile_m / 64 of them): setmaxnreg up to 240 (two) or 160 (three);
//                each owns 64 of the tile's query rows and runs QK^T / softmax / PV
//                (mainloop_fwd_mma.cuh) and the epilogue (epilogue_fwd.cuh).
// The producer warp claims work items (static stride, a dynamic LPT counter, or the static stride
// with a stream-K tail; shared/tile_scheduler.cuh) and passes each to the consumers through a small smem
// ring; shared memory holds TMA stage rings
// for Q, K and V. Q has q_stages buffers (with 2 — d64 — the next tile's Q loads during this tile;
// with 1 it loads once the buffer is free). O is staged for its TMA store in its own buffer where
// the config has one (o_buffer: d64-d128; the Q buffer is then free after the tile's key loop),
// else in the finished tile's Q buffer, which the epilogue frees after the store has read it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "core/constants.h"
#include "hopper/arch/arch.cuh"
#include "hopper/fwd/epilogue_fwd.cuh"
#include "hopper/fwd/kernel_traits_fwd.cuh"
#include "hopper/fwd/mainloop_fwd_load.cuh"
#include "hopper/fwd/mainloop_fwd_mma.cuh"
#include "hopper/shared/softmax.cuh"
#include "hopper/shared/stream_k.cuh"
#include "hopper/shared/tile_info.cuh"

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
  typename Pipeline::Params pp;
  pp.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
  pp.is_leader = threadIdx.x == 0;  // the lane that issues the TMAs
  pp.num_consumers = Kt::kNumMmaThreads;
  // Gathering: the full barriers complete on the gathering threads' arrivals (one each per stage
  // use, no transaction bytes); otherwise on lane 0's expect-tx and the TMA bytes.
  pp.num_producers = Kt::kGather ? Kt::kGatherThreads : 1;
  pp.transaction_bytes = Kt::kTmaBytesK;
  Pipeline pipe_k(ss.pipeline_k, pp, Shape<_1, _1, _1>{});
  pp.transaction_bytes = Kt::kTmaBytesV;
  Pipeline pipe_v(ss.pipeline_v, pp, Shape<_1, _1, _1>{});
  typename Kt::PipelineQ::Params pq;
  pq.role = warp_group == 0 ? Kt::PipelineQ::ThreadCategory::Producer : Kt::PipelineQ::ThreadCategory::Consumer;
  pq.is_leader = threadIdx.x == 0;
  pq.num_consumers = Kt::kNumMmaThreads;
  pq.transaction_bytes = Kt::kTmaBytesQ;
  typename Kt::PipelineQ pipe_q(ss.pipeline_q, pq, Shape<_1, _1, _1>{});
  // The gathering warps follow the tile ring as the consumers do.
  TileRing::Pipeline pipe_t = TileRing::make(ss.tiles, Kt::kGather ? warp_idx == 0 : warp_group == 0,
                                             Kt::kNumMmaThreads + Kt::kGatherThreads);
  if (threadIdx.x == 0) TileRing::set_up(p, ss.tiles);
  __syncthreads();  // barrier inits (and the stream-K tail) visible to everyone

  if (warp_group == 0) {
    arch::warpgroup_reg_dealloc<Kt::kProducerRegs>();
    if (warp_idx == 0) MainloopLoad<Kt>::run(p, ss, pipe_k, pipe_v, pipe_q, pipe_t);
    else if constexpr (Kt::kGather) MainloopLoad<Kt>::gather(p, ss, pipe_k, pipe_v, pipe_t);
    return;
  }
  arch::warpgroup_reg_alloc<Kt::kConsumerRegs>();
  const int tid = threadIdx.x - cutlass::NumThreadsPerWarpGroup;  // 0..kNumMmaThreads-1
  const int wg = tid / 128;
  using Mma = MainloopMma<Kt>;
  Mma::pingpong_init(wg);

  typename Kt::TiledMmaPV mma_pv;
  Tensor tOrO = partition_fragment_C(mma_pv, Shape<Int<Kt::kBlockM>, Int<Kt::kHeadDimV>>{});
  OnlineSoftmax<Mma::kFragS> softmax;
  typename Kt::PipelineState rd;  // consumer start state: stage 0, phase 0
  typename Kt::PipelineStateQ rq;

  TileRing::State ts;  // consumer start state: slot 0, phase 0
  for (detail::WorkItem w = TileRing::receive(pipe_t, ss.tiles, ts); w.tile < p.num_tiles;
       w = TileRing::receive(pipe_t, ss.tiles, ts)) {
    const TileInfo ti = make_tile_info<Kt::kBlockM, Kt::kBlockN>(p, w);  // has rows (producer skips others)
    float sink[2];  // of each row's head (loaded before the key loop: its latency is hidden there)
#pragma unroll
    for (int r = 0; r < 2; ++r) sink[r] = p.sink ? p.sink[fragment_row_coord<Kt::kBlockM>(p, ti, tid, r).head] : -INFINITY;
    float o_scale[2], lse[2];
    // No key visible to any row (of this piece): O = 0, LSE = -inf (or the sink). A stream-K piece
    // with no key (restrict_keys) has no Q loaded either, but a contributor still publishes its
    // (empty, weight 0) partial, which its combiner waits for, and a combiner merges the others'.
    const bool keys = ti.has_keys();
    const bool partial = w.role < 0;  // a stream-K contributor: no epilogue, its Q is freed now
    if (keys) {
      Mma::run(p, ss, pipe_k, pipe_v, pipe_q, rd, rq, ti, tid, !p.out_tma || partial || Kt::kOBuffer, tOrO, softmax);
    } else {
      clear(tOrO);
      softmax.init();
    }
    if (partial) {
      StreamK<Kt>::store_partial(p, tid, tOrO, softmax);
      if (keys) ++rq;
      continue;  // the combiner writes O and LSE
    }
    if (w.role > 0) StreamK<Kt>::combine(p, tid, w.role, tOrO, softmax);
    softmax.finalize(p.score_scale_log2, sink, o_scale, lse);
    if (keys && p.out_tma) Epilogue<Kt>::store_tma(p, ss, pipe_q, rq, ti, tid, tOrO, o_scale);
    else Epilogue<Kt>::store_direct(p, ti, tid, tOrO, o_scale);
    if (keys) ++rq;
    Epilogue<Kt>::store_lse(p, ti, tid, lse);
  }
  // The TMA engine must have read the last staged O before the CTA's smem goes away.
  if constexpr (Kt::kOBuffer) {
    if (tid % 128 == 0) tma_store_wait<0>();
  }
#endif
}

}  // namespace fa4::hopper
