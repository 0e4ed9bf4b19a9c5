// tools/cli_case.cpp — see cli_case.h.
#include "cli_case.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "accuracy_check.h"
#include "common/validate.h"
#include "cpu/cpu_attention.h"
#include "cpu/naive_attention.h"
#include "hopper/fwd/tuning_fwd.h"

namespace fa4::cli {

namespace {

HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(DType::kInt32, {static_cast<int64_t>(values.size())});
  std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

/// N(mean, 1) values rounded to the tensor's dtype, from the case's own generator (so --seed
/// reproduces a run; the test suites draw fresh seeds instead).
void fill_normal(HostTensor& t, std::mt19937_64& rng, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, dist(rng));
}

}  // namespace

// ---- CaseSpec -------------------------------------------------------------------------------------

DType CaseSpec::dtype_enum() const {
  if (dtype == "bf16") return DType::kBF16;
  if (dtype == "fp16") return DType::kFP16;
  if (dtype == "fp32") return DType::kFP32;
  throw Error(ErrorCode::kInvalidArgument, "fa4 cli: --dtype must be bf16, fp16 or fp32, got " + dtype);
}

detail::MaskSpec CaseSpec::mask() const { return {window[0], causal ? 0 : window[1]}; }

float CaseSpec::resolved_scale() const {
  return softmax_scale ? *softmax_scale : 1.0f / std::sqrt(static_cast<float>(headdim));
}

std::string CaseSpec::describe() const {
  std::ostringstream s;
  s << "b=" << batch << " sq=" << seqlen_q << " sk=" << seqlen_k << " h=" << num_heads << "/"
    << heads_kv() << " d=" << headdim << "/" << dim_v() << " " << dtype;
  if (causal) s << " causal";
  if (window[0] != -1 || window[1] != -1) s << " window=(" << window[0] << "," << window[1] << ")";
  if (softcap > 0) s << " softcap=" << softcap;
  if (sink) s << " sink";
  if (softmax_scale) s << " scale=" << *softmax_scale;
  if (varlen) s << " varlen";
  for (const auto& [name, values] :
       {std::pair{" lens_q=", &lens_q}, {" lens_k=", &lens_k}, {" seqused_k=", &used_k}}) {
    if (values->empty()) continue;
    s << name;
    for (size_t i = 0; i < values->size(); ++i) s << (i ? "," : "") << (*values)[i];
  }
  if (pad_rows) s << " pad_rows=" << pad_rows;
  if (rescale_threshold != 8.0f) s << " tau=" << rescale_threshold;
  if (exp2_emulation_fraction) s << " exp2_emulation_fraction=" << *exp2_emulation_fraction;
  if (backward) s << (deterministic ? " +bwd(deterministic)" : " +bwd");
  s << " device=" << device << " seed=" << seed;
  return s.str();
}

// ---- Problem --------------------------------------------------------------------------------------

