// tests/gpu/gpu_reference.cuh — plain CUDA fp32 attention for the GPU tests (no Python needed).
//
// One CTA per (query row, head, batch): it MATERIALISES the score row S (shared memory), applies
// softcap and the mask (core/mask.h: masked logits replaced by -inf), then P, l, O and LSE.
// It consumes the same validated FwdParams (device pointers) the kernel under test gets.
//   exact: fp32 everywhere, output fp32 (the reference);
//   naive16: S, P and O rounded to the input dtype, like a plain same-precision implementation
//            (its error against `exact` sets the accuracy bound of the test).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/mask.h"
#include "core/params.h"

namespace fa4::test {

constexpr int kRefThreads = 128;
/// Longest key row the shared-memory S buffer holds (160 KB of floats; launch_reference raises the
/// kernel's dynamic shared-memory limit past the 48 KB default where a row needs it).
constexpr int kRefMaxSeqlenK = 40960;

__device__ __forceinline__ float ref_load(const void* base, DType t, int64_t i) {
  if (t == DType::kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
  if (t == DType::kFP16) return __half2float(static_cast<const __half*>(base)[i]);
  return static_cast<const float*>(base)[i];
}
__device__ __forceinline__ float ref_round(DType t, float x) {
  if (t == DType::kBF16) return __bfloat162float(__float2bfloat16_rn(x));
  if (t == DType::kFP16) return __half2float(__float2half_rn(x));
  return x;
}

__device__ __forceinline__ float block_reduce(float x, bool is_max, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kRefThreads / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

/// out: (rows, heads, headdim_v) fp32 with rows = total_q (varlen) or batch*seqlen_q; lse: (rows,
/// heads) fp32. Launched by launch_reference.
// static: internal linkage, since every GPU test file that checks against it includes this header.
static __global__ void reference_attention_kernel(const detail::FwdParams p, bool naive16, float* out, float* lse) {
  extern __shared__ float s_row[];
  __shared__ float scratch[kRefThreads / 32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int64_t q0 = 0, k0 = 0;
  int sq = p.seqlen_q, sk = p.seqlen_k;
  if (p.is_varlen) {
    q0 = p.cu_seqlens_q[b];
    k0 = p.cu_seqlens_k[b];
    sq = p.cu_seqlens_q[b + 1] - int(q0);
    sk = p.seqused_k ? p.seqused_k[b] : p.cu_seqlens_k[b + 1] - int(k0);
  }
  if (i >= sq) return;
  const int hk = p.kv_head(h);
  const int64_t qb = p.is_varlen ? 0 : b * p.q_stride.batch;
  const int64_t kb = p.is_varlen ? 0 : b * p.k_stride.batch;
  const int64_t vb = p.is_varlen ? 0 : b * p.v_stride.batch;
  const int64_t qrow = qb + (q0 + i) * p.q_stride.row + h * p.q_stride.head;
  const DType t = p.dtype;
  for (int j = threadIdx.x; j < sk; j += kRefThreads) {
    const int64_t krow = kb + (k0 + j) * p.k_stride.row + hk * p.k_stride.head;
    float acc = 0.f;
    for (int d = 0; d < p.headdim; ++d) acc = fmaf(ref_load(p.q, t, qrow + d), ref_load(p.k, t, krow + d), acc);
    float s = acc * p.softmax_scale;
    if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
    if (naive16) s = ref_round(t, s);
    if (!detail::key_visible(i, j, sq, sk, p.mask)) s = -INFINITY;  // replaced, never added
    s_row[j] = s;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = threadIdx.x; j < sk; j += kRefThreads) m = fmaxf(m, s_row[j]);
  m = block_reduce(m, true, scratch);
  const float sink = p.sink ? p.sink[h] : -INFINITY;
  const float mm = fmaxf(m, sink);
  float l = 0.f;
  for (int j = threadIdx.x; j < sk; j += kRefThreads) {
    // A NaN score (from the data) makes the row NaN, also when it is the row's only kind of score
    // (fmaxf above dropped it, so mm may be -inf).
    float e = s_row[j] != s_row[j] ? s_row[j] : mm == -INFINITY ? 0.f : expf(s_row[j] - mm);
    if (naive16) e = ref_round(t, e);
    s_row[j] = e;
    l += e;
  }
  l = block_reduce(l, false, scratch);
  if (p.sink) l += expf(sink - mm);
  __syncthreads();
  const int64_t orow = p.is_varlen ? q0 + i : int64_t(b) * p.seqlen_q + i;
  for (int d = threadIdx.x; d < p.headdim_v; d += kRefThreads) {
    float acc = 0.f;
    for (int j = 0; j < sk; ++j) {
      if (s_row[j] == 0.f) continue;  // masked keys never contribute (not even a NaN in V)
      const int64_t vrow = vb + (k0 + j) * p.v_stride.row + hk * p.v_stride.head;
      acc = fmaf(s_row[j], ref_load(p.v, t, vrow + d), acc);
    }
    float o = l > 0.f ? acc / l : 0.f;
    if (l != l) o = l;  // NaN from the data propagates
    if (naive16) o = ref_round(t, o);
    out[(orow * p.num_heads + h) * p.headdim_v + d] = o;
  }
  if (threadIdx.x == 0) lse[orow * p.num_heads + h] = l > 0.f ? mm + logf(l) : (l != l ? l : -INFINITY);
}

/// reference_attention_kernel over grid (max seqlen_q, heads, batch) with a score row of max_sk
/// (<= kRefMaxSeqlenK) keys in dynamic shared memory, padded by 16 bytes past the last score: nvcc
/// may read the row with 16-byte vector loads whose tail passes its end (compute-sanitizer memcheck
/// flagged it). Returns the launch's error.
static inline cudaError_t launch_reference(dim3 grid, int max_sk, const detail::FwdParams& p, bool naive16,
                                           float* out, float* lse) {
  const size_t smem = (size_t(max_sk > 1 ? max_sk : 1) + 3) / 4 * 4 * sizeof(float) + 16;
  if (cudaError_t e = cudaFuncSetAttribute(reference_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           int(smem));
      e != cudaSuccess)
    return e;
  reference_attention_kernel<<<grid, kRefThreads, smem>>>(p, naive16, out, lse);
  return cudaGetLastError();
}

}  // namespace fa4::test
