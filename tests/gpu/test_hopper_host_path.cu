// tests/gpu/test_hopper_host_path.cu — what the host path promises a serving engine: no
// allocation, sync or environment lookup per call (src/hopper/shared/device_state.h), so that
//   * a varlen forward captures into a CUDA graph and its replays give the eager result bitwise,
//     also after the inputs change (the graph reads live memory);
//   * the launch scratch (dynamic claim counter, stream-K flags) is left zero by every kernel,
//     eager or replayed, so the next launch needs no memset;
//   * device-resident cu_seqlens / seqused_k that break a rule are checked by the kernel: nothing
//     is read or written out of bounds (run under compute-sanitizer: Sanitize* filter), the bad
//     sequences are skipped (their rows keep the poison), the good ones are computed as if alone,
//     and the next call on the device reports the broken rule, once;
//   * rows past the kernels' int32 row limit are refused by every direction's selector.
// The backward's host path: test_hopper_bwd_host_path.cu.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fa4/attention.h"
#include "core/float16.h"
#include "hopper/shared/device_state.h"
#include "hopper/shared/launch_context.h"

#include "gpu_test_util.cuh"
#include "host_path_problem.cuh"

namespace {

using fa4::test::kPoison16;

using fa4::DType;
using fa4::TensorView;
using fa4::test::HostPathProblem;
using fa4::test::any_nan16;
using fa4::test::batched;
using fa4::test::captured_buffers;
using Problem = HostPathProblem;

/// The counter/flag region of the (device 0, stream) launch scratch (launch_fwd.cuh: room for 3
/// flags per SM), which every kernel must leave zero; the eager scratch is one buffer per stream,
/// so this reads the buffer the launches used.
std::vector<uint8_t> scratch_flags(cudaStream_t s) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t bytes = (size_t(sms) * 3 * 4 + 255) / 256 * 256;
  fa4::hopper::ScratchHold held(s);
  const char* base = held.hold(fa4::hopper::acquire_scratch(0, s, bytes, bytes));
  std::vector<uint8_t> h(bytes);
  cudaMemcpy(h.data(), base, bytes, cudaMemcpyDeviceToHost);
  held.release();
  return h;
}


TEST(HopperFwd, ScratchLeftZero) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(128, 128, fa4::test::kFwd);  // both problems below
  fa4::test::ScopedOverride fwd_kernel("small_q", "fwd");  // the forward kernel's scratch
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Dynamic claiming: causal, 3 x 8 x 8 = 192 tiles > SMs. A counter left non-zero would make the
  // next launch skip tiles, whose rows would keep the poison.
  {
    Problem p = batched(3, 1024, 1024, 8, 8, 128, 11);
    fa4::AttentionOptions o;
    o.causal = true;
    fa4::test::ScopedOverride dynamic("schedule", "dynamic");
    std::vector<uint16_t> first;
    for (int r = 0; r < 3; ++r) {
      p.poison(s);
      p.run(o, s);
      CUDA_OK(cudaStreamSynchronize(s));
      const auto now = p.out_host();
      ASSERT_FALSE(any_nan16(now)) << "run " << r << ": a tile was not computed";
      if (r == 0) first = now;
      ASSERT_EQ(0, std::memcmp(first.data(), now.data(), now.size() * 2)) << "run " << r;
      for (uint8_t b : scratch_flags(s)) ASSERT_EQ(b, 0) << "claim counter left non-zero";
    }
  }
  // Stream-K forced: 16 tiles of 3000 keys split over the SMs; every flag must be cleared.
  {
    Problem p = batched(1, 128, 3000, 16, 16, 128, 12);
    fa4::test::ScopedOverride split("stream_k", "1");
    for (int r = 0; r < 2; ++r) {
      p.poison(s);
      p.run({}, s);
      CUDA_OK(cudaStreamSynchronize(s));
      ASSERT_FALSE(any_nan16(p.out_host()));
      for (uint8_t b : scratch_flags(s)) ASSERT_EQ(b, 0) << "stream-K flags left set";
    }
  }
  CUDA_OK(cudaStreamDestroy(s));
}

