// src/hopper/arch/arch.cuh — the ONE file of the Hopper kernels that holds raw PTX.
//
// Everything else goes through CuTe/CUTLASS. What is here has no CuTe wrapper with the exact
// semantics we need, or we want the id/count explicit:
//   * named barriers (bar.sync / bar.arrive) with ids from one allocator (NamedBarriers):
//     warpgroups synchronise in pairs (a consumer WG and the one before it in the ping-pong of wgmma
//     issue) or alone (a warpgroup's O slice staged for the TMA store) without stalling the whole
//     CTA as __syncthreads would;
//   * ex2.approx.ftz.f32: the MUFU exponential (2^x, ~2 ulp, flushes subnormals) that the FA4
//     softmax splits against the FMA-pipe polynomial fa4::exp2_emulated;
//   * cp.reduce.async.bulk (fp32 add) and its bulk-group waits: the backward's dQ leaves a CTA as
//     one smem -> global reduce-add per warpgroup and query block instead of per-element atomics;
//   * acquire/release flag accesses for the deterministic backward's ordered dQ accumulation;
//   * the decode kernel's warp-level pieces (decode/): cp.async with zero fill (16-byte rows
//     gathered one by one through the page table, which TMA boxes cannot do for any page size;
//     the gathering forward's producer warps copy paged K/V rows with it too),
//     ldmatrix (plain and transposed) and mma.sync m16n8k16: a decode tile has 16 rows, a quarter
//     of one wgmma's 64, and its four warps work on separate keys;
//   * thread-block clusters (decode/): the CTA's rank, the cluster-wide barrier in two halves and
//     stores into a peer CTA's shared memory (distributed shared memory), with which the splits of
//     one decode tile merge without a round trip through global memory;
//   * an empty asm that hides a pointer's value from the compiler (opaque), so per-step address
//     arithmetic (the backward's smem descriptors) is not hoisted into registers it lacks;
//   * griddepcontrol (programmatic dependent launch): a kernel lets the next one on its stream,
//     launched with the programmatic-serialization attribute, start early (its prologue and the
//     loads of inputs the first kernel does not write overlap the first kernel's tail), and the
//     next one waits for the first's completion and memory before it reads what that one wrote;
//   * setmaxnreg: moves registers from the producer warpgroup (which only issues TMA) to the two
//     consumer warpgroups (which hold S, P and O in registers). Needs sm_90a and a register cap at
//     kernel entry (__launch_bounds__(threads, 1)).
// Tested on its own by tests/gpu/test_hopper_arch.cu.
#pragma once

#include <cstdint>

namespace fa4::hopper::arch {

/// Named-barrier ids of a kernel with kNumWarpGroups consumer warpgroups (2 or 3). 0 is
/// __syncthreads(); CUTLASS reserves none of these in our kernels. Every kernel takes its ids from
/// here, so two kinds never share one:
///   turn(wg)     ping-pong: consumer warpgroup wg may issue its wgmmas    2, 3 (third: 7)
///   consumers()  all consumer warpgroups together                          4
///   local(wg)    consumer warpgroup wg alone (its O slice is in smem, ...)  5, 6 (third: 8)
///   dq_full(wg, w)   backward (two warpgroups): warpgroup wg's dQ (or a round of its parts) of
///                    a step with parity w is staged in smem (wg + writer w)  7, 8 (w = 1: 9, 10)
///   dq_empty(wg, w)  backward: writer w's bulk reduce has read that staging  11, 12 (13, 14)
/// A third warpgroup's ids come after the shared one, so the two-warpgroup forward keeps the ids
/// it was tuned with; the dq_* ids exist for two warpgroups only (they reuse the third's 7, 8).
/// A kernel needing more kinds numbers them from kFirstFree up (ids < 16).
template <int kNumWarpGroups>
struct NamedBarriers {
  static_assert(kNumWarpGroups == 2 || kNumWarpGroups == 3, "two or three consumer warpgroups");
  // (kNumWarpGroups == 3 && ...: with two warpgroups the id is base + wg, no compare on the path.)
  __host__ __device__ static constexpr uint32_t turn(int wg) {
    return kNumWarpGroups == 3 && wg == 2 ? 7u : 2u + uint32_t(wg);
  }
  __host__ __device__ static constexpr uint32_t consumers() { return 4u; }
  __host__ __device__ static constexpr uint32_t local(int wg) {
    return kNumWarpGroups == 3 && wg == 2 ? 8u : 5u + uint32_t(wg);
  }
  __host__ __device__ static constexpr uint32_t dq_full(int wg, int w) {
    static_assert(kNumWarpGroups == 2, "the dQ staging barriers exist for two warpgroups");
    return 7u + 2u * uint32_t(w) + uint32_t(wg);
  }
  __host__ __device__ static constexpr uint32_t dq_empty(int wg, int w) {
    static_assert(kNumWarpGroups == 2, "the dQ staging barriers exist for two warpgroups");
    return 11u + 2u * uint32_t(w) + uint32_t(wg);
  }
  static constexpr uint32_t kFirstFree = kNumWarpGroups == 3 ? 9 : 15;
};

/// Blocks until `num_threads` threads (multiple of 32, whole warps) have arrived at barrier `id`.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

/// Counts this warp's threads at barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(num_threads) : "memory");
}

