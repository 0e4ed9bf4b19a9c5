// tests/cpu/test_validation_edges.cpp — accepted inputs of fa4::forward / fa4::backward and the
// edge cases of the public failure list that are about argument handling (C08, C20, C21, C28, C32,
// C34, C35): resolved params, forward_support, empty problems, untouched varlen rows, size-1 dims
// with odd strides, and the TensorView helpers. The bad-input matrix: test_validation.cpp.
#include "validation_fixture.h"

namespace {

using namespace fa4::test::validation;

// ------------------------------------------------------------------------------------------------
// Accepted inputs and resolved params.

TEST(Validation, ValidProblemsAreSupported) {
  for (bool vl : {false, true}) {
    Problem p = vl ? varlen() : batched();
    std::string kernel;
    EXPECT_EQ(p.support(&kernel), "");
    EXPECT_EQ(kernel, "cpu::flash_forward");
    p.opt.backend = Backend::kCpuReference;
    EXPECT_EQ(p.support(&kernel), "");
    EXPECT_EQ(kernel, "cpu::reference_forward");
    p.opt.backend = Backend::kCpu;
    EXPECT_EQ(p.support(nullptr), "");
  }
}

TEST(Validation, BatchedParamsResolved) {
  Problem p = batched(DType::kFP16, 2, 3, 5, 16, 4);
  const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_EQ(fp.dtype, DType::kFP16);
  EXPECT_EQ(fp.batch, 2);
  EXPECT_EQ(fp.seqlen_q, 3);
  EXPECT_EQ(fp.seqlen_k, 5);
  EXPECT_EQ(fp.num_heads, kH);
  EXPECT_EQ(fp.num_heads_kv, kHkv);
  EXPECT_EQ(fp.headdim, 16);
  EXPECT_EQ(fp.headdim_v, 4);
  EXPECT_EQ(fp.total_q, 6);
  EXPECT_EQ(fp.total_k, 10);
  EXPECT_FALSE(fp.is_varlen);
  // C32: the default scale uses the real head dim of q (16), never headdim_v (4).
  EXPECT_FLOAT_EQ(fp.softmax_scale, 0.25f);
  EXPECT_FLOAT_EQ(fp.softmax_scale_log2, 0.25f * 1.4426950408889634f);
  EXPECT_EQ(fp.q_stride.batch, 3 * kH * 16);
  EXPECT_EQ(fp.q_stride.row, kH * 16);
  EXPECT_EQ(fp.q_stride.head, 16);
  EXPECT_EQ(fp.lse_batch_stride, kH * 3);
  EXPECT_EQ(fp.lse_head_stride, 3);
  EXPECT_EQ(fp.lse_row_stride, 1);
  EXPECT_EQ(fp.mask.window_left, -1);
  EXPECT_EQ(fp.mask.window_right, -1);
  EXPECT_FALSE(fp.exp2_fraction_given);
  EXPECT_EQ(fp.q, p.q.t.data);
  EXPECT_EQ(fp.lse, p.lse.t.data);
  EXPECT_EQ(fp.kv_head(3), 1);  // C21: contiguous groups, h / (H / Hkv)
  EXPECT_EQ(fp.kv_head(1), 0);

  p.opt.softmax_scale = 10.0f;
  p.opt.softcap = 30.0f;
  p.opt.exp2_emulation_fraction = 0.25f;
  p.opt.rescale_threshold = 0.0f;
  const auto fp2 = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_EQ(fp2.softmax_scale, 10.0f);
  EXPECT_EQ(fp2.softcap, 30.0f);
  EXPECT_TRUE(fp2.exp2_fraction_given);
  EXPECT_EQ(fp2.exp2_emulation.period, 16);
  EXPECT_EQ(fp2.exp2_emulation.emulated, 4);
  EXPECT_EQ(fp2.rescale_threshold, 0.0f);
}

TEST(Validation, Exp2FractionEndpointsAccepted) {
  for (float f : {0.0f, 0.0625f, 1.0f}) {
    Problem p = batched();
    p.opt.exp2_emulation_fraction = f;
    const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
    EXPECT_EQ(fp.exp2_emulation.emulated, static_cast<int>(f * 16));
  }
}

TEST(Validation, BackwardParamsResolved) {
  Problem p = batched();
  p.sink = make(DType::kFP32, {kH});
  p.dsink = make(DType::kFP32, {kH});
  p.opt.deterministic = true;
  p.sync_options();
  const auto bp = fa4::detail::make_bwd_params(p.dout.t, p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t,
                                               p.dq.t, p.dk.t, p.dv.t, p.opt, p.dsink->t, "t");
  EXPECT_TRUE(bp.deterministic);
  EXPECT_EQ(bp.dsink, p.dsink->t.data);
  EXPECT_EQ(bp.sink, p.sink->t.data);
  EXPECT_EQ(bp.dq, p.dq.t.data);
  EXPECT_EQ(bp.dk_stride.row, kHkv * kD);
  EXPECT_EQ(bp.dout_stride.batch, kSq * kH * kDv);
}

TEST(Validation, VarlenParamsResolved) {
  Problem p = varlen();
  p.used = make_int32({2, 4});
  p.sync_options();
  const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_TRUE(fp.is_varlen);
  EXPECT_EQ(fp.batch, 2);
  EXPECT_EQ(fp.seqlen_q, 3);
  EXPECT_EQ(fp.seqlen_k, 4);
  EXPECT_EQ(fp.total_q, kTotalQ);
  EXPECT_EQ(fp.total_k, kTotalK);
  EXPECT_EQ(fp.q_stride.batch, 0);
  EXPECT_EQ(fp.q_stride.row, kH * kD);
  EXPECT_EQ(fp.lse_batch_stride, 0);
  EXPECT_EQ(fp.lse_head_stride, kTotalQ);
  EXPECT_EQ(fp.lse_row_stride, 1);
  EXPECT_EQ(fp.cu_seqlens_q, p.cu_q->t.data);
  EXPECT_EQ(fp.seqused_k, p.used->t.data);
  const auto s1 = fa4::detail::seq_info_host(fp, 1);
  EXPECT_EQ(s1.q_row0, 2);
  EXPECT_EQ(s1.k_row0, 3);
  EXPECT_EQ(s1.seqlen_q, 3);
  EXPECT_EQ(s1.seqlen_k, 4);
}

// C08: (-1, 0) + causal is causal; causal folds into window_right = 0; (S-1, 0) is accepted.
TEST(Validation, C08_WindowSentinels) {
  Problem p = batched();
  auto mask = [&] {
    return fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t").mask;
  };
  p.opt.causal = true;
  EXPECT_EQ(mask().window_left, -1);
  EXPECT_EQ(mask().window_right, 0);
  p.opt.window_size_left = -1;
  p.opt.window_size_right = 0;
  EXPECT_EQ(mask().window_right, 0);
  EXPECT_EQ(p.support(nullptr), "");
  p.opt.window_size_left = kSk - 1;
  EXPECT_EQ(mask().window_left, kSk - 1);
  p.opt.causal = false;
  p.opt.window_size_left = 0;
  p.opt.window_size_right = 0;
  EXPECT_EQ(mask().window_left, 0);
  EXPECT_EQ(mask().window_right, 0);
}

// lse may have any (non-negative) strides, e.g. a (batch, seqlen_q, num_heads) buffer transposed.
TEST(Validation, LseAnyStrides) {
  Problem p = batched();
  Tensor buf = make(DType::kFP32, {kB, kSq, kH});
  p.lse = buf;
  p.lse.t.shape[1] = kH;
  p.lse.t.shape[2] = kSq;
  p.lse.t.stride[1] = 1;
  p.lse.t.stride[2] = kH;
  const auto fp = fa4::detail::make_fwd_params(p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.opt, "t");
  EXPECT_EQ(fp.lse_head_stride, 1);
  EXPECT_EQ(fp.lse_row_stride, kH);
}

// An output whose padding holds another tensor of the call is accepted: out's rows use 64 of
// every 192 bytes and lse (96 bytes) lies in the gap after its first row, touching none of out's
// elements (test_validation.cpp lse_inside_padded_out: the same, overlapping). Both hold what a
// call with their own buffers gives.
TEST(Validation, OutputInAnotherOutputsPadding) {
  Problem p = batched();
  p.opt.backend = Backend::kCpu;
  Problem s = p;  // the same inputs; out and lse in one buffer
  s.out = make(p.out.t.dtype, {kB, kSq, 3 * kH, kDv});
  s.out.t.shape[2] = kH;
  s.lse.t.data = static_cast<uint8_t*>(s.out.t.data) + kH * kDv * 2;
  ASSERT_EQ(kB * kH * kSq * 4, 96);
  ASSERT_EQ(s.support(nullptr), "");
  p.forward();
  s.forward();
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t i = 0; i < kSq; ++i)
      for (int64_t h = 0; h < kH; ++h) {
        const auto at = [&](const Tensor& x) {
          return static_cast<const uint16_t*>(x.t.data) + b * x.t.stride[0] + i * x.t.stride[1] +
                 h * x.t.stride[2];
        };
        EXPECT_EQ(std::memcmp(at(p.out), at(s.out), kDv * 2), 0) << b << " " << i << " " << h;
        const float* lp = static_cast<const float*>(p.lse.t.data) + b * kH * kSq + h * kSq + i;
        const float* ls = static_cast<const float*>(s.lse.t.data) + b * kH * kSq + h * kSq + i;
        EXPECT_EQ(std::memcmp(lp, ls, 4), 0) << b << " " << i << " " << h;
      }
}