/// One forward (output poisoned first) captured into a CUDA graph on stream s; replay() launches it
/// and waits.
struct CapturedForward {
  cudaStream_t s;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedForward(Problem& p, const fa4::AttentionOptions& o, cudaStream_t stream) : s(stream) {
    EXPECT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    p.poison(s);
    p.run(o, s);
    EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  }
  ~CapturedForward() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  CapturedForward(const CapturedForward&) = delete;
  cudaError_t replay() {
    const cudaError_t e = cudaGraphLaunch(exec, s);
    return e != cudaSuccess ? e : cudaStreamSynchronize(s);
  }
};

TEST(HopperFwd, VarlenGraphReplay) {
  REQUIRE_HOPPER();
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::vector<int> cu_q = {0, 300, 301, 301, 1100}, cu_k = {0, 500, 900, 1000, 1900};
  Problem p(cu_q.back(), cu_k.back(), 8, 2, 128, 0, 21);
  int* dcu = nullptr;
  CUDA_OK(cudaMalloc(&dcu, 2 * cu_q.size() * sizeof(int)));
  CUDA_OK(cudaMemcpy(dcu, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dcu + cu_q.size(), cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));
  const int64_t nb = int64_t(cu_q.size());
  const auto dev = fa4::Device::cuda(0, s);
  fa4::AttentionOptions o;
  o.causal = true;
  o.cu_seqlens_q = TensorView::contiguous(dcu, DType::kInt32, {nb}, dev);
  o.cu_seqlens_k = TensorView::contiguous(dcu + nb, DType::kInt32, {nb}, dev);
  o.max_seqlen_q = 800;
  o.max_seqlen_k = 900;

  auto eager = [&] {
    p.poison(s);
    p.run(o, s);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return std::make_pair(p.out_host(), p.lse_host());
  };
  // A partial build (FA4_HOPPER_HEADDIMS) runs the part whose bucket it compiled. The varlen graph
  // lives on while the batched one is captured, as in a full build.
  std::optional<CapturedForward> graph;
  if (!fa4::test::leave_out(p.d, p.d, fa4::test::kFwd)) {
    const auto want = eager();
    ASSERT_FALSE(any_nan16(want.first));

    graph.emplace(p, o, s);
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(graph->replay(), cudaSuccess);
      EXPECT_EQ(0, std::memcmp(want.first.data(), p.out_host().data(), want.first.size() * 2))
          << "replay " << r;
      EXPECT_EQ(0, std::memcmp(want.second.data(), p.lse_host().data(), want.second.size() * 4))
          << "replay " << r;
    }
    // New inputs in the same memory: the replay computes them (eager on the new inputs is the
    // truth).
    p.randomize(22);
    const auto want2 = eager();
    ASSERT_EQ(graph->replay(), cudaSuccess);
    EXPECT_NE(0, std::memcmp(want.first.data(), want2.first.data(), want.first.size() * 2));
    EXPECT_EQ(0, std::memcmp(want2.first.data(), p.out_host().data(), want2.first.size() * 2));
  }

  // A batched causal forward with dynamic claiming (graph-owned scratch under capture) replays too.
  Problem b = batched(2, 2048, 2048, 8, 8, 64, 23);
  if (!fa4::test::leave_out(b.d, b.d, fa4::test::kFwd)) {
    fa4::AttentionOptions oc;
    oc.causal = true;
    b.poison(s);
    b.run(oc, s);
    CUDA_OK(cudaStreamSynchronize(s));
    const auto want_b = b.out_host();
    CapturedForward graph_b(b, oc, s);
    for (int r = 0; r < 3; ++r) {
      ASSERT_EQ(graph_b.replay(), cudaSuccess);
      EXPECT_EQ(0, std::memcmp(want_b.data(), b.out_host().data(), want_b.size() * 2))
          << "dynamic replay " << r;
    }
  }
  cudaFree(dcu);
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(HopperFwd, CapturedScratchBelongsToTheGraph) {
  // A captured forward whose kernel needs zeroed scratch (the dynamic schedule's claim counter;
  // stream-K flags, and its unzeroed partials beside them), its buffers owned by the graph (user
  // objects: fa4's retained budget spent, forced here), is its kernels alone (no memset, no
  // graph-memory nodes), replays correctly many times (the kernel leaves the scratch zero for the
  // next replay), and once the first graph is destroyed and CUDA has given its buffers back, the
  // next capture reuses them (the zeroed one zeroed again) and is correct too.
  REQUIRE_HOPPER();
  fa4::test::ScopedOverride fwd_kernel("small_q", "fwd");  // the forward kernel's scratch
  fa4::test::ScopedOverride owner("capture_scratch", "graph");
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Variant {
    const char* knob;
    const char* value;
    Problem p;
    bool causal;
  };
  Variant variants[] = {{"stream_k", "1", batched(1, 128, 3000, 16, 16, 128, 31), false},
                        {"schedule", "dynamic", batched(3, 1024, 1024, 8, 8, 64, 32), true}};
  for (Variant& v : variants) {
    if (fa4::test::leave_out(v.p.d, v.p.d, fa4::test::kFwd)) continue;
    fa4::test::ScopedOverride knob(v.knob, v.value);
    size_t buffers = 0;  // graph-owned buffers the first capture took
    fa4::AttentionOptions o;
    o.causal = v.causal;
    v.p.poison(s);
    v.p.run(o, s);
    CUDA_OK(cudaStreamSynchronize(s));
    const auto want = v.p.out_host();
    ASSERT_FALSE(any_nan16(want)) << v.knob;
    for (int capture = 0; capture < 2; ++capture) {
      const fa4::hopper::CaptureScratchStats before = fa4::hopper::capture_scratch_stats();
      cudaGraphExec_t exec = nullptr;
      const fa4::test::Capture c = fa4::test::capture_graph(s, [&] { v.p.run(o, s); });
      cudaGraph_t graph = c.graph;
      ASSERT_EQ(c.thrown, "") << v.knob;
      CUDA_OK(c.ended);
      EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeKernel, true), 0) << v.knob << ": not only kernels";
      const fa4::hopper::CaptureScratchStats after = fa4::hopper::capture_scratch_stats();
      if (capture == 0) {
        buffers = after.created + after.reused - before.created - before.reused;
        EXPECT_EQ(buffers, v.causal ? 1u : 2u) << v.knob << ": counter, or flags and partials";
      } else {
        EXPECT_EQ(after.reused, before.reused + buffers) << v.knob << ": buffers not reused";
      }
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int r = 0; r < 4; ++r) {
        v.p.poison(s);
        CUDA_OK(cudaGraphLaunch(exec, s));
        CUDA_OK(cudaStreamSynchronize(s));
        EXPECT_EQ(0, std::memcmp(want.data(), v.p.out_host().data(), want.size() * 2))
            << v.knob << " capture " << capture << " replay " << r;
      }
      // (free buffers other graphs gave back earlier are counted apart)
      const size_t free_before = fa4::hopper::capture_scratch_stats().free;
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      if (capture == 0) {  // CUDA gives the buffers back on a thread of its own, shortly after
        const size_t want_free = free_before + buffers;
        for (int wait = 0; wait < 1000 && (fa4::hopper::capture_scratch_stats().free) < want_free; ++wait)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ASSERT_GE(fa4::hopper::capture_scratch_stats().free, want_free) << v.knob << ": the destroyed graph kept its buffers";
      }
    }
  }
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(HopperFwd, CapturedScratchRetainedByFa4) {
  // With fa4 keeping a captured call's scratch (the default within kRetainedCaptureScratchBytes;
  // forced here), a captured stream-K forward takes two retained buffers (zeroed flags, partials)
  // and none owned by its graph (no user object: nothing for CUDA to track per replay). fa4 cannot
  // know when such a graph is destroyed, so it never hands its buffers to another capture: a second
  // capture takes two of its own, both graphs replay correctly in turn, and destroying the first
  // gives nothing back and leaves the second correct.
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(128, 128, fa4::test::kFwd);
  fa4::test::ScopedOverride fwd_kernel("small_q", "fwd");
  fa4::test::ScopedOverride stream_k("stream_k", "1");
  fa4::test::ScopedOverride owner("capture_scratch", "retained");
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Problem p = batched(1, 128, 3000, 16, 16, 128, 51);
  fa4::AttentionOptions o;
  p.poison(s);
  p.run(o, s);
  CUDA_OK(cudaStreamSynchronize(s));
  const auto want = p.out_host();
  ASSERT_FALSE(any_nan16(want));
  cudaGraph_t graph[2] = {nullptr, nullptr};
  cudaGraphExec_t exec[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    const fa4::hopper::CaptureScratchStats before = fa4::hopper::capture_scratch_stats();
    const fa4::test::Capture c = fa4::test::capture_graph(s, [&] { p.run(o, s); });
    ASSERT_EQ(c.thrown, "") << "capture " << i;
    CUDA_OK(c.ended);
    graph[i] = c.graph;
    const fa4::hopper::CaptureScratchStats after = fa4::hopper::capture_scratch_stats();
    EXPECT_EQ(after.retained - before.retained, 2u) << "flags and partials, capture " << i;
    EXPECT_GT(after.retained_bytes, before.retained_bytes) << "capture " << i;
    EXPECT_EQ(after.created + after.reused, before.created + before.reused) << "a graph-owned buffer, capture " << i;
    EXPECT_EQ(fa4::test::count_nodes(graph[i], cudaGraphNodeTypeKernel, true), 0) << "not only kernels, capture " << i;
    CUDA_OK(cudaGraphInstantiate(&exec[i], graph[i], 0));
  }
  auto replay = [&](int i, const char* when) {
    p.poison(s);
    CUDA_OK(cudaGraphLaunch(exec[i], s));
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_EQ(0, std::memcmp(want.data(), p.out_host().data(), want.size() * 2)) << "graph " << i << ", " << when;
  };
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 2; ++i) replay(i, "in turn");
  const size_t free_before = fa4::hopper::capture_scratch_stats().free;
  CUDA_OK(cudaGraphExecDestroy(exec[0]));
  CUDA_OK(cudaGraphDestroy(graph[0]));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (a graph-owned give-back would be done)
  EXPECT_EQ(fa4::hopper::capture_scratch_stats().free, free_before) << "retained buffers were given back";
  for (int r = 0; r < 2; ++r) replay(1, "after the first graph was destroyed");
  CUDA_OK(cudaGraphExecDestroy(exec[1]));
  CUDA_OK(cudaGraphDestroy(graph[1]));
  CUDA_OK(cudaStreamDestroy(s));
}

