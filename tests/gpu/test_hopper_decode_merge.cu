// tests/gpu/test_hopper_decode_merge.cu — the Hopper decode's split merges (thread-block clusters
// against the global merge), CUDA-graph replays, its two row tiles, the exp2 option's refusal and
// the sanitizer subset (--gtest_filter='HopperDecode.Sanitize*'); each case and its checks:
// decode_case.cuh.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "gpu/decode_case.cuh"
#include "test_util.h"

namespace {

TEST(HopperDecode, GraphReplayFollowsCacheSeqlens) {
  REQUIRE_HOPPER();
  KvCase c;
  REQUIRE_BUCKETS(c.d, c.dv, fa4::test::kDecode);
  c.batch = 2;
  c.page_size = 16;
  c.capacity = 1024;
  c.cache_seqlens = {1000, 50};
  c.full_page_table = true;  // the replay changes the lengths
  // 6 splits, clusters forced: clusters of 2 merge in shared memory, the 3 cluster partials
  // through global scratch, whose arrival counters every replay must leave reset.
  c.num_splits = 6;
  const fa4::test::ScopedOverride cluster("decode_cluster", "1");
  c.seed = 800;
  // Two problems of one shape with different inputs: captured alone, then one after the other on
  // one stream, where the second shares the first's captured partials and arrival counters (the
  // capture orders the calls as the stream would; counters the first left set would make the
  // second merge the first's partials).
  KvProblem P[2];
  std::vector<uint16_t> eager[2][2];  // [problem][lengths]
  std::vector<float> lse[2][2];
  const std::vector<int> other{37, 1020};
  for (int i = 0; i < 2; ++i) {
    KvCase ci = c;
    ci.seed = 800 + i;
    build(P[i], ci);
    if (::testing::Test::HasFatalFailure()) return;
    run_fa4(P[i], eager[i][0], lse[i][0]);
    P[i].d_cl->upload(other);
    run_fa4(P[i], eager[i][1], lse[i][1]);
    P[i].d_cl->upload(c.cache_seqlens);
  }
  ASSERT_NO_THROW(fa4::check_async_errors(0));
  ASSERT_NE(eager[0][0], eager[1][0]);  // a replay giving one call's rows twice fails

  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Both owners of captured scratch: fa4 (retained, the default within its budget) and the graph
  // (a CUDA user object).
  for (const bool retained : {true, false})
  for (const int calls : {1, 2}) {
    SCOPED_TRACE(std::string(calls == 1 ? "one captured call" : "two captured calls") +
                 (retained ? ", retained scratch" : ", graph-owned scratch"));
    const fa4::test::ScopedOverride owner("capture_scratch", retained ? "retained" : "graph");
    const fa4::hopper::CaptureScratchStats before = fa4::hopper::capture_scratch_stats();
    std::string thrown;
    cudaGraph_t g = capture_calls(calls == 1 ? std::vector<KvProblem*>{&P[0]} : std::vector<KvProblem*>{&P[0], &P[1]}, s, &thrown);
    cudaGraphExec_t ge;
    ASSERT_EQ(thrown, "");
    const fa4::hopper::CaptureScratchStats after = fa4::hopper::capture_scratch_stats();
    EXPECT_EQ(after.retained - before.retained, retained ? 2u : 0u) << "partials and arrival counters, retained";
    EXPECT_EQ(after.created + after.reused - before.created - before.reused, retained ? 0u : 2u)
        << "partials and arrival counters, graph-owned";
    EXPECT_EQ(after.shared - before.shared, calls == 2 ? 2u : 0u);
    // The split partials and their arrival counters are captured scratch, retained or owned by the
    // graph: the kernels alone (no memset, no graph-memory allocation and free).
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel), calls);
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel, /*other=*/true), 0)
        << "the captured call added nodes besides its kernels";
    CUDA_OK(cudaGraphInstantiate(&ge, g, 0));
    for (int round = 0; round < 2; ++round) {  // the replay follows the lengths
      for (int i = 0; i < calls; ++i) {
        P[i].d_cl->upload(round ? other : c.cache_seqlens);
        CUDA_OK(cudaMemsetAsync(P[i].out->ptr, 0xFF, P[i].out->n * 2, s));
        CUDA_OK(cudaMemsetAsync(P[i].lse->ptr, 0xFF, P[i].lse->n * 4, s));
      }
      CUDA_OK(cudaGraphLaunch(ge, s));
      CUDA_OK(cudaStreamSynchronize(s));
      for (int i = 0; i < calls; ++i) {
        EXPECT_TRUE(P[i].out->download() == eager[i][round]) << "call " << i << ", replay " << round;
        EXPECT_EQ(0, std::memcmp(P[i].lse->download().data(), lse[i][round].data(), lse[i][round].size() * 4))
            << "call " << i << ", replay " << round;
      }
    }
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  }
  cudaStreamDestroy(s);
}

