// tests/gpu/test_hopper_fwd.cu — the Hopper forward kernels against the GPU fp32 reference
// (gpu_reference.cuh) through the public fa4::forward (backend kCuda).
//
// Rule (project guide): max|out - ref| <= 2 * max|naive16 - ref| + atol, same for LSE; outputs are
// poisoned (NaN) before each run; rows outside every sequence must keep the poison; fully masked
// rows must be exactly O = 0 and LSE = -inf (or the sink); NaN only where the reference has NaN.
// Fused-attention cases covered: C01/C06 (fully masked rows), C03/C13 (tails, NaN past the keys),
// C08 (window sentinels), C10/C12 (varlen zero-length, untouched padding rows), C16 (every head dim
// uses all channels), C18/C20 (strided views, size-1 dims), C21 (GQA grouping), C27 (bitwise
// repeatability), C28 (empty problems), C32 (softmax_scale).
// Sanitizer subset: --gtest_filter='HopperFwd.Sanitize*' (see tests/gpu/README.md).
#include "fwd_case.cuh"

namespace {

// ---- the option matrix ------------------------------------------------------------------------

TEST(HopperFwd, SeqlenSweepD64D128) {  // C13: every tail length, Sq = Sk and Sq = 1
  REQUIRE_HOPPER();
  // Around the 128-key and 128-row (d128) / 192-row (d64) tile edges.
  for (DType t : {DType::kBF16, DType::kFP16})
    for (int d : {64, 128})
      for (bool causal : {false, true})
        for (int s : {1, 17, 63, 65, 113, 127, 129, 191, 192, 193, 383, 385, 1023}) {
          Case c; c.dtype = t; c.d = c.dv = d; c.causal = causal; c.seqlen_q = c.seqlen_k = s;
          run_case(c);
          c.seqlen_q = 1; run_case(c, 1);
        }
}

TEST(HopperFwd, LongSequence4096) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Case c; c.seqlen_q = c.seqlen_k = 4096; c.causal = causal; c.heads = c.heads_kv = 2;
    run_case(c, 3);
  }
}

TEST(HopperFwd, AllHeadDims) {  // C16 / C14 / C32: every bucket and padded dims
  REQUIRE_HOPPER();
  const int dims[][2] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256}, {192, 128},
                         {40, 40}, {72, 72}, {104, 104}, {160, 160}, {136, 128}, {8, 8}};
  for (DType t : {DType::kBF16, DType::kFP16})
    for (auto& dd : dims)
      for (bool causal : {false, true}) {
        Case c; c.dtype = t; c.d = dd[0]; c.dv = dd[1]; c.causal = causal; c.seqlen_q = 200; c.seqlen_k = 333;
        run_case(c, 1);
      }
}

TEST(HopperFwd, SeqlenQNotSeqlenK) {  // C06: bottom-right causal, fully masked rows
  REQUIRE_HOPPER();
  const int shapes[][2] = {{2, 5}, {5, 2}, {300, 129}, {129, 700}, {1000, 64}, {64, 1000}};
  for (auto& s : shapes)
    for (bool causal : {false, true}) {
      Case c; c.seqlen_q = s[0]; c.seqlen_k = s[1]; c.causal = causal; c.d = c.dv = 64;
      run_case(c, 1);
    }
}

// d64 too: its windows with a right edge run the local kernel (per-warpgroup key ranges), the
// others its plain one.
TEST(HopperFwd, WindowsSoftcapSink) {  // C08 window sentinels, softcap, learnable sink
  REQUIRE_HOPPER();
  const int wins[][2] = {{-1, 0}, {0, 0}, {127, 0}, {64, 64}, {0, -1}, {300, 5}, {1, 1000}};
  for (int d : {128, 64}) {
    for (auto& w : wins) {
      Case c; c.seqlen_q = 333; c.seqlen_k = 517; c.window_left = w[0]; c.window_right = w[1];
      c.d = c.dv = d;
      run_case(c, 1);
    }
    Case c; c.seqlen_q = c.seqlen_k = 700; c.softcap = 15.f; c.causal = true; c.d = c.dv = d; run_case(c, 1);
    c.softcap = 0; c.sink = true; run_case(c, 1);
    c.seqlen_q = 300; c.seqlen_k = 100; run_case(c, 1);  // fully masked rows with a sink: LSE = sink
  }
}