TEST(HopperFwd, CapturedCallsShareScratchPerStream) {
  // Three stream-K forwards (zeroed flags + unzeroed partials: two graph-owned buffers per call
  // alone) captured in one graph: on one stream they share the first call's two buffers (the
  // capture orders them); with the third on a forked stream, that one gets buffers of its own
  // (the fork runs beside the second call). Every replay gives each call's eager output bitwise.
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(128, 128, fa4::test::kFwd);  // the three problems below
  fa4::test::ScopedOverride fwd_kernel("small_q", "fwd");
  fa4::test::ScopedOverride stream_k("stream_k", "1");
  cudaStream_t s, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CUDA_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  Problem p[3] = {batched(1, 128, 3000, 16, 16, 128, 41), batched(1, 128, 3000, 16, 16, 128, 42),
                  batched(1, 128, 3000, 16, 16, 128, 43)};
  fa4::AttentionOptions o;
  std::vector<std::vector<uint16_t>> want;
  for (Problem& q : p) {
    q.poison(s);
    q.run(o, s);
    CUDA_OK(cudaStreamSynchronize(s));
    want.push_back(q.out_host());
    ASSERT_FALSE(any_nan16(want.back()));
  }
  ASSERT_NE(want[0], want[1]);  // distinct inputs: a replay writing one call's result twice fails
  for (const bool forked : {false, true}) {
    const fa4::hopper::CaptureScratchStats before = fa4::hopper::capture_scratch_stats();
    cudaGraphExec_t exec = nullptr;
    const fa4::test::Capture c = fa4::test::capture_graph(
        s, cudaStreamCaptureModeGlobal,
        [&] {
          p[0].run(o, s);
          if (forked) {  // p[2] on s2, beside p[1] on s
            CUDA_OK(cudaEventRecord(fork, s));
            CUDA_OK(cudaStreamWaitEvent(s2, fork, 0));
            p[2].run(o, s2);
            CUDA_OK(cudaEventRecord(join, s2));
            p[1].run(o, s);
            CUDA_OK(cudaStreamWaitEvent(s, join, 0));
          } else {
            p[1].run(o, s);
            p[2].run(o, s);
          }
        },
        [&] {  // s2 rejoined, or the capture cannot end
          if (forked) {
            cudaEventRecord(join, s2);
            cudaStreamWaitEvent(s, join, 0);
          }
        });
    cudaGraph_t graph = c.graph;
    ASSERT_EQ(c.thrown, "") << "forked " << forked;
    CUDA_OK(c.ended);
    const fa4::hopper::CaptureScratchStats after = fa4::hopper::capture_scratch_stats();
    EXPECT_EQ(captured_buffers(after) - captured_buffers(before), forked ? 4u : 2u) << "forked " << forked;
    EXPECT_EQ(after.shared - before.shared, forked ? 2u : 4u) << "forked " << forked;
    EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeKernel, true), 0) << "forked " << forked;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 4; ++r) {
      for (Problem& q : p) q.poison(s);
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      for (int i = 0; i < 3; ++i)
        EXPECT_EQ(0, std::memcmp(want[i].data(), p[i].out_host().data(), want[i].size() * 2))
            << "forked " << forked << " replay " << r << " call " << i;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  CUDA_OK(cudaStreamDestroy(s2));
  CUDA_OK(cudaStreamDestroy(s));
}