Problem Problem::make(const CaseSpec& spec) {
  Problem p;
  p.spec = spec;
  std::mt19937_64 rng(spec.seed);
  SeqLayout& s = p.seq;
  s.varlen = spec.varlen;
  s.batch = spec.batch;
  s.cu_q.assign(1, 0);
  s.cu_k.assign(1, 0);
  for (int32_t b = 0; b < spec.batch; ++b) {
    int32_t lq = spec.seqlen_q, lk = spec.seqlen_k;
    if (spec.varlen) {  // lengths in [1, seqlen] (0 only when seqlen is 0)
      lq = lq > 0 ? std::uniform_int_distribution<int32_t>(1, lq)(rng) : 0;
      lk = lk > 0 ? std::uniform_int_distribution<int32_t>(1, lk)(rng) : 0;
      if (!spec.lens_q.empty()) lq = spec.lens_q.at(b);
      if (!spec.lens_k.empty()) lk = spec.lens_k.at(b);
    }
    if (int64_t(s.cu_q.back()) + lq > INT32_MAX || int64_t(s.cu_k.back()) + lk > INT32_MAX)
      throw Error(ErrorCode::kInvalidArgument, "fa4 cli: the varlen sequences hold more than 2^31 - 1 rows "
                                               "in all (int32 cu_seqlens); lower --batch or --seqlen-q/k");
    s.cu_q.push_back(s.cu_q.back() + lq);
    s.cu_k.push_back(s.cu_k.back() + lk);
    s.max_q = std::max(s.max_q, lq);
    s.max_k = std::max(s.max_k, lk);
  }
  if (!spec.varlen) {
    s.max_q = spec.seqlen_q;
    s.max_k = spec.seqlen_k;
  }

  const DType t = spec.dtype_enum();
  const int64_t h = spec.num_heads, hk = spec.heads_kv(), d = spec.headdim, dv = spec.dim_v();
  if (spec.pad_rows < 0 || (spec.pad_rows > 0 && !spec.varlen))
    throw Error(ErrorCode::kInvalidArgument, "fa4 cli: --pad-rows must be >= 0 and needs --varlen");
  if (s.total_q() + spec.pad_rows > INT32_MAX || s.total_k() + spec.pad_rows > INT32_MAX)
    throw Error(ErrorCode::kInvalidArgument, "fa4 cli: the varlen rows and --pad-rows exceed 2^31 - 1 rows");
  const int64_t pad = spec.pad_rows;
  auto rows = [&](int64_t total, int64_t per_seq, int64_t heads, int64_t dim) {
    return spec.varlen ? std::vector<int64_t>{total + pad, heads, dim}
                       : std::vector<int64_t>{spec.batch, per_seq, heads, dim};
  };
  // The pad rows' inputs are NaN: rows in no sequence must never reach an output.
  auto nan_pad = [&](HostTensor& x, int64_t total) {
    const int64_t per_row = x.numel() / std::max<int64_t>(total + pad, 1);
    for (int64_t i = total * per_row; i < x.numel(); ++i) x.set(i, std::numeric_limits<float>::quiet_NaN());
  };
  p.q = HostTensor(t, rows(s.total_q(), spec.seqlen_q, h, d));
  p.k = HostTensor(t, rows(s.total_k(), spec.seqlen_k, hk, d));
  p.v = HostTensor(t, rows(s.total_k(), spec.seqlen_k, hk, dv));
  p.out = HostTensor(t, rows(s.total_q(), spec.seqlen_q, h, dv));
  p.lse = HostTensor(DType::kFP32, spec.varlen ? std::vector<int64_t>{h, s.total_q() + pad}
                                               : std::vector<int64_t>{spec.batch, h, spec.seqlen_q});
  fill_normal(p.q, rng);
  fill_normal(p.k, rng);
  fill_normal(p.v, rng);
  if (pad) nan_pad(p.q, s.total_q()), nan_pad(p.k, s.total_k()), nan_pad(p.v, s.total_k());
  if (spec.sink) {
    p.sink = HostTensor(DType::kFP32, {h});
    // Centred near log(seqlen_k), the size of the keys' share of the softmax denominator, so the
    // sink changes the result noticeably instead of vanishing next to seqlen_k keys.
    fill_normal(p.sink, rng, std::log(static_cast<float>(std::max(1, spec.seqlen_k))));
  }
  if (spec.backward) {
    p.dout = HostTensor(t, p.out.shape());
    fill_normal(p.dout, rng);
    if (pad) nan_pad(p.dout, s.total_q());
    p.dq = HostTensor(t, p.q.shape());
    p.dk = HostTensor(t, p.k.shape());
    p.dv = HostTensor(t, p.v.shape());
    if (spec.sink) p.dsink = HostTensor(DType::kFP32, {h});
  }
  if (spec.varlen) {
    p.cu_seqlens_q = int32_tensor(s.cu_q);
    p.cu_seqlens_k = int32_tensor(s.cu_k);
    if (!spec.used_k.empty()) p.seqused_k = int32_tensor(spec.used_k);
  }
  for (HostTensor* o : {&p.out, &p.lse, &p.dq, &p.dk, &p.dv, &p.dsink}) test::fill_poison(*o);
  return p;
}

int64_t Problem::visible_pairs() const {
  const detail::MaskSpec m = spec.mask();
  int64_t pairs = 0;
  for (int32_t b = 0; b < seq.batch; ++b) {
    const int32_t sq = seq.len_q(b), sk = spec.used_k.empty() ? seq.len_k(b) : spec.used_k.at(b);
    for (int32_t i = 0; i < sq; ++i) {
      const detail::KeyRange r = detail::visible_key_range(i, sq, sk, m);
      pairs += r.last - r.first;
    }
  }
  return pairs;
}

Placement Placement::host(Problem& p) {
  auto ptr = [](HostTensor& t) -> void* { return t.numel() > 0 ? t.data() : nullptr; };
  Placement at;
  at.q = ptr(p.q), at.k = ptr(p.k), at.v = ptr(p.v), at.dout = ptr(p.dout);
  at.out = ptr(p.out), at.lse = ptr(p.lse), at.dq = ptr(p.dq), at.dk = ptr(p.dk), at.dv = ptr(p.dv);
  at.sink = ptr(p.sink), at.dsink = ptr(p.dsink);
  at.cu_q = ptr(p.cu_seqlens_q), at.cu_k = ptr(p.cu_seqlens_k), at.used_k = ptr(p.seqused_k);
  return at;
}

// ---- running fa4 ----------------------------------------------------------------------------------

TensorView view_at(const HostTensor& t, void* ptr, Device device) {
  TensorView v = t.view();
  v.data = ptr;
  v.device = device;
  return v;
}

