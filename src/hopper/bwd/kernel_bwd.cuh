// src/hopper/bwd/kernel_bwd.cuh — the persistent, warp-specialised backward kernel (key-stationary).
//
// CTA = 3 warpgroups (384 threads), one CTA per SM, grid = min(tiles, SMs); a tile is one key
// block (tile_n = 128 keys; 64 for the rows above d128) of one KV head:
//   warpgroup 0  setmaxnreg down: warp 0 issues the TMA loads (mainloop_bwd_load.cuh BwdLoad),
//                warps 1 and 2 reduce-add the staged dQ parts of even and odd steps (BwdDqWriter);
//                warp 3 exits.
//   warpgroups 1, 2  consumers, 64 keys each, or (above d128) the same 64 keys and half the
//                    queries / columns each (mainloop_bwd_mma.cuh): S^T, dP^T, dV, dK, dQ.
// The preprocess (D, lse_log2, zeroed dQ accumulator) runs before it and the postprocess (dQ in the
// input dtype, dsink) after it, on the same stream (pre_post_bwd.cuh); the postprocess as this
// kernel's programmatic dependent (launched under its tail, waiting for it before reading dQ).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

#include "hopper/arch/arch.cuh"
#include "hopper/bwd/kernel_traits_bwd.cuh"
#include "hopper/bwd/mainloop_bwd_load.cuh"
#include "hopper/bwd/mainloop_bwd_mma.cuh"

namespace fa4::hopper {

template <class Kt>
__global__ void __launch_bounds__(Kt::kNumThreads, 1)
    bwd_kernel(CUTE_GRID_CONSTANT const typename Kt::Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using namespace cute;
  using SharedStorage = typename Kt::SharedStorage;
  extern __shared__ __align__(1024) char smem_raw[];
  SharedStorage& ss = *reinterpret_cast<SharedStorage*>(smem_raw);

  const int warp_idx = cutlass::canonical_warp_idx_sync();
  const int warp_group = threadIdx.x / cutlass::NumThreadsPerWarpGroup;
  typename Kt::PipelineQ::Params pq;
  pq.role = warp_group == 0 ? Kt::PipelineQ::ThreadCategory::Producer : Kt::PipelineQ::ThreadCategory::Consumer;
  pq.is_leader = threadIdx.x == 0;  // the lane that issues the copies
  pq.num_consumers = Kt::kNumMmaThreads;
  constexpr uint32_t kBytesdO = Kt::kTmaBytesdO + Kt::kRowStatBytes;  // dO and D
  pq.transaction_bytes = Kt::kTmaBytesQ + Kt::kRowStatBytes + (Kt::kSplitdO ? 0 : kBytesdO);
  typename Kt::PipelineQ pipe_q(ss.pipeline_q, pq, Shape<_1, _1, _1>{});
  typename Kt::PipelinedO::Params pdo;  // its own ring only with kSplitdO (else never used)
  pdo.role = pq.role == Kt::PipelineQ::ThreadCategory::Producer ? Kt::PipelinedO::ThreadCategory::Producer
                                                                 : Kt::PipelinedO::ThreadCategory::Consumer;
  pdo.is_leader = pq.is_leader;
  pdo.num_consumers = Kt::kNumMmaThreads;
  pdo.transaction_bytes = kBytesdO;
  typename Kt::PipelinedO pipe_do(ss.pipeline_do, pdo, Shape<_1, _1, _1>{});
  typename Kt::PipelineKV::Params pkv;
  pkv.role = warp_group == 0 ? Kt::PipelineKV::ThreadCategory::Producer : Kt::PipelineKV::ThreadCategory::Consumer;
  pkv.is_leader = threadIdx.x == 0;
  pkv.num_consumers = Kt::kNumMmaThreads;
  pkv.transaction_bytes = Kt::kTmaBytesK + Kt::kTmaBytesV;
  typename Kt::PipelineKV pipe_kv(ss.pipeline_kv, pkv, Shape<_1, _1, _1>{});
  // With tile claims the TMA warp (warp 0) publishes each tile; the consumers and the dQ writers
  // receive it (geometry_bwd.cuh bwd_tiles).
  auto ring = make_bwd_tile_ring<Kt::kTileClaims>(ss.tile_ring, warp_idx == 0, Kt::kTileReceivers);
  __syncthreads();  // barrier inits visible to everyone
  // The postprocess may be scheduled (it waits for this grid's completion before it reads dQ).
  arch::launch_dependents();

  if (warp_group == 0) {
    arch::warpgroup_reg_dealloc<Kt::kConfig.producer_regs>();
    if (warp_idx == 0) BwdLoad<Kt>::run(p, ss, pipe_q, pipe_do, pipe_kv, ring);
    else if (warp_idx == 1 || warp_idx == 2) BwdDqWriter<Kt>::run(p, ss, ring, warp_idx - 1);
    return;
  }
  arch::warpgroup_reg_alloc<Kt::kConfig.consumer_regs>();
  BwdMma<Kt>::run(p, ss, pipe_q, pipe_do, pipe_kv, ring, int(threadIdx.x) - cutlass::NumThreadsPerWarpGroup);
#endif
}

}  // namespace fa4::hopper