/// Runs varlen sequences (cu_q, cu_k, optional used) on a fresh poisoned output and returns it.
struct VarlenRun {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  std::string later_error;  // what the next call on the device reported ("" if nothing)
};
VarlenRun run_varlen(Problem& p, const std::vector<int>& cu_q, const std::vector<int>& cu_k,
                     const std::vector<int>& used, int max_q, int max_k) {
  VarlenRun r;
  int* d = nullptr;
  cudaMalloc(&d, (cu_q.size() + cu_k.size() + used.size() + 1) * sizeof(int));
  cudaMemcpy(d, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d + cu_q.size(), cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice);
  if (!used.empty()) cudaMemcpy(d + cu_q.size() + cu_k.size(), used.data(), used.size() * 4, cudaMemcpyHostToDevice);
  const auto dev = fa4::Device::cuda(0);
  fa4::AttentionOptions o;
  o.cu_seqlens_q = TensorView::contiguous(d, DType::kInt32, {int64_t(cu_q.size())}, dev);
  o.cu_seqlens_k = TensorView::contiguous(d + cu_q.size(), DType::kInt32, {int64_t(cu_k.size())}, dev);
  if (!used.empty())
    o.seqused_k = TensorView::contiguous(d + cu_q.size() + cu_k.size(), DType::kInt32, {int64_t(used.size())}, dev);
  o.max_seqlen_q = max_q;
  o.max_seqlen_k = max_k;
  p.poison(nullptr);
  p.run(o, nullptr);  // the call itself cannot know yet: it must not throw
  cudaDeviceSynchronize();
  r.out = p.out_host();
  r.lse = p.lse_host();
  try {
    fa4::check_async_errors(0);
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kInvalidArgument);
    r.later_error = e.what();
  }
  fa4::check_async_errors(0);  // reported once: cleared now
  cudaFree(d);
  return r;
}

