// tests/gpu/host_path_problem.cuh — the bf16 problems of the host-path suites
// (test_hopper_host_path.cu, test_hopper_bwd_host_path.cu): q/k/v/out/lse in device memory, run
// through fa4::forward on a given stream.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/float16.h"
#include "fa4/attention.h"
#include "hopper/shared/device_state.h"

namespace fa4::test {

/// A bf16 problem in device memory: q (rows_q, H, d), k/v (rows_k, HK, d), out, lse (H, rows_q)
/// for varlen, or the batched 4-D layout when `batch` > 0.
struct HostPathProblem {
  int64_t rows_q, rows_k;
  int H, HK, d, batch;  // batch 0: varlen
  int seqlen_q = 0, seqlen_k = 0;
  int device = 0;  // where the buffers were allocated (the device current at construction)
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  float* lse = nullptr;

  HostPathProblem(int64_t rq, int64_t rk, int h, int hk, int dim, int b, uint32_t seed, int sq = 0, int sk = 0)
      : rows_q(rq), rows_k(rk), H(h), HK(hk), d(dim), batch(b), seqlen_q(sq), seqlen_k(sk) {
    cudaGetDevice(&device);
    cudaMalloc(&q, rows_q * H * d * 2);
    cudaMalloc(&k, rows_k * HK * d * 2);
    cudaMalloc(&v, rows_k * HK * d * 2);
    cudaMalloc(&out, rows_q * H * d * 2);
    cudaMalloc(&lse, rows_q * H * 4);
    randomize(seed);
  }
  ~HostPathProblem() { cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(out); cudaFree(lse); }
  HostPathProblem(const HostPathProblem&) = delete;

  void randomize(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto put = [&](uint16_t* dst, int64_t n) {
      std::vector<uint16_t> h(n);
      for (auto& x : h) x = fa4::detail::float_to_bf16(nd(rng));
      cudaMemcpy(dst, h.data(), n * 2, cudaMemcpyHostToDevice);
    };
    put(q, rows_q * H * d);
    put(k, rows_k * HK * d);
    put(v, rows_k * HK * d);
  }
  void poison(cudaStream_t s) {
    cudaMemsetAsync(out, 0xFF, rows_q * H * d * 2, s);
    cudaMemsetAsync(lse, 0xFF, rows_q * H * 4, s);
  }
  void run(const fa4::AttentionOptions& o, cudaStream_t s) const {
    const auto dev = fa4::Device::cuda(device, s);
    if (batch == 0) {
      fa4::forward(TensorView::contiguous(q, DType::kBF16, {rows_q, H, d}, dev),
                   TensorView::contiguous(k, DType::kBF16, {rows_k, HK, d}, dev),
                   TensorView::contiguous(v, DType::kBF16, {rows_k, HK, d}, dev),
                   TensorView::contiguous(out, DType::kBF16, {rows_q, H, d}, dev),
                   TensorView::contiguous(lse, DType::kFP32, {H, rows_q}, dev), o);
    } else {
      fa4::forward(TensorView::contiguous(q, DType::kBF16, {batch, seqlen_q, H, d}, dev),
                   TensorView::contiguous(k, DType::kBF16, {batch, seqlen_k, HK, d}, dev),
                   TensorView::contiguous(v, DType::kBF16, {batch, seqlen_k, HK, d}, dev),
                   TensorView::contiguous(out, DType::kBF16, {batch, seqlen_q, H, d}, dev),
                   TensorView::contiguous(lse, DType::kFP32, {batch, H, seqlen_q}, dev), o);
    }
  }
  std::vector<uint16_t> out_host() const {
    std::vector<uint16_t> h(rows_q * H * d);
    cudaMemcpy(h.data(), out, h.size() * 2, cudaMemcpyDeviceToHost);
    return h;
  }
  std::vector<float> lse_host() const {
    std::vector<float> h(rows_q * H);
    cudaMemcpy(h.data(), lse, h.size() * 4, cudaMemcpyDeviceToHost);
    return h;
  }
};

inline HostPathProblem batched(int batch, int seqlen_q, int seqlen_k, int H, int HK, int d, uint32_t seed) {
  return HostPathProblem(int64_t(batch) * seqlen_q, int64_t(batch) * seqlen_k, H, HK, d, batch, seed, seqlen_q, seqlen_k);
}

inline bool any_nan16(const std::vector<uint16_t>& v) {
  for (uint16_t x : v)
    if ((x & 0x7F80) == 0x7F80 && (x & 0x7F)) return true;
  return false;
}

/// Buffers captured calls took so far, retained by fa4 or owned by their graphs.
inline size_t captured_buffers(const hopper::CaptureScratchStats& s) { return s.created + s.reused + s.retained; }

}  // namespace fa4::test