BackwardOptions make_options(const Problem& p, const Placement& at, Backend backend) {
  const CaseSpec& s = p.spec;
  BackwardOptions o;
  o.softmax_scale = s.softmax_scale;
  o.causal = s.causal;
  o.window_size_left = s.window[0];
  o.window_size_right = s.window[1];
  o.softcap = s.softcap;
  if (s.sink) o.sink = view_at(p.sink, at.sink, at.device);
  if (s.varlen) {
    o.cu_seqlens_q = view_at(p.cu_seqlens_q, at.cu_q, at.device);
    o.cu_seqlens_k = view_at(p.cu_seqlens_k, at.cu_k, at.device);
    o.max_seqlen_q = p.seq.max_q;
    o.max_seqlen_k = p.seq.max_k;
    if (at.used_k) o.seqused_k = view_at(p.seqused_k, at.used_k, at.device);
  }
  o.rescale_threshold = s.rescale_threshold;
  o.exp2_emulation_fraction = s.exp2_emulation_fraction;
  o.backend = backend;
  o.deterministic = s.deterministic;
  return o;
}

void run_forward(const Problem& p, const Placement& at, Backend backend) {
  const Device dev = at.device;
  fa4::forward(view_at(p.q, at.q, dev), view_at(p.k, at.k, dev), view_at(p.v, at.v, dev),
               view_at(p.out, at.out, dev), view_at(p.lse, at.lse, dev),
               make_options(p, at, backend));
}

void run_backward(const Problem& p, const Placement& at, Backend backend) {
  const Device dev = at.device;
  std::optional<TensorView> dsink;
  if (p.spec.sink) dsink = view_at(p.dsink, at.dsink, dev);
  fa4::backward(view_at(p.dout, at.dout, dev), view_at(p.q, at.q, dev), view_at(p.k, at.k, dev),
                view_at(p.v, at.v, dev), view_at(p.out, at.out, dev), view_at(p.lse, at.lse, dev),
                view_at(p.dq, at.dq, dev), view_at(p.dk, at.dk, dev), view_at(p.dv, at.dv, dev),
                make_options(p, at, backend), dsink);
}

std::string forward_kernel_name(const Problem& p, const Placement& at) {
  std::string name;
  const Device dev = at.device;
  const std::string why = fa4::forward_support(
      view_at(p.q, at.q, dev), view_at(p.k, at.k, dev), view_at(p.v, at.v, dev),
      view_at(p.out, at.out, dev), view_at(p.lse, at.lse, dev), make_options(p, at, Backend::kAuto),
      &name);
  if (!why.empty()) throw Error(ErrorCode::kUnsupported, why);
  return name;
}

// ---- accuracy -------------------------------------------------------------------------------------

namespace {

/// The exp2 emulation share the implementation that ran applies (the Hopper bucket's default on CUDA).
Exp2Emulation effective_exp2_emulation(const Problem& p, const detail::FwdParams& fp) {
  if (fp.exp2_fraction_given) return fp.exp2_emulation;
  if (p.spec.device == "cuda") {
    const detail::HopperFwdConfig* c = detail::hopper_fwd_bucket(fp.headdim, fp.headdim_v);
    if (c) return c->exp2_emulation;
  }
  return cpu::default_exp2_emulation(fp.dtype);
}

}  // namespace

std::vector<test::Accuracy> check_outputs(const Problem& tested, Problem& poisoned) {
  // Params over the untouched problem (the naive code reads only its inputs through them).
  Problem& src = poisoned;
  const Placement at = Placement::host(src);
  std::optional<TensorView> dsink;
  if (src.spec.sink && src.spec.backward) dsink = view_at(src.dsink, at.dsink, at.device);
  detail::BwdParams bp{};
  const BackwardOptions o = make_options(src, at, Backend::kAuto);
  if (src.spec.backward) {
    bp = detail::make_bwd_params(
        view_at(src.dout, at.dout, at.device), view_at(src.q, at.q, at.device),
        view_at(src.k, at.k, at.device), view_at(src.v, at.v, at.device),
        view_at(src.out, at.out, at.device), view_at(src.lse, at.lse, at.device),
        view_at(src.dq, at.dq, at.device), view_at(src.dk, at.dk, at.device),
        view_at(src.dv, at.dv, at.device), o, dsink, "fa4 check");
  } else {
    static_cast<detail::FwdParams&>(bp) = detail::make_fwd_params(
        view_at(src.q, at.q, at.device), view_at(src.k, at.k, at.device),
        view_at(src.v, at.v, at.device), view_at(src.out, at.out, at.device),
        view_at(src.lse, at.lse, at.device), o, "fa4 check");
  }
  // The dsink rounding bound reads the out and lse the tested backward consumed (same layout).
  bp.out = const_cast<void*>(tested.out.data());
  bp.lse = const_cast<float*>(static_cast<const float*>(tested.lse.data()));
  const test::OutputSet out{&tested.out, &tested.lse, &tested.dq, &tested.dk, &tested.dv, &tested.dsink};
  const test::OutputSet before{&poisoned.out, &poisoned.lse, &poisoned.dq, &poisoned.dk,
                               &poisoned.dv, &poisoned.dsink};
  std::vector<test::Accuracy> acc =
      test::check_outputs(bp, out, before, src.spec.backward, src.spec.sink,
                          effective_exp2_emulation(src, bp), test::max_abs_finite(src.v));
  return acc;
}

}  // namespace fa4::cli
