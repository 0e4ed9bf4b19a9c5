// tests/gpu/test_hopper_bwd_options.cu — the Hopper backward over more of the option matrix, each
// case judged as in test_hopper_bwd.cu (bwd_case.cuh): empty varlen sequences, softcap on the d128
// kernel, windows and a sink with more queries than keys, headdim_v != headdim, padded head dims in
// varlen calls, explicit softmax scales, an empty batch, and deterministic mode with GQA 16/2,
// varlen and a sink.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "gpu/bwd_case.cuh"

namespace {

/// Varlen batches with empty sequences (no queries: dK = dV = 0 over its keys; no keys: dq = 0),
/// among them C10's (query lengths 0, 1, 0, 1 over key lengths 0, 3, 0, 5, heads 9/3, causal,
/// scale 1); softcap on the d128 kernel (and d96 padded onto it), with GQA, varlen and a window;
/// windows and a sink with more queries than keys; headdim_v != headdim on one kernel; padded head
/// dims in a varlen call (one sequence of 512 rows, 8 heads, d 40 to 144).
TEST(HopperBwd, EmptySequencesSoftcapAndUnequalDims) {
  REQUIRE_HOPPER();
  CaseSpec c = base(64);
  c.batch = 4;
  c.varlen = true;
  c.lens_q = {0, 1, 0, 1};
  c.lens_k = {0, 3, 0, 5};
  c.seqlen_q = 1;
  c.seqlen_k = 5;
  c.num_heads = 9;
  c.num_heads_kv = 3;
  c.causal = true;
  c.softmax_scale = 1.f;
  check_case(c);
  c = base(128);
  c.batch = 5;
  c.varlen = true;
  c.lens_q = {0, 130, 64, 0, 200};
  c.lens_k = {100, 0, 257, 0, 300};
  c.seqlen_q = 200;
  c.seqlen_k = 300;
  c.num_heads_kv = 2;
  check_case(c);
  c.causal = true;
  c.sink = true;
  check_case(c);
  for (int d : {128, 96})
    for (bool causal : {false, true}) {
      c = base(d, d == 96 ? "fp16" : "bf16");
      c.softcap = 5.f;
      c.causal = causal;
      check_case(c);
    }
  c = base(128);
  c.softcap = 3.f;
  c.num_heads = 8;
  c.num_heads_kv = 2;
  c.causal = true;
  check_case(c);
  c.varlen = true;  // random lengths in [1, 300]
  c.batch = 4;
  c.seqlen_q = c.seqlen_k = 300;
  check_case(c);
  c.causal = false;
  c.window = {40, 8};
  check_case(c);
  c.softcap = 0.f;
  check_case(c);
  for (const auto& w : {std::vector<int32_t>{40, 20}, std::vector<int32_t>{0, 0}}) {
    c = base(128);
    c.seqlen_q = 300;  // more queries than keys: rows before the window's reach see no key
    c.seqlen_k = 100;
    c.window = w;
    check_case(c);
  }
  c = base(64);
  c.seqlen_q = 300;
  c.seqlen_k = 100;
  c.causal = true;
  c.sink = true;  // rows without keys: lse = sink, dq = 0, and their share of dsink
  check_case(c);
  for (const auto& [d, dv] : {std::pair{128, 64}, std::pair{64, 128}, std::pair{96, 64}, std::pair{128, 96}}) {
    c = base(d);
    c.headdim_v = dv;
    c.causal = dv < d;
    check_case(c);
  }
  for (int d : {40, 72, 80, 96, 104, 144}) {  // padded head dims, varlen: one sequence of 512 rows
    c = base(d);
    c.batch = 1;
    c.varlen = true;
    c.lens_q = c.lens_k = {512};
    c.seqlen_q = c.seqlen_k = 512;
    c.num_heads = 8;
    check_case(c);
  }
}

/// Packed rows after the last varlen sequence (C12: outputs outside every sequence untouched),
/// their q, k, v and dout rows NaN (they must reach no output): every bucket, causal and not.
TEST(HopperBwd, VarlenRowsAfterTheLastSequence) {
  REQUIRE_HOPPER();
  for (int d : {64, 128, 192, 256})
    for (bool causal : {false, true}) {
      CaseSpec c = base(d, causal ? "fp16" : "bf16");
      c.batch = 3;
      c.varlen = true;  // random lengths in [1, 300]
      c.seqlen_q = c.seqlen_k = 300;
      c.num_heads_kv = 2;
      c.pad_rows = 37;
      c.causal = causal;
      check_case(c);
    }
}

/// Explicit softmax scales used alike by the forward and the backward (1, 0.01, 1/d, 10 and the
/// default 1/sqrt(72), never the padded 128 or headdim_v) on d72, which runs padded on the d128
/// kernel, and on 192 x 128; an empty batch (B = 0 with 3952 x 16: empty outputs, dsink = 0).
TEST(HopperBwd, SoftmaxScalesAndAnEmptyBatch) {
  REQUIRE_HOPPER();
  for (float scale : {1.f, 0.01f, 1.f / 72, 10.f, 0.f})
    for (bool causal : {false, true}) {
      CaseSpec c = base(72);
      c.batch = 1;
      if (scale > 0) c.softmax_scale = scale;
      c.causal = causal;
      check_case(c);
    }
  CaseSpec c = base(192);
  c.headdim_v = 128;
  c.batch = 1;
  check_case(c);
  c.softmax_scale = 10.f;
  check_case(c);
  c = base(64, "fp16");
  c.batch = 0;
  c.seqlen_q = 3952;
  c.seqlen_k = 16;
  c.num_heads = 10;
  check_case(c);
  c.sink = true;
  check_case(c);
}

/// deterministic = true with GQA 16/2 at B = 2, S = 1024 (dK/dV summed over eight query heads),
/// causal and not, and a varlen batch with a sink: ten runs onto poisoned gradients give bitwise
/// dq, dk, dv and dsink; the first passes the accuracy rule.
TEST(HopperBwd, DeterministicGqaVarlenSink) {
  REQUIRE_HOPPER();
  for (int variant = 0; variant < 3; ++variant) {
    if (fa4::test::leave_out(128, 128, fa4::test::kFwd | fa4::test::kBwd)) continue;
    CaseSpec s = deterministic_case(128, 128, variant == 1);
    s.batch = 2;
    s.num_heads = 16;
    s.num_heads_kv = 2;
    s.seqlen_q = s.seqlen_k = 1024;
    if (variant == 2) {
      s.varlen = true;  // random lengths in [1, 1024]
      s.batch = 3;
      s.causal = true;
      s.sink = true;
    }
    check_deterministic_runs(s);
  }
}

}  // namespace