TEST(HopperFwd, SoftmaxScaleAndFa4Knobs) {  // C32; exp2 emulation share and lazy-rescaling knobs
  REQUIRE_HOPPER();
  for (float s : {1.0f, 0.01f, 1.f / 128, 10.f}) {
    Case c; c.seqlen_q = c.seqlen_k = 513; c.scale = s; c.causal = true;
    // From scale 1 the logits of unit q and k (std s sqrt(d): 11 to 113) leave bf16's rounding of
    // S in the naive bound at up to the output's own size; q and k of std sqrt(3 / (s sqrt(d)))
    // keep them near std 3, where a wrongly applied scale still changes every row.
    if (s >= 1.f) c.qk_std = std::sqrt(3.f / (s * std::sqrt(float(c.d))));
    run_case(c, 1);
  }
  for (float f : {0.f, 0.125f, 0.5f, 1.f})
    for (float tau : {0.f, 8.f})
      for (int d : {64, 128}) {
        Case c; c.seqlen_q = c.seqlen_k = 777; c.d = c.dv = d; c.exp2_fraction = f; c.tau = tau;
        run_case(c, 1);
      }
}

TEST(HopperFwd, GqaMqa) {  // C21: kv_head = h / (H / Hkv)
  REQUIRE_HOPPER();
  for (int hk : {1, 2, 3}) {
    Case c; c.heads = 6; c.heads_kv = hk; c.seqlen_q = 257; c.seqlen_k = 300; c.causal = hk == 2;
    run_case(c, 1);
  }
}

TEST(HopperFwd, Varlen) {  // C10, C12 (padding rows untouched), seqused_k
  REQUIRE_HOPPER();
  {
    Case c; c.lens_q = {0, 1, 0, 1}; c.lens_k = {0, 3, 0, 5}; c.heads = 9; c.heads_kv = 3; c.d = c.dv = 64;
    c.causal = true; c.scale = 1.0f; run_case(c);
  }
  {
    Case c; c.lens_q = {3, 4}; c.lens_k = {3, 4}; c.pad_rows_q = 3; c.d = c.dv = 64; run_case(c);
  }
  for (bool causal : {false, true}) {
    Case c; c.lens_q = {100, 0, 513, 129, 1}; c.lens_k = {300, 7, 400, 129, 1000}; c.causal = causal;
    run_case(c);
    c.used_k = {250, 0, 399, 1, 999}; run_case(c, 1);
    c.nan_unused_k = true; run_case(c, 1);  // the smem V-tail zeroing and the key mask
  }
}

// A persistent CTA runs many tiles in a row through the same Q/K/V stage rings, tile-index ring
// and softmax state. These shapes give every CTA several consecutive tiles (>= 2x the 132 SMs)
// with what can differ between neighbours: key-block counts (causal), tiles without keys in
// between (seqlen_q > seqlen_k, bottom-right causal), varlen V tails zeroed in smem (NaN in unused
// K/V rows), the sink, softcap and windows; d64 has two Q buffers, d128 and d256 one; d64/d128
// stage O in their own O buffer, d256 in the tile's Q buffer (freed only after the TMA store).
TEST(HopperFwd, TileChainsAcrossBoundaries) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 256}) {
    Case c; c.d = c.dv = d; c.batch = 4; c.heads = c.heads_kv = 40; c.seqlen_q = c.seqlen_k = 300;
    run_case(c, 1);  // d128: 480 tiles of 3 key blocks (d64: 320 tiles of 192 rows)
    c.causal = true; c.heads_kv = 8; run_case(c, 1);
    c.seqlen_q = 700; c.seqlen_k = 300; c.batch = 2; c.sink = true; run_case(c, 1);  // keyless m-blocks
    c.sink = false; c.softcap = 20.f; c.causal = false; c.window_left = 100; c.window_right = 30;
    c.dtype = DType::kFP16; run_case(c, 1);
  }
  Case v; v.heads = 24; v.heads_kv = 8; v.causal = true;
  std::mt19937 rng(7);
  for (int b = 0; b < 24; ++b) {
    v.lens_q.push_back(int(rng() % 400));
    v.lens_k.push_back(v.lens_q.back() + int(rng() % 300));
  }
  v.used_k = v.lens_k;
  for (int& u : v.used_k) u = u > 0 ? u - int(rng() % u) / 2 : 0;
  v.nan_unused_k = true;
  for (int d : {64, 128}) {
    v.d = v.dv = d;
    run_case(v, 1);
  }
}

