// tests/gpu/gpu_test_util.cuh — what every GPU test file needs to decide whether it can run.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "common/overrides.h"
#include "core/float16.h"
#include "fa4/tensor.h"

namespace fa4::test {

/// Forces one kernel choice (common/overrides.h: "lpt", "schedule", "bwd_lpt_band", ...) for the
/// scope, then returns it to the selector.
struct ScopedOverride {
  const char* name;
  ScopedOverride(const char* n, const char* value) : name(n) { fa4::detail::set_kernel_override(n, value); }
  ~ScopedOverride() { fa4::detail::set_kernel_override(name, "auto"); }
  ScopedOverride(const ScopedOverride&) = delete;
  ScopedOverride& operator=(const ScopedOverride&) = delete;
};

/// Every GPU test's poison (NaN in bf16 and fp16: a value the kernel never wrote shows as NaN)
/// and the absolute terms of the accuracy rule (error <= 2 x the naive same-precision
/// implementation's + atol): out elements, lse values.
inline constexpr uint16_t kPoison16 = 0xFFFF;
inline constexpr float kAtolO = 1e-4f;
inline constexpr float kAtolLse = 1e-3f;

/// True when device 0 is a Hopper (compute capability 9.x) GPU the sm_90a kernels can run on.
inline bool have_hopper() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  return major == 9;
}

/// Device memory of `count` T, freed with the buffer; upload/download copy whole buffers.
template <class T>
struct DevBuf {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { if (n) cudaMalloc(&ptr, n * sizeof(T)); }
  ~DevBuf() { if (ptr) cudaFree(ptr); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& h) { if (n) cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

/// A float as the 16 bits of a bf16 / fp16 value (round to nearest even), and back.
inline uint16_t to16(DType t, float f) {
  return t == DType::kBF16 ? detail::float_to_bf16(f) : detail::float_to_fp16(f);
}
inline float from16(DType t, uint16_t h) {
  return t == DType::kBF16 ? detail::bf16_to_float(h) : detail::fp16_to_float(h);
}

/// What capture_graph captured: the graph, cudaStreamEndCapture's status, and the message of an
/// exception the captured code threw ("" if none).
struct Capture {
  cudaGraph_t graph = nullptr;
  cudaError_t ended = cudaSuccess;
  std::string thrown;
};

/// Captures fn() on stream s into a graph. The capture ends even if fn throws (a thread left
/// capturing fails every later CUDA call): on_throw() runs first (e.g. to rejoin a forked stream,
/// without which the capture cannot end), and the message is kept.
template <class Fn, class OnThrow>
Capture capture_graph(cudaStream_t s, cudaStreamCaptureMode mode, Fn&& fn, OnThrow&& on_throw) {
  Capture c;
  c.ended = cudaStreamBeginCapture(s, mode);
  if (c.ended != cudaSuccess) {
    c.thrown = "cudaStreamBeginCapture failed";
    return c;
  }
  try {
    fn();
  } catch (const std::exception& e) {
    c.thrown = e.what();
    on_throw();
  }
  c.ended = cudaStreamEndCapture(s, &c.graph);
  return c;
}
template <class Fn>
Capture capture_graph(cudaStream_t s, Fn&& fn) {
  return capture_graph(s, cudaStreamCaptureModeGlobal, std::forward<Fn>(fn), [] {});
}

/// How many of graph g's nodes have type `type` (kernel, memset, ...), or, with `other` set, any
/// other type; -1 if the graph cannot be read. A captured fa4 call adds no memset node: what must
/// start zeroed belongs to the graph and the kernels leave it zero for the next replay.
inline int count_nodes(cudaGraph_t g, cudaGraphNodeType type, bool other = false) {
  size_t n = 0;
  if (cudaGraphGetNodes(g, nullptr, &n) != cudaSuccess) return -1;
  std::vector<cudaGraphNode_t> nodes(n);
  if (n && cudaGraphGetNodes(g, nodes.data(), &n) != cudaSuccess) return -1;
  int count = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    if (cudaGraphNodeGetType(node, &t) != cudaSuccess) return -1;
    count += (t == type) != other;
  }
  return count;
}

/// Edges of g whose type is cudaGraphDependencyTypeProgrammatic (a kernel launched as a
/// programmatic dependent of the one before it); -1 if CUDA cannot list them.
inline int count_programmatic_edges(cudaGraph_t g) {
  size_t n = 0;
  if (cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &n) != cudaSuccess) return -1;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (n && cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &n) != cudaSuccess) return -1;
  int count = 0;
  for (size_t i = 0; i < n; ++i) count += data[i].type == cudaGraphDependencyTypeProgrammatic;
  return count;
}

}  // namespace fa4::test

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << cudaGetErrorString(x)

/// Skips the calling test, loudly, where no Hopper GPU exists (CI machines have none).
#define REQUIRE_HOPPER() \
  if (!fa4::test::have_hopper()) GTEST_SKIP() << "no sm_90 CUDA device: Hopper kernel tests skipped"
