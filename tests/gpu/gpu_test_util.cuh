// tests/gpu/gpu_test_util.cuh — what every GPU test file needs to decide whether it can run.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "common/overrides.h"
#include "core/float16.h"
#include "core/params.h"
#include "fa4/tensor.h"
#include "hopper/hopper_api.h"

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

/// The Hopper kernels a case runs, as a set (kFwd | kBwd): each has its own bucket table, so one
/// head dim can run on different buckets (72: the d96 forward, the d128 backward).
enum HopperKernels : unsigned { kFwd = 1u, kBwd = 2u, kDecode = 4u };

/// The part of the selectors' answer (hopper_api.cu not_compiled) that says a bucket exists but
/// this build left it out (CMake FA4_HOPPER_HEADDIMS).
inline constexpr const char* kNotCompiled = "was not compiled in this build";

/// "" where this build compiled the bucket on which `kernel` (one of kFwd, kBwd, kDecode) runs
/// head dims (d, dv); else that kernel's selector's reason, which names the bucket. It asks the
/// selector itself (hopper_api.h) about an empty problem (no rows: no stride or size rule
/// applies), so a padded head dim maps to its bucket as in a real call. Any other refusal answers
/// "": the case then runs and its own checks judge it, exactly as in a full build.
inline std::string bucket_not_compiled(unsigned kernel, int d, int dv) {
  detail::KVCacheParams p;  // the forward's parameters, a decode's and (below) a backward's
  p.device = Device::cuda(0);
  p.batch = p.num_heads = p.num_heads_kv = 1;
  p.headdim = d;
  p.headdim_v = dv;
  std::string why;
  if (kernel == kFwd) {
    why = hopper::forward_support(p, nullptr);
  } else if (kernel == kBwd) {
    detail::BwdParams b;
    static_cast<detail::FwdParams&>(b) = p;
    why = hopper::backward_support(b, nullptr);
  } else {
    why = hopper::kvcache_support(p, nullptr);
  }
  return why.find(kNotCompiled) != std::string::npos ? why : std::string();
}

/// The running test's record of the cases it left out because this build did not compile their
/// head-dim bucket (a partial build, CMake FA4_HOPPER_HEADDIMS), and of whether a case ran.
/// REQUIRE_HOPPER() opens one per test; leave_out() reports to it. At the test's end a test that
/// left cases out and ran none is skipped (GTEST_SKIP naming the buckets); one that ran some keeps
/// its result (each case that ran was checked in full) and prints what it left out (also recorded
/// as the test property "left_out"). A full build leaves nothing out: then it does nothing.
class BucketCases {
 public:
  BucketCases() : outer_(current()) { current() = this; }
  ~BucketCases() {
    current() = outer_;
    report(left_out_, ran_);
  }
  BucketCases(const BucketCases&) = delete;
  BucketCases& operator=(const BucketCases&) = delete;

  /// The record of the running test (nullptr outside REQUIRE_HOPPER()'s scope).
  static BucketCases*& current() {
    thread_local BucketCases* open = nullptr;
    return open;
  }
  /// One case: `why` "" ran, else the reason its bucket is missing (each reason kept once).
  void note(const std::string& why) {
    if (why.empty())
      ran_ = true;
    else if (std::find(left_out_.begin(), left_out_.end(), why) == left_out_.end())
      left_out_.push_back(why);
  }

 private:
  // GTEST_SKIP() returns from the function it is in: here a void one, called at the test's end.
  static void report(const std::vector<std::string>& left_out, bool ran) {
    if (left_out.empty() || ::testing::Test::IsSkipped()) return;  // REQUIRE_BUCKETS said it
    std::string list;
    for (const std::string& why : left_out) list += "\n  " + why;
    if (!ran && !::testing::Test::HasFailure())
      GTEST_SKIP() << "every case needs a head-dim bucket this build did not compile:" << list;
    ::testing::Test::RecordProperty("left_out", list);
    std::printf("[   NOTE   ] cases left out, their bucket not compiled in this build:%s\n",
                list.c_str());
    std::fflush(stdout);
  }

  BucketCases* outer_;
  std::vector<std::string> left_out_;
  bool ran_ = false;
};

/// "" where this build compiled the bucket of every kernel in `kernels` (kFwd | kBwd | kDecode)
/// for head dims (d, dv), and the running test's case counts as run; else the first missing
/// bucket's reason, noted in the test's record (BucketCases) as a case left out.
inline std::string bucket_missing(int d, int dv, unsigned kernels) {
  std::string why;
  for (unsigned k : {kFwd, kBwd, kDecode})
    if ((kernels & k) && why.empty()) why = bucket_not_compiled(k, d, dv);
  if (BucketCases* cases = BucketCases::current()) cases->note(why);
  else ADD_FAILURE() << "fa4::test::bucket_missing outside a test that called REQUIRE_HOPPER()";
  return why;
}

/// True where the running test must leave a case out (and go on with its next one): this build
/// did not compile a bucket the case needs (bucket_missing). Never in a full build.
inline bool leave_out(int d, int dv, unsigned kernels) {
  return !bucket_missing(d, dv, kernels).empty();
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
/// start zeroed is zeroed at capture and the kernels leave it zero for the next replay.
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

/// Skips the calling test, loudly, where no Hopper GPU exists (CI machines have none); else opens
/// the test's record of the cases it leaves out for buckets this build did not compile
/// (fa4::test::BucketCases: a test that ran none of its cases then ends skipped). Two statements:
/// use it at a test body's top level only, never as an unbraced if's or loop's body.
#define REQUIRE_HOPPER()                                                               \
  if (!fa4::test::have_hopper())                                                       \
    GTEST_SKIP() << "no sm_90 CUDA device: Hopper kernel tests skipped";               \
  const fa4::test::BucketCases fa4_bucket_cases_

/// At the top of a test (after REQUIRE_HOPPER) whose every case needs these buckets: skips it,
/// naming the bucket, where this build did not compile one of them (fa4::test::bucket_missing).
#define REQUIRE_BUCKETS(d, dv, kernels)                                                \
  if (const std::string fa4_missing_ = fa4::test::bucket_missing(d, dv, kernels);      \
      !fa4_missing_.empty())                                                           \
    GTEST_SKIP() << fa4_missing_
