// tests/gpu/test_hopper_bwd.cu — the Hopper backward against the float64 oracle, through the public
// fa4::forward + fa4::backward on CUDA tensors (the forward's out and lse feed the backward, as in
// training). More of the option matrix: test_hopper_bwd_options.cu; training layouts:
// test_hopper_bwd_layouts.cu.
//
// Rule (tests/accuracy_check.h, the one `fa4 check` uses): for out, lse, dq, dk, dv and dsink,
// max|x - ref64| <= 2 * max|naive_same_precision - ref64| + atol (+ the documented stored-O term for
// the gradients); every output is poisoned (NaN) before the run and must be written exactly where
// the oracle writes (varlen rows outside the sequences stay poisoned); NaN never passes. Inputs are
// drawn fresh for every run (tests/test_util.h next_seed; FA4_TEST_SEED replays a failure).
// Cases of ../shared/cases covered here for the backward: fully masked rows give zero gradients, never
// NaN (causal with seqlen_q > seqlen_k, windows); seqlen_q != seqlen_k bottom-right; tails that are
// not a multiple of the tiles; GQA/MQA sums of dK/dV; varlen; padded head dims use every channel;
// dsink; deterministic mode bitwise over 10 runs and across tile orders; NaN in one varlen
// sequence's rows never reaches the others' gradients; invalid device-side varlen indices
// (skipped, reported asynchronously); a head dim the kernels cannot read is a clear kUnsupported.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpu/bwd_case.cuh"
#include "hopper/bwd/tuning_bwd.h"
#include "hopper/hopper_api.h"