// out and lse are the backward's inputs: like q, k and v they may repeat elements (a stride-0
// broadcast). Two sequences with the same q, k, v and dout; the backward reading sequence 0's out
// and lse for both (batch stride 0) gives the bits of the backward reading each sequence's own.
// The forward still refuses such an out or lse (test_validation.cpp *_stride0_aliases_rows). The
// CPU backward reads out and lse (its D = rowsum(dO * O) and P); the float64 oracle recomputes them.
TEST(Validation, BackwardReadsBroadcastOutAndLse) {
  Problem p = batched(DType::kFP32);
  p.opt.backend = Backend::kCpu;
  for (Tensor* x : {&p.q, &p.k, &p.v, &p.dout}) {  // sequence 1 := sequence 0
    const size_t half = size_t(x->t.stride[0]) * sizeof(float);
    std::memcpy(static_cast<uint8_t*>(x->t.data) + half, x->t.data, half);
  }
  poison_outputs(p);
  p.forward();
  p.backward();
  const std::vector<uint8_t> dq = *p.dq.mem, dk = *p.dk.mem, dv = *p.dv.mem;

  Problem s = p;  // shares q, k, v, dout; own gradients
  s.out.t.stride[0] = 0;
  s.lse.t.stride[0] = 0;
  reshape(s.dq, {kB, kSq, kH, kD});
  reshape(s.dk, {kB, kSk, kHkv, kD});
  reshape(s.dv, {kB, kSk, kHkv, kDv});
  for (Tensor* g : {&s.dq, &s.dk, &s.dv}) poison(*g);
  for (Tensor* x : {&p.out, &p.lse}) {  // sequence 1's own out and lse: NaN, never read now
    const size_t half = size_t(x->t.stride[0]) * sizeof(float);
    std::memset(static_cast<uint8_t*>(x->t.data) + half, 0xFF, half);
  }
  ASSERT_NO_THROW(s.backward());
  EXPECT_EQ(*s.dq.mem, dq);
  EXPECT_EQ(*s.dk.mem, dk);
  EXPECT_EQ(*s.dv.mem, dv);
}

