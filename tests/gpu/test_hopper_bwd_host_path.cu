// tests/gpu/test_hopper_bwd_host_path.cu — the backward's host path (src/hopper/shared/device_state.h,
// src/hopper/bwd/launch_bwd.cuh):
//   * a backward captures into a CUDA graph and replays to the eager result, its workspace set
//     aside at capture (or graph memory past kGraphOwnedScratchMaxBytes);
//   * release_cached_memory frees what eager calls keep, and later calls give the same bits;
//   * a caller's workspace (BackwardOptions::workspace, sized by backward_workspace_size) replaces
//     fa4's scratch: same bits, no graph-memory nodes when captured, and one byte too few is a
//     clear error before anything is written.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/float16.h"
#include "fa4/attention.h"
#include "hopper/shared/device_state.h"

#include "gpu_test_util.cuh"
#include "host_path_problem.cuh"

namespace {

using fa4::DType;
using fa4::TensorView;
using fa4::test::any_nan16;
using fa4::test::batched;
using fa4::test::captured_buffers;
using Problem = fa4::test::HostPathProblem;

/// A backward captured into a CUDA graph (the preprocess, main kernel and postprocess kernel nodes;
/// deterministic mode's cooperative main kernel too) replays to the eager result: dK/dV bitwise in
/// both modes (registers, fixed order), dq bitwise in deterministic mode and within a bf16 rounding
/// of the reduce-add order otherwise. GQA, causal, tails. The postprocess follows the main kernel
/// by programmatic dependent launch (a programmatic graph edge). A workspace up to
/// kGraphOwnedScratchMaxBytes belongs to the graph (kernel nodes alone); a larger one is graph
/// memory (an allocation and a free node).
TEST(HopperBwd, GraphReplayMatchesEager) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(128, 128, fa4::test::kFwd | fa4::test::kBwd);  // both problems below
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // dQ accumulator 2 x 704 x 8 x 128 fp32 (5.8 MB), then 1 x 2112 x 16 x 128 (17.3 MB: > 16 MiB).
  Problem small = batched(2, 700, 900, 8, 2, 128, 31), large = batched(1, 2100, 1000, 16, 4, 128, 33);
  for (Problem* pp : {&small, &large}) {
    Problem& p = *pp;
    const bool graph_memory = pp == &large;
    SCOPED_TRACE(graph_memory ? "17 MB workspace" : "6 MB workspace");
    fa4::AttentionOptions fo;
    fo.causal = true;
    p.run(fo, s);
    CUDA_OK(cudaStreamSynchronize(s));
    const int64_t nq = p.rows_q * p.H * p.d, nk = p.rows_k * p.HK * p.d;
    fa4::test::DevBuf<uint16_t> dout{size_t(nq)}, dq{size_t(nq)}, dk{size_t(nk)}, dv{size_t(nk)};
    ASSERT_TRUE(dout.ptr && dq.ptr && dk.ptr && dv.ptr) << "cudaMalloc of dout / dq / dk / dv";
    auto random_dout = [&](fa4::test::DevBuf<uint16_t>& b, uint32_t seed) {
      std::mt19937 rng(seed);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<uint16_t> h(static_cast<size_t>(nq));
      for (auto& x : h) x = fa4::detail::float_to_bf16(nd(rng));
      b.upload(h);
    };
    random_dout(dout, 32);
    const auto dev = fa4::Device::cuda(0, s);
    auto q_like = [&](void* x) { return TensorView::contiguous(x, DType::kBF16, {p.batch, p.seqlen_q, p.H, p.d}, dev); };
    auto k_like = [&](void* x) { return TensorView::contiguous(x, DType::kBF16, {p.batch, p.seqlen_k, p.HK, p.d}, dev); };
    // One backward from `go` into gq / gk / gv, poisoned first.
    auto backward_into = [&](const fa4::BackwardOptions& o, void* go, void* gq, void* gk, void* gv) {
      cudaMemsetAsync(gq, 0xFF, nq * 2, s);
      cudaMemsetAsync(gk, 0xFF, nk * 2, s);
      cudaMemsetAsync(gv, 0xFF, nk * 2, s);
      fa4::backward(q_like(go), q_like(p.q), k_like(p.k), k_like(p.v), q_like(p.out),
                    TensorView::contiguous(p.lse, DType::kFP32, {p.batch, p.H, p.seqlen_q}, dev), q_like(gq),
                    k_like(gk), k_like(gv), o);
    };
    auto backward = [&](const fa4::BackwardOptions& o) { backward_into(o, dout.ptr, dq.ptr, dk.ptr, dv.ptr); };
    for (bool det : {false, true}) {
      fa4::BackwardOptions o;
      o.causal = true;
      o.deterministic = det;
      backward(o);
      CUDA_OK(cudaStreamSynchronize(s));
      const auto want_q = dq.download(), want_k = dk.download(), want_v = dv.download();
      ASSERT_FALSE(any_nan16(want_q) || any_nan16(want_k) || any_nan16(want_v)) << "eager, deterministic " << det;

      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      backward(o);
      CUDA_OK(cudaStreamEndCapture(s, &graph));
      EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeKernel), 3)
          << "preprocess, main kernel and postprocess; deterministic " << det;
      EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeMemAlloc), graph_memory ? 1 : 0)
          << "workspace in graph memory only above kGraphOwnedScratchMaxBytes; deterministic " << det;
      EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeMemFree), graph_memory ? 1 : 0) << "deterministic " << det;
      EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeKernel, /*other=*/true), 3 + (graph_memory ? 2 : 0))
          << "nodes besides the kernels: this test's three poisoning memsets, and the graph memory's "
             "allocation and free; deterministic " << det;
      // The postprocess is the main kernel's programmatic dependent.
      EXPECT_EQ(fa4::test::count_programmatic_edges(graph), 1) << "deterministic " << det;
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int r = 0; r < 3; ++r) {
        CUDA_OK(cudaGraphLaunch(exec, s));
        CUDA_OK(cudaStreamSynchronize(s));
        EXPECT_TRUE(dk.download() == want_k && dv.download() == want_v) << "dk/dv, deterministic " << det << " replay " << r;
        const auto got_q = dq.download();
        if (det) {
          EXPECT_TRUE(got_q == want_q) << "dq, replay " << r;
        } else {
          ASSERT_FALSE(any_nan16(got_q)) << "replay " << r;
          for (int64_t i = 0; i < nq; ++i) {
            const float a = fa4::detail::bf16_to_float(want_q[size_t(i)]), b = fa4::detail::bf16_to_float(got_q[size_t(i)]);
            ASSERT_LE(std::fabs(a - b), 0x1p-6f * std::fabs(a) + 1e-3f) << "dq[" << i << "], replay " << r;
          }
        }
      }
      CUDA_OK(cudaGraphExecDestroy(exec));
      CUDA_OK(cudaGraphDestroy(graph));
    }
    if (graph_memory) continue;
    // Two deterministic backwards captured on one stream (as two layers' would be), with different
    // dout into their own gradients: the second shares the first's graph-owned workspace, which
    // its preprocess must re-zero (the capture orders it after the first's postprocess; a dQ
    // accumulator or semaphore left over from the first call would change its dq or hang it), and
    // every replay gives both calls' eager gradients bitwise.
    fa4::test::DevBuf<uint16_t> dout2{size_t(nq)}, dq2{size_t(nq)}, dk2{size_t(nk)}, dv2{size_t(nk)};
    ASSERT_TRUE(dout2.ptr && dq2.ptr && dk2.ptr && dv2.ptr) << "cudaMalloc of the second call's buffers";
    random_dout(dout2, 34);
    auto backward2 = [&](const fa4::BackwardOptions& o) { backward_into(o, dout2.ptr, dq2.ptr, dk2.ptr, dv2.ptr); };
    fa4::BackwardOptions o;
    o.causal = true;
    o.deterministic = true;
    backward(o);
    backward2(o);
    CUDA_OK(cudaStreamSynchronize(s));
    const auto want_q = dq.download(), want_k = dk.download(), want_v = dv.download();
    const auto want_q2 = dq2.download(), want_k2 = dk2.download(), want_v2 = dv2.download();
    ASSERT_FALSE(any_nan16(want_q2) || any_nan16(want_k2) || any_nan16(want_v2)) << "eager, second call";
    ASSERT_NE(want_q, want_q2);  // distinct douts: a replay giving one call's dq twice fails
    const fa4::hopper::CaptureScratchStats before = fa4::hopper::capture_scratch_stats();
    cudaGraphExec_t exec = nullptr;
    const fa4::test::Capture c = fa4::test::capture_graph(s, [&] {
      backward(o);
      backward2(o);
    });
    cudaGraph_t graph = c.graph;
    ASSERT_EQ(c.thrown, "");
    CUDA_OK(c.ended);
    const fa4::hopper::CaptureScratchStats after = fa4::hopper::capture_scratch_stats();
    EXPECT_EQ(captured_buffers(after) - captured_buffers(before), 1u) << "one workspace for both calls";
    EXPECT_EQ(after.shared - before.shared, 1u);
    EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeKernel), 6);
    EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeKernel, /*other=*/true), 6) << "the poisoning memsets only";
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; ++r) {
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      EXPECT_TRUE(dq.download() == want_q && dk.download() == want_k && dv.download() == want_v)
          << "first captured call, replay " << r;
      EXPECT_TRUE(dq2.download() == want_q2 && dk2.download() == want_k2 && dv2.download() == want_v2)
          << "second captured call, replay " << r;
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }
  CUDA_OK(cudaStreamDestroy(s));
}