namespace {

TEST(HopperBwd, EveryBucketAndDtype) {
  REQUIRE_HOPPER();
  for (int d : {64, 96, 128})  // 96 runs on the d128 backward
    for (const char* t : {"bf16", "fp16"}) {
      check_case(base(d, t));
      CaseSpec c = base(d, t);
      c.causal = true;
      check_case(c);
    }
}

TEST(HopperBwd, TailsAndBottomRightCausal) {
  REQUIRE_HOPPER();
  for (int d : {64, 128}) {
    CaseSpec c = base(d);
    c.seqlen_q = 130;  // tails in both the query blocks (64 rows; d64: 128) and the 128-key blocks
    c.seqlen_k = 257;
    check_case(c);
    c.causal = true;
    check_case(c);
    c.seqlen_q = 300;  // more queries than keys: the first 200 rows see no key (zero gradients)
    c.seqlen_k = 100;
    check_case(c);
    c.seqlen_q = 1;    // a decode-like row against many keys
    c.seqlen_k = 700;
    check_case(c);
    c.seqlen_q = 0;    // no queries: dk = dv = 0 are written (and dq is empty)
    c.seqlen_k = 200;
    check_case(c);
    c.seqlen_q = 200;  // no keys: dq = 0, dk/dv empty
    c.seqlen_k = 0;
    check_case(c);
  }
}

TEST(HopperBwd, WindowsSoftcapSinkScale) {
  REQUIRE_HOPPER();
  CaseSpec c = base(128);
  c.window = {32, 8};
  check_case(c);
  c.window = {0, 0};  // the diagonal only
  check_case(c);
  c = base(64);
  c.softcap = 5.f;
  check_case(c);
  c.window = {40, 20};  // d64's 128-row query blocks: windowed steps with softcap
  c.seqlen_q = 300;
  c.seqlen_k = 333;
  check_case(c);
  c.softcap = 0.f;
  c.causal = true;      // a causal window
  c.window = {100, -1};
  check_case(c);
  c = base(128);
  c.sink = true;
  check_case(c);
  c.causal = true;
  c.softmax_scale = 0.3f;
  check_case(c);
}

TEST(HopperBwd, GqaMqaVarlenPaddedDims) {
  REQUIRE_HOPPER();
  CaseSpec c = base(128);
  c.num_heads = 8;
  c.num_heads_kv = 2;
  c.causal = true;
  check_case(c);
  c.num_heads_kv = 1;
  c.seqlen_q = 200;
  c.seqlen_k = 333;
  check_case(c);
  c = base(64);
  c.batch = 5;
  c.varlen = true;  // random lengths in [1, 300]
  c.seqlen_q = c.seqlen_k = 300;
  c.num_heads_kv = 2;
  check_case(c);
  c.causal = true;
  c.sink = true;
  check_case(c);
  // seqused_k: keys past a sequence's used length are not attended and their dK/dV rows stay
  // untouched (poisoned); one sequence uses none of its keys.
  c.causal = false;
  c.lens_k = {300, 256, 128, 77, 400};
  c.used_k = {300, 256, 100, 0, 250};
  c.seqlen_k = 400;
  check_case(c);
  for (int d : {40, 72, 112}) {  // padded: 40 runs on the d64 backward, 72 and 112 on the d128
    c = base(d, "fp16");
    c.causal = true;
    check_case(c);
  }
}

TEST(HopperBwd, LongerSequences) {
  REQUIRE_HOPPER();
  for (int d : {64, 128}) {
    CaseSpec c = base(d);
    c.batch = 1;
    c.num_heads = 2;
    c.seqlen_q = c.seqlen_k = 1500;
    check_case(c);
    c.causal = true;
    check_case(c);
  }
}

/// One bucket whose warpgroups share the 64 keys of a tile (d256, d192, 192 x 128: P^T through
/// smem, dQ in tuning_bwd.h dq_parts parts per warpgroup; the 192 buckets skip or narrow warpgroup
/// 1's padding): both dtypes, causal and not; tails of the 64-key blocks, rows without keys, empty sides (causal); GQA,
/// MQA; varlen + sink (fp16); softcap; a window.
void check_shared_key_bucket(int d, int dv) {
  auto spec = [&](const char* dtype = "bf16") {
    CaseSpec s = base(d, dtype);
    s.headdim_v = dv;
    return s;
  };
  for (const char* t : {"bf16", "fp16"})
    for (bool causal : {false, true}) {
      CaseSpec c = spec(t);
      c.causal = causal;
      check_case(c);
    }
  CaseSpec c = spec();
  c.causal = true;
  const int32_t lengths[][2] = {{130, 257}, {300, 100}, {1, 700}, {0, 200}, {200, 0}, {64, 63}};
  for (const auto& qk : lengths) {
    c.seqlen_q = qk[0];
    c.seqlen_k = qk[1];
    check_case(c);
  }
  c = spec();
  c.num_heads = 8;
  c.num_heads_kv = 2;
  c.seqlen_q = 200;
  c.seqlen_k = 333;
  check_case(c);
  c.num_heads_kv = 1;
  c.causal = true;
  check_case(c);
  c = spec("fp16");
  c.batch = 5;
  c.varlen = true;  // random lengths in [1, 300]
  c.seqlen_q = c.seqlen_k = 300;
  c.num_heads_kv = 2;
  c.causal = true;
  c.sink = true;
  check_case(c);
  c = spec();
  c.softcap = 5.f;
  check_case(c);
  c.softcap = 0.f;
  c.window = {40, 8};
  check_case(c);
}

/// The buckets above d128 (256 x 256 tiles for d256 and d192, 256 x 128 for 192 x 128), and head
/// dims padded onto each: 136 (d192), 136 x 128 (192 x 128), 200 and 128 x 256 (d256).
TEST(HopperBwd, WideHeadDims) {
  REQUIRE_HOPPER();
  check_shared_key_bucket(256, 256);
  check_shared_key_bucket(192, 192);
  check_shared_key_bucket(192, 128);
  for (const auto& [d, dv] : {std::pair{136, 136}, std::pair{136, 128}, std::pair{200, 200}, std::pair{128, 256}}) {
    CaseSpec c = base(d);
    c.headdim_v = dv;
    c.causal = d != 128;
    check_case(c);
  }
}

/// dK and dV through smem + TMA stores (TMA-aligned: the default) are bitwise those of the direct
/// register stores (override epilogue = direct): the same registers, the same rounding. Each run
/// writes onto poisoned outputs; the TMA run must take the TMA path (counted). Tails (300 keys:
/// a last key block of 44 rows, clipped by TMA), a padded head dim (96 on the d128 kernel: columns
/// clipped), GQA, causal with seqlen_q < seqlen_k, fp16, a window (key blocks no query sees: zeros
/// through TMA), more tiles than SMs (the dS buffers staged again by the CTA's next tile); dq too in
/// deterministic mode, dK / dV alone in the default mode (dq's adds are unordered there); varlen
/// (whole key blocks through TMA at their sequence's offset, a sequence's partial last block direct:
/// a box past it would overwrite the next sequence's rows).
TEST(HopperBwd, DkDvTmaEpilogueMatchesDirect) {
  REQUIRE_HOPPER();
  struct Shape {
    int d;
    const char* dtype;
    int heads, heads_kv, seqlen_q, seqlen_k;
    bool window, deterministic, varlen;
  };
  const Shape shapes[] = {
      {64, "bf16", 4, 2, 200, 300, false, true, false},     {96, "bf16", 4, 2, 200, 300, false, true, false},
      {128, "bf16", 4, 2, 200, 300, false, true, false},    {128, "fp16", 4, 2, 200, 300, true, true, false},
      {128, "bf16", 8, 4, 1000, 5176, false, true, false},  {64, "fp16", 8, 4, 1000, 5176, true, false, false},
      {128, "bf16", 4, 2, 300, 400, false, true, true},     {64, "fp16", 4, 4, 300, 400, true, false, true},
  };
  for (const Shape& sh : shapes) {
    if (fa4::test::leave_out(sh.d, sh.d, fa4::test::kFwd | fa4::test::kBwd)) continue;
    CaseSpec s = deterministic_case(sh.d, sh.d, !sh.window);
    s.dtype = sh.dtype;
    s.deterministic = sh.deterministic;
    if (sh.window) s.window = {150, 0};
    if (sh.varlen) {
      // Key blocks of 64 or 128: whole ones through TMA, then a partial last block (300, 77), a
      // whole one ending at the next sequence (256, 128), and used lengths that cut a block (100,
      // 250; rows past them stay poisoned, so a box written past them fails deterministically)
      // or use no key (0).
      s.varlen = true;
      s.batch = 5;
      s.lens_k = {300, 256, 128, 77, 400};
      s.used_k = {300, 256, 100, 0, 250};
    }
    s.seqlen_q = sh.seqlen_q;
    s.seqlen_k = sh.seqlen_k;
    s.num_heads = sh.heads;
    s.num_heads_kv = sh.heads_kv;
    s.seed = fa4::test::next_seed();
    Problem p = Problem::make(s);
    DeviceProblem dp(p, nullptr);
    fa4::cli::run_forward(p, dp.placement(), fa4::Backend::kCuda);
    std::vector<std::vector<char>> got[2];
    for (int direct = 0; direct < 2; ++direct) {
      const fa4::test::ScopedOverride epilogue("epilogue", direct ? "direct" : "tma");
      poison_gradients(dp, p);  // a row only one path writes shows as NaN against the other
      const uint64_t before = fa4::hopper::bwd_tma_epilogue_calls();
      fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
      EXPECT_EQ(fa4::hopper::bwd_tma_epilogue_calls() - before, direct ? 0u : 1u) << s.describe() << ": the TMA path";
      dp.download_outputs();
      got[direct] = {tensor_bytes(p.dk), tensor_bytes(p.dv)};
      if (sh.deterministic) got[direct].push_back(tensor_bytes(p.dq));
    }
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    for (size_t i = 0; i < got[0].size(); ++i)
      EXPECT_TRUE(got[0][i] == got[1][i]) << s.describe() << " tensor " << i << " (dk, dv, dq)";
  }
}

/// deterministic = true: ten backward runs on the same inputs, each onto poisoned gradients, give
/// bitwise-equal dq, dk, dv (dense, causal and a window: three tile orders / query-block ranges),
/// and the first run passes the accuracy rule.
TEST(HopperBwd, DeterministicBitwise) {
  REQUIRE_HOPPER();
  for (const fa4::detail::HopperBwdConfig& row : fa4::detail::kHopperBwdConfigs)  // every bucket
  for (int mask = 0; mask < 3; ++mask) {
    const int d = row.headdim, dv = row.headdim_v;
    if (fa4::test::leave_out(d, dv, fa4::test::kFwd | fa4::test::kBwd)) continue;
    CaseSpec s = deterministic_case(d, dv, mask == 1);
    if (mask == 2) s.window = {300, 100};
    s.batch = 1;
    s.num_heads = 4;
    s.num_heads_kv = 2;
    s.seqlen_q = s.seqlen_k = 1024;  // 8 key blocks add into every query block's dQ
    check_deterministic_runs(s);
  }
}

/// Deterministic mode under other tile orders (overrides bwd_lpt_band, bwd_walk): several bands, a
/// narrower last band, more tiles than SMs (waits across rounds). dq is added in ascending key
/// block order whatever the order, so it is bitwise that of band 1 with an ascending walk; dK/dV
/// sum a CTA's query blocks in its walk's order, so they are bitwise equal between bands of one
/// walk direction. Causal and not, every bucket (shared keys: 82 key blocks of 64).
TEST(HopperBwd, DeterministicAcrossTileOrders) {
  REQUIRE_HOPPER();
  for (const fa4::detail::HopperBwdConfig& row : fa4::detail::kHopperBwdConfigs)
    for (bool causal : {false, true}) {
      const int d = row.headdim, dv = row.headdim_v;
      if (fa4::test::leave_out(d, dv, fa4::test::kFwd | fa4::test::kBwd)) continue;
      CaseSpec s = deterministic_case(d, dv, causal);
      s.batch = 2;
      s.num_heads = 8;
      s.num_heads_kv = 4;
      s.seqlen_q = s.seqlen_k = 40 * 128 + 56;  // 41 key blocks: bands of 16 leave a last band of 9
      s.seed = fa4::test::next_seed();
      Problem p = Problem::make(s);
      DeviceProblem dp(p, nullptr);
      fa4::cli::run_forward(p, dp.placement(), fa4::Backend::kCuda);
      struct Order {
        const char* band;
        const char* walk;
        const char* schedule;  // claimed greedily (dynamic; rows with tile_claims) or a static stride (328 tiles)
      };
      std::vector<std::vector<char>> ref[2];  // by walk: dq, dk, dv of the first band run
      for (const Order& o : {Order{"1", "asc", "auto"}, Order{"16", "asc", "auto"}, Order{"3", "asc", "dynamic"},
                             Order{"1", "desc", "static"}, Order{"16", "desc", "dynamic"},
                             Order{"16", "desc", "static"}, Order{"5", "desc", "auto"}}) {
        const fa4::test::ScopedOverride band("bwd_lpt_band", o.band);
        const fa4::test::ScopedOverride walk("bwd_walk", o.walk);
        const fa4::test::ScopedOverride schedule("schedule", o.schedule);
        poison_gradients(dp, p);
        fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
        dp.download_outputs();
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        const std::vector<std::vector<char>> now{tensor_bytes(p.dq), tensor_bytes(p.dk), tensor_bytes(p.dv)};
        const int w = std::strcmp(o.walk, "desc") == 0;
        if (ref[w].empty()) ref[w] = now;
        EXPECT_TRUE(now[0] == ref[0][0])
            << "dq, band " << o.band << " walk " << o.walk << " schedule " << o.schedule << ": " << s.describe();
        EXPECT_TRUE(now[1] == ref[w][1] && now[2] == ref[w][2])
            << "dk/dv, band " << o.band << " walk " << o.walk << " schedule " << o.schedule << ": " << s.describe();
      }
    }
}

/// Varlen: the rows just past a sequence's last query block (tile_m rows) and key block (tile_n) are
/// the next sequence's, and its gradients are multiplied by an exact 0 there. NaN in all of the
/// middle sequence's q, k, v and dout rows must leave the other two sequences' dq, dk and dv
/// bitwise those of a run with finite inputs (deterministic mode), in every bucket (d256 and
/// the 192 buckets: key blocks of 64), causal or not.
TEST(HopperBwd, VarlenNaNInTheNextSequenceStaysThere) {
  REQUIRE_HOPPER();
  for (const fa4::detail::HopperBwdConfig& bucket : fa4::detail::kHopperBwdConfigs)
    for (bool causal : {false, true}) {
      const int d = bucket.headdim, dv = bucket.headdim_v;
      if (fa4::test::leave_out(d, dv, fa4::test::kFwd | fa4::test::kBwd)) continue;
      const fa4::detail::HopperBwdConfig* row = &bucket;
      CaseSpec s = deterministic_case(d, dv, causal);
      s.batch = 3;
      s.varlen = true;  // random lengths in [1, 300]
      s.seqlen_q = s.seqlen_k = 300;
      s.num_heads_kv = 2;
      Problem p;
      do {  // sequence 0 must end inside a query block and a key block
        s.seed = fa4::test::next_seed();
        p = Problem::make(s);
      } while (p.seq.len_q(0) % row->tile_m == 0 || p.seq.len_k(0) % row->tile_n == 0 || p.seq.len_q(1) == 0 ||
               p.seq.len_k(1) == 0);
      DeviceProblem dp(p, nullptr);
      fa4::cli::run_forward(p, dp.placement(), fa4::Backend::kCuda);
      fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
      dp.download_outputs();
      const std::vector<char> good_dq = tensor_bytes(p.dq), good_dk = tensor_bytes(p.dk), good_dv = tensor_bytes(p.dv);
      const fa4::cli::Placement& at = dp.placement();
      // Sequence 1's input rows to NaN (0xFF bytes) and the gradients poisoned again, then the
      // backward again (out and lse of the finite forward: sequence 1's gradients become NaN, the
      // others' must come out bitwise as before).
      auto fill_seq1 = [&](void* ptr, const fa4::test::HostTensor& t, const std::vector<int32_t>& cu, int64_t total,
                           int byte) {
        const size_t row = size_t(t.numel()) * fa4::dtype_size(t.dtype()) / size_t(total);
        ASSERT_EQ(cudaMemset(static_cast<char*>(ptr) + size_t(cu[1]) * row, byte, size_t(cu[2] - cu[1]) * row),
                  cudaSuccess);
      };
      auto poison_seq1 = [&](void* ptr, const fa4::test::HostTensor& t, const std::vector<int32_t>& cu, int64_t total) {
        fill_seq1(ptr, t, cu, total, 0xFF);
      };
      poison_seq1(at.q, p.q, p.seq.cu_q, p.seq.total_q());
      poison_seq1(at.dout, p.dout, p.seq.cu_q, p.seq.total_q());
      poison_seq1(at.k, p.k, p.seq.cu_k, p.seq.total_k());
      poison_seq1(at.v, p.v, p.seq.cu_k, p.seq.total_k());
      poison_gradients(dp, p);
      // Sequence 1's gradient rows start finite (0), not as the 0xFF poison (itself a NaN), so a NaN
      // found there below was written by the kernel.
      fill_seq1(at.dq, p.dq, p.seq.cu_q, p.seq.total_q(), 0);
      fill_seq1(at.dk, p.dk, p.seq.cu_k, p.seq.total_k(), 0);
      fill_seq1(at.dv, p.dv, p.seq.cu_k, p.seq.total_k(), 0);
      fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      dp.download_outputs();
      auto same_outside_seq1 = [&](const std::vector<char>& good, const fa4::test::HostTensor& t,
                                   const std::vector<int32_t>& cu, int64_t total, const char* name) {
        const std::vector<char> got = tensor_bytes(t);
        const size_t row = got.size() / size_t(total);
        for (size_t i = 0; i < got.size(); ++i) {
          const bool seq1 = i >= size_t(cu[1]) * row && i < size_t(cu[2]) * row;
          if (!seq1 && got[i] != good[i]) {
            ADD_FAILURE() << name << " byte " << i << " (row " << i / row << ") moved: " << s.describe();
            return;
          }
        }
      };
      same_outside_seq1(good_dq, p.dq, p.seq.cu_q, p.seq.total_q(), "dq");
      same_outside_seq1(good_dk, p.dk, p.seq.cu_k, p.seq.total_k(), "dk");
      same_outside_seq1(good_dv, p.dv, p.seq.cu_k, p.seq.total_k(), "dv");
      // The poisoning reached the kernel: sequence 1's dq, dk and dv rows (zeroed above) hold NaN
      // (its rows that see a key, its keys that a query sees).
      auto seq1_has_nan = [&](const fa4::test::HostTensor& t, const std::vector<int32_t>& cu, int64_t total) {
        const std::vector<char> got = tensor_bytes(t);
        const size_t row = got.size() / size_t(total);
        for (int64_t r = cu[1]; r < cu[2]; ++r)
          for (size_t c = 0; c + 2 <= row; c += 2) {
            uint16_t x;  // bf16: NaN when the exponent is all ones and the mantissa is not zero
            std::memcpy(&x, got.data() + size_t(r) * row + c, 2);
            if ((x & 0x7F80) == 0x7F80 && (x & 0x007F) != 0) return true;
          }
        return false;
      };
      EXPECT_TRUE(seq1_has_nan(p.dq, p.seq.cu_q, p.seq.total_q())) << "sequence 1's dq has no NaN: " << s.describe();
      EXPECT_TRUE(seq1_has_nan(p.dk, p.seq.cu_k, p.seq.total_k())) << "sequence 1's dk has no NaN: " << s.describe();
      EXPECT_TRUE(seq1_has_nan(p.dv, p.seq.cu_k, p.seq.total_k())) << "sequence 1's dv has no NaN: " << s.describe();
    }
}

/// Small problems for compute-sanitizer (memcheck / racecheck / synccheck): varlen + GQA + causal
/// + sink, deterministic and not, every bucket.
TEST(HopperBwd, SanitizeSmall) {
  REQUIRE_HOPPER();
  for (const fa4::detail::HopperBwdConfig& row : fa4::detail::kHopperBwdConfigs)
    for (bool det : {false, true}) {
      CaseSpec c = base(row.headdim);
      c.headdim_v = row.headdim_v;
      c.batch = 3;
      c.varlen = true;
      c.seqlen_q = c.seqlen_k = 200;
      c.num_heads = 4;
      c.num_heads_kv = 2;
      c.causal = true;
      c.sink = true;
      c.deterministic = det;
      check_case(c);
    }
}

/// The dynamic schedule (tiles claimed from a counter, causal without varlen) for
/// compute-sanitizer: more tiles than the H200's 132 SMs (67 heads x 2 or 4 key blocks),
/// deterministic and not, every bucket with tile claims (tuning_bwd.h tile_claims; the others
/// run the static order, which SanitizeSmall covers). The tile ring that hands a claim to the
/// consumers and the dQ writers is what racecheck looks at.
TEST(HopperBwd, SanitizeGreedyClaims) {
  REQUIRE_HOPPER();
  for (const fa4::detail::HopperBwdConfig& row : fa4::detail::kHopperBwdConfigs)
    for (bool det : {false, true}) {
      if (!row.tile_claims) continue;
      CaseSpec c = base(row.headdim);
      c.headdim_v = row.headdim_v;
      c.batch = 1;
      c.seqlen_q = c.seqlen_k = 256;
      c.num_heads = c.num_heads_kv = 67;
      c.causal = true;
      c.deterministic = det;
      const fa4::test::ScopedOverride schedule("schedule", "dynamic");  // also if the default changes
      check_case(c);
    }
}

/// After a call with broken device-side indices: the next check reports the rule naming `index`
/// (kInvalidArgument), once.
void expect_index_rule_reported_once(const char* index) {
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  try {
    fa4::check_async_errors(0);
    FAIL() << "no asynchronous error reported";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(index), std::string::npos) << e.what();
  }
  fa4::check_async_errors(0);  // reported once, then clear
}