// Device-resident tensors: fp32 has no Hopper kernel (either direction), so the selector refuses
// before anything runs, with or without a GPU; a CPU-only build has no CUDA at all. Validation
// never dereferences q/k/v/out/lse, so host memory marked as CUDA is safe here.
TEST(Validation, CudaTensorsSelector) {
  Problem p = batched(DType::kFP32);
  for (Tensor* x : p.all()) x->t.device = Device::cuda(0);
  poison_outputs(p);
  const auto before = snapshot(p);
  try {
    p.backward();
    ADD_FAILURE() << "no error";
  } catch (const fa4::Error& e) {
#if FA4_WITH_CUDA
    expect_fp32_cuda_refusal(e);
#else
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice) << e.what();
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
#endif
  }
  p.opt.backend = Backend::kCpu;
  try {
    p.forward();
    ADD_FAILURE() << "no error";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("kCpu ('cpu') needs CPU tensors"), std::string::npos) << e.what();
  }
#if !FA4_WITH_CUDA
  p.opt.backend = Backend::kAuto;
  std::string kernel;
  const std::string why = p.support(&kernel);
  EXPECT_NE(why.find("built without CUDA"), std::string::npos) << why;
  EXPECT_TRUE(kernel.empty());
#endif
  EXPECT_TRUE(before == snapshot(p));
}

// ------------------------------------------------------------------------------------------------
// C28: empty problems are no-ops (nothing read: null data is fine; nothing written), except that a
// backward with no queries but some keys writes its exactly-zero dk/dv.

