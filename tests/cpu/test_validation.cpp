// tests/cpu/test_validation.cpp — the bad-input matrix of fa4::forward / fa4::backward.
//
// Every rule of include/fa4/attention.h is broken once (one table row each) on an otherwise valid
// tiny problem. Each row asserts the fa4::Error code, that the message names the tensor/option and
// the rule, and that EVERY buffer of the call (outputs, inputs and a guard region after each) is
// byte-for-byte untouched. Accepted inputs and edge cases: test_validation_edges.cpp.
#include "validation_fixture.h"

namespace {

using namespace fa4::test::validation;

// ------------------------------------------------------------------------------------------------
// The bad-input matrix.

struct BadCase {
  const char* name;
  Call call;
  bool varlen;
  std::function<void(Problem&)> mutate;
  ErrorCode code;
  std::vector<std::string> needles;  ///< substrings the message must contain
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.name; }

using F = Call;
constexpr ErrorCode kInv = ErrorCode::kInvalidArgument;
constexpr ErrorCode kUns = ErrorCode::kUnsupported;

void set_dtype4(Problem& p, DType dt) {
  for (Tensor* x : {&p.q, &p.k, &p.v, &p.out, &p.dout, &p.dq, &p.dk, &p.dv}) x->t.dtype = dt;
}

std::vector<BadCase> bad_cases() {
  return {
      // ---- ranks / layout mode ----
      {"q_ndim3_batched", F::kForward, false, [](Problem& p) { reshape(p.q, {kB * kSq, kH, kD}); },
       kInv, {"q.ndim = 3", "must be 4"}},
      {"lse_ndim_wrong", F::kForward, false, [](Problem& p) { reshape(p.lse, {kB, kH * kSq}); },
       kInv, {"lse.ndim = 2", "(batch, num_heads, seqlen_q)"}},
      {"varlen_only_cu_q", F::kForward, false, [](Problem& p) { p.cu_q = make_int32({0, 3, 6}); },
       kInv, {"cu_seqlens_k is missing", "both"}},
      {"varlen_only_cu_k", F::kForward, true, [](Problem& p) { p.cu_q.reset(); },
       kInv, {"cu_seqlens_q is missing"}},
      {"varlen_q_4d", F::kForward, true, [](Problem& p) { reshape(p.q, {1, kTotalQ, kH, kD}); },
       kInv, {"q.ndim = 4", "varlen"}},
      // ---- dtypes ----
      {"fp8_rejected", F::kForward, false, [](Problem& p) { set_dtype4(p, DType::kFP8E4M3); },
       kUns, {"fp8_e4m3", "reserved"}},
      {"q_int32", F::kForward, false, [](Problem& p) { set_dtype4(p, DType::kInt32); },
       kInv, {"q.dtype = int32", "bf16, fp16 or fp32"}},
      {"k_dtype_mismatch", F::kForward, false, [](Problem& p) { p.k.t.dtype = DType::kFP16; },
       kInv, {"k.dtype = fp16", "must equal q.dtype = bf16"}},
      {"out_dtype_mismatch", F::kForward, false, [](Problem& p) { p.out.t.dtype = DType::kFP32; },
       kInv, {"out.dtype = fp32"}},
      {"lse_not_fp32", F::kForward, false, [](Problem& p) { p.lse.t.dtype = DType::kBF16; },
       kInv, {"lse.dtype = bf16", "fp32"}},
      // ---- devices, data, strides ----
      {"out_on_other_device", F::kForward, false,
       [](Problem& p) { p.out.t.device = Device::cuda(0); },
       kInv, {"out is on cuda:0", "q is on cpu", "same device"}},
      {"out_on_other_stream", F::kForward, false,
       [](Problem& p) {
         for (Tensor* x : p.all()) x->t.device = Device::cuda(0);
         p.out.t.device.stream = reinterpret_cast<void*>(0x10);
       },
       kInv, {"out.device.stream differs from q.device.stream", "same CUDA stream"}},
      {"lse_on_other_device", F::kForward, false,
       [](Problem& p) { p.lse.t.device = Device::cuda(1); }, kInv, {"lse is on cuda:1"}},
      {"q_null_data", F::kForward, false, [](Problem& p) { p.q.t.data = nullptr; },
       kInv, {"q.data is null"}},
      {"q_last_dim_not_contiguous", F::kForward, false,
       [](Problem& p) { p.q.t.stride[3] = 2; }, kInv, {"q.stride[3] = 2", "contiguous"}},
      {"out_stride0_aliases_rows", F::kForward, false, [](Problem& p) { p.out.t.stride[1] = 0; },
       kInv, {"out.stride[1] = 0", "two elements to one address"}},
      {"lse_stride0_aliases_rows", F::kForward, false, [](Problem& p) { p.lse.t.stride[0] = 0; },
       kInv, {"lse.stride[0] = 0", "two elements to one address"}},
      {"dk_stride0_aliases_heads", F::kBackward, false, [](Problem& p) { p.dk.t.stride[2] = 0; },
       kInv, {"dk.stride[2] = 0", "two elements to one address"}},
      {"out_misaligned_data", F::kForward, false,
       [](Problem& p) { p.out.t.data = static_cast<char*>(p.out.t.data) + 1; },
       kInv, {"out.data is not aligned", "2 bytes"}},
      {"v_last_dim_not_contiguous", F::kForward, false,
       [](Problem& p) { p.v.t.stride[3] = 0; }, kInv, {"v.stride[3] = 0", "contiguous"}},
      {"k_negative_stride", F::kForward, false, [](Problem& p) { p.k.t.stride[1] = -16; },
       kInv, {"k.stride[1] = -16", "negative"}},
      {"negative_extent", F::kForward, false, [](Problem& p) { p.q.t.shape[1] = -1; },
       kInv, {"q.shape[1] = -1", ">= 0"}},
      // ---- shape relations ----
      {"k_headdim_mismatch", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, kH, 64});
         reshape(p.k, {kB, kSk, kHkv, 72});
       },
       kInv, {"fa4::forward: k.shape[3] (headdim) = 72 must equal q.shape[3] = 64"}},
      {"k_batch_mismatch", F::kForward, false, [](Problem& p) { reshape(p.k, {3, kSk, kHkv, kD}); },
       kInv, {"k.shape[0] (batch) = 3 must equal q.shape[0] = 2"}},
      {"v_seqlen_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.v, {kB, kSk + 1, kHkv, kDv}); },
       kInv, {"v.shape[1] (seqlen_k) = 5 must equal k.shape[1] = 4"}},
      {"v_heads_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.v, {kB, kSk, 1, kDv}); },
       kInv, {"v.shape[2] (num_heads_kv) = 1 must equal k.shape[2] = 2"}},
      {"out_headdim_v_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.out, {kB, kSq, kH, 16}); },
       kInv, {"out.shape[3] (headdim_v) = 16 must equal v.shape[3] = 8"}},
      {"out_seqlen_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.out, {kB, kSq + 1, kH, kDv}); },
       kInv, {"out.shape[1] (seqlen_q)"}},
      {"lse_seqlen_mismatch", F::kForward, false,
       [](Problem& p) { reshape(p.lse, {kB, kH, kSq + 2}); },
       kInv, {"lse.shape[2] (seqlen_q) = 5 must equal q.shape[1] = 3"}},
      {"lse_batch_layout_swapped", F::kForward, false,
       [](Problem& p) { reshape(p.lse, {kB, kSq, kH}); }, kInv, {"lse.shape[1] (num_heads)"}},
      // ---- heads (C21, C28) and head dims (C34) ----
      {"C21_heads_not_multiple", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, 3, kD});
         reshape(p.out, {kB, kSq, 3, kDv});
         reshape(p.lse, {kB, 3, kSq});
       },
       kInv, {"num_heads = 3", "multiple of num_heads_kv = 2"}},
      {"C21_num_heads_kv_zero", F::kForward, false,
       [](Problem& p) {
         reshape(p.k, {kB, kSk, 0, kD});
         reshape(p.v, {kB, kSk, 0, kDv});
       },
       kInv, {"k.shape[2] (num_heads_kv) = 0", ">= 1"}},
      {"num_heads_zero", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, 0, kD});
         reshape(p.out, {kB, kSq, 0, kDv});
         reshape(p.lse, {kB, 0, kSq});
       },
       kInv, {"q.shape[2] (num_heads) = 0", ">= 1"}},
      {"C34_headdim_0", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, kH, 0});
         reshape(p.k, {kB, kSk, kHkv, 0});
       },
       kInv, {"q.shape[3] (headdim) = 0 must be >= 1"}},
      {"C34_headdim_300", F::kForward, false,
       [](Problem& p) {
         reshape(p.q, {kB, kSq, kH, 300});
         reshape(p.k, {kB, kSk, kHkv, 300});
       },
       kUns, {"q.shape[3] (headdim) = 300", "maximum is 256"}},
      {"C34_headdim_v_300", F::kForward, false,
       [](Problem& p) {
         reshape(p.v, {kB, kSk, kHkv, 300});
         reshape(p.out, {kB, kSq, kH, 300});
       },
       kUns, {"v.shape[3] (headdim_v) = 300", "maximum is 256"}},
      // ---- options ----
      {"C32_scale_zero", F::kForward, false, [](Problem& p) { p.opt.softmax_scale = 0.0f; },
       kInv, {"options.softmax_scale = 0", "finite and > 0"}},
      {"C32_scale_negative", F::kForward, false, [](Problem& p) { p.opt.softmax_scale = -0.5f; },
       kInv, {"options.softmax_scale = -0.5"}},
      {"C32_scale_nan", F::kForward, false,
       [](Problem& p) { p.opt.softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
       kInv, {"options.softmax_scale = nan"}},
      {"C32_scale_inf", F::kForward, false,
       [](Problem& p) { p.opt.softmax_scale = std::numeric_limits<float>::infinity(); },
       kInv, {"options.softmax_scale = inf"}},
      {"C32_scale_zero_backward", F::kBackward, false,
       [](Problem& p) { p.opt.softmax_scale = 0.0f; }, kInv, {"fa4::backward: options.softmax_scale"}},
      {"softcap_negative", F::kForward, false, [](Problem& p) { p.opt.softcap = -1.0f; },
       kInv, {"options.softcap = -1", ">= 0"}},
      {"softcap_nan", F::kForward, false,
       [](Problem& p) { p.opt.softcap = std::numeric_limits<float>::quiet_NaN(); },
       kInv, {"options.softcap = nan"}},
      // Finite but beyond what the log2-unit scales hold: softmax_scale * log2(e), softcap *
      // log2(e) and softmax_scale / softcap would be inf (every score NaN in the kernels).
      {"scale_times_log2e_overflows", F::kForward, false, [](Problem& p) { p.opt.softmax_scale = 3.0e38f; },
       kInv, {"options.softmax_scale = ", "FLT_MAX / log2(e)"}},
      {"scale_times_log2e_overflows_backward", F::kBackward, false,
       [](Problem& p) { p.opt.softmax_scale = 3.0e38f; }, kInv, {"fa4::backward: options.softmax_scale"}},
      {"softcap_times_log2e_overflows", F::kForward, false, [](Problem& p) { p.opt.softcap = 3.0e38f; },
       kInv, {"options.softcap = ", "softcap * log2(e) must be a finite float"}},
      {"softcap_over_scale_subnormal", F::kForward, false,
       [](Problem& p) { p.opt.softmax_scale = 0.125f; p.opt.softcap = 3.0e37f; },
       kInv, {"options.softcap = ", "of at least FLT_MIN"}},
      {"softcap_below_scale_over_flt_max", F::kForward, false,
       [](Problem& p) { p.opt.softmax_scale = 2.0f; p.opt.softcap = 5.0e-39f; },
       kInv, {"options.softcap = ", "softmax_scale / softcap"}},
      {"C08_window_left_minus2", F::kForward, false,
       [](Problem& p) { p.opt.window_size_left = -2; p.opt.window_size_right = 0; },
       kInv, {"options.window_size_left = -2", "-1 (unbounded) or >= 0"}},
      {"window_right_minus5", F::kForward, false, [](Problem& p) { p.opt.window_size_right = -5; },
       kInv, {"options.window_size_right = -5"}},
      {"causal_with_window_right_3", F::kForward, false,
       [](Problem& p) { p.opt.causal = true; p.opt.window_size_right = 3; },
       kInv, {"options.causal", "window_size_right = 3"}},
      {"rescale_threshold_9", F::kForward, false, [](Problem& p) { p.opt.rescale_threshold = 9; },
       kInv, {"options.rescale_threshold = 9", "[0, 8]"}},
      {"rescale_threshold_negative", F::kForward, false,
       [](Problem& p) { p.opt.rescale_threshold = -1; }, kInv, {"options.rescale_threshold = -1"}},
      {"rescale_threshold_nan", F::kForward, false,
       [](Problem& p) { p.opt.rescale_threshold = std::nanf(""); },
       kInv, {"options.rescale_threshold = nan"}},
      {"exp2_fraction_0_3", F::kForward, false,
       [](Problem& p) { p.opt.exp2_emulation_fraction = 0.3f; },
       kInv, {"options.exp2_emulation_fraction = 0.3", "multiple of 1/16"}},
      {"exp2_fraction_above_1", F::kForward, false,
       [](Problem& p) { p.opt.exp2_emulation_fraction = 1.0625f; },
       kInv, {"options.exp2_emulation_fraction = 1.0625"}},
      {"exp2_fraction_negative", F::kForward, false,
       [](Problem& p) { p.opt.exp2_emulation_fraction = -0.0625f; },
       kInv, {"options.exp2_emulation_fraction = -0.0625"}},
      {"backend_cuda_on_cpu_tensors", F::kForward, false,
       [](Problem& p) { p.opt.backend = Backend::kCuda; }, kInv, {"kCuda", "cpu"}},
      {"backend_not_an_enum", F::kForward, false,
       [](Problem& p) { p.opt.backend = static_cast<Backend>(7); }, kInv, {"options.backend = 7"}},
      {"batched_seqused_k", F::kForward, false,
       [](Problem& p) { p.used = make_int32({1, 1}); }, kInv, {"seqused_k", "varlen"}},
      {"batched_max_seqlen_q_disagrees", F::kForward, false,
       [](Problem& p) { p.opt.max_seqlen_q = 7; }, kInv, {"options.max_seqlen_q = 7", "varlen"}},
      // ---- sink ----
      {"sink_wrong_dtype", F::kForward, false,
       [](Problem& p) { p.sink = make(DType::kBF16, {kH}); }, kInv, {"sink.dtype = bf16", "fp32"}},
      {"sink_wrong_size", F::kForward, false,
       [](Problem& p) { p.sink = make(DType::kFP32, {kH + 1}); },
       kInv, {"sink.shape[0] (num_heads) = 5 must equal q.shape[2] = 4"}},
      // ---- varlen structure and contents (C35) ----
      {"C35_cu_q_last_exceeds_total_q", F::kForward, true,
       [](Problem& p) { p.cu_q = make_int32({0, 2, kTotalQ + 1}); p.opt.max_seqlen_q = 5; },
       kInv, {"cu_seqlens_q[2] = 7 exceeds q.shape[0] (total_q) = 6"}},
      {"C35_cu_k_last_exceeds_total_k", F::kForward, true,
       [](Problem& p) { p.cu_k = make_int32({0, 4, kTotalK + 2}); p.opt.max_seqlen_k = 6; },
       kInv, {"cu_seqlens_k[2] = 10 exceeds k.shape[0] (total_k) = 8"}},
      {"C35_cu_q_start_not_zero", F::kForward, true,
       [](Problem& p) { p.cu_q = make_int32({1, 2, 5}); }, kInv, {"cu_seqlens_q[0] = 1 must be 0"}},
      {"C35_cu_k_decreasing", F::kForward, true,
       [](Problem& p) { p.cu_k = make_int32({0, 5, 3}); p.opt.max_seqlen_k = 5; },
       kInv, {"cu_seqlens_k[2] = 3 < cu_seqlens_k[1] = 5", "non-decreasing"}},
      {"C35_length_exceeds_max_seqlen_q", F::kForward, true,
       [](Problem& p) { p.opt.max_seqlen_q = 2; },
       kInv, {"sequence 1", "= 3 > options.max_seqlen_q = 2"}},
      {"C35_length_exceeds_max_seqlen_k", F::kForward, true,
       [](Problem& p) { p.opt.max_seqlen_k = 3; }, kInv, {"options.max_seqlen_k = 3"}},
      {"C35_seqused_k_too_long", F::kForward, true,
       [](Problem& p) { p.used = make_int32({3, 5}); },
       kInv, {"seqused_k[1] = 5 must be in [0, 4]"}},
      {"C35_seqused_k_negative", F::kForward, true,
       [](Problem& p) { p.used = make_int32({-1, 2}); }, kInv, {"seqused_k[0] = -1"}},
      {"C35_seqused_k_wrong_size", F::kForward, true,
       [](Problem& p) { p.used = make_int32({1, 1, 1}); },
       kInv, {"seqused_k.shape[0] = 3 must equal batch = 2"}},
      {"C35_cu_seqlens_sizes_differ", F::kForward, true,
       [](Problem& p) { p.cu_k = make_int32({0, 3, 6, 7}); },
       kInv, {"cu_seqlens_k.shape[0] = 4 must equal cu_seqlens_q.shape[0] = 3"}},
      {"C35_cu_seqlens_backward", F::kBackward, true,
       [](Problem& p) { p.cu_q = make_int32({0, 4, kTotalQ + 3}); p.opt.max_seqlen_q = 5; },
       kInv, {"fa4::backward: cu_seqlens_q[2] = 9 exceeds"}},
      {"varlen_cu_seqlens_fp32", F::kForward, true,
       [](Problem& p) { p.cu_q->t.dtype = DType::kFP32; },
       kInv, {"cu_seqlens_q.dtype = fp32", "int32"}},
      {"varlen_cu_seqlens_empty", F::kForward, true,
       [](Problem& p) { p.cu_q = make_int32({}); p.cu_k = make_int32({}); },
       kInv, {"cu_seqlens_q.shape[0] = 0"}},
      {"varlen_max_seqlen_q_zero", F::kForward, true,
       [](Problem& p) { p.opt.max_seqlen_q = 0; }, kInv, {"options.max_seqlen_q = 0", "> 0"}},
      {"varlen_lse_layout", F::kForward, true, [](Problem& p) { reshape(p.lse, {kTotalQ, kH}); },
       kInv, {"lse.shape[0] (num_heads) = 6 must equal q.shape[1] = 4"}},
      // ---- backward-only ----
      {"dsink_missing", F::kBackward, false,
       [](Problem& p) { p.sink = make(DType::kFP32, {kH}); }, kInv, {"dsink is missing"}},
      {"dsink_without_sink", F::kBackward, false,
       [](Problem& p) { p.dsink = make(DType::kFP32, {kH}); },
       kInv, {"dsink is given but options.sink is not set"}},
      {"dsink_wrong_size", F::kBackward, false,
       [](Problem& p) {
         p.sink = make(DType::kFP32, {kH});
         p.dsink = make(DType::kFP32, {2});
       },
       kInv, {"dsink.shape[0] = 2 must equal num_heads = 4"}},
      {"dq_shape_mismatch", F::kBackward, false,
       [](Problem& p) { reshape(p.dq, {kB, kSq, kH, kD + 1}); },
       kInv, {"dq.shape[3] = 9 must equal q.shape[3] = 8"}},
      {"dk_shape_mismatch", F::kBackward, false,
       [](Problem& p) { reshape(p.dk, {kB, kSk - 1, kHkv, kD}); }, kInv, {"dk.shape[1] = 3"}},
      {"dv_ndim", F::kBackward, false, [](Problem& p) { reshape(p.dv, {kB, kSk, kHkv * kDv}); },
       kInv, {"dv.ndim = 3", "v.ndim = 4"}},
      {"dout_shape_mismatch", F::kBackward, false,
       [](Problem& p) { reshape(p.dout, {kB, kSq, kH, kDv * 2}); },
       kInv, {"dout.shape[3] = 16 must equal out.shape[3] = 8"}},
      {"dout_dtype_mismatch", F::kBackward, false,
       [](Problem& p) { p.dout.t.dtype = DType::kFP16; }, kInv, {"dout.dtype = fp16"}},
      {"dk_last_dim_not_contiguous", F::kBackward, false,
       [](Problem& p) { p.dk.t.stride[3] = 3; }, kInv, {"dk.stride[3] = 3"}},
      {"q_dtype_not_an_enum", F::kForward, false, [](Problem& p) { p.q.t.dtype = static_cast<DType>(7); },
       kInv, {"q.dtype = 7 is not an fa4::DType value"}},
      {"k_stride_address_range_overflows", F::kForward, false,
       [](Problem& p) { p.k.t.stride[1] = int64_t(1) << 61; }, kInv, {"k has shape", "overflows int64"}},
      {"dout_stride_byte_range_overflows", F::kBackward, false,
       [](Problem& p) { p.dout.t.stride[0] = int64_t(1) << 62; }, kInv, {"dout has shape", "byte range overflows int64"}},
      // Outputs apart from every other tensor (checked after every other rule).
      {"out_overlaps_k", F::kForward, false, [](Problem& p) { p.out.t.data = p.k.t.data; },
       kInv, {"out and k share memory"}},
      {"out_heads_overlap", F::kForward, false, [](Problem& p) { p.out.t.stride[2] = kDv / 2; },
       kInv, {"out has shape (2, 3, 4, 8) and strides (96, 32, 4, 1) under which elements may share an address"}},
      {"lse_overlaps_out", F::kForward, false,
       [](Problem& p) { p.lse.t.data = static_cast<uint8_t*>(p.out.t.data) + 64; }, kInv, {"out and lse share memory"}},
      {"lse_inside_padded_out", F::kForward, false,
       [](Problem& p) {
         // out with a padded head dim (16 of each row's 32 bytes used), lse (96 bytes) from its
         // second head's row on: neither end of out lies in lse, but the strides prove that
         // element [0][0][1][0] and the next 7 do.
         p.out = make(p.out.t.dtype, {kB, kSq, kH, 2 * kDv});
         p.out.t.shape[3] = kDv;
         p.lse.t.data = static_cast<uint8_t*>(p.out.t.data) + 2 * kDv * 2;
       },
       kInv, {"out and lse share memory"}},
      {"dk_in_place_of_k", F::kBackward, false, [](Problem& p) { p.dk.t.data = p.k.t.data; },
       kInv, {"dk and k share memory"}},
      {"dq_overlaps_dv", F::kBackward, false, [](Problem& p) { p.dv.t.data = p.dq.t.data; },
       kInv, {"dq and dv share memory"}},
      {"dq_overlaps_dout", F::kBackward, false, [](Problem& p) { p.dq.t.data = p.dout.t.data; },
       kInv, {"dq and dout share memory"}},
      {"dv_overlaps_out", F::kBackward, false, [](Problem& p) { p.dv.t.data = p.out.t.data; },
       kInv, {"dv and out share memory: an output must not overlap"}},
      {"varlen_dsink_overlaps_lse", F::kBackward, true,
       [](Problem& p) {
         p.sink = make(DType::kFP32, {kH});
         p.dsink = make(DType::kFP32, {kH});
         p.dsink->t.data = p.lse.t.data;
       },
       kInv, {"dsink and lse share memory"}},
      {"varlen_out_in_place_of_q", F::kForward, true,
       [](Problem& p) {
         reshape(p.out, {kTotalQ, kH, kD});  // out with q's layout (headdim_v = headdim here)
         reshape(p.v, {kTotalK, kHkv, kD});
         p.out.t.data = p.q.t.data;
       },
       kInv, {"out and q share memory"}},
      {"lse_over_cu_seqlens_k", F::kForward, true,
       [](Problem& p) {
         // cu_seqlens_k as the first entries of a buffer at least as large as lse (96 bytes), so
         // lse overlaps it alone whatever the allocator puts next.
         std::vector<int32_t> cu(kCuK.begin(), kCuK.end());
         cu.resize(32, 0);
         p.cu_k = make_int32(cu);
         p.cu_k->t.shape[0] = int64_t(kCuK.size());
         p.lse.t.data = p.cu_k->t.data;
       },
       kInv, {"lse and cu_seqlens_k share memory"}},
      {"dq_other_device", F::kBackward, false,
       [](Problem& p) { p.dq.t.device = Device::cuda(0); }, kInv, {"dq is on cuda:0"}},
      {"backward_forward_rules_apply", F::kBackward, false,
       [](Problem& p) { reshape(p.k, {kB, kSk, kHkv, kD + 8}); }, kInv, {"k.shape[3] (headdim)"}},
  };
}

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, ThrowsNamedErrorAndWritesNothing) {
  const BadCase& c = GetParam();
  Problem p = c.varlen ? varlen() : batched();
  c.mutate(p);
  poison_outputs(p);
  const auto before = snapshot(p);

  std::string message;
  ErrorCode code = ErrorCode::kOk;
  try {
    if (c.call == Call::kForward) p.forward(); else p.backward();
  } catch (const fa4::Error& e) {
    message = e.what();
    code = e.code();
  }
  ASSERT_FALSE(message.empty()) << "no fa4::Error thrown";
  EXPECT_EQ(code, c.code) << fa4::error_code_name(code) << ": " << message;
  const char* fn = c.call == Call::kForward ? "fa4::forward: " : "fa4::backward: ";
  EXPECT_EQ(message.rfind(fn, 0), 0u) << message;
  for (const std::string& n : c.needles)
    EXPECT_NE(message.find(n), std::string::npos) << "message: " << message << "\nmissing: " << n;

  const auto after = snapshot(p);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_TRUE(before[i] == after[i]) << "buffer " << i << " of the call was modified";

  if (c.call == Call::kForward) {  // forward_support reports exactly what forward throws
    std::string kernel = "stale";
    EXPECT_EQ(p.support(&kernel), message);
    EXPECT_TRUE(kernel.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Validation, BadInput, ::testing::ValuesIn(bad_cases()),
                         [](const auto& info) { return std::string(info.param.name); });

// check_async_errors reports what kernels recorded on a device: for an index no kernel ran on
// (negative, or no such device) there is nothing, in every build (the C ABI's v2 contract).
TEST(Validation, CheckAsyncErrorsOfAnIndexWithoutKernels) {
  EXPECT_NO_THROW(fa4::check_async_errors(-1));
  EXPECT_NO_THROW(fa4::check_async_errors(1 << 20));
}

// release_cached_memory: a negative index is an error naming it; an index with nothing cached
// (no such device, or none in this build) is a no-op.
TEST(Validation, ReleaseCachedMemoryIndex) {
  try {
    fa4::release_cached_memory(-1);
    ADD_FAILURE() << "device_index -1 accepted";
  } catch (const fa4::Error& e) {
    EXPECT_EQ(e.code(), fa4::ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "fa4::release_cached_memory: device_index = -1 must be >= 0");
  }
  EXPECT_NO_THROW(fa4::release_cached_memory(1 << 20));
}

// Inputs may share memory (packed qkv), and outputs may interleave as slices of one packed buffer
// (packed dqkv): neither is refused by the overlap rule, which refuses provable overlaps only.
TEST(Validation, PackedInputsAndInterleavedOutputsPass) {
  constexpr int64_t B = 2, S = 4, H = 2, D = 8;
  // One (B, S, 3, H, D) buffer (flat); q/k/v (and dq/dk/dv) are its slices at offsets 0, H*D, 2*H*D.
  Tensor qkv = make(DType::kFP32, {B * S * 3 * H * D}), dqkv = make(DType::kFP32, {B * S * 3 * H * D});
  auto slice = [&](const Tensor& whole, int i) {
    return TensorView::strided(static_cast<float*>(whole.t.data) + i * H * D, DType::kFP32, {B, S, H, D},
                               {S * 3 * H * D, 3 * H * D, D, 1});
  };
  Tensor out = make(DType::kFP32, {B, S, H, D}), lse = make(DType::kFP32, {B, H, S});
  Tensor dout = make(DType::kFP32, {B, S, H, D});
  fa4::BackwardOptions o;
  o.backend = fa4::Backend::kCpu;
  EXPECT_NO_THROW(fa4::forward(slice(qkv, 0), slice(qkv, 1), slice(qkv, 2), out.t, lse.t, o));
  EXPECT_NO_THROW(fa4::backward(dout.t, slice(qkv, 0), slice(qkv, 1), slice(qkv, 2), out.t, lse.t,
                                slice(dqkv, 0), slice(dqkv, 1), slice(dqkv, 2), o));
  // ... but dk written over the packed k slice itself (neither view dense: the same first address).
  try {
    fa4::backward(dout.t, slice(qkv, 0), slice(qkv, 1), slice(qkv, 2), out.t, lse.t, slice(dqkv, 0), slice(qkv, 1),
                  slice(dqkv, 2), o);
    ADD_FAILURE() << "dk over the packed k accepted";
  } catch (const fa4::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dk and k share memory"), std::string::npos) << e.what();
  }
}

/// The bytes of x's view (contiguous), to compare results bitwise.
std::vector<uint8_t> bytes(const Tensor& x) {
  const uint8_t* d = static_cast<const uint8_t*>(x.t.data);
  return std::vector<uint8_t>(d, d + x.t.numel() * fa4::dtype_size(x.t.dtype));
}

// out may be q itself, and dq may be q itself (the same view: every implementation reads a query
// row before it writes that row's output): the results equal those into separate buffers. dk in
// place of k is refused (tested in the table above).
TEST(Validation, InPlaceOutAndDqOverQ) {
  auto copy_of = [](const Tensor& x) {
    Tensor c = x;
    c.mem = std::make_shared<std::vector<uint8_t>>(*x.mem);
    c.t.data = c.mem->data();
    return c;
  };
  for (Backend b : {Backend::kCpu, Backend::kCpuReference}) {
    SCOPED_TRACE(b == Backend::kCpu ? "cpu" : "reference");
    Problem p = batched(DType::kFP32, kB, kSq, kSk, kD, kD);  // headdim_v == headdim: out has q's layout
    p.opt.backend = b;
    p.forward();
    const std::vector<uint8_t> out_apart = bytes(p.out);
    p.backward();
    const std::vector<uint8_t> dq_apart = bytes(p.dq);
    // dq written over (a copy of) q: the backward reads q, out and lse of the forward above.
    const Tensor q = p.q;
    p.q = copy_of(q);
    p.dq = p.q;
    ASSERT_NO_THROW(p.backward());
    EXPECT_EQ(bytes(p.dq), dq_apart);
    // out written over (a copy of) q.
    p.q = copy_of(q);
    p.out = p.q;
    ASSERT_NO_THROW(p.forward());
    EXPECT_EQ(bytes(p.out), out_apart);
  }
}

// out and lse are the backward's inputs: like q, k and v they may share memory with other inputs,
// even laid out as the forward refuses its outputs. The backward over such views equals the
// backward over the same values in buffers of their own.
TEST(Validation, BackwardOutAndLseMayShareMemoryWithInputs) {
  // x's view moved to the same offset of a copy of owner's memory (x.t.data lies in owner's).
  auto own_copy = [](const Tensor& owner, const Tensor& x) {
    Tensor c = x;
    c.mem = std::make_shared<std::vector<uint8_t>>(*owner.mem);
    c.t.data = c.mem->data() + (static_cast<uint8_t*>(x.t.data) - owner.mem->data());
    return c;
  };
  for (bool is_varlen : {false, true}) {
    SCOPED_TRACE(is_varlen ? "varlen" : "batched");
    Problem p = is_varlen ? varlen(DType::kFP32) : batched(DType::kFP32);  // out has q's shape
    p.opt.backend = Backend::kCpu;
    p.forward();  // lse must belong to q and k: the CPU backward checks it
    const Tensor q = p.q, dout = p.dout;
    // lse over dout's first elements, which take lse's values.
    std::memcpy(dout.t.data, p.lse.t.data, size_t(p.lse.t.numel()) * sizeof(float));
    p.lse.mem = dout.mem;
    p.lse.t.data = dout.t.data;
    if (is_varlen) {
      p.out = q;  // the same view: a forward in place is refused for varlen
    } else {
      // q's bytes read as (batch, head, row, dim): a forward refuses any out over q but q itself.
      p.out.mem = q.mem;
      p.out.t.data = q.t.data;
      p.out.t.stride[1] = kD;
      p.out.t.stride[2] = kSq * kD;
    }
    try {
      p.forward();
      ADD_FAILURE() << "the forward accepted out over q";
    } catch (const fa4::Error& e) {
      EXPECT_NE(std::string(e.what()).find("fa4::forward: out and q share memory"), std::string::npos)
          << e.what();
    }
    for (Tensor* g : {&p.dq, &p.dk, &p.dv}) poison(*g);
    ASSERT_NO_THROW(p.backward());
    const std::vector<uint8_t> dq = bytes(p.dq), dk = bytes(p.dk), dv = bytes(p.dv);
    p.out = own_copy(q, p.out);
    p.lse = own_copy(dout, p.lse);
    for (Tensor* g : {&p.dq, &p.dk, &p.dv}) poison(*g);
    ASSERT_NO_THROW(p.backward());
    EXPECT_EQ(bytes(p.dq), dq);
    EXPECT_EQ(bytes(p.dk), dk);
    EXPECT_EQ(bytes(p.dv), dv);
  }
}

// BackwardOptions::workspace is checked before anything is written (1-D, contiguous, on q's
// device, 256-byte aligned, apart from every other tensor of the call); the CPU backward needs
// none (backward_workspace_size 0) and leaves a given one untouched, with the same gradients.
TEST(Validation, BackwardWorkspaceRules) {
  Problem p = batched(DType::kFP32);
  p.opt.backend = Backend::kCpu;
  p.forward();
  p.backward();
  const std::vector<uint8_t> dq = bytes(p.dq), dk = bytes(p.dk), dv = bytes(p.dv);
  auto size = [&] {
    return fa4::backward_workspace_size(p.dout.t, p.q.t, p.k.t, p.v.t, p.out.t, p.lse.t, p.dq.t, p.dk.t,
                                        p.dv.t, p.opt);
  };

  const Tensor raw = make(DType::kInt32, {256});  // zeros
  const auto base = reinterpret_cast<uintptr_t>(raw.t.data);
  Tensor ws = raw;
  ws.t.data = reinterpret_cast<void*>((base + 255) / 256 * 256);
  ws.t.shape[0] = 64;
  p.opt.workspace = ws.t;
  EXPECT_EQ(size(), 0u);
  for (Tensor* g : {&p.dq, &p.dk, &p.dv}) poison(*g);
  p.backward();
  EXPECT_TRUE(bytes(p.dq) == dq && bytes(p.dk) == dk && bytes(p.dv) == dv);
  EXPECT_EQ(bytes(raw), std::vector<uint8_t>(256 * 4, 0)) << "the CPU backward wrote into the workspace";

  struct Bad {
    const char* name;
    TensorView w;
    const char* message;
  };
  std::vector<Bad> bad;
  TensorView two_d = ws.t;
  two_d.ndim = 2;
  two_d.shape[0] = two_d.shape[1] = 8;
  two_d.stride[0] = 8;
  two_d.stride[1] = 1;
  bad.push_back({"2-D", two_d, "options.workspace.ndim = 2 (shape (8, 8)) must be 1: a 1-D buffer (any dtype)"});
  TensorView strided = ws.t;
  strided.shape[0] = 32;
  strided.stride[0] = 2;
  bad.push_back({"strided", strided, "options.workspace.stride[0] = 2 must be 1 (a contiguous buffer)"});
  TensorView off = ws.t;
  off.data = static_cast<char*>(ws.t.data) + 4;
  off.shape[0] = 32;
  bad.push_back({"misaligned", off, "options.workspace.data must be a multiple of 256 bytes"});
  TensorView gpu = ws.t;
  gpu.device = Device::cuda(0);
  bad.push_back({"other device", gpu, "options.workspace is on cuda:0 but q is on cpu"});
  TensorView over_dq = ws.t;  // 16 bytes inside dq's 768, at a multiple of 256
  over_dq.data = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(p.dq.t.data) + 255) / 256 * 256);
  over_dq.shape[0] = 4;
  bad.push_back({"over dq", over_dq, "share memory"});
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.name);
    p.opt.workspace = b.w;
    for (Tensor* g : {&p.dq, &p.dk, &p.dv}) poison(*g);
    for (int query = 0; query < 2; ++query) {
      try {
        if (query) {
          size();
        } else {
          p.backward();
        }
        ADD_FAILURE() << (query ? "backward_workspace_size" : "backward") << " accepted it";
      } catch (const fa4::Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(b.message), std::string::npos) << e.what();
      }
    }
    for (Tensor* g : {&p.dq, &p.dk, &p.dv})
      for (uint8_t x : bytes(*g)) ASSERT_EQ(x, kSentinel) << "written before the error";
  }
}

}  // namespace