/// Device-resident varlen indices that break the rules: the backward computes nothing for the
/// sequences concerned (their gradient rows keep the poison; no out-of-bounds access: run under
/// compute-sanitizer), the good sequence gets exactly the gradients of a run with valid indices,
/// and the rule is reported by fa4::check_async_errors.
TEST(HopperBwd, SanitizeBadVarlenIndices) {
  REQUIRE_HOPPER();
  CaseSpec s = base(64);
  REQUIRE_BUCKETS(s.headdim, s.dim_v(), fa4::test::kFwd | fa4::test::kBwd);
  s.device = "cuda";
  s.backward = true;
  s.deterministic = true;  // the good sequence's gradients are compared bitwise
  s.batch = 3;
  s.varlen = true;
  s.seqlen_q = s.seqlen_k = 150;
  s.seed = fa4::test::next_seed();
  Problem p = Problem::make(s);
  DeviceProblem dp(p, nullptr);
  fa4::cli::run_forward(p, dp.placement(), fa4::Backend::kCuda);
  fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);  // valid indices: the reference
  dp.download_outputs();
  const std::vector<char> good_dq = tensor_bytes(p.dq), good_dk = tensor_bytes(p.dk), good_dv = tensor_bytes(p.dv);
  // Poison the gradients again (0xFF: NaN in bf16).
  const fa4::cli::Placement& at = dp.placement();
  for (auto [ptr, t] : {std::pair{at.dq, &p.dq}, std::pair{at.dk, &p.dk}, std::pair{at.dv, &p.dv}})
    ASSERT_EQ(cudaMemset(ptr, 0xFF, size_t(t->numel()) * fa4::dtype_size(t->dtype())), cudaSuccess);
  // cu_seqlens_k[2] past the packed rows: sequences 1 and 2 break the rule.
  std::vector<int32_t> cu_k(p.seq.cu_k.begin(), p.seq.cu_k.end());
  cu_k[2] = int32_t(p.seq.total_k()) + 1000;
  ASSERT_EQ(cudaMemcpy(dp.placement().cu_k, cu_k.data(), cu_k.size() * sizeof(int32_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
  expect_index_rule_reported_once("cu_seqlens_k");
  dp.download_outputs();
  // Packed rows (of the valid layout): sequence 0's equal the reference, sequences 1-2's are poison.
  const std::vector<char> dq = tensor_bytes(p.dq), dk = tensor_bytes(p.dk), dv = tensor_bytes(p.dv);
  const size_t q_row = dq.size() / size_t(p.seq.total_q()), k_row = dk.size() / size_t(p.seq.total_k()),
               v_row = dv.size() / size_t(p.seq.total_k());
  auto split_check = [](const std::vector<char>& got, const std::vector<char>& ref, size_t row_bytes, int32_t rows0,
                        const char* name) {
    for (size_t i = 0; i < got.size(); ++i) {
      const bool seq0 = i < size_t(rows0) * row_bytes;
      if (seq0 ? got[i] != ref[i] : got[i] != char(0xFF)) {
        ADD_FAILURE() << name << " byte " << i << (seq0 ? " of the good sequence differs" : " of a skipped sequence was written");
        return;
      }
    }
  };
  split_check(dq, good_dq, q_row, p.seq.cu_q[1], "dq");
  split_check(dk, good_dk, k_row, p.seq.cu_k[1], "dk");
  split_check(dv, good_dv, v_row, p.seq.cu_k[1], "dv");
}

/// cu_seqlens_q that steps back (sequence 1 = [768, 0), breaking the rule) so that sequences 0
/// and 2 both cover rows [0, 768): each is valid on its own, and their workspace chunks overlap
/// (sequence 2's start at floor(0 / 64) + 2). In deterministic mode the key blocks of both then
/// count on the same chunk semaphores; the call must finish (not wait forever for a count the
/// other sequence's blocks have passed) and report the rule, in both modes.
TEST(HopperBwd, OverlappingCuSeqlensQFinishesAndIsReported) {
  REQUIRE_HOPPER();
  CaseSpec s = base(128);  // tile_m 64: sequence 0's 12 chunks reach sequence 2's first (2)
  REQUIRE_BUCKETS(s.headdim, s.dim_v(), fa4::test::kFwd | fa4::test::kBwd);
  ASSERT_EQ(fa4::detail::hopper_bwd_bucket(128, 128)->tile_m, 64);
  s.device = "cuda";
  s.backward = true;
  s.batch = 3;
  s.varlen = true;
  s.seqlen_q = s.seqlen_k = 256;
  s.lens_q = {256, 256, 256};
  s.lens_k = {256, 256, 256};  // two key blocks per sequence: chains of two on every chunk
  for (bool det : {true, false}) {
    SCOPED_TRACE(det ? "deterministic" : "default");
    s.deterministic = det;
    s.seed = fa4::test::next_seed();
    Problem p = Problem::make(s);
    p.seq.max_q = int32_t(p.seq.total_q());  // a sequence of all 768 rows is within max_seqlen_q
    DeviceProblem dp(p, nullptr);
    fa4::cli::run_forward(p, dp.placement(), fa4::Backend::kCuda);
    const std::vector<int32_t> cu_q = {0, 768, 0, 768};
    ASSERT_EQ(cudaMemcpy(dp.placement().cu_q, cu_q.data(), cu_q.size() * sizeof(int32_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
    expect_index_rule_reported_once("cu_seqlens_q");
  }
}

TEST(HopperBwd, UnsupportedInputIsAClearError) {
  REQUIRE_HOPPER();
  CaseSpec s = base(60);  // every head dim up to 256 has a bucket; 60 is no multiple of 8 (TMA rows)
  s.device = "cuda";
  s.backward = true;
  s.seed = 1;
  Problem p = Problem::make(s);
  DeviceProblem dp(p, nullptr);  // out and lse stay poisoned: the selector refuses before any read
  try {
    fa4::cli::run_backward(p, dp.placement(), fa4::Backend::kCuda);
    FAIL() << "the d60 backward ran";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kUnsupported);
    const std::string what = e.what();
    EXPECT_TRUE(what.find("multiples of 8") != std::string::npos) << what;
  }
}

}  // namespace