TEST(Validation, C28_EmptyProblemsWriteNothing) {
  struct Empty { const char* name; std::function<Problem()> make; };
  const std::vector<Empty> cases = {
      {"batch0", [] { return batched(DType::kFP16, 0, 5, 3); }},
      {"seqlen_q0", [] { return batched(DType::kFP16, 2, 0, kSk); }},
      {"seqlen_q0_seqlen_k0", [] { return batched(DType::kFP16, 2, 0, 0); }},
      {"varlen_total_q0", [] {
         Problem p = varlen();
         p.cu_q = make_int32({0, 0, 0});
         reshape(p.q, {0, kH, kD});
         reshape(p.out, {0, kH, kDv});
         reshape(p.dout, {0, kH, kDv});
         reshape(p.dq, {0, kH, kD});
         reshape(p.lse, {kH, 0});
         return p;
       }},
      {"varlen_batch0", [] {
         Problem p = varlen();
         p.cu_q = make_int32({0});
         p.cu_k = make_int32({0});
         p.opt.max_seqlen_q = 0;
         p.opt.max_seqlen_k = 0;
         return p;
       }},
  };
  for (const Empty& c : cases) {
    for (Call call : {Call::kForward, Call::kBackward}) {
      for (Backend b : {Backend::kAuto, Backend::kCpuReference}) {
        SCOPED_TRACE(std::string(c.name) + (call == Call::kForward ? " fwd" : " bwd"));
        Problem p = c.make();
        p.opt.backend = b;
        poison_outputs(p);
        auto before = snapshot(p);
        EXPECT_NO_THROW(call == Call::kForward ? p.forward() : p.backward());
        // No queries but some keys: the backward's dk/dv gradient is exactly 0 and is written
        // (never left as garbage); everything else stays untouched.
        const std::string name = c.name;
        const bool zero_grads =
            call == Call::kBackward && (name == "seqlen_q0" || name == "varlen_total_q0");
        if (zero_grads) {
          const std::vector<Tensor*> bufs = p.all();
          for (size_t i = 0; i < bufs.size(); ++i) {
            if (bufs[i] != &p.dk && bufs[i] != &p.dv) continue;
            // Rows inside the key sequences become +0.0 (all bytes 0 in any float dtype); the
            // varlen padding row past cu_seqlens_k[batch] keeps its poison (case C12).
            const TensorView& g = bufs[i]->t;  // contiguous; a sentinel zone follows its data
            const size_t row_bytes = size_t(g.numel() / g.shape[0] * fa4::dtype_size(g.dtype));
            const size_t rows = name == "varlen_total_q0" ? size_t(kCuK.back()) : size_t(g.shape[0]);
            std::fill(before[i].begin(), before[i].begin() + rows * row_bytes, uint8_t(0));
          }
        }
        const auto after = snapshot(p);
        for (size_t i = 0; i < before.size(); ++i)
          EXPECT_TRUE(before[i] == after[i]) << "an empty problem wrote buffer " << i;
      }
    }
  }
  // Batch 0 with null data pointers everywhere: nothing may be dereferenced.
  Problem p = batched(DType::kBF16, 0);
  for (Tensor* x : p.all()) x->t.data = nullptr;
  EXPECT_NO_THROW(p.forward());
  EXPECT_NO_THROW(p.backward());
}

// C28 with a sink: the backward of any empty problem writes dsink = 0 (the sink's gradient is
// exactly zero; an optimizer must never get the poison), whether or not any kernel runs (batch 0,
// no keys and no queries: none does; no queries but keys: dk/dv are zeroed too).
TEST(Validation, C28_EmptyProblemsZeroTheSinkGradient) {
  const std::vector<std::pair<const char*, std::function<Problem()>>> cases = {
      {"batch0", [] { return batched(DType::kFP32, 0, 5, 3); }},
      {"seqlen_q0_seqlen_k0", [] { return batched(DType::kFP32, 2, 0, 0); }},
      {"seqlen_q0", [] { return batched(DType::kFP32, 2, 0, kSk); }},
  };
  for (const auto& [name, make_problem] : cases)
    for (Backend b : {Backend::kAuto, Backend::kCpuReference}) {
      SCOPED_TRACE(std::string(name) + (b == Backend::kAuto ? " auto" : " reference"));
      Problem p = make_problem();
      p.opt.backend = b;
      p.sink = make(DType::kFP32, {kH});
      p.dsink = make(DType::kFP32, {kH});
      poison_outputs(p);
      EXPECT_NO_THROW(p.backward());
      const float* ds = static_cast<const float*>(p.dsink->t.data);
      for (int h = 0; h < kH; ++h) EXPECT_EQ(ds[h], 0.f) << "dsink[" << h << "]";
    }
}