// A serving engine's decode loop: one captured call that appends a token to a paged cache and
// attends over it, replayed step after step with new q, k_new, v_new and cache_seqlens advanced by
// one (a sequence starting empty among them). Every replay's out, lse and cache equal, bitwise, an
// eager call on an identical problem given the same inputs; one split and automatic splits, causal.
TEST(HopperDecode, GraphReplayOfADecodeLoopWithAppend) {
  REQUIRE_HOPPER();
  KvCase c;
  REQUIRE_BUCKETS(c.d, c.dv, fa4::test::kDecode);
  c.batch = 3;
  c.page_size = 16;
  c.capacity = 512;
  c.cache_seqlens = {300, 17, 0};
  c.seqlen_new = 1;
  c.full_page_table = true;  // the lengths grow past the pages a sequence uses at build time
  c.causal = true;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  for (int splits : {1, 0}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    c.num_splits = splits;
    c.seed = 850 + splits;
    graph_loop_matches_eager(c, s, 6);
  }
  cudaStreamDestroy(s);
}

// The splits of a tile that form one thread-block cluster merge through distributed shared memory,
// in split order: bitwise the result of the global merge (override decode_cluster = 0) for split
// counts one cluster of the portable size holds whole (2, 4, 8; clusters forced: decode_cluster =
// 1). With 16 (one cluster of 16 where the device schedules it, else two of 8 and a global merge of
// their partials), 24, 64 and 112 (clusters of 8 and 16, then the global merge; at 64 the
// automatic rule picks clusters itself, 256 KB of partials per tile; at 112, two waves, it does
// not), and with the global merge alone, each within the accuracy rule (run_case). A call whose splits form one cluster of 8
// per tile needs no scratch: captured, it is one kernel node (this also proves the clusters were
// used).
TEST(HopperDecode, ClusterMergeMatchesTheGlobalMerge) {
  REQUIRE_HOPPER();
  for (int splits : {2, 4, 8, 16, 24, 64, 112}) {
    KvCase c;
    c.batch = 2;
    c.heads = 16;
    c.heads_kv = 2;       // group 8: 8 live rows of the 16-row tile
    c.capacity = 64 * 70;  // 70 blocks: uneven shares, and empty splits at 64
    c.cache_seqlens = {64 * 70, 1000};
    c.page_size = splits == 8 ? 16 : 0;
    c.sink = splits == 4;
    c.num_splits = splits;
    c.seed = 900 + splits;
    if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;  // the calls below too
    run_case(c);
    for (const char* mode : {"0", "1"}) {
      const fa4::test::ScopedOverride merge("decode_cluster", mode);
      run_case(c);
    }
    if (splits > 8) continue;
    KvProblem P;
    build(P, c);
    std::vector<uint16_t> out_cluster, out_global;
    std::vector<float> lse_cluster, lse_global;
    {  // (each override scope ends at "auto", so the two must not nest)
      const fa4::test::ScopedOverride cluster("decode_cluster", "1");
      run_fa4(P, out_cluster, lse_cluster);
    }
    {
      const fa4::test::ScopedOverride global("decode_cluster", "0");
      run_fa4(P, out_global, lse_global);
    }
    EXPECT_TRUE(out_cluster == out_global) << c.name() << ": the cluster merge differs from the global merge";
    EXPECT_EQ(0, std::memcmp(lse_cluster.data(), lse_global.data(), lse_global.size() * 4)) << c.name();
    if (splits != 8) continue;
    const fa4::test::ScopedOverride cluster("decode_cluster", "1");
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::string thrown;
    cudaGraph_t g = capture_call(P, s, &thrown);
    ASSERT_EQ(thrown, "");
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel), 1);
    EXPECT_EQ(fa4::test::count_nodes(g, cudaGraphNodeTypeKernel, /*other=*/true), 0)
        << "a captured decode whose splits form one cluster added non-kernel nodes";
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  }
}

// The wide row tile (64 rows, one warp per 16 over all keys of a block) and the narrow one (16
// rows, one warp per 16 keys), each forced onto the same inputs and checked against the reference:
// 1 to 132 rows per KV head (one live row, partial tiles, several tiles), causal with masked rows
// (the second sequence has fewer keys than queries), a window, softcap, sink, appended keys, pages
// of 16, 3 and automatic splits, the cluster merge (16 splits), fp16, d128 / d64 / d80 (padded).
TEST(HopperDecode, WideAndNarrowTilesOverTheOptions) {
  REQUIRE_HOPPER();
  const int shapes[][3] = {{1, 8, 8}, {5, 16, 2}, {16, 8, 2}, {33, 8, 2}, {66, 2, 1}};  // seqlen_q, heads, heads_kv
  // (132 rows per KV head would take the forward kernel on a dense cache: kept on this one.)
  const fa4::test::ScopedOverride decode("small_q", "decode");
  for (const auto& sh : shapes)
    for (const char* tile : {"64", "16"}) {
      const fa4::test::ScopedOverride forced("decode_tile", tile);
      KvCase c;
      c.seqlen_q = sh[0];
      c.heads = sh[1];
      c.heads_kv = sh[2];
      c.capacity = 700;
      c.cache_seqlens = {690, 40};
      c.causal = true;
      c.seed = 1000 + sh[0] * 7 + sh[1];
      if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;
      run_case(c);
      c.causal = false;
      c.window_left = 50;
      c.window_right = 0;
      c.softcap = 20.f;
      c.sink = true;
      c.seqlen_new = 3;
      c.page_size = 16;
      c.num_splits = 3;
      run_case(c);
      c.dtype = DType::kFP16;
      c.d = c.dv = 64;
      c.page_size = c.num_splits = 0;
      if (!fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) run_case(c);
      c.dtype = DType::kBF16;
      c.d = c.dv = 80;
      c.num_splits = 16;
      const fa4::test::ScopedOverride cluster("decode_cluster", "1");
      if (!fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) run_case(c);
    }
}