/// A backward of p on stream s: dO (q's values: any finite dO), the gradient buffers and the
/// views of the call.
struct BwdCall {
  Problem& p;
  int64_t nq, nk;
  fa4::test::DevBuf<uint16_t> dout, dq, dk, dv;
  fa4::Device dev;
  cudaStream_t s;
  BwdCall(Problem& problem, cudaStream_t stream)
      : p(problem), nq(p.rows_q * p.H * p.d), nk(p.rows_k * p.HK * p.d), dout{size_t(nq)}, dq{size_t(nq)},
        dk{size_t(nk)}, dv{size_t(nk)}, dev(fa4::Device::cuda(0, stream)), s(stream) {
    if (dout.ptr) cudaMemcpy(dout.ptr, p.q, size_t(nq) * 2, cudaMemcpyDeviceToDevice);
  }
  bool allocated() const { return dout.ptr && dq.ptr && dk.ptr && dv.ptr; }
  TensorView q_like(void* x) const {
    return TensorView::contiguous(x, DType::kBF16, {p.batch, p.seqlen_q, p.H, p.d}, dev);
  }
  TensorView k_like(void* x) const {
    return TensorView::contiguous(x, DType::kBF16, {p.batch, p.seqlen_k, p.HK, p.d}, dev);
  }
  TensorView lse() const { return TensorView::contiguous(p.lse, DType::kFP32, {p.batch, p.H, p.seqlen_q}, dev); }
  void poison_grads() {
    for (auto* g : {&dq, &dk, &dv}) cudaMemsetAsync(g->ptr, 0xFF, g->n * 2, s);
  }
  void backward(const fa4::BackwardOptions& o) {
    fa4::backward(q_like(dout.ptr), q_like(p.q), k_like(p.k), k_like(p.v), q_like(p.out), lse(), q_like(dq.ptr),
                  k_like(dk.ptr), k_like(dv.ptr), o);
  }
  size_t workspace_size(const fa4::BackwardOptions& o) {
    return fa4::backward_workspace_size(q_like(dout.ptr), q_like(p.q), k_like(p.k), k_like(p.v), q_like(p.out),
                                        lse(), q_like(dq.ptr), k_like(dk.ptr), k_like(dv.ptr), o);
  }
};