// C28 on the GPU: empty problems write nothing; seqlen_k = 0 makes every row fully masked.
TEST(HopperFwd, EmptyProblemsAndNoKeys) {
  REQUIRE_HOPPER();
  for (bool causal : {false, true}) {
    Case c; c.causal = causal;
    c.seqlen_q = 300; c.seqlen_k = 0; run_case(c, 1);  // O = 0, LSE = -inf everywhere
    c.seqlen_q = 0; c.seqlen_k = 50; run_case(c, 1);
    c.batch = 0; c.seqlen_q = 64; run_case(c, 1);
  }
  Case v; v.lens_q = {0, 0}; v.lens_k = {0, 5}; v.pad_rows_q = 4; run_case(v, 1);  // padding keeps poison
  Case w; w.lens_q = {130, 3}; w.lens_k = {0, 0}; w.causal = true; run_case(w, 1);
}

TEST(HopperFwd, StridedPackedQkvAndNaNPastKeys) {  // C18/C20 strided views; C03/C13 garbage past K
  REQUIRE_HOPPER();
  Case c; c.packed_qkv = true; c.seqlen_q = c.seqlen_k = 300; c.heads = c.heads_kv = 3; c.batch = 2;
  run_case(c);
  c.causal = true; run_case(c, 1);
  Case n; n.nan_past_k = true; n.seqlen_q = 100; n.seqlen_k = 77; n.batch = 1; run_case(n, 1);
}

// O leaves through smem + TMA when out is 16-byte aligned (batched layouts), else through direct
// stores: 4-byte pairs (out 4-byte aligned) or single elements. Every path, with row tails.
TEST(HopperFwd, OutputStorePaths) {
  REQUIRE_HOPPER();
  for (int off : {0, 1, 2, 8})
    for (int d : {64, 128}) {
      Case c; c.batch = 2; c.heads = c.heads_kv = 3; c.seqlen_q = 200; c.seqlen_k = 300; c.d = c.dv = d;
      c.causal = d == 128; c.out_offset = off; run_case(c, 1);
    }
  Case p; p.d = 192; p.dv = 128; p.seqlen_q = 77; p.seqlen_k = 500; p.out_offset = 2; run_case(p, 1);
  p.out_offset = 0; run_case(p, 1);
  // The TMA and the direct store of the same O must agree bitwise (override epilogue = direct
  // forces the direct path where TMA would run); each run counted on the path it should take.
  for (int d : {64, 128, 256}) {
    Case c; c.batch = 2; c.heads = c.heads_kv = 2; c.seqlen_q = 333; c.seqlen_k = 257; c.d = c.dv = d; c.causal = true;
    Result tma, direct;
    const uint64_t before = fa4::hopper::fwd_tma_epilogue_calls();
    if (!run_case(c, 1, &tma)) continue;  // left out: nothing to compare
    EXPECT_EQ(fa4::hopper::fwd_tma_epilogue_calls() - before, 1u) << c.name() << ": the TMA path";
    {
      fa4::test::ScopedOverride direct_store("epilogue", "direct");
      const uint64_t before_direct = fa4::hopper::fwd_tma_epilogue_calls();
      run_case(c, 1, &direct);
      EXPECT_EQ(fa4::hopper::fwd_tma_epilogue_calls(), before_direct) << c.name() << ": the direct path";
    }
    EXPECT_EQ(0, std::memcmp(tma.out.data(), direct.out.data(), tma.out.size() * 2)) << c.name();
  }
}