TEST(HopperFwd, SanitizeBadVarlenIndices) {
  REQUIRE_HOPPER();
  const int H = 2, D = 64;
  REQUIRE_BUCKETS(D, D, fa4::test::kFwd);
  Problem p(400, 400, H, H, D, 0, 31);
  const int64_t row = int64_t(H) * D;
  // Sequence 0 alone (rows 0..99, keys 0..149) is the truth for its rows in every bad batch below.
  const VarlenRun alone = run_varlen(p, {0, 100}, {0, 150}, {}, 100, 150);
  ASSERT_EQ(alone.later_error, "");
  ASSERT_FALSE(any_nan16(std::vector<uint16_t>(alone.out.begin(), alone.out.begin() + 100 * row)));
  struct Bad {
    std::vector<int> cu_q, cu_k, used;
    int max_q, max_k;
    const char* names;  // the tensor the report must name
  };
  const Bad bad[] = {
      {{0, 100, 50}, {0, 150, 300}, {}, 300, 300, "cu_seqlens_q"},          // decreasing
      {{0, 100, 4000}, {0, 150, 300}, {}, 4000, 300, "cu_seqlens_q"},       // past total_q
      {{0, 100, 390}, {0, 150, 300}, {}, 200, 300, "cu_seqlens_q"},         // longer than max_seqlen_q
      {{0, 100, 200}, {0, 150, 1 << 30}, {}, 300, 1 << 30, "cu_seqlens_k"}, // past total_k
      {{0, 100, 200}, {0, 150, -5}, {}, 300, 300, "cu_seqlens_k"},          // negative
      {{0, 100, 200}, {0, 150, 300}, {150, 151}, 300, 300, "seqused_k"},    // used > length
      {{0, 100, 200}, {0, 150, 300}, {150, -1}, 300, 300, "seqused_k"},     // negative
      {{5, 100}, {0, 150}, {}, 300, 300, "cu_seqlens_q"},                    // [0] != 0: seq 0 skipped
      {{0, 100, 200}, {0, 150, 120}, {}, 300, 300, "cu_seqlens_k"},          // decreasing
  };
  for (const Bad& c : bad) {
    const VarlenRun r = run_varlen(p, c.cu_q, c.cu_k, c.used, c.max_q, c.max_k);
    EXPECT_NE(r.later_error.find(c.names), std::string::npos) << c.names << ": " << r.later_error;
    // Sequence 0 is computed as if alone, except where its own offsets are bad (cu_seqlens_q[0]
    // != 0): then its rows must keep the poison too.
    const int64_t first_skipped = c.cu_q[0] != 0 ? 0 : 100;
    if (first_skipped == 100) {
      EXPECT_EQ(0, std::memcmp(alone.out.data(), r.out.data(), 100 * row * 2)) << c.names << ": sequence 0 changed";
      for (int h = 0; h < H; ++h)
        EXPECT_EQ(0, std::memcmp(alone.lse.data() + size_t(h) * p.rows_q, r.lse.data() + size_t(h) * p.rows_q, 100 * 4))
            << c.names << ": lse of sequence 0, head " << h;
    }
    for (int64_t i = first_skipped * row; i < int64_t(r.out.size()); ++i)
      ASSERT_EQ(r.out[i], kPoison16) << c.names << ": a skipped sequence wrote out element " << i;
    for (int h = 0; h < H; ++h)  // lse is (H, rows): rows of skipped sequences keep the poison
      for (int64_t i = first_skipped; i < p.rows_q; ++i) {
        const float x = r.lse[size_t(h) * p.rows_q + i];
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        ASSERT_EQ(bits, 0xFFFFFFFFu) << c.names << ": a skipped sequence wrote lse (" << h << ", " << i << ")";
      }
  }
  // The report fails the next forward (which writes nothing), once.
  {
    int* d = nullptr;
    CUDA_OK(cudaMalloc(&d, 6 * sizeof(int)));
    const std::vector<int> idx = {0, 100, 50, 0, 150, 300};
    CUDA_OK(cudaMemcpy(d, idx.data(), 24, cudaMemcpyHostToDevice));
    fa4::AttentionOptions o;
    const auto dev = fa4::Device::cuda(0);
    o.cu_seqlens_q = TensorView::contiguous(d, DType::kInt32, {3}, dev);
    o.cu_seqlens_k = TensorView::contiguous(d + 3, DType::kInt32, {3}, dev);
    o.max_seqlen_q = o.max_seqlen_k = 300;
    p.run(o, nullptr);
    CUDA_OK(cudaDeviceSynchronize());
    p.poison(nullptr);
    EXPECT_THROW(p.run(o, nullptr), fa4::Error);
    CUDA_OK(cudaDeviceSynchronize());
    for (uint16_t x : p.out_host()) ASSERT_EQ(x, kPoison16) << "the reporting call wrote";
    fa4::check_async_errors(0);  // nothing left: the throw cleared it
    cudaFree(d);
  }
}