// release_cached_memory frees what eager calls keep (device_state.h): the stream's cached claim
// counter of a dynamic-schedule forward and the pool's backward workspace (17 MB, above
// kEagerCachedMaxBytes); the calls after it allocate again (the counter zeroed anew) and give the
// same bits.
TEST(HopperBwd, ReleaseCachedMemory) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(128, 128, fa4::test::kFwd | fa4::test::kBwd);
  fa4::test::ScopedOverride dynamic("schedule", "dynamic");  // 17 x 16 causal tiles > SMs
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Problem p = batched(1, 2100, 1000, 16, 4, 128, 41);
  BwdCall c(p, s);
  ASSERT_TRUE(c.allocated()) << "cudaMalloc of dout / dq / dk / dv";
  struct Result {
    std::vector<uint16_t> out, dq, dk, dv;
  };
  auto run = [&]() {
    fa4::BackwardOptions o;
    o.causal = true;
    o.deterministic = true;
    p.poison(s);
    p.run(o, s);
    c.poison_grads();
    c.backward(o);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return Result{p.out_host(), c.dq.download(), c.dk.download(), c.dv.download()};
  };
  const Result first = run();
  for (const auto* v : {&first.out, &first.dq, &first.dk, &first.dv}) ASSERT_FALSE(any_nan16(*v));
  const fa4::hopper::EagerScratchStats kept = fa4::hopper::eager_scratch_stats(0);
  EXPECT_GE(kept.cached, 1u) << "the forward's claim counter, cached for the stream";
  EXPECT_EQ(kept.held, 0u) << "every call released its scratch";
  EXPECT_GE(kept.pool_reserved_bytes, size_t(16) << 20) << "the backward's workspace, kept by the pool";
  EXPECT_EQ(kept.pool_used_bytes, 0u) << "given back to the pool after the backward";

  fa4::release_cached_memory(0);
  const fa4::hopper::EagerScratchStats after = fa4::hopper::eager_scratch_stats(0);
  EXPECT_EQ(after.cached, 0u);
  EXPECT_EQ(after.cached_bytes, 0u);
  EXPECT_EQ(after.pool_reserved_bytes, 0u);

  const Result second = run();
  EXPECT_TRUE(second.out == first.out) << "out after the release";
  EXPECT_TRUE(second.dq == first.dq && second.dk == first.dk && second.dv == first.dv)
      << "deterministic gradients after the release";
  EXPECT_GE(fa4::hopper::eager_scratch_stats(0).cached, 1u) << "allocated again";
  CUDA_OK(cudaStreamDestroy(s));
}