// C28: seqlen_k == 0 with seqlen_q > 0 -> fully masked rows: out = 0, lse = -inf (= sink_h with a
// sink), dq = 0. Needs the CPU implementations.
TEST(Validation, C28_SeqlenK0GivesFullyMaskedRows) {
  for (Backend b : {Backend::kCpu, Backend::kCpuReference}) {
    for (bool with_sink : {false, true}) {
      SCOPED_TRACE(std::string(b == Backend::kCpu ? "cpu" : "reference") +
                   (with_sink ? " sink" : ""));
      Problem p = batched(DType::kFP32, 2, 3, 0);
      p.opt.backend = b;
      if (with_sink) {
        p.sink = make(DType::kFP32, {kH});
        p.dsink = make(DType::kFP32, {kH});
      }
      poison_outputs(p);
      ASSERT_NO_THROW(p.forward());
      const auto* out = static_cast<const float*>(p.out.t.data);
      const auto* lse = static_cast<const float*>(p.lse.t.data);
      for (int64_t i = 0; i < p.out.t.numel(); ++i) ASSERT_EQ(out[i], 0.0f) << i;
      for (int64_t bi = 0; bi < 2; ++bi)
        for (int64_t h = 0; h < kH; ++h)
          for (int64_t i = 0; i < 3; ++i) {
            const float l = lse[(bi * kH + h) * 3 + i];
            if (with_sink)
              ASSERT_EQ(l, static_cast<const float*>(p.sink->t.data)[h]);
            else
              ASSERT_TRUE(std::isinf(l) && l < 0) << l;
          }
      for (Tensor* x : {&p.out, &p.lse})  // guard region after the buffer untouched
        for (size_t i = x->mem->size() - kGuardBytes; i < x->mem->size(); ++i)
          ASSERT_EQ((*x->mem)[i], kSentinel);
      ASSERT_NO_THROW(p.backward());
      const auto* dq = static_cast<const float*>(p.dq.t.data);
      for (int64_t i = 0; i < p.dq.t.numel(); ++i) ASSERT_EQ(dq[i], 0.0f) << i;
    }
  }
}

// C35 (valid side): varlen rows outside every cu_seqlens range, dk/dv rows past seqused_k, and the
// memory right after each buffer stay untouched; rows inside the ranges are written.
TEST(Validation, C35_VarlenRowsOutsideRangesUntouched) {
  auto row_is_sentinel = [](const Tensor& x, int64_t row) {
    const int64_t bytes = x.t.stride[0] * fa4::dtype_size(x.t.dtype);
    for (int64_t i = row * bytes; i < (row + 1) * bytes; ++i)
      if ((*x.mem)[i] != kSentinel) return false;
    return true;
  };
  auto guard_intact = [](const Tensor& x) {
    for (size_t i = x.mem->size() - kGuardBytes; i < x.mem->size(); ++i)
      if ((*x.mem)[i] != kSentinel) return false;
    return true;
  };
  for (Backend b : {Backend::kCpu, Backend::kCpuReference}) {
    SCOPED_TRACE(b == Backend::kCpu ? "cpu" : "reference");
    Problem p = varlen(DType::kFP32);
    p.used = make_int32({2, 3});  // k rows 2 (seq 0) and 6 (seq 1) are past seqused_k
    p.opt.backend = b;
    poison_outputs(p);
    ASSERT_NO_THROW(p.forward());
    ASSERT_NO_THROW(p.backward());
    const int64_t last_q = kCuQ.back();  // == 5: packed row 5 belongs to no sequence
    for (int64_t r = 0; r < kTotalQ; ++r) {
      EXPECT_EQ(row_is_sentinel(p.out, r), r >= last_q) << "out row " << r;
      EXPECT_EQ(row_is_sentinel(p.dq, r), r >= last_q) << "dq row " << r;
    }
    const auto* lse_bytes = p.lse.mem->data();
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t r = 0; r < kTotalQ; ++r) {
        bool poisoned = true;
        for (int byte = 0; byte < 4; ++byte)
          poisoned = poisoned && lse_bytes[(h * kTotalQ + r) * 4 + byte] == kSentinel;
        EXPECT_EQ(poisoned, r >= last_q) << "lse head " << h << " row " << r;
      }
    for (int64_t r = 0; r < kTotalK; ++r) {
      const bool outside = r == 2 || r == 6 || r >= kCuK.back();
      EXPECT_EQ(row_is_sentinel(p.dk, r), outside) << "dk row " << r;
      EXPECT_EQ(row_is_sentinel(p.dv, r), outside) << "dv row " << r;
    }
    for (Tensor* x : p.all()) EXPECT_TRUE(guard_intact(*x));
  }
}