// C03(b): a NaN in one query row's data comes out as that row's out and lse, and nowhere else.
// out and lse start as finite sentinels (a row the kernel skipped would keep them), bf16 and fp16,
// three buckets, causal and not.
TEST(HopperFwd, NaNInQueryPropagates) {
  REQUIRE_HOPPER();
  const int S = 200, H = 2;
  const float kOutSentinel = 1000.f, kLseSentinel = -12345.f;
  for (DType t : {DType::kBF16, DType::kFP16})
    for (int D : {64, 128, 256})
      for (bool causal : {false, true}) {
        if (fa4::test::leave_out(D, D, fa4::test::kFwd)) continue;
        SCOPED_TRACE(std::string(t == DType::kBF16 ? "bf16" : "fp16") + " d" + std::to_string(D) +
                     (causal ? " causal" : ""));
        std::vector<uint16_t> hq(S * H * D), hk(S * H * D), hv(S * H * D);
        std::mt19937 rng(fa4::test::next_seed());
        std::normal_distribution<float> nd;
        for (auto* v : {&hq, &hk, &hv}) for (auto& x : *v) x = fa4::test::to16(t, nd(rng));
        for (int d = 0; d < D; ++d) hq[(5 * H + 1) * D + d] = kPoison16;  // query row 5, head 1 is NaN
        DevBuf<uint16_t> q(hq.size()), k(hk.size()), v(hv.size()), o(hq.size());
        DevBuf<float> l(S * H);
        q.upload(hq); k.upload(hk); v.upload(hv);
        o.upload(std::vector<uint16_t>(hq.size(), fa4::test::to16(t, kOutSentinel)));
        l.upload(std::vector<float>(S * H, kLseSentinel));
        const auto dev = fa4::Device::cuda(0);
        fa4::AttentionOptions opt;
        opt.backend = fa4::Backend::kCuda;
        opt.causal = causal;
        fa4::forward(TensorView::contiguous(q.ptr, t, {1, S, H, D}, dev), TensorView::contiguous(k.ptr, t, {1, S, H, D}, dev),
                     TensorView::contiguous(v.ptr, t, {1, S, H, D}, dev), TensorView::contiguous(o.ptr, t, {1, S, H, D}, dev),
                     TensorView::contiguous(l.ptr, DType::kFP32, {1, H, S}, dev), opt);
        CUDA_OK(cudaDeviceSynchronize());
        const auto ho = o.download();
        const auto hl = l.download();
        for (int i = 0; i < S; ++i)
          for (int h = 0; h < H; ++h) {
            const bool nan_row = i == 5 && h == 1;
            ASSERT_EQ(std::isnan(hl[h * S + i]), nan_row) << "lse " << i << " " << h << ": " << hl[h * S + i];
            ASSERT_NE(hl[h * S + i], kLseSentinel) << "lse " << i << " " << h << " unwritten";
            for (int d = 0; d < D; ++d) {
              const float x = fa4::test::from16(t, ho[(i * H + h) * D + d]);
              ASSERT_EQ(std::isnan(x), nan_row) << "out " << i << " " << h << " " << d << ": " << x;
              ASSERT_NE(x, kOutSentinel) << "out " << i << " " << h << " " << d << " unwritten";
            }
          }
      }
}