/// `ptr`, as a value the compiler cannot see through: what is derived from it inside a loop is
/// recomputed there instead of hoisted out of it. The backward's smem descriptors of K and V (16
/// 64-bit values at d128) are loop-invariant; hoisted, they occupy registers the consumers do not
/// have, and ptxas spills them and reloads one before every wgmma.
template <class T>
__device__ __forceinline__ T* opaque(T* ptr) {
  asm volatile("" : "+l"(ptr));
  return ptr;
}

/// 2^x on the MUFU unit. -inf -> +0, results below 2^-126 flush to 0 (irrelevant in a softmax whose
/// row maximum contributes 2^0 to the sum).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm volatile("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// Adds `bytes` (a multiple of 16; both addresses 16-byte aligned) of fp32 values from shared memory
/// into global memory, element by element, as one asynchronous bulk operation of this thread's
/// current bulk group (the adds are atomic per element at L2).
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem, const float* smem, uint32_t bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
               ::"l"(gmem), "r"(s), "r"(bytes) : "memory");
}
/// Closes this thread's current bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// Waits until at most kPending of this thread's bulk groups still READ shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
/// Waits until at most kPending of this thread's bulk groups are incomplete (writes performed).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// GPU-scope acquire load / release add of a flag word (other CTAs' writes before the release are
/// visible after an acquire that reads its value).
__device__ __forceinline__ int32_t load_acquire(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void add_release(int32_t* p, int32_t v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
/// GPU-scope acquire-release fetch-add: releases this thread's earlier writes (and, after a CTA
/// barrier, its CTA's) and acquires those released by earlier adds to the same word.
__device__ __forceinline__ int32_t fetch_add_acq_rel(int32_t* p, int32_t v) {
  int32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

/// Programmatic dependent launch (PTX griddepcontrol; both are no-ops in a kernel launched without
/// the attribute, or with no dependent). launch_dependents: once every CTA of this grid has executed
/// it (or exited), the next kernel on the stream, if launched with
/// cudaLaunchAttributeProgrammaticStreamSerialization, may start. wait_on_prerequisites: blocks the
/// calling thread until the grids this one depends on have completed and their memory operations
/// are visible to it; every read of what they wrote must follow it.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_on_prerequisites() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

/// The global nanosecond timer (%globaltimer; its resolution is about a microsecond).
__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
/// Keeps the calling thread busy for at least `ns` nanoseconds (for tests that need a slow kernel).
__device__ __forceinline__ void spin_for_ns(uint32_t ns) {
  const uint64_t start = global_time_ns();
  while (global_time_ns() - start < ns) __nanosleep(1000);
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

/// wgmma accumulator fragment maps (m64nNk16, fp32 accumulators): consumer thread `tid` (warpgroup
/// tid / 128 owns 64 rows; warp w of it 16 rows; lane l rows l / 4 and l / 4 + 8) holds, for each
/// 8-column group, the value pair at columns fragment_col(tid), +1 of fragment rows 0 and 1.
/// Tile row (0..tile_m-1) of fragment row 0 of thread `tid`; fragment row 1 is 8 below.
__device__ __forceinline__ int fragment_row(int tid) {
  return (tid / 128) * 64 + ((tid % 128) / 32) * 16 + (tid % 32) / 4;
}
/// Column, within each 8-column group, of the first of thread `tid`'s value pair.
__device__ __forceinline__ int fragment_col(int tid) { return 2 * (tid % 4); }

/// Quad reductions: the 4 lanes of a quad (lane/4 equal) hold one accumulator row of a wgmma.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- decode (warp-level MMA) ----

/// 16-byte global -> shared copy through L2 only (.cg: streamed K/V have no reuse in L1), to a
/// shared-state-space address (__cvta_generic_to_shared's: a caller can step it by constants across
/// copies). With `valid` false no byte is read and the 16 bytes of smem are zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
/// The same to a generic pointer into shared memory.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  cp_async_16(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, valid);
}
/// Closes this thread's current cp.async group.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until every cp.async of this thread has completed (grouped or not).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
/// Waits until at most kPending of this thread's cp.async groups are incomplete.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// Four 8x8 16-bit matrices from shared memory: lane l gives the address of row l % 8 of matrix
/// l / 8; r[j] receives matrix j in the mma fragment layout (lane l: row l / 4, columns 2 (l % 4)
/// and +1). kTrans: each matrix transposed (lane l: column l / 4, rows 2 (l % 4) and +1).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}

/// c += a b for one m16n8k16 tile, fp32 accumulators; kBF16 picks bf16 or fp16 operands. a: the
/// 16x16 A fragment (pairs of rows l/4, l/4+8 at columns 2(l%4) and +8), b: the 16x8 B fragment
/// (column l/4, rows 2(l%4) and +8), c: rows l/4 (c[0], c[1]) and l/4+8 (c[2], c[3]).
template <bool kBF16>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- thread-block clusters (decode split merge) ----

/// This CTA's rank in its cluster (0 .. cluster size - 1; 0 without a cluster launch).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

/// The cluster-wide barrier in its two halves, each executed by every thread of every CTA of the
/// cluster (`.aligned`: all threads of a warp together). arrive_relaxed orders nothing: a kernel
/// arrives with it at its start so that the matching wait, later, is a cheap proof that every peer
/// CTA has started (storing to a peer's shared memory requires that). arrive_release publishes the
/// thread's earlier writes (its stores to peers' shared memory included) at cluster scope; the wait
/// after it acquires every peer's. A CTA must not exit while a peer may still access its shared
/// memory.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/// The address of `p` (in this CTA's shared memory) in the shared memory of the cluster's CTA
/// `rank`, in the cluster's shared window (mapa; distributed shared memory).
__device__ __forceinline__ uint32_t peer_smem_addr(const void* p, uint32_t rank) {
  uint32_t a;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(a) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(p))), "r"(rank));
  return a;
}
/// Stores v there (st_peer(p, rank, v)): the thread goes on without waiting for a reply, unlike
/// a remote load.
__device__ __forceinline__ void st_peer(float* p, uint32_t rank, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" :: "r"(peer_smem_addr(p, rank)), "f"(v) : "memory");
}
__device__ __forceinline__ void st_peer(int32_t* p, uint32_t rank, int32_t v) {
  asm volatile("st.shared::cluster.s32 [%0], %1;\n" :: "r"(peer_smem_addr(p, rank)), "r"(v) : "memory");
}
__device__ __forceinline__ void st_peer(float4* p, uint32_t rank, const float4& v) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n"
               :: "r"(peer_smem_addr(p, rank)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}

}  // namespace fa4::hopper::arch
