// tests/gpu/test_hopper_fwd_schedule.cu — which CTA and which kernel compute a Hopper forward's
// tiles, each checked against the GPU fp32 reference by fwd_case.cuh's run_case: the tile
// schedules (static, dynamic, LPT) agree bitwise, the stream-K split of the keys over idle SMs
// (dense problems and causal chunks of one query tile per head), and the small-query route to the
// decode kernel.
#include "fwd_case.cuh"

namespace {

// The tile schedule (static stride or dynamic claim counter; LPT order or plain) decides only
// which CTA computes a tile, so every schedule must give bitwise the same O and LSE. The shapes have
// more tiles than the GPU has SMs, so the dynamic path really runs (it is skipped otherwise).
TEST(HopperFwd, SchedulesAgreeBitwise) {
  REQUIRE_HOPPER();
  struct Choice {
    const char* sched;
    const char* lpt;
  };
  const Choice choices[] = {{"static", "0"}, {"static", "1"}, {"dynamic", "1"}, {"dynamic", "0"}};
  std::vector<Case> cases;
  {
    Case c; c.batch = 3; c.heads = c.heads_kv = 8; c.seqlen_q = c.seqlen_k = 1024; c.causal = true;
    cases.push_back(c);  // 192 tiles of 1..8 key blocks
    c.heads_kv = 2; c.window_left = 200; c.window_right = 0; c.dtype = DType::kFP16; c.d = c.dv = 64;
    cases.push_back(c);
  }
  {
    Case c; c.heads = 12; c.heads_kv = 4; c.causal = true;
    c.lens_q = {1000, 1, 0, 700, 129, 1023, 64, 513};
    c.lens_k = {1000, 900, 5, 700, 300, 1023, 64, 600};
    cases.push_back(c);  // varlen: unequal tiles, empty and one-row sequences
  }
  for (const Case& c : cases) {
    Result ref;
    for (size_t e = 0; e < sizeof(choices) / sizeof(choices[0]); ++e) {
      fa4::test::ScopedOverride sched("schedule", choices[e].sched), lpt("lpt", choices[e].lpt);
      Result r;
      const uint64_t dynamic_before = fa4::hopper::fwd_dynamic_launches();
      if (!run_case(c, 1, &r)) break;  // left out (every choice alike): nothing to compare
      EXPECT_EQ(fa4::hopper::fwd_dynamic_launches() > dynamic_before, std::strcmp(choices[e].sched, "dynamic") == 0)
          << c.name() << " sched=" << choices[e].sched << ": the forward's schedule is not the one asked for";
      if (e == 0) { ref = r; continue; }
      EXPECT_EQ(0, std::memcmp(ref.out.data(), r.out.data(), r.out.size() * 2))
          << c.name() << " sched=" << choices[e].sched << " lpt=" << choices[e].lpt;
      EXPECT_EQ(0, std::memcmp(ref.lse.data(), r.lse.data(), r.lse.size() * 4))
          << c.name() << " sched=" << choices[e].sched << " lpt=" << choices[e].lpt;
    }
  }
}

// Stream-K tail (core/stream_k.h, src/hopper/shared/stream_k.cuh), forced on: tiles cut into pieces
// of a few key blocks (3-7, the plan's count) across 16-54 CTAs, some straddling tiles, the combiner merging partials whose maxima differ (rising
// scores, so every piece has its own max), masked tail keys in the combiner's first block, sink,
// softcap, GQA, fp16, every bucket, causal and right-windowed chunks of one or several query tiles
// per head.
// Each case is checked against the references by run_case (and run twice: the merge order is
// fixed, so the split is deterministic). The same random-input case without the split must give a
// different rounding somewhere, or the split did not run.
TEST(HopperFwd, StreamKTailMatchesReference) {
  REQUIRE_HOPPER();
  fa4::test::ScopedOverride fwd_kernel("small_q", "fwd");  // the split is the forward kernel's
  std::vector<Case> cases;
  for (int d : {64, 96, 128, 192, 256}) {
    Case c; c.heads = 3; c.heads_kv = 1; c.seqlen_q = 200; c.seqlen_k = 5000; c.d = c.dv = d;
    cases.push_back(c);  // 6 tiles of 40-63 blocks on many CTAs: pieces of a few blocks
  }
  {
    Case c; c.heads = 2; c.seqlen_q = 256; c.seqlen_k = 3000; c.sink = true; c.dtype = DType::kFP16;
    cases.push_back(c);
    c.sink = false; c.softcap = 30.f; c.d = 192; c.dv = 128; c.dtype = DType::kBF16;
    cases.push_back(c);
    Case r; r.heads = 2; r.seqlen_q = 128; r.seqlen_k = 4096; r.ramp_log2 = 20.f;
    cases.push_back(r);  // every block moves the max: pieces carry different maxima
    r.ramp_log2 = 300.f;
    cases.push_back(r);  // partials 2^300 apart: the merge must rescale, not overflow
    // More tiles than SMs: whole-tile rounds first, then the tail (batch 2 x 70 heads = 140 tiles).
    Case m; m.batch = 2; m.heads = 70; m.heads_kv = 14; m.seqlen_q = 100; m.seqlen_k = 1500; m.d = m.dv = 64;
    cases.push_back(m);
  }
  // Masks with a right edge where a head's queries are one tile (a causal chunk against a long
  // cache): every tile still walks all key blocks, and the pieces holding the diagonal mask their
  // keys per row as the whole tile does; rows that see none of a piece's keys give it weight 0.
  // d64's tiles of 192 rows run its local kernel, whose warpgroups past the chunk's rows pass every
  // piece through (seqlen_q 100: the third has no rows, 150: the third has 22).
  for (int d : {64, 96, 128, 192, 256}) {
    Case c; c.heads = 3; c.heads_kv = 1; c.seqlen_q = 100; c.seqlen_k = 5000; c.d = c.dv = d; c.causal = true;
    c.seed = 30 + d;
    cases.push_back(c);
  }
  {
    Case c; c.heads = 2; c.seqlen_q = 150; c.seqlen_k = 4000; c.d = c.dv = 64; c.causal = true; c.sink = true;
    cases.push_back(c);
    // A right window of 10 keys: row i sees keys up to 2946 + i, so the chunk's last block is
    // masked per row (d64's local kernel and d128).
    for (int d : {64, 128}) {
      Case w; w.heads = 4; w.heads_kv = 2; w.seqlen_q = 64; w.seqlen_k = 3000; w.window_right = 10;
      w.softcap = 20.f; w.dtype = DType::kFP16; w.d = w.dv = d; w.seed = 60 + d;
      cases.push_back(w);
    }
    Case r; r.heads = 2; r.seqlen_q = 128; r.seqlen_k = 4096; r.causal = true; r.ramp_log2 = 300.f;
    cases.push_back(r);  // partials 2^300 apart, diagonal piece first
  }
  // Several query tiles per head with a right edge (launch_fwd.h fwd_key_split_eligible): every
  // tile is planned at all key blocks, so a piece past an early tile's last visible block runs
  // none of them (restrict_keys) and stores an empty partial, weight 0 in the merge. 700 x 1200:
  // the first tile sees only 5 of 10 blocks (6 of 10 at d64's 192 rows, 7 of 13 at d192's 96
  // keys, 8 of 15 at d256's 80), so whole pieces, and combiners' own pieces, see no key at all.
  for (int d : {64, 96, 128, 192, 256}) {
    Case c; c.heads = 2; c.heads_kv = 1; c.seqlen_q = 400; c.seqlen_k = 3000; c.d = c.dv = d; c.causal = true;
    c.seed = 80 + d;
    cases.push_back(c);
    c.seqlen_q = 700; c.seqlen_k = 1200; c.heads = 1; c.seed = 90 + d;
    cases.push_back(c);
  }
  {
    for (int d : {64, 128}) {  // a right window of 10 keys over three-four query tiles
      Case w; w.heads = 3; w.heads_kv = 1; w.seqlen_q = 500; w.seqlen_k = 2500; w.window_right = 10; w.sink = true;
      w.d = w.dv = d; w.seed = 100 + d;
      cases.push_back(w);
    }
    Case c; c.heads = 2; c.seqlen_q = 384; c.seqlen_k = 2048; c.causal = true; c.softcap = 25.f;
    c.dtype = DType::kFP16; c.d = 192; c.dv = 128;
    cases.push_back(c);
    Case r; r.heads = 2; r.seqlen_q = 384; r.seqlen_k = 4096; r.causal = true; r.ramp_log2 = 300.f;
    cases.push_back(r);  // partials 2^300 apart over three tiles of different lengths
  }
  for (const Case& c : cases) {
    Result split, whole;
    bool ran;
    {
      fa4::test::ScopedOverride on("stream_k", "1");
      ran = run_case(c, 2, &split);
    }
    if (!ran) continue;  // left out: nothing to compare
    {
      fa4::test::ScopedOverride off("stream_k", "0");
      run_case(c, 1, &whole);
    }
    // (Rising scores put every row's mass in the combiner's own first block: the other pieces add
    // below bf16 rounding there, so those two cases may round identically.)
    if (c.ramp_log2 == 0.f)
      EXPECT_NE(0, std::memcmp(split.out.data(), whole.out.data(), split.out.size() * 2))
          << c.name() << ": bitwise equal with and without the split; did the split run?";
  }
}

// Batched forwards with few query rows per KV head run on the decode kernel (pack-GQA rows, keys
// split over CTAs): one 16-row tile always, up to 128 rows where the forward kernel's tiles would
// not fill the GPU, up to 256 where the decode kernel runs one 8-warp split per tile; never with an
// explicit exp2 emulation share (the decode kernel has none), and not where the decode kernel's
// alignment rules fail (out 4-byte aligned only).
TEST(HopperFwd, SmallQueryForwardsRunOnTheDecodeKernel) {
  REQUIRE_HOPPER();
  struct Route {
    Case c;
    bool decode;
  };
  std::vector<Route> routes;
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  {
    Case c; c.seqlen_q = 1; c.seqlen_k = 1000; c.heads = 32; c.heads_kv = 8; routes.push_back({c, true});
    c.batch = 64; routes.push_back({c, true});                        // one row tile: any batch
    c.batch = 1; c.seqlen_q = 4; c.causal = true; c.sink = true; routes.push_back({c, true});
    c.seqlen_q = 128; c.heads = c.heads_kv = 8; c.d = c.dv = 64; routes.push_back({c, true});  // 8 tiles
    c.batch = 32; routes.push_back({c, false});                       // 256 forward tiles: fill the GPU
    // More than 128 rows: the forward, unless the decode kernel runs them as one 8-warp split per
    // row tile (hopper_api.cu decode_one_split_wins: 72 tiles over 16 key blocks; 32 blocks: not).
    c.batch = 1; c.seqlen_q = 129; routes.push_back({c, sms >= 72 && sms < 144});
    c.seqlen_k = 2048; routes.push_back({c, false});
    c.seqlen_k = 1000;
    c.d = c.dv = 128; c.seqlen_q = 16; c.exp2_fraction = 0.5f; routes.push_back({c, false});
    c.exp2_fraction.reset(); c.out_offset = 2; routes.push_back({c, false});  // decode needs 16-byte rows
    c.out_offset = 0; c.softcap = 10.f; c.window_left = 5; c.window_right = 0; routes.push_back({c, true});
    // Few forward tiles that walk every key: the forward splits its keys over the idle SMs (stream-K),
    // and the decode kernel's 128 narrow tiles (8 per KV head, each re-reading its keys) are more
    // than twice the forward's 16 (launch_decode.h small_q_decode_beats_split_forward).
    Case f; f.seqlen_q = 128; f.seqlen_k = 8192; f.heads = f.heads_kv = 16; routes.push_back({f, false});
    f.causal = true; routes.push_back({f, false});  // a causal chunk of one tile per head splits as well
    // Short keys (8 key blocks per forward tile): the forward's plan cuts them finer, and it is
    // taken from about half the SMs' worth of narrow decode tiles x 128 columns
    // (launch_decode.h small_q_decode_beats_fine_split_forward), except where the decode kernel
    // runs one 8-warp split per tile (decode_one_split_wins: tiles <= SMs < 2 x tiles).
    Case g; g.seqlen_q = 128; g.seqlen_k = 1024; g.heads = g.heads_kv = 24; g.causal = true;
    routes.push_back({g, false});  // 192 narrow tiles x 128
    g.heads = g.heads_kv = 16; routes.push_back({g, sms >= 128 && sms < 256});  // 128 tiles: one split each
    g.heads = g.heads_kv = 8; routes.push_back({g, true});  // 64 x 128
  }
  for (const Route& r : routes) {
    Result res;
    std::string kernel;
    run_case_on(r.c, 2, &res, kernel);
    if (kernel.empty()) continue;  // left out: its bucket not compiled in this build
    EXPECT_EQ(kernel.find("small-query") != std::string::npos, r.decode) << r.c.name() << ": " << kernel;
    if (r.decode) {  // and the forward kernel's answer passes the same checks
      fa4::test::ScopedOverride fwd("small_q", "fwd");
      run_case_on(r.c, 1, nullptr, kernel);
      EXPECT_EQ(kernel.find("small-query"), std::string::npos) << r.c.name();
    }
  }
}

}  // namespace