// A caller's workspace (BackwardOptions::workspace) instead of fa4's scratch: the size
// backward_workspace_size reports is what the launch needs (a buffer one byte short is refused
// before anything is written), the gradients are bitwise those of the call without it
// (deterministic), and a captured call with it holds its kernels and no graph-memory nodes.
TEST(HopperBwd, CallerWorkspace) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(128, 128, fa4::test::kFwd | fa4::test::kBwd);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // 2 x 33 key blocks x 16 KV heads: more tiles than SMs, so the causal layout has the dynamic
  // schedule's claim counter too.
  Problem p = batched(2, 2100, 4200, 16, 16, 128, 43);
  BwdCall c(p, s);
  ASSERT_TRUE(c.allocated()) << "cudaMalloc of dout / dq / dk / dv";
  auto& dq = c.dq;
  auto& dk = c.dk;
  auto& dv = c.dv;
  const fa4::Device dev = c.dev;
  fa4::BackwardOptions o;
  o.causal = true;
  o.deterministic = true;
  p.run(o, s);
  auto poison = [&] { c.poison_grads(); };
  auto backward = [&](const fa4::BackwardOptions& bo) { c.backward(bo); };
  poison();
  backward(o);
  CUDA_OK(cudaStreamSynchronize(s));
  const auto want_q = dq.download(), want_k = dk.download(), want_v = dv.download();
  ASSERT_FALSE(any_nan16(want_q) || any_nan16(want_k) || any_nan16(want_v));

  const size_t bytes = c.workspace_size(o);
  // dQ accumulator alone: 16 heads x 2 x 33 chunks of 64 rows x 128 columns, fp32.
  ASSERT_GE(bytes, size_t(16) * 66 * 64 * 128 * 4);
  fa4::test::DevBuf<uint8_t> ws{bytes};
  ASSERT_TRUE(ws.ptr) << "cudaMalloc of the workspace";
  CUDA_OK(cudaMemset(ws.ptr, 0xFF, bytes));  // its contents need not be anything
  fa4::BackwardOptions with = o;

  // (A 1-byte dtype, so the view can be exactly one byte short.)
  with.workspace = TensorView::contiguous(ws.ptr, DType::kFP8E4M3, {int64_t(bytes) - 1}, dev);
  poison();
  try {
    backward(with);
    ADD_FAILURE() << "a workspace one byte short was accepted";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(bytes)), std::string::npos) << e.what();
  }
  CUDA_OK(cudaStreamSynchronize(s));
  for (const auto& g : {dq.download(), dk.download(), dv.download()})
    for (uint16_t x : g) ASSERT_EQ(x, 0xFFFF) << "written before the error";

  with.workspace = TensorView::contiguous(ws.ptr, DType::kInt32, {int64_t(bytes) / 4}, dev);
  const fa4::hopper::EagerScratchStats before = fa4::hopper::eager_scratch_stats(0);
  for (int r = 0; r < 2; ++r) {
    poison();
    backward(with);
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(dq.download() == want_q && dk.download() == want_k && dv.download() == want_v) << "run " << r;
  }
  const fa4::hopper::EagerScratchStats after = fa4::hopper::eager_scratch_stats(0);
  EXPECT_EQ(after.pool_reserved_bytes, before.pool_reserved_bytes) << "fa4's pool was not used";
  EXPECT_EQ(after.cached_bytes, before.cached_bytes) << "nor its per-stream cache";

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  poison();
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  backward(with);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeKernel), 3);
  EXPECT_EQ(fa4::test::count_nodes(graph, cudaGraphNodeTypeMemAlloc), 0) << "the caller's workspace, not graph memory";
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_TRUE(dq.download() == want_q && dk.download() == want_k && dv.download() == want_v) << "replay";
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
