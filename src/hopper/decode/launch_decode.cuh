// src/hopper/decode/launch_decode.cuh — host side of the decode launch (included by the generated
// instantiation files only).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "hopper/decode/kernel_decode.cuh"
#include "hopper/decode/launch_decode.h"
#include "hopper/shared/device_state.h"
#include "hopper/shared/launch_common.cuh"

namespace fa4::hopper {

namespace {
/// The launch configuration of a decode kernel (`threads` threads, `smem` bytes) over `grid` in clusters
/// of `c` CTAs along x, asking for a cluster's CTAs to be spread over the GPC's SMs: a batch-1
/// decode CTA alone on its SM walks its keys faster than two sharing one, and such a launch has SMs
/// to spare. (Spread and the one-wave rule of decode_cluster_size came in together; their separate
/// effects were not measured.) `dependent`: also the programmatic dependent of the kernel before it
/// on the stream (launch_decode: the append), as the last attribute (launch_programmatic_ex).
struct ClusterLaunch {
  cudaLaunchAttribute attrs[3]{};
  cudaLaunchConfig_t cfg{};
  ClusterLaunch(int32_t c, dim3 grid, int threads, int smem, cudaStream_t stream, bool dependent = false) {
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = unsigned(c);
    attrs[0].val.clusterDim.y = attrs[0].val.clusterDim.z = 1;
    attrs[1].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
    attrs[1].val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicySpread;
    attrs[2] = programmatic_attribute();
    cfg.gridDim = grid;
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = size_t(smem);
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = dependent ? 3 : 2;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // cfg points into attrs
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

/// decode_kernel `Key`'s DecodeClusterCapacity on `device` (clusters of c CTAs with
/// Smem::cluster_bytes(c) each), asked once per device (driver queries cost more host time than a
/// short decode's launch). Internal linkage, like the smem flags of
/// launch_common.cuh (several libfa4 builds in one process). A race asks twice, harmlessly.
template <class Key>
struct ClusterCapacitySlot {
  std::atomic<bool> known{false};
  std::atomic<int32_t> clusters[4]{};
};

template <class Key, class Smem, int kThreads, class Kernel>
DecodeClusterCapacity cluster_capacity_once(Kernel kernel, int device) {
  static ClusterCapacitySlot<Key> slots[64];
  ClusterCapacitySlot<Key>& slot = slots[device & 63];
  DecodeClusterCapacity cap;
  if (device < 64 && slot.known.load(std::memory_order_acquire)) {
    for (int i = 0; i < 4; ++i) cap.clusters[i] = slot.clusters[i].load(std::memory_order_relaxed);
    return cap;
  }
  // Past the portable size (8) only with this attribute; refused, size 16 reads 0 below.
  bool refused = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess;
  for (int32_t c = 2, i = 0; c <= detail::kDecodeMaxCluster; c *= 2, ++i) {
    const ClusterLaunch launch(c, dim3(unsigned(c)), kThreads, Smem::cluster_bytes(c), nullptr);
    int n = 0;
    const bool ok = cudaOccupancyMaxActiveClusters(&n, kernel, &launch.cfg) == cudaSuccess;
    cap.clusters[i] = ok ? n : 0;
    refused |= !ok;
  }
  if (refused) cudaGetLastError();  // a refused query leaves no error behind for a later check
  if (device < 64) {
    for (int i = 0; i < 4; ++i) slot.clusters[i].store(cap.clusters[i], std::memory_order_relaxed);
    slot.known.store(true, std::memory_order_release);
  }
  return cap;
}
}  // namespace

/// Appends k_new / v_new in place at cache_seqlens (decode::append_kernel): before the attention,
/// which reads the appended rows after them (in stream order, or as the append's programmatic
/// dependent: launch_decode).
template <bool kBF16>
void launch_append(const detail::KVCacheParams& p, const LaunchContext& ctx) {
  decode::DecodeArgs a{};
  a.p = p;
  a.async_error = ctx.async_error;
  a.append_delay_ns = uint32_t(ctx.decode_append_delay_us) * 1000u;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.device.stream);
  decode::append_kernel<typename decode::ElemOf<kBF16>::type>
      <<<dim3(p.seqlen_new, p.num_heads_kv, p.batch), decode::append_threads(p), 0, stream>>>(a);
  check_cuda(cudaGetLastError(), ctx.fn, "append kernel launch");
}

/// The decode launch with row tiles of 16 x kRowWarps rows on kBlockN-key blocks (decode_kernel:
/// the narrow tile's 4-warp form on 64-key blocks, its 8-warp form on 128; the wide tile on 64),
/// `splits` splits per tile.
template <bool kBF16, int kHeadDim, int kRowWarps, int kBlockN>
void launch_decode(const detail::KVCacheParams& p, const LaunchContext& ctx, const detail::DecodeTile& tile,
                   int32_t splits) {
  constexpr detail::HopperDecodeConfig c = detail::hopper_decode_config(kHeadDim, kHeadDim);
  constexpr int kRows = 16 * kRowWarps;
  constexpr int kStages = kBlockN == detail::kDecodeEightWarpKeys ? c.eight_warp_stages
                          : kRowWarps > 1                          ? c.wide_stages
                                                                   : c.stages;
  static_assert(kBlockN == c.block_n || (kBlockN == detail::kDecodeEightWarpKeys && kRowWarps == 1 && kStages > 1),
                "64-key blocks, or the narrow tile's 8-warp form where the row has it");
  constexpr int kThreads = 32 * decode::kDecodeCtaWarps<kBlockN, kRows>;
  using Smem = decode::DecodeSmem<kHeadDim, kBlockN, kStages, kRows>;
  static_assert(Smem::cluster_bytes(detail::kDecodeMaxCluster) + 1024 <= 227 * 1024,
                "a CTA of the largest decode cluster must fit the 227 KB per-block limit, with room for static smem");
  const char* const kFn = ctx.fn;
  const cudaStream_t stream = static_cast<cudaStream_t>(p.device.stream);

  decode::DecodeArgs a{};
  a.p = p;
  a.async_error = ctx.async_error;
  a.group = p.num_heads / p.num_heads_kv;
  const int64_t rows = decode_rows(p);
  a.row_tiles = int32_t(decode_row_tiles(p, kRows));
  a.num_splits = splits;
  auto kernel = decode::decode_kernel<kBF16, kHeadDim, kBlockN, kStages, kRowWarps>;
  using Key = decode::DecodeKernelKey<kBF16, kHeadDim, kRows, kBlockN>;
  check_cuda(raise_smem_limit_once<Key>(kernel, Smem::cluster_bytes(detail::kDecodeMaxCluster), p.device.index), kFn,
             "cudaFuncSetAttribute (decode shared memory)");
  const int64_t ctas = int64_t(a.num_splits) * p.num_heads_kv * a.row_tiles * p.batch;
  // The 8-warp form's shared memory leaves one CTA per SM.
  const int64_t wave = int64_t(ctx.num_sms) * (kBlockN == detail::kDecodeEightWarpKeys ? 1 : tile.ctas_per_sm);
  const int64_t merge_bytes =
      int64_t(a.num_splits) * std::min<int64_t>(rows, kRows) * p.headdim_v * int64_t(sizeof(float));
  a.cluster = ctx.decode_cluster != 0 && a.num_splits > 1
                  ? decode_cluster_size(a.num_splits, ctas, wave, ctx.num_sms, merge_bytes,
                                        cluster_capacity_once<Key, Smem, kThreads>(kernel, p.device.index),
                                        ctx.decode_cluster == 1,
                                        !p.paged && decode_cluster_room(ctas, wave, ctx.num_sms, decode_full_tiles(p, tile)))
                  : 1;
  a.num_partials = a.num_splits / a.cluster;

  // Everything that can fail on the host (scratch, the smem limit) comes before the append, the
  // first write to a caller's tensor.
  ScratchHold scratch(stream), arrivals(stream);
  if (p.seqlen_q > 0 && a.num_partials > 1) {
    const size_t parts = size_t(a.num_partials), batch = size_t(p.batch);
    const size_t o_bytes = parts * batch * p.seqlen_q * p.num_heads * kHeadDim * sizeof(float);
    const size_t lse_bytes = parts * size_t(a.cluster) * batch * p.seqlen_q * p.num_heads * sizeof(float);
    // One counter per tile, or per tile and cluster rank (each rank's columns merge on their own).
    const size_t tiles = batch * size_t(p.num_heads_kv) * size_t(a.row_tiles) * size_t(a.cluster);
    scratch.hold(acquire_scratch(p.device.index, stream, o_bytes + lse_bytes, 0, ScratchKind::kDecode));
    arrivals.hold(acquire_scratch(p.device.index, stream, tiles * sizeof(int32_t), tiles * sizeof(int32_t),
                                  ScratchKind::kDecodeArrivals));
    a.o_partial = reinterpret_cast<float*>(scratch.ptr());
    a.lse_partial = reinterpret_cast<float*>(scratch.ptr() + o_bytes);
    a.arrivals = reinterpret_cast<int32_t*>(arrivals.ptr());
  }
  // After an append the decode is its programmatic dependent: its launch, index checks and Q load
  // overlap the append, and it waits for the append's writes before its first K / V copy
  // (decode_kernel, arch::wait_on_prerequisites). Where the attribute is refused as unsupported,
  // a plain launch (stream order).
  const bool dependent = p.seqlen_new > 0;
  a.after_append = dependent ? 1 : 0;
  if (dependent) launch_append<kBF16>(p, ctx);
  if (p.seqlen_q == 0) return;
  const dim3 grid(a.num_splits, p.num_heads_kv * a.row_tiles, p.batch);
  if (a.cluster > 1) {  // the splits of a tile in clusters along x (grid.x = num_splits, a multiple)
    ClusterLaunch launch(a.cluster, grid, kThreads, Smem::cluster_bytes(a.cluster), stream, dependent);
    check_cuda(dependent ? launch_programmatic_ex(launch.cfg, kernel, a) : cudaLaunchKernelEx(&launch.cfg, kernel, a),
               kFn, "decode kernel launch (cluster)");
  } else if (dependent) {
    check_cuda(launch_programmatic(kernel, grid, dim3(kThreads), Smem::kAllocBytes, stream, a), kFn,
               "decode kernel launch");
  } else {
    kernel<<<grid, kThreads, Smem::kAllocBytes, stream>>>(a);
    check_cuda(cudaGetLastError(), kFn, "decode kernel launch");
  }
  arrivals.release();
  scratch.release();
}

template <int kDType, int kHeadDim, int kHeadDimV>
void run_decode(const detail::KVCacheParams& p, const LaunchContext& ctx) {
  static_assert(kHeadDim == kHeadDimV, "the decode kernel has one head dim for K and V");
  constexpr bool kBF16 = kDType == int(DType::kBF16);
  if (ctx.decode_append_only) {  // the forward kernel attends (hopper_api.cu forward_kvcache)
    if (p.seqlen_new > 0) launch_append<kBF16>(p, ctx);
    return;
  }
  constexpr detail::HopperDecodeConfig c = detail::hopper_decode_config(kHeadDim, kHeadDimV);
  const detail::DecodeTile tile = decode_tile(p, c, ctx.num_sms, ctx.decode_tile);
  const int32_t splits = decode_num_splits(p, c, ctx.num_sms, tile, ctx.decode_warps);
  if constexpr (c.wide_ctas_per_sm > 0) {
    if (tile.rows == detail::kDecodeWideRows)
      return launch_decode<kBF16, kHeadDim, detail::kDecodeWideRows / 16, c.block_n>(p, ctx, tile, splits);
  }
  if constexpr (c.eight_warp_stages > 0) {
    if (decode_eight_warps(p, c, ctx.num_sms, tile, splits, ctx.decode_warps))
      return launch_decode<kBF16, kHeadDim, 1, detail::kDecodeEightWarpKeys>(p, ctx, tile, splits);
  }
  launch_decode<kBF16, kHeadDim, 1, c.block_n>(p, ctx, tile, splits);
}

}  // namespace fa4::hopper
