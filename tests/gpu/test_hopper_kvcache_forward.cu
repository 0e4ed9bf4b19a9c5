// tests/gpu/test_hopper_kvcache_forward.cu — KV-cache calls that the selector runs on the forward
// kernel (hopper_api.cu kvcache_on_forward: the cache read in place, dense or paged with pages of
// whole key blocks or, on a bucket with a gathering kernel and from its gather_min_seqlen_q query
// tokens, of a power of two from 8 rows; more than 128 query rows per KV head: chunked prefill,
// except the decode kernel's one-split calls, hopper_api.cu decode_one_split_wins): the route (the
// kernel's name) and decode_case.cuh's checks on the forward kernel — the append (bitwise), out /
// lse against the reference, rows that see no key, stale cache rows past a sequence's keys holding
// NaN, broken cache_seqlens or page-table entries skipping the sequence — with its stream-K split
// automatic, forced on and off (and shown to change the rounding), each case also forced onto the
// decode kernel; pack-GQA on the gathering kernels; and a captured chunk loop replayed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/decode_case.cuh"
#include "hopper/fwd/launch_fwd.h"
#include "hopper/fwd/tuning_fwd.h"
#include "test_util.h"

namespace {

bool on_forward_kernel(const std::string& kernel) { return kernel.find("hopper::fwd_") != std::string::npos; }

// Whether c's pages go to its bucket's gathering kernel (launch_fwd.h kvcache_gathers: a power of
// two from 8 rows that is no whole key block, on a bucket with one, and the bucket's
// gather_min_seqlen_q query tokens); such a chunk runs on the decode kernel otherwise.
bool bucket_gathers(const KvCase& c) {
  const fa4::detail::HopperFwdConfig* fc = fa4::detail::hopper_fwd_bucket(c.d, c.dv);
  return fc != nullptr && fa4::hopper::kvcache_gathers(*fc, c.page_size, c.seqlen_q);
}

TEST(HopperKVCacheForward, ChunksRunOnTheForwardKernel) {
  REQUIRE_HOPPER();
  struct Route {
    KvCase c;
    bool forward;
    bool gather = false;  // on the gathering forward kernel (hopper::fwd_..._gather)
    bool packed = false;  // ... with the GQA group packed into its row tiles (fwd_pack_gqa_launches)
  };
  std::vector<Route> routes;
  // A case on small pages: gathered where its bucket has the kernel, else on the decode kernel;
  // `packs`: gathered, the default packs it (d128's 64-token GQA 32/8 chunks: half a row tile).
  const auto small_pages = [&](const KvCase& c, bool packs = false) {
    const bool g = bucket_gathers(c);
    routes.push_back({c, g, g, g && packs});
  };
  {
    // GQA 32/8, 64 queries (256 rows per KV head), appended as the chunk's own keys; sequence 1
    // nearly empty; every cache row past a sequence's keys NaN (the last block's tail must be zeroed).
    KvCase c;
    c.batch = 2; c.seqlen_q = 64; c.heads = 32; c.heads_kv = 8; c.capacity = 3000;
    c.cache_seqlens = {2100, 37}; c.seqlen_new = 64; c.causal = true; c.nan_past_keys = true; c.seed = 31;
    routes.push_back({c, true});
    KvCase e = c;  // no key at all: O = 0, LSE = the sink
    e.cache_seqlens = {0, 0}; e.seqlen_new = 0; e.sink = true; e.seed = 32;
    routes.push_back({e, true});
    KvCase bad = c;  // sequence 1's cache_seqlens past the capacity: skipped and reported
    bad.bad_seqlen_b = 1; bad.seed = 33;
    routes.push_back({bad, true});
    KvCase neg = c;  // a negative length
    neg.bad_seqlen_b = 0; neg.bad_seqlen_value = -5; neg.seed = 34;
    routes.push_back({neg, true});
    KvCase w = c;  // a left window: the forward, without the split
    w.window_left = 100; w.softcap = 20.f; w.dtype = DType::kFP16; w.seed = 35;
    routes.push_back({w, true});
    KvCase small = c;  // 16 queries: 64 rows per KV head stay on the decode kernel
    small.seqlen_q = 16; small.seqlen_new = 16; small.seed = 36;
    routes.push_back({small, false});
    // One sequence over a cache of 1,024 keys (16 key blocks): 128 narrow decode tiles, which the
    // decode kernel runs as one 8-warp split each where they fill the SMs once but not twice
    // (hopper_api.cu decode_one_split_wins); over 2,048 keys (32 blocks) the forward.
    int sms = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    KvCase one = c;
    one.batch = 1; one.capacity = 1024; one.cache_seqlens = {900}; one.seed = 70;
    routes.push_back({one, !(sms >= 128 && sms < 256)});
    one.capacity = 2048; one.cache_seqlens = {1900}; one.seed = 71;
    routes.push_back({one, true});
    KvCase paged = c;  // a paged cache with pages of whole key blocks (128 keys at d128): the forward too
    paged.page_size = 128; paged.seed = 37;
    routes.push_back({paged, true});
    KvCase p256 = c;  // two key blocks a page, a length at a page boundary, softcap
    p256.page_size = 256; p256.cache_seqlens = {2240, 0}; p256.softcap = 25.f; p256.seed = 52;
    routes.push_back({p256, true});
    KvCase pbad = paged;  // a page-table entry past the pool: the sequence is skipped and reported
    pbad.bad_page_b = 0; pbad.seed = 53;
    routes.push_back({pbad, true});
    KvCase plast = paged;  // ... in the last used slot of a sequence (the 101 keys' one page)
    plast.bad_page_b = 1; plast.bad_page_slot = 0; plast.seed = 54;
    routes.push_back({plast, true});
    KvCase pfull = c;  // no cache_seqlens: every slot of the table is a page, all keys attended
    pfull.page_size = 128; pfull.cache_seqlens = {}; pfull.seqlen_new = 0; pfull.capacity = 1000; pfull.seed = 55;
    routes.push_back({pfull, true});
    // Pages that are no whole key blocks (bad entries in the middle and in sequence 1's last used
    // slot, the 7th page of 16 of its 101 keys; every slot mapped; head dim 120, its padding
    // columns zero-filled; fp16 and softcap); then pages of 48 and 4, which no bucket gathers.
    KvCase p64 = c;
    p64.page_size = 64; p64.seed = 56;
    small_pages(p64, true);
    KvCase g16 = c;
    g16.page_size = 16; g16.seed = 57;
    small_pages(g16, true);
    KvCase g8 = c;
    g8.page_size = 8; g8.dtype = DType::kFP16; g8.softcap = 15.f; g8.seed = 58;
    small_pages(g8, true);
    KvCase g32bad = c;
    g32bad.page_size = 32; g32bad.bad_page_b = 0; g32bad.seed = 59;
    small_pages(g32bad, true);
    KvCase g16last = c;
    g16last.page_size = 16; g16last.bad_page_b = 1; g16last.bad_page_slot = 6; g16last.seed = 60;
    small_pages(g16last, true);
    KvCase g16full = c;
    g16full.page_size = 16; g16full.cache_seqlens = {}; g16full.seqlen_new = 0; g16full.capacity = 1000; g16full.seed = 61;
    small_pages(g16full, true);
    KvCase g16pad = c;
    g16pad.page_size = 16; g16pad.d = g16pad.dv = 120; g16pad.seed = 62;
    small_pages(g16pad, true);
    KvCase p48 = c;
    p48.page_size = 48; p48.seed = 63;
    routes.push_back({p48, false});
    KvCase p4 = c;
    p4.page_size = 4; p4.seed = 64;
    routes.push_back({p4, false});
    KvCase idx = c;  // and so does cache_batch_idx
    idx.batch_idx = true; idx.seed = 38;
    routes.push_back({idx, false});
    KvCase splits = c;  // and an explicit num_splits
    splits.num_splits = 3; splits.seed = 39;
    routes.push_back({splits, false});
  }
  {
    // d64 (the forward's three-warpgroup local kernel), 300 queries over 4 heads: two query tiles
    // per head; non-causal with the full cache; GQA 8/1 d128, 20 queries (160 rows), three
    // sequences of 1000, 1 and 2999 keys, softcap and sink; d256 16/2, 40 queries (320 rows).
    KvCase c;
    c.batch = 1; c.seqlen_q = 300; c.heads = 4; c.heads_kv = 4; c.d = c.dv = 64; c.capacity = 4096;
    c.cache_seqlens = {3000}; c.causal = true; c.nan_past_keys = true; c.seed = 41;
    routes.push_back({c, true});
    c.cache_seqlens = {}; c.causal = false; c.seed = 42;
    routes.push_back({c, true});
    KvCase g;
    g.batch = 3; g.seqlen_q = 20; g.heads = 8; g.heads_kv = 1; g.capacity = 3000; g.cache_seqlens = {1000, 1, 2999};
    g.softcap = 30.f; g.sink = true; g.causal = true; g.nan_past_keys = true; g.seed = 43;
    routes.push_back({g, true});
    KvCase d256;
    d256.batch = 1; d256.seqlen_q = 40; d256.heads = 16; d256.heads_kv = 2; d256.d = d256.dv = 256;
    d256.capacity = 2500; d256.cache_seqlens = {1800}; d256.seqlen_new = 40; d256.causal = true; d256.seed = 44;
    routes.push_back({d256, true});
    // The same three on paged caches: d64 pages of 384 rows (three key blocks), GQA 8/1 pages
    // of 128, d256 (key blocks of 80 rows) pages of 160.
    KvCase c384 = c;
    c384.page_size = 384; c384.cache_seqlens = {3000}; c384.causal = true; c384.seed = 45;
    routes.push_back({c384, true});
    KvCase g128 = g;
    g128.page_size = 128; g128.seed = 46;
    routes.push_back({g128, true});
    KvCase d256p = d256;
    d256p.page_size = 160; d256p.seed = 47;
    routes.push_back({d256p, true});
    // Small pages: d64 (pages of 16; 300 queries, and 64 of GQA 32/4), GQA 8/1 (pages of 32), d256 with pages of 64 and 128
    // (80-key blocks start inside a page, groups of 8 keys never do), 16, 8 (fp16, softcap), 32
    // with a bad entry (that sequence skipped) and 16 at head dim 248.
    KvCase c16 = c;
    c16.page_size = 16; c16.cache_seqlens = {3000}; c16.causal = true; c16.seed = 48;
    small_pages(c16);
    KvCase c16g = c16;  // GQA 32/4, 64 queries (512 rows per KV head): under d64's gather_min_seqlen_q
    c16g.seqlen_q = 64; c16g.heads = 32; c16g.heads_kv = 4; c16g.capacity = 2048; c16g.cache_seqlens = {2000};
    c16g.seed = 69;
    small_pages(c16g);
    KvCase g32 = g;
    g32.page_size = 32; g32.seed = 49;
    small_pages(g32);
    KvCase d256g = d256;
    d256g.page_size = 64; d256g.seed = 50;
    small_pages(d256g);
    KvCase d256g16 = d256;
    d256g16.page_size = 16; d256g16.seed = 65;
    small_pages(d256g16);
    KvCase d256g8 = d256;
    d256g8.page_size = 8; d256g8.dtype = DType::kFP16; d256g8.softcap = 15.f; d256g8.seed = 66;
    small_pages(d256g8);
    KvCase d256bad = d256;  // two sequences, the first skipped, the second attended
    d256bad.batch = 2; d256bad.cache_seqlens = {1800, 37}; d256bad.page_size = 32; d256bad.bad_page_b = 0;
    d256bad.seed = 67;
    small_pages(d256bad);
    KvCase d248 = d256;  // head dim 248 on the 256 bucket: the padding columns are zero-filled
    d248.d = d248.dv = 248; d248.page_size = 16; d248.seed = 68;
    small_pages(d248);
    KvCase d256g128 = d256;  // pages of 128 (blocks 1, 3, 4, ... cross a page boundary), fp16
    d256g128.page_size = 128; d256g128.dtype = DType::kFP16; d256g128.seed = 51;
    small_pages(d256g128);
  }
  int ran = 0;
  for (const Route& r : routes) {
    if (fa4::test::leave_out(r.c.d, r.c.dv, fa4::test::kFwd | fa4::test::kDecode)) continue;
    for (const char* split : {"auto", "1", "0"}) {
      if (!r.forward && std::strcmp(split, "auto") != 0) continue;
      SCOPED_TRACE(r.c.name() + " stream_k " + split);
      const fa4::test::ScopedOverride sk("stream_k", split);
      std::string kernel;
      const uint64_t packed_before = fa4::hopper::fwd_pack_gqa_launches();
      if (!run_case(r.c, &kernel)) continue;
      EXPECT_EQ(on_forward_kernel(kernel), r.forward) << "kernel " << kernel;
      EXPECT_EQ(kernel.find("_gather") != std::string::npos, r.gather) << "kernel " << kernel;
      // (run_case calls fa4 twice)
      EXPECT_EQ(fa4::hopper::fwd_pack_gqa_launches() - packed_before, r.packed ? 2u : 0u) << "kernel " << kernel;
      ++ran;
    }
    if (r.forward) {  // forced onto the decode kernel, the same call passes the same checks there
      SCOPED_TRACE(r.c.name() + " small_q decode");
      const fa4::test::ScopedOverride dec("small_q", "decode");
      std::string kernel;
      if (run_case(r.c, &kernel)) EXPECT_FALSE(on_forward_kernel(kernel)) << "kernel " << kernel;
    }
  }
  EXPECT_GT(ran, 0);
  // The split ran on this route: the first case's out differs somewhere, in rounding, with and
  // without it (its pieces' partials merge in another order than one CTA's key loop).
  const KvCase& c = routes[0].c;
  if (fa4::test::leave_out(c.d, c.dv, fa4::test::kFwd | fa4::test::kDecode)) return;
  KvProblem P;
  build(P, c);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<uint16_t> split, whole;
  std::vector<float> lse;
  {
    const fa4::test::ScopedOverride on("stream_k", "1");
    run_fa4(P, split, lse);
  }
  {
    const fa4::test::ScopedOverride off("stream_k", "0");
    run_fa4(P, whole, lse);
  }
  EXPECT_NE(0, std::memcmp(split.data(), whole.data(), split.size() * 2)) << "bitwise equal: did the split run?";
}

// Pack-GQA (core/pack_gqa.h packed_row, shared/tile_info.cuh tile_row) on the gathering kernels, the only ones
// compiled with it: a row tile holds (token, head) pairs of one KV head's group, Q read by TMA
// boxes of the group's heads, O and LSE stored per row's head. Chunks on pages of 16 forced onto
// the forward (small_q = fwd: the gathering kernel at any token count), packing forced on and off,
// each against the reference and counted on the path it should take: groups that divide the row
// tiles (2 to 64; 3 on d64's 192 rows) and one that does not (7: never packed); 1 to 200 tokens;
// plain, causal (bottom-right), a window with softcap and a sink (a sink per query head), and a
// causal chunk beside an empty sequence whose stale cache rows hold NaN; two sequences and several
// KV heads, so the tiles' batch and KV head both vary. A refused packed descriptor would fall back
// unpacked and fail the count.
TEST(HopperKVCacheForward, PackGqa) {
  REQUIRE_HOPPER();
  const fa4::test::ScopedOverride on_forward("small_q", "fwd");
  struct Group { int d, heads, heads_kv; };
  int ran = 0;
  for (const Group g : {Group{64, 6, 2}, Group{64, 16, 2}, Group{64, 64, 1}, Group{128, 32, 8}, Group{128, 8, 1},
                        Group{128, 64, 2}, Group{128, 14, 2}, Group{256, 16, 4}}) {
    const fa4::detail::HopperFwdConfig* bucket = fa4::detail::hopper_fwd_bucket(g.d, g.d);
    ASSERT_NE(bucket, nullptr);
    ASSERT_TRUE(bucket->gather_kernel) << "d" << g.d;
    if (fa4::test::leave_out(g.d, g.d, fa4::test::kFwd | fa4::test::kDecode)) continue;
    const bool fits = fa4::hopper::fwd_pack_gqa_fits(bucket->tile_m, g.heads, g.heads_kv);
    EXPECT_EQ(fits, g.heads / g.heads_kv != 7) << "d" << g.d;
    for (int sq : {1, 7, 64, 200})
      for (int mode = 0; mode < 4; ++mode) {
        KvCase c;
        c.d = c.dv = g.d; c.heads = g.heads; c.heads_kv = g.heads_kv; c.batch = 2; c.seqlen_q = sq;
        c.page_size = 16; c.capacity = 320; c.cache_seqlens = {300, 77}; c.seed = uint32_t(1000 * g.d + 10 * sq + mode);
        if (mode == 1) c.causal = true;
        if (mode == 2) { c.window_left = 100; c.window_right = 20; c.softcap = 30.f; c.sink = true; }
        if (mode == 3) { c.causal = true; c.cache_seqlens = {250, 0}; c.nan_past_keys = true; }
        for (const char* pack : {"1", "0"}) {
          SCOPED_TRACE(c.name() + " pack_gqa " + pack);
          const fa4::test::ScopedOverride forced("pack_gqa", pack);
          const uint64_t before = fa4::hopper::fwd_pack_gqa_launches();
          std::string kernel;
          ASSERT_TRUE(run_case(c, &kernel));
          EXPECT_NE(kernel.find("_gather"), std::string::npos) << "kernel " << kernel;
          const bool packed = fits && pack[0] == '1';
          // (run_case calls fa4 twice: every launch of a packed case packed, none of the others)
          EXPECT_EQ(fa4::hopper::fwd_pack_gqa_launches() - before, packed ? 2u : 0u);
          ++ran;
        }
      }
  }
  if (ran == 0) GTEST_SKIP() << "no gathering bucket (64, 128, 256) in this build";
}

// A chunked prefill loop: one captured call appends a chunk of 64 tokens to a cache and attends
// over it (on the forward kernel, or on the decode kernel for small pages without a gathering
// kernel), replayed with new q, k_new, v_new and cache_seqlens advanced by
// 64 (one sequence starting empty); every replay's out, lse and cache equal, bitwise, an eager call
// on an identical problem. Dense, and paged with pages of 128 and 16 (every slot of the table a
// page, as a serving engine maps them ahead); and at d256 with pages of 16. Pages of 16 run on the
// bucket's gathering kernel where tuning_fwd.h gives it one (else on the decode kernel).
TEST(HopperKVCacheForward, GraphReplayOfAChunkLoop) {
  REQUIRE_HOPPER();
  KvCase c;
  REQUIRE_BUCKETS(c.d, c.dv, fa4::test::kFwd | fa4::test::kDecode);
  c.batch = 2; c.seqlen_q = 64; c.heads = 32; c.heads_kv = 8; c.capacity = 1024;
  c.cache_seqlens = {300, 0}; c.seqlen_new = 64; c.causal = true; c.seed = 860;
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  for (int page_size : {0, 128, 16}) {
    SCOPED_TRACE("page_size " + std::to_string(page_size));
    c.page_size = page_size;
    c.full_page_table = page_size > 0;
    const bool gathered = page_size == 16 && bucket_gathers(c);
    std::string kernel;
    graph_loop_matches_eager(c, s, 5, &kernel);
    EXPECT_EQ(on_forward_kernel(kernel), page_size != 16 || gathered) << kernel;
    EXPECT_EQ(kernel.find("paged") != std::string::npos, page_size > 0) << kernel;
    EXPECT_EQ(kernel.find("_gather") != std::string::npos, gathered) << kernel;
  }
  if (!fa4::test::leave_out(256, 256, fa4::test::kFwd | fa4::test::kDecode)) {
    SCOPED_TRACE("d256, page_size 16");
    KvCase g = c;
    g.d = g.dv = 256; g.heads = 16; g.heads_kv = 2; g.page_size = 16; g.full_page_table = true; g.seed = 861;
    std::string kernel;
    graph_loop_matches_eager(g, s, 5, &kernel);
    EXPECT_EQ(on_forward_kernel(kernel), bucket_gathers(g)) << kernel;
    EXPECT_EQ(kernel.find("_gather") != std::string::npos, bucket_gathers(g)) << kernel;
  }
  cudaStreamDestroy(s);
}

}  // namespace
