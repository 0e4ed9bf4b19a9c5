// tests/gpu/test_hopper_decode.cu — fa4::forward_with_kvcache on the Hopper decode kernels: split
// counts, page sizes and boundaries, append, query lengths and groups, masks, softcap, sink, head
// dims, long caches, empty caches, broken device indices, NaN rows (each case and its checks:
// decode_case.cuh). The merge, graph, row-tile and sanitizer tests: test_hopper_decode_merge.cu.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "gpu/decode_case.cuh"

namespace {

// (Here and in the paged test below the cache rows past the lengths hold NaN: a block that ends
// past its sequence must never bring them into the products, where P = 0 x NaN would be NaN.)
TEST(HopperDecode, DenseSplitCounts) {
  REQUIRE_HOPPER();
  for (int splits : {1, 2, 3, 7, 64, 0}) {
    KvCase c;
    c.cache_seqlens = {300, 77};
    c.nan_past_keys = true;
    c.num_splits = splits;
    c.seed = 10 + splits;
    run_case(c);
  }
}

// The append kernel checks its sequence's whole page-table range before it writes (a sequence with
// a broken entry is neither appended nor attended to), reading the row four entries at a time from
// its first 16-byte boundary, by 64 threads, or 256 where the row holds more than 1024 entries.
// Pages of 3 over a capacity of 100 keys: rows of 34 entries (136 B), so sequence 1's row starts 8
// bytes past a boundary; its 97 keys (95 cached + 2 appended) take entries 0..32: two before the
// boundary (0, 1), seven vectors (2..29), three after (30..32). Pages of one key over 9001: rows of
// 9001 entries (36004 B), sequence 1's starting 4 bytes past a boundary; its 8997 keys take three
// entries before it (0..2), 2248 vectors (3..8994: 8 or 9 per thread of 256, two batches of 4 loads
// and a partial third) and two after (8995, 8996). A broken entry at each of those places must
// skip sequence 1 (its cache rows unwritten, its output the poison) while sequences 0 and 2 are
// appended and attended to.
TEST(HopperDecode, AppendChecksTheWholePageRangeOfAMisalignedRow) {
  REQUIRE_HOPPER();
  struct Row {
    int page_size, capacity, cached;
    std::vector<int> slots;
  };
  const Row rows[] = {{3, 100, 95, {0, 1, 2, 29, 30, 32}}, {1, 9001, 8995, {0, 2, 3, 5000, 8994, 8995, 8996}}};
  for (const Row& r : rows)
    for (int slot : r.slots) {
      KvCase c;
      c.batch = 3;
      c.page_size = r.page_size;
      c.capacity = r.capacity;
      c.cache_seqlens = {r.cached - 5, r.cached, r.cached / 2};
      c.seqlen_new = 2;
      c.bad_page_b = 1;
      c.bad_page_slot = slot;
      c.seed = 260 + slot;
      run_case(c);
    }
}

TEST(HopperDecode, PagedPageSizesAndBoundaries) {
  REQUIRE_HOPPER();
  // (At d128 a thread copies runs of 8 consecutive keys: pages of 8 and more hold whole runs,
  // which take one page-table entry each; 1, 3 and 4 take one per row. HeadDimsAndPadding adds
  // pages of 6 at every width: runs of 4 at d64, 16 at d256.)
  for (int ps : {1, 3, 4, 8, 16, 64, 256}) {
    KvCase c;
    c.batch = 4;
    c.page_size = ps;
    c.capacity = 1024;
    c.cache_seqlens = {0, 1, std::min(1024, 2 * ps) - 1, std::min(1024, 2 * ps + 1)};
    c.nan_past_keys = true;
    for (int splits : {1, 0}) {
      c.num_splits = splits;
      c.seed = 100 + ps + splits;
      run_case(c);
    }
  }
}

TEST(HopperDecode, AppendDensePagedBatchIdx) {
  REQUIRE_HOPPER();
  for (int ps : {0, 16, 5}) {
    KvCase c;
    c.batch = 3;
    c.page_size = ps;
    c.capacity = 256;
    c.cache_seqlens = {0, 100, 253};
    c.seqlen_new = 3;
    c.seqlen_q = 3;
    c.causal = true;
    c.batch_idx = ps == 0;
    c.seed = 200 + ps;
    run_case(c);
    c.num_splits = 4;
    run_case(c);
  }
}

// The decode kernel is the append's programmatic dependent (launch_decode.cuh): it starts while the
// append runs and must wait for every appended row before its first K / V copy; the rows to be
// appended hold other random values beforehand, so a copy before the append's write fails the
// comparison with the reference.
// * One wave of slow appends: 16 new keys x 8 KV heads = 128 append CTAs (one per SM, room beside
//   them for the decode's), each of which first checks the 32,768 page-table entries of its
//   sequence (pages of one key) and only then writes its row; 256 explicit splits (the most) of 2
//   64-key blocks, so the last split's first copies are of the appended rows.
// * Many appends: 512 new keys x 8 KV heads x 4 sequences (16,384 append CTAs, whose last ones
//   still run when the decode's CTAs start) into caches that held few keys; dense, pages of 16, and
//   pages of one key over up to 7,512 keys; automatic and one split.
// Without the decode's wait these appends are still fast enough to land first in every run tried
// (bench/results/history.md): WaitsForASlowAppend is the test of the wait.
TEST(HopperDecode, AttendsToEveryRowOfALongAppend) {
  REQUIRE_HOPPER();
  {
    KvCase c;
    c.batch = 1;
    c.heads = 32;
    c.heads_kv = 8;
    c.page_size = 1;
    c.capacity = 32768;
    c.cache_seqlens = {32768 - 16};
    c.seqlen_new = 16;
    c.num_splits = 256;
    c.seed = 279;
    run_case(c);
  }
  for (int ps : {0, 16, 1})
    for (int splits : {0, 1}) {
      KvCase c;
      c.batch = 4;
      c.heads = 32;
      c.heads_kv = 8;
      c.page_size = ps;
      c.capacity = ps == 1 ? 8192 : 1024;
      c.cache_seqlens = ps == 1 ? std::vector<int>{0, 3, 4000, 7000} : std::vector<int>{0, 3, 200, 500};
      c.seqlen_new = 512;
      c.num_splits = splits;
      c.seed = 280 + ps + splits;
      run_case(c);
    }
}

// Every append CTA waits 300 us between its checks and its writes (override
// decode_append_delay_us), while the decode kernel, its programmatic dependent, is launched at the
// append's start and has SMs to spare beside its few CTAs: a decode that read the cache before the
// append's writes were visible would attend to the rows' earlier random values and fail the
// comparison. Each launch form the append may precede: the 4-warp form over splits merged in
// global scratch and in one cluster, the 8-warp form's one split, the wide tile, pages of 16 and
// of one key, and a chunk on the forward kernel (appended first in plain stream order: that form
// shows the order kept, not a wait).
TEST(HopperDecode, WaitsForASlowAppend) {
  REQUIRE_HOPPER();
  const fa4::test::ScopedOverride slow("decode_append_delay_us", "300");
  struct Form {
    const char* name;
    int seqlen_q, heads, heads_kv, page_size, splits;
    const char* cluster;  // the overrides decode_cluster, decode_tile, decode_warps and small_q
    const char* tile;
    const char* warps;
    const char* small_q;
  };
  const Form forms[] = {
      {"4-warp, 4 splits in global scratch", 1, 32, 8, 0, 4, "0", "16", "4", "auto"},
      {"4-warp, 4 splits in one cluster", 1, 32, 8, 0, 4, "1", "16", "4", "auto"},
      {"8-warp, one split", 16, 32, 8, 0, 1, "auto", "16", "8", "decode"},
      {"wide tile, pages of 16", 64, 8, 1, 16, 0, "auto", "64", "auto", "decode"},
      {"pages of one key", 4, 16, 2, 1, 0, "auto", "auto", "auto", "decode"},
      {"forward kernel", 128, 8, 2, 0, 0, "auto", "auto", "auto", "fwd"}};
  for (const Form& f : forms) {
    SCOPED_TRACE(f.name);
    const fa4::test::ScopedOverride cluster("decode_cluster", f.cluster), tile("decode_tile", f.tile),
        warps("decode_warps", f.warps), route("small_q", f.small_q);
    KvCase c;
    c.batch = 2;
    c.seqlen_q = f.seqlen_q;
    c.heads = f.heads;
    c.heads_kv = f.heads_kv;
    c.page_size = f.page_size;
    c.capacity = 1024;
    c.cache_seqlens = {1000, 500};
    c.seqlen_new = 8;
    c.num_splits = f.splits;
    c.seed = 290 + f.seqlen_q + f.page_size;
    std::string kernel;
    if (!run_case(c, &kernel)) continue;  // bucket not built
    const bool on_forward = f.small_q[0] == 'f';
    EXPECT_EQ(kernel.rfind(on_forward ? "hopper::fwd_" : "hopper::decode_", 0), 0u) << kernel;
  }
}

TEST(HopperDecode, SeqlenQAndGroupsCausal) {
  REQUIRE_HOPPER();
  // (16 queries of 16 heads per KV head would take the forward kernel on a dense cache:
  // test_hopper_kvcache_forward.cu; kept on the decode kernel here.)
  const fa4::test::ScopedOverride decode("small_q", "decode");
  for (int sq : {1, 2, 5, 16})
    for (int group : {1, 4, 8, 16}) {
      KvCase c;
      c.seqlen_q = sq;
      c.heads_kv = 2;
      c.heads = 2 * group;
      c.capacity = 700;
      c.cache_seqlens = {699, 9};  // the second: fewer keys than queries for sq 16 (masked rows)
      c.causal = true;
      c.seed = 300 + sq * 17 + group;
      run_case(c);
    }
}

TEST(HopperDecode, WindowSoftcapSinkFp16) {
  REQUIRE_HOPPER();
  KvCase c;
  c.batch = 3;
  c.seqlen_q = 4;
  c.page_size = 32;
  c.capacity = 2000;
  c.cache_seqlens = {1999, 500, 0};
  c.window_left = 100;
  c.window_right = 0;
  c.softcap = 20.f;
  c.sink = true;
  for (DType t : {DType::kBF16, DType::kFP16})
    for (int splits : {1, 0}) {
      c.dtype = t;
      c.num_splits = splits;
      c.seed = 400 + splits + int(t);
      run_case(c);
    }
}

TEST(HopperDecode, HeadDimsAndPadding) {
  REQUIRE_HOPPER();
  const int dims[][2] = {{64, 64}, {128, 128}, {256, 256}, {80, 80}, {192, 128}, {32, 32}};
  for (const auto& dd : dims) {
    KvCase c;
    c.d = dd[0];
    c.dv = dd[1];
    c.page_size = 16;
    c.capacity = 600;
    c.cache_seqlens = {600, 333};
    c.seqlen_new = 0;
    c.seed = 500 + dd[0] + dd[1];
    run_case(c);
    c.page_size = 6;  // a thread's run of rows (4, 8 or 16 keys) spans pages: an entry per row
    run_case(c);
    c.page_size = 16;
    // The cluster merge at every width: 16 splits of 10 key blocks (6 empty) in clusters of up to
    // 16, each CTA merging d / 16 columns of the tile (4 at d64; at 32 of 64, 80 of 128 and 128 of
    // 256 the last CTAs own only padding columns yet receive every row's log2-sum-exp).
    const fa4::test::ScopedOverride cluster("decode_cluster", "1");
    c.num_splits = 16;
    run_case(c);
    // More splits than a cluster: CTA q of each cluster writes its columns' partial and the last
    // to arrive at the tile's counter q merges them, padding-only ranks included (they write none).
    c.num_splits = 32;
    run_case(c);
  }
}

TEST(HopperDecode, LongCacheAutoSplit) {
  REQUIRE_HOPPER();
  KvCase c;
  c.batch = 1;
  c.heads = 32;
  c.heads_kv = 8;
  c.capacity = 12000;
  c.page_size = 64;
  c.cache_seqlens = {11999};
  c.seqlen_new = 1;
  c.seed = 600;
  run_case(c);
}

TEST(HopperDecode, EmptyCachesGiveMaskedRows) {
  REQUIRE_HOPPER();
  KvCase c;
  c.cache_seqlens = {0, 0};
  c.sink = true;
  for (int splits : {1, 5}) {
    c.num_splits = splits;
    run_case(c);
  }
}

TEST(HopperDecode, BrokenDeviceIndicesSkipTheSequence) {
  REQUIRE_HOPPER();
  const int broken[][2] = {{1, -1}, {-1, 2}, {1, 2}};  // (bad cache_seqlens, bad page) sequence
  for (const auto& bb : broken)
    for (int splits : {1, 6}) {
      KvCase c;
      c.batch = 3;
      c.page_size = 16;
      c.capacity = 512;
      c.cache_seqlens = {400, 300, 200};
      c.seqlen_new = 2;
      c.bad_seqlen_b = bb[0];
      c.bad_page_b = bb[1];
      c.num_splits = splits;
      c.seed = 700 + splits;
      run_case(c);
    }
}

// A broken page-table entry of keys no row of a tile reads must still skip the sequence: a page
// before a left window's first visible key (checked by split 0 only), and the last page of a
// causal chunk, which the first row tiles' rows do not see (each tile checks its split's keys
// beyond its own). No append, so the decode kernel alone must find the entry.
TEST(HopperDecode, BrokenPagesOutsideTheKeysReadSkipTheSequence) {
  REQUIRE_HOPPER();
  for (int splits : {1, 6}) {
    KvCase c;
    c.batch = 3;
    c.page_size = 16;
    c.capacity = 512;
    c.cache_seqlens = {400, 300, 200};
    c.window_left = 100;
    c.bad_page_b = 1;
    c.bad_page_slot = 0;  // keys 0..15; sequence 1 sees keys 199..299
    c.num_splits = splits;
    c.seed = 720 + splits;
    run_case(c);
  }
  for (const char* tile : {"64", "16"})
    for (int splits : {1, 3}) {
      const fa4::test::ScopedOverride forced("decode_tile", tile);
      KvCase c;
      c.batch = 2;
      c.heads = c.heads_kv = 2;  // 80 rows per KV head: two wide tiles, five narrow ones
      c.seqlen_q = 80;
      c.causal = true;
      c.page_size = 16;
      c.capacity = 512;
      c.cache_seqlens = {400, 300};
      c.bad_page_b = 0;
      c.bad_page_slot = 24;  // keys 384..399: rows 0..63 see keys up to 383
      c.num_splits = splits;
      c.seed = 730 + splits;
      run_case(c);
    }
}

// The same over long splits (more page-table entries per split than a CTA checks before its first
// copy), so each entry is checked as a copy reads it or after the first copies: a broken entry in
// the middle (read), and before a left window's first visible key (not read). Pages of one key
// (up to 3000 entries per split; each row's entry read by its copy) and of 8 (up to 1500; one entry
// per thread's run of 8 keys at d128).
TEST(HopperDecode, BrokenPagesOfALongSplitSkipTheSequence) {
  REQUIRE_HOPPER();
  for (int ps : {1, 8})
    for (int slot : {-1, 5}) {
      KvCase c;
      c.batch = 2;
      c.page_size = ps;
      c.capacity = 3000 * ps / (ps == 1 ? 1 : 2);  // 3000 / 12000 keys
      c.cache_seqlens = {c.capacity, c.capacity * 5 / 6};
      if (slot >= 0) c.window_left = 1000;  // the last 1001 keys of sequence 0
      c.bad_page_b = 0;
      c.bad_page_slot = slot;
      c.seed = 740 + slot + ps;
      // One split; two (1500 / 750 entries each: the second still past the check before the first
      // copy at pages of one key), through the global merge and in one cluster, whose flagged CTA
      // stays for its peers' barriers.
      for (int splits : {1, 2}) {
        c.num_splits = splits;
        run_case(c);
      }
      const fa4::test::ScopedOverride cluster("decode_cluster", "1");
      run_case(c);
    }
}

TEST(HopperDecode, NegativeLengthAndBadCacheRow) {
  REQUIRE_HOPPER();
  for (int splits : {1, 4}) {
    KvCase c;
    c.batch = 3;
    c.capacity = 300;
    c.cache_seqlens = {100, 200, 250};
    c.seqlen_new = 1;
    c.bad_seqlen_b = 0;
    c.bad_seqlen_value = -1;
    c.num_splits = splits;
    run_case(c);
    c.bad_seqlen_b = -1;
    c.batch_idx = true;
    c.bad_batch_idx_b = 2;
    run_case(c);
  }
}

// Query heads per KV head that are no power of two (3, 5, 7, 12): the packed rows (a query row and
// its head's place in the group) split by a division that powers of two would not exercise. One,
// three and five queries per sequence, causal (the second sequence has fewer keys than queries for
// five without its appended key), the wide and narrow row tiles, one split and automatic, dense
// and paged with an appended key.
TEST(HopperDecode, GroupsThatAreNoPowerOfTwo) {
  REQUIRE_HOPPER();
  const int groups[][2] = {{9, 3}, {40, 8}, {28, 4}, {12, 1}};  // heads, heads_kv
  for (const auto& g : groups)
    for (int sq : {1, 3, 5})
      for (const char* tile : {"64", "16"}) {
        const fa4::test::ScopedOverride forced("decode_tile", tile);
        KvCase c;
        c.seqlen_q = sq;
        c.heads = g[0];
        c.heads_kv = g[1];
        c.capacity = 700;
        c.cache_seqlens = {690, 4};
        c.causal = true;
        c.seed = 1500 + g[0] * 11 + sq;
        c.num_splits = 1;
        run_case(c);
        c.num_splits = 0;
        c.page_size = 16;
        c.seqlen_new = 1;
        run_case(c);
      }
}

// Batch invariance: a sequence's out and lse do not depend on the other sequences' lengths (the
// split count and row tiles follow the shapes only). Lengths 900, 1000, 120, 500 of a 1024-key
// cache, then the first set to 800: sequences 1 to 3 bitwise the same; automatic and fixed splits.
TEST(HopperDecode, OtherSequencesLengthsChangeNothing) {
  REQUIRE_HOPPER();
  for (int splits : {0, 3}) {
    KvCase c;
    if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;
    c.batch = 4;
    c.heads = 32;
    c.heads_kv = 8;
    c.capacity = 1024;
    c.cache_seqlens = {900, 1000, 120, 500};
    c.num_splits = splits;
    c.seed = 1700 + splits;
    KvProblem P;
    build(P, c);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<uint16_t> out[2];
    std::vector<float> lse[2];
    run_fa4(P, out[0], lse[0]);
    P.d_cl->upload(std::vector<int>{800, 1000, 120, 500});
    run_fa4(P, out[1], lse[1]);
    if (::testing::Test::HasFatalFailure()) return;
    const size_t out_seq = out[0].size() / 4, lse_seq = lse[0].size() / 4;  // (B, Sq, H, dv), (B, H, Sq)
    EXPECT_NE(0, std::memcmp(out[0].data(), out[1].data(), out_seq * 2)) << "sequence 0 did not change";
    EXPECT_EQ(0, std::memcmp(out[0].data() + out_seq, out[1].data() + out_seq, 3 * out_seq * 2)) << c.name();
    EXPECT_EQ(0, std::memcmp(lse[0].data() + lse_seq, lse[1].data() + lse_seq, 3 * lse_seq * 4)) << c.name();
  }
}

// Strided views, as serving code hands them: q, k_new and v_new as slices of one fused (batch,
// seqlen, heads + 2 heads_kv, d) projection, the k and v caches as the two halves of one (pages,
// page_size, 2, heads_kv, d) buffer (dense: (batch, capacity, 2, heads_kv, d)), out with padded rows:
// out, lse and the cache after the append bitwise those of the same call on contiguous tensors,
// and out's row padding untouched.
TEST(HopperDecode, StridedViewsMatchContiguous) {
  REQUIRE_HOPPER();
  for (int ps : {16, 0}) {
    KvCase c;
    if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;
    c.batch = 3;
    c.seqlen_q = c.seqlen_new = 2;
    c.page_size = ps;
    c.capacity = 300;
    c.cache_seqlens = {100, 0, 250};
    c.causal = true;
    c.seed = 1800 + ps;
    KvProblem P;
    build(P, c);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<uint16_t> out_ref;
    std::vector<float> lse_ref;
    run_fa4(P, out_ref, lse_ref);  // contiguous; leaves the appended cache in P.k / P.v
    if (::testing::Test::HasFatalFailure()) return;
    const std::vector<uint16_t> k_ref = P.k->download(), v_ref = P.v->download();
    const int64_t B = P.B, S = c.seqlen_q, H = P.H, HK = P.HK, D = c.d;
    ASSERT_EQ(c.d, c.dv);
    const int64_t row = (H + 2 * HK) * D, out_row = H * D + 8, kv_row = 2 * HK * D;
    std::vector<uint16_t> fused(size_t(B * S * row)), kv(size_t(P.cache_rows * kv_row));
    for (int64_t t = 0; t < B * S; ++t) {
      std::copy_n(&P.hq[t * H * D], H * D, &fused[t * row]);
      std::copy_n(&P.hkn[t * HK * D], HK * D, &fused[t * row + H * D]);
      std::copy_n(&P.hvn[t * HK * D], HK * D, &fused[t * row + (H + HK) * D]);
    }
    for (int64_t r = 0; r < P.cache_rows; ++r) {  // the pre-append cache
      std::copy_n(&P.hk[r * HK * D], HK * D, &kv[r * kv_row]);
      std::copy_n(&P.hv[r * HK * D], HK * D, &kv[r * kv_row + HK * D]);
    }
    DevBuf<uint16_t> dfused(fused.size()), dkv(kv.size()), dout(size_t(B * S * out_row));
    dfused.upload(fused);
    dkv.upload(kv);
    dout.upload(std::vector<uint16_t>(dout.n, kPoison16));
    CUDA_OK(cudaMemset(P.lse->ptr, 0xFF, P.lse->n * 4));
    const auto dev = fa4::Device::cuda(0);
    const DType t = c.dtype;
    const int64_t outer = ps ? P.num_pages : P.batch_cache, inner = ps ? ps : P.cap;
    auto fused_view = [&](int64_t first, int64_t heads) {
      return TensorView::strided(dfused.ptr + first, t, {B, S, heads, D}, {S * row, row, D, 1}, dev);
    };
    auto cache_view = [&](int64_t first) {
      return TensorView::strided(dkv.ptr + first, t, {outer, inner, HK, D}, {inner * kv_row, kv_row, D, 1}, dev);
    };
    fa4::KVCacheOptions o = P.o;
    o.k_new = fused_view(H * D, HK);
    o.v_new = fused_view((H + HK) * D, HK);
    fa4::forward_with_kvcache(fused_view(0, H), cache_view(0), cache_view(HK * D),
                              TensorView::strided(dout.ptr, t, {B, S, H, D}, {S * out_row, out_row, D, 1}, dev),
                              P.tlse, o);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = dout.download(), cache = dkv.download();
    int64_t out_diff = 0, pad_written = 0, cache_diff = 0;
    for (int64_t r = 0; r < B * S; ++r) {
      out_diff += !std::equal(&got[r * out_row], &got[r * out_row + H * D], &out_ref[r * H * D]);
      for (int64_t e = H * D; e < out_row; ++e) pad_written += got[r * out_row + e] != kPoison16;
    }
    for (int64_t r = 0; r < P.cache_rows; ++r)
      cache_diff += !std::equal(&cache[r * kv_row], &cache[r * kv_row + HK * D], &k_ref[r * HK * D]) ||
                    !std::equal(&cache[r * kv_row + HK * D], &cache[(r + 1) * kv_row], &v_ref[r * HK * D]);
    EXPECT_EQ(out_diff, 0) << c.name() << ": out rows differing from the contiguous call";
    EXPECT_EQ(pad_written, 0) << c.name() << ": out's row padding written";
    EXPECT_EQ(cache_diff, 0) << c.name() << ": cache rows differing after the append";
    EXPECT_TRUE(P.lse->download() == lse_ref) << c.name() << ": lse";
    EXPECT_NO_THROW(fa4::check_async_errors(0));
  }
}

// Shared cache memory without an append (prefix caching): sequences whose page tables point at the
// same physical pages for their first keys, and dense sequences reading one cache row (repeated
// cache_batch_idx). Each sequence against the reference on the keys it addresses.
TEST(HopperDecode, SharedPagesAndRepeatedCacheRows) {
  REQUIRE_HOPPER();
  for (int splits : {1, 0}) {
    KvCase c;
    if (fa4::test::leave_out(c.d, c.dv, fa4::test::kDecode)) continue;
    c.batch = 3;
    c.page_size = 16;
    c.capacity = 400;
    c.cache_seqlens = {390, 40, 200};
    c.num_splits = splits;
    c.seed = 1900 + splits;
    KvProblem P;
    build(P, c);
    if (::testing::Test::HasFatalFailure()) return;
    for (int b : {1, 2})  // the first 3 pages (48 keys) of sequence 0 are also those of 1 and 2
      for (int p = 0; p < 3; ++p) P.page_table[b * P.max_pages + p] = P.page_table[p];
    P.d_pt->upload(P.page_table);
    check_built(P);
    c.page_size = 0;
    c.batch_idx = true;
    c.seed = 1950 + splits;
    KvProblem D;
    build(D, c);
    if (::testing::Test::HasFatalFailure()) return;
    D.cb[2] = D.cb[0];  // sequences 0 and 2 read one cache row (lengths 390 and 200 of it)
    D.d_cb->upload(D.cb);
    check_built(D);
  }
}

// The last sequence's cache_seqlens one past the room for its append (capacity - seqlen_new + 1):
// its append would write the row after the cache (the buffer's guard rows). The sequence is
// skipped and reported, the guard rows and every other row stay as they were; dense and paged.
TEST(HopperDecode, LastSequenceAppendPastTheCache) {
  REQUIRE_HOPPER();
  for (int ps : {0, 16}) {
    KvCase c;
    c.batch = 3;
    c.page_size = ps;
    c.capacity = 304;
    c.cache_seqlens = {100, 200, 250};
    c.seqlen_new = 4;
    c.seqlen_q = 4;
    c.causal = true;
    c.bad_seqlen_b = 2;
    c.bad_seqlen_value = 304 - 4 + 1;
    c.guard_rows = 8;
    c.seed = 2000 + ps;
    run_case(c);
  }
}

// A NaN in one query row reaches that row only, whether one split finishes it or the last split
// merges several; tau = 0 takes the rescale branch at every larger block max.
TEST(HopperDecode, NaNRowAndEagerRescale) {
  REQUIRE_HOPPER();
  for (int splits : {1, 5}) {
    KvCase c;
    c.batch = 2;
    c.capacity = 900;
    c.cache_seqlens = {900, 400};
    c.nan_q = true;
    c.num_splits = splits;
    run_case(c);
    c.nan_q = false;
    c.tau = 0.f;
    c.page_size = 16;
    run_case(c);
  }
}

}  // namespace