TEST(HopperFwd, MisalignedStrideIsAClearError) {
  REQUIRE_HOPPER();
  DevBuf<uint16_t> buf(4 * 100 * 2 * 72), obuf(100 * 2 * 64), lbuf(2 * 2 * 100);
  const auto dev = fa4::Device::cuda(0);
  // Row stride 2*68+4 = 140 elements = 280 bytes: not a multiple of 16 -> TMA cannot load it.
  // (out and lse in buffers of their own: outputs must not overlap another tensor.)
  auto q = TensorView::strided(buf.ptr, DType::kBF16, {1, 100, 2, 64}, {100 * 140, 140, 68, 1}, dev);
  auto out = TensorView::contiguous(obuf.ptr, DType::kBF16, {1, 100, 2, 64}, dev);
  auto lse = TensorView::contiguous(lbuf.ptr, DType::kFP32, {1, 2, 100}, dev);
  fa4::AttentionOptions opt; opt.backend = fa4::Backend::kCuda;
  const std::string why = fa4::forward_support(q, q, q, out, lse, opt);
  EXPECT_NE(why.find("16 bytes"), std::string::npos) << why;
  try {
    fa4::forward(q, q, q, out, lse, opt);
    FAIL() << "expected fa4::Error";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kUnsupported);
  }
}

// An explicit exp2 share the 16-group rule cannot give on a key tile that is not a multiple of 128
// columns (d >= 192 buckets) is refused, never silently changed; 0 stays supported.
TEST(HopperFwd, Exp2FractionOnNon128KeyTileIsAClearError) {
  REQUIRE_HOPPER();
  REQUIRE_BUCKETS(256, 256, fa4::test::kFwd);  // without it the answer is "not compiled"
  DevBuf<uint16_t> buf(64 * 2 * 256), obuf(64 * 2 * 256);
  DevBuf<float> lbuf(2 * 64);
  const auto dev = fa4::Device::cuda(0);
  auto x = TensorView::contiguous(buf.ptr, DType::kBF16, {1, 64, 2, 256}, dev);
  auto out = TensorView::contiguous(obuf.ptr, DType::kBF16, {1, 64, 2, 256}, dev);
  auto lse = TensorView::contiguous(lbuf.ptr, DType::kFP32, {1, 2, 64}, dev);
  fa4::AttentionOptions opt;
  opt.backend = fa4::Backend::kCuda;
  opt.exp2_emulation_fraction = 0.25f;
  const std::string why = fa4::forward_support(x, x, x, out, lse, opt);
  EXPECT_NE(why.find("exp2_emulation_fraction"), std::string::npos) << why;
  opt.exp2_emulation_fraction = 0.0f;
  EXPECT_EQ(fa4::forward_support(x, x, x, out, lse, opt), "");
}

// A device index that does not exist is a clear error (not a crash or a cache overrun).
TEST(HopperFwd, MissingDeviceIsAClearError) {
  REQUIRE_HOPPER();
  DevBuf<uint16_t> buf(16 * 64), obuf(16 * 64);
  DevBuf<float> lbuf(16);
  const auto dev = fa4::Device::cuda(4096);
  auto x = TensorView::contiguous(buf.ptr, DType::kBF16, {1, 16, 1, 64}, dev);
  auto out = TensorView::contiguous(obuf.ptr, DType::kBF16, {1, 16, 1, 64}, dev);
  auto lse = TensorView::contiguous(lbuf.ptr, DType::kFP32, {1, 1, 16}, dev);
  const std::string why = fa4::forward_support(x, x, x, out, lse, {});
  EXPECT_NE(why.find("does not exist"), std::string::npos) << why;
}