// The narrow tile's 8-warp form (128-key blocks, warp w takes keys 16w..; launch_decode.h
// decode_eight_warps) forced over the options: a partial last block and a sequence shorter than one
// block, one to 66 rows per KV head (one and several row tiles), causal with masked rows, a window,
// softcap, sink, appended keys, pages of 16 and of 3, explicit splits (more than the blocks: empty
// splits), the cluster merge and the global merge of several clusters, fp16, d64 and d80 (padded).
TEST(HopperDecode, EightWarpTileOverTheOptions) {
  REQUIRE_HOPPER();
  const fa4::test::ScopedOverride narrow("decode_tile", "16");
  const fa4::test::ScopedOverride eight("decode_warps", "8");
  const fa4::test::ScopedOverride decode("small_q", "decode");  // (132 rows on a dense cache)
  const int shapes[][3] = {{1, 8, 1}, {1, 32, 8}, {5, 16, 2}, {66, 2, 1}};  // seqlen_q, heads, heads_kv
  for (const auto& sh : shapes) {
    KvCase c;
    c.seqlen_q = sh[0];
    c.heads = sh[1];
    c.heads_kv = sh[2];
    c.capacity = 1000;
    c.cache_seqlens = {990, 40};
    c.causal = true;
    c.nan_past_keys = true;
    c.seed = 1200 + sh[0] * 7 + sh[1];
    if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;
    run_case(c);
    c.num_splits = 5;
    run_case(c);
    c.causal = false;
    c.window_left = 300;
    c.window_right = 0;
    c.softcap = 20.f;
    c.sink = true;
    c.seqlen_new = 3;
    c.nan_past_keys = false;
    for (int ps : {16, 3}) {
      c.page_size = ps;
      c.num_splits = ps == 16 ? 3 : 12;
      run_case(c);
    }
    c.window_left = c.window_right = -1;
    c.softcap = 0.f;
    c.sink = false;
    c.seqlen_new = 0;
    c.page_size = 0;
    c.dtype = DType::kFP16;
    c.d = c.dv = 64;
    c.num_splits = 0;
    if (!fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) run_case(c);
    c.dtype = DType::kBF16;
    c.d = c.dv = 80;
    const fa4::test::ScopedOverride cluster("decode_cluster", "1");
    for (int splits : {8, 32}) {  // one cluster per tile; several clusters, then the global merge
      c.num_splits = splits;
      if (!fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) run_case(c);
    }
  }
}

TEST(HopperDecode, ExplicitExp2EmulationIsAClearError) {
  REQUIRE_HOPPER();
  KvCase c;
  REQUIRE_BUCKETS(c.d, c.dv, fa4::test::kDecode);  // without it the answer is "not compiled"
  KvProblem P;
  build(P, c);
  P.o.exp2_emulation_fraction = 0.5f;
  try {
    fa4::forward_with_kvcache(P.tq, P.tk, P.tv, P.tout, P.tlse, P.o);
    ADD_FAILURE() << "exp2_emulation_fraction was ignored";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("exp2_emulation_fraction"), std::string::npos) << e.what();
  }
}

TEST(HopperDecode, SanitizeSmall) {
  REQUIRE_HOPPER();
  // Page 7, and page 16 (a power of two, several pages per 64-key block), the sequences ending
  // inside a page (132 and 5 keys after the append).
  for (int ps : {7, 16}) {
    KvCase c;
    c.batch = 2;
    c.seqlen_q = 2;
    c.page_size = ps;
    c.capacity = 150;
    c.cache_seqlens = {130, 3};
    c.seqlen_new = 2;
    c.causal = true;
    const fa4::test::ScopedOverride cluster("decode_cluster", "1");  // wherever the launch fits
    for (int splits : {3, 4, 6}) {  // the global merge, one cluster per tile, clusters of 2 + global
      c.num_splits = splits;
      run_case(c);
    }
    c.bad_page_b = 0;
    for (int splits : {1, 4, 6}) {  // 6: a flagged cluster of 2 then arrives at the global merge
      c.num_splits = splits;
      run_case(c);
    }
    // The wide row tile: global merge, one cluster per tile, and the flagged cluster again.
    const fa4::test::ScopedOverride wide("decode_tile", "64");
    for (int splits : {3, 4, 6}) {
      c.bad_page_b = splits == 6 ? 0 : -1;
      c.num_splits = splits;
      run_case(c);
    }
  }
}

}  // namespace