// A call on another device than the thread's gives the thread its device back where that device
// has a context (has_primary_context; restoring one without would create it, hundreds of MiB).
// Device 0's context exists here, so the driver must be asked and report it; with two Hopper
// GPUs, a fresh thread calling on device 1 computes there and is back on device 0 afterwards.
TEST(HopperFwd, CallOnAnotherDeviceGivesTheThreadItsDeviceBack) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(64, 64, fa4::test::kFwd);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  EXPECT_EQ(fa4::hopper::primary_context_state(0), std::optional<bool>(true));
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "one GPU: the call on a second device is not exercised";
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
  if (prop.major != 9) GTEST_SKIP() << "device 1 is no sm_90 GPU: the call on it is not exercised";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  Problem p = batched(1, 64, 128, 2, 2, 64, 11);
  p.poison(nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int during = -1, after = -1;
  std::string error;
  std::thread t([&] {
    cudaGetDevice(&during);  // a fresh thread: device 0, whose context exists
    try {
      p.run(fa4::AttentionOptions{}, nullptr);
    } catch (const std::exception& e) {
      error = e.what();
    }
    cudaGetDevice(&after);
  });
  t.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(during, 0);
  EXPECT_EQ(after, 0);
  EXPECT_EQ(fa4::hopper::primary_context_state(1), std::optional<bool>(true));
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_FALSE(any_nan16(p.out_host()));
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

/// The row limit (src/hopper/shared/launch_context.h kMaxRows = 2^31 - 512: the kernels add a
/// block's extent to int32 row and key indices): at the limit every direction's selector accepts,
/// one row past it each refuses and names the limit. The queries read no tensor memory, so the
/// views sit at far-apart addresses that are never dereferenced (no 32-GiB allocation).
TEST(HopperSelectors, RowLimitIsAClearErrorInEveryDirection) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(64, 64, fa4::test::kFwd | fa4::test::kBwd | fa4::test::kDecode);
  const auto dev = fa4::Device::cuda(0);
  int next = 0;  // each view gets its own 1-TiB slot of the address space
  auto view = [&](DType t, std::initializer_list<int64_t> shape) {
    void* at = reinterpret_cast<void*>((uintptr_t(1) << 44) + uintptr_t(next++) * (uintptr_t(1) << 40));
    return TensorView::contiguous(at, t, shape, dev);
  };
  for (int64_t rows : {fa4::hopper::kMaxRows, fa4::hopper::kMaxRows + 1}) {
    SCOPED_TRACE(rows);
    const bool fits = rows <= fa4::hopper::kMaxRows;
    auto expect = [&](const std::string& why, const char* direction) {
      if (fits)
        EXPECT_EQ(why, "") << direction;
      else
        EXPECT_NE(why.find("2^31 - 512"), std::string::npos) << direction << ": " << why;
    };
    next = 0;
    const TensorView q = view(DType::kBF16, {1, rows, 1, 64}), k = view(DType::kBF16, {1, rows, 1, 64}),
                     v = view(DType::kBF16, {1, rows, 1, 64}), out = view(DType::kBF16, {1, rows, 1, 64}),
                     lse = view(DType::kFP32, {1, 1, rows});
    fa4::AttentionOptions fo;
    fo.backend = fa4::Backend::kCuda;
    fo.causal = true;
    expect(fa4::forward_support(q, k, v, out, lse, fo), "forward");
    // A short query block against the long keys: the key count alone is over the limit.
    const TensorView q1 = view(DType::kBF16, {1, 128, 1, 64}), out1 = view(DType::kBF16, {1, 128, 1, 64}),
                     lse1 = view(DType::kFP32, {1, 1, 128});
    expect(fa4::forward_support(q1, k, v, out1, lse1, fo), "forward, long keys");

    fa4::BackwardOptions bo;
    bo.backend = fa4::Backend::kCuda;
    bo.causal = true;
    const TensorView dout = view(DType::kBF16, {1, rows, 1, 64}), dq = view(DType::kBF16, {1, rows, 1, 64}),
                     dk = view(DType::kBF16, {1, rows, 1, 64}), dv = view(DType::kBF16, {1, rows, 1, 64});
    std::string bwd_why;
    try {
      EXPECT_GT(fa4::backward_workspace_size(dout, q, k, v, out, lse, dq, dk, dv, bo), 0u);
    } catch (const fa4::Error& e) {
      EXPECT_EQ(e.code(), fa4::ErrorCode::kUnsupported) << e.what();
      bwd_why = e.what();
    }
    expect(bwd_why, "backward");

    fa4::KVCacheOptions ko;
    ko.backend = fa4::Backend::kCuda;
    const TensorView qd = view(DType::kBF16, {1, 1, 8, 64}), outd = view(DType::kBF16, {1, 1, 8, 64}),
                     lsed = view(DType::kFP32, {1, 8, 1});
    expect(fa4::forward_with_kvcache_support(qd, k, v, outd, lsed, ko), "decode");
  }
}

}  // namespace