// Random inputs move a row's running max almost only in the first key block, so the lazy-rescaling
// paths (a warp votes to rescale O and l mid-tile) barely run elsewhere. Here the scores rise from
// each key block to the one before it, i.e. at every step of the descending key loop, by:
//   * 7 log2 units: below tau = 8, so no max moves, but a thread's sum of P passes 2^8 and takes
//     step_from_running_max's read-off path, which must then leave m alone;
//   * 20: a rescale at every block;
//   * 100: the block max read off exponentials up to 2^100;
//   * 124: exponentials past 2^120 count as overflowed; their scores are recomputed from smem
//     (rescale_after_overflow);
//   * 300: MUFU gives +inf and the emulated exp2 is capped at 2^127: the same recompute. 2^300
//     overflows fp32, so a missed rescale would give inf/NaN.
// Each with tau = 8 and tau = 0, both exp2 paths and every exponential emulated (the 127 cap
// alone must flag the overflow), and rows whose keys start only in a later block (causal,
// seqlen_q < seqlen_k). Also: d96 and d192x128 (other smem layouts for the recompute), head dim 112
// on the 128 bucket (zero-filled columns), a left window (masked entries inside the key loop) and
// d256 (80-key tiles, the max-first loop of the MMA-bound buckets).
TEST(HopperFwd, RisingScoresMoveTheMax) {
  REQUIRE_HOPPER();
  for (float ramp : {20.f, 300.f}) {
    Case c; c.d = c.dv = 256; c.seqlen_q = 200; c.seqlen_k = 500; c.ramp_log2 = ramp; c.causal = true;
    run_case(c, 1);
  }
  for (int d : {64, 128})
    for (float ramp : {7.f, 20.f, 100.f, 124.f, 300.f}) {
      Case c; c.d = c.dv = d; c.seqlen_q = 300; c.seqlen_k = 600; c.ramp_log2 = ramp; c.seed = 11 + d;
      run_case(c, 1);
      c.causal = true; c.dtype = DType::kFP16; run_case(c, 1);
      c.tau = 0.f; c.exp2_fraction = 0.5f; run_case(c, 1);
      c.tau = 8.f; c.exp2_fraction = 1.f; run_case(c, 1);
    }
  for (float ramp : {100.f, 300.f}) {
    Case c; c.seqlen_q = 300; c.seqlen_k = 600; c.ramp_log2 = ramp;
    c.d = c.dv = 96; run_case(c, 1);
    c.d = 192; c.dv = 128; c.causal = true; run_case(c, 1);
    c.d = c.dv = 112; c.causal = false; run_case(c, 1);
    c.d = c.dv = 128; c.window_left = 300; c.window_right = 0; run_case(c, 1);
  }
}

// ---- sanitizer subset (small, every code path once) ----------------------------------------------
TEST(HopperFwd, SanitizeSmall) {
  REQUIRE_HOPPER();
  Case c; c.seqlen_q = 200; c.seqlen_k = 333; c.causal = true; c.d = c.dv = 64; run_case(c, 1);
  Case s; s.seqlen_q = 3; s.seqlen_k = 333; s.heads = 8; s.heads_kv = 2; s.causal = true; run_case(s, 1);
  Case v; v.lens_q = {100, 0, 200}; v.lens_k = {50, 7, 300}; v.d = v.dv = 128; run_case(v, 1);
  // More tiles than SMs with a causal mask: the dynamic tile counter and the tile-index ring.
  Case d; d.batch = 2; d.heads = d.heads_kv = 80; d.seqlen_q = d.seqlen_k = 129; d.causal = true;
  d.d = d.dv = 64; run_case(d, 1);
  // Two tiles or more per CTA with the TMA epilogue: d128 stages O in its O buffer (the next Q
  // loads before the store), d256 in the tile's Q buffer (the next Q loads after it), d64 from
  // three warpgroups (two full 192-row tiles and a 16-row one per head).
  Case f; f.heads = f.heads_kv = 140; f.seqlen_q = f.seqlen_k = 200; run_case(f, 1);
  f.d = f.dv = 256; run_case(f, 1);
  f.d = f.dv = 64; f.seqlen_q = f.seqlen_k = 400; run_case(f, 1);
  // A causal chunk's keys split over CTAs (stream-K): partials, flags and the combiner's merge, on
  // d64's local kernel (a warpgroup past the chunk's rows passes every piece through) and on d128.
  fa4::test::ScopedOverride split("stream_k", "1"), fwd_kernel("small_q", "fwd");
  Case k; k.seqlen_q = 100; k.seqlen_k = 2000; k.causal = true; k.d = k.dv = 64; run_case(k, 1);
  k.d = k.dv = 128; run_case(k, 1);
}

}  // namespace