// ------------------------------------------------------------------------------------------------
// C20: odd strides on size-1 dims are ignored; head dim 1 works (CPU supports [1, 256]).

TEST(Validation, C20_SizeOneDimsOddStridesAccepted) {
  // q (1, 2, 1, 1) as left by transposing a (1, 1, 2, 1)-ish buffer: last-dim stride 2.
  Tensor q = make(DType::kFP32, {1, 2, 1, 1});
  q.t.stride[0] = 7;
  q.t.stride[1] = 1;
  q.t.stride[2] = 0;
  q.t.stride[3] = 2;
  Tensor k = make(DType::kFP32, {1, 1, 1, 1});
  k.t.stride[0] = 5; k.t.stride[1] = 3; k.t.stride[2] = 0; k.t.stride[3] = 9;
  Tensor v = make(DType::kFP32, {1, 1, 1, 1});
  v.t.stride[0] = -4; v.t.stride[1] = 0; v.t.stride[2] = 11; v.t.stride[3] = -1;  // never moved
  fa4::detail::store_from_float(k.t.data, DType::kFP32, 0, 1.0f);
  fa4::detail::store_from_float(v.t.data, DType::kFP32, 0, 1.0f);
  Tensor out = make(DType::kFP32, {1, 2, 1, 1});
  Tensor lse = make(DType::kFP32, {1, 1, 2});
  const fa4::AttentionOptions opt;
  const auto fp = fa4::detail::make_fwd_params(q.t, k.t, v.t, out.t, lse.t, opt, "t");
  EXPECT_EQ(fp.headdim, 1);
  EXPECT_EQ(fp.q_stride.row, 1);  // the one dim of size > 1 keeps its stride
  EXPECT_GE(fp.k_stride.batch, 0);
  EXPECT_GE(fp.v_stride.batch, 0);
  std::string kernel;
  EXPECT_EQ(fa4::forward_support(q.t, k.t, v.t, out.t, lse.t, opt, &kernel), "");
  for (Backend b : {Backend::kCpu, Backend::kCpuReference}) {
    fa4::AttentionOptions o;
    o.backend = b;
    poison(out);
    ASSERT_NO_THROW(fa4::forward(q.t, k.t, v.t, out.t, lse.t, o));
    const auto* po = static_cast<const float*>(out.t.data);
    EXPECT_EQ(po[0], 1.0f);  // one visible key: P = 1, out = v
    EXPECT_EQ(po[1], 1.0f);
  }
}

// ------------------------------------------------------------------------------------------------
// TensorView helpers and names.

TEST(Validation, TensorViewHelpers) {
  float buf[24];
  const TensorView t = TensorView::contiguous(buf, DType::kFP32, {2, 3, 4});
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[1], 4);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.shape_string(), "(2, 3, 4)");
  EXPECT_FALSE(t.is_cuda());
  const TensorView z = TensorView::contiguous(nullptr, DType::kBF16, {0, 5});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.stride[0], 5);
  const TensorView s = TensorView::strided(buf, DType::kFP32, {3, 2}, {1, 3}, Device::cuda(1));
  EXPECT_EQ(s.stride[1], 3);
  EXPECT_TRUE(s.is_cuda());
  EXPECT_EQ(s.device.index, 1);
  EXPECT_THROW(TensorView::strided(buf, DType::kFP32, {3, 2}, {1}), fa4::Error);
  EXPECT_THROW(TensorView::contiguous(buf, DType::kFP32, {1, 1, 1, 1, 1}), fa4::Error);
  EXPECT_THROW(TensorView::contiguous(buf, DType::kFP32, {2, -1}), fa4::Error);
  EXPECT_STREQ(fa4::dtype_name(DType::kBF16), "bf16");
  EXPECT_STREQ(fa4::dtype_name(DType::kFP8E4M3), "fp8_e4m3");
  EXPECT_STREQ(fa4::dtype_name(DType::kInt32), "int32");
  EXPECT_STREQ(fa4::error_code_name(ErrorCode::kUnsupported), "unsupported");
  EXPECT_STREQ(fa4::error_code_name(ErrorCode::kNoDevice), "no_device");
}

}  // namespace
