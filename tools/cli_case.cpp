// tools/cli_case.cpp — see cli_case.h.
#include "cli_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "common/validate.h"
#include "cpu/cpu_attention.h"
#include "cpu/naive_attention.h"
#include "fa4/detail/kernel_config.h"

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
  if (rescale_threshold != 8.0f) s << " tau=" << rescale_threshold;
  if (exp2_fraction) s << " exp2_fraction=" << *exp2_fraction;
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
    }
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
  auto rows = [&](int64_t total, int64_t per_seq, int64_t heads, int64_t dim) {
    return spec.varlen ? std::vector<int64_t>{total, heads, dim}
                       : std::vector<int64_t>{spec.batch, per_seq, heads, dim};
  };
  p.q = HostTensor(t, rows(s.total_q(), spec.seqlen_q, h, d));
  p.k = HostTensor(t, rows(s.total_k(), spec.seqlen_k, hk, d));
  p.v = HostTensor(t, rows(s.total_k(), spec.seqlen_k, hk, dv));
  p.out = HostTensor(t, rows(s.total_q(), spec.seqlen_q, h, dv));
  p.lse = HostTensor(DType::kFP32, spec.varlen ? std::vector<int64_t>{h, s.total_q()}
                                               : std::vector<int64_t>{spec.batch, h, spec.seqlen_q});
  fill_normal(p.q, rng);
  fill_normal(p.k, rng);
  fill_normal(p.v, rng);
  if (spec.sink) {
    p.sink = HostTensor(DType::kFP32, {h});
    // Centred near log(seqlen_k), the size of the keys' share of the softmax denominator, so the
    // sink changes the result noticeably instead of vanishing next to seqlen_k keys.
    fill_normal(p.sink, rng, std::log(static_cast<float>(std::max(1, spec.seqlen_k))));
  }
  if (spec.backward) {
    p.dout = HostTensor(t, p.out.shape());
    fill_normal(p.dout, rng);
    p.dq = HostTensor(t, p.q.shape());
    p.dk = HostTensor(t, p.k.shape());
    p.dv = HostTensor(t, p.v.shape());
    if (spec.sink) p.dsink = HostTensor(DType::kFP32, {h});
  }
  if (spec.varlen) {
    p.cu_seqlens_q = int32_tensor(s.cu_q);
    p.cu_seqlens_k = int32_tensor(s.cu_k);
  }
  for (HostTensor* o : {&p.out, &p.lse, &p.dq, &p.dk, &p.dv, &p.dsink}) test::fill_poison(*o);
  return p;
}

int64_t Problem::visible_pairs() const {
  const detail::MaskSpec m = spec.mask();
  int64_t pairs = 0;
  for (int32_t b = 0; b < seq.batch; ++b) {
    const int32_t sq = seq.len_q(b), sk = seq.len_k(b);
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
  at.cu_q = ptr(p.cu_seqlens_q), at.cu_k = ptr(p.cu_seqlens_k);
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
  }
  o.rescale_threshold = s.rescale_threshold;
  o.exp2_emulation_fraction = s.exp2_fraction;
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

/// Oracle (float64, no rounding) or same-precision naive results as float64 mirrors.
struct Mirrors {
  test::Mirror o, l, gq, gk, gv, gs;
  explicit Mirrors(const Problem& p)
      : o(p.out.numel()), l(p.lse.numel()), gq(p.dq.numel()), gk(p.dk.numel()), gv(p.dv.numel()),
        gs(p.dsink.numel()) {}
};

Mirrors run_naive(const detail::BwdParams& bp, const Problem& p, bool float64) {
  Mirrors m(p);
  test::MirrorWriter w{&m.o, &m.l, &m.gq, &m.gk, &m.gv, &m.gs};
  if (float64) {
    cpu::naive::forward<double>(bp, cpu::naive::NoRounding{}, w);
    if (p.spec.backward) cpu::naive::backward<double>(bp, cpu::naive::NoRounding{}, w);
  } else {
    const cpu::naive::RoundToDtype rnd{bp.dtype};
    cpu::naive::forward<float>(bp, rnd, w);
    if (p.spec.backward) cpu::naive::backward<float>(bp, rnd, w);
  }
  return m;
}

double max_abs_written(const test::Mirror& m) {
  double r = 0;
  for (size_t i = 0; i < m.v.size(); ++i)
    if (m.written[i] && std::isfinite(m.v[i])) r = std::max(r, std::abs(m.v[i]));
  return r;
}

/// Documented slack for fp32 inputs, as in the CPU test suite: a share of P comes from the
/// degree-3 exp2 polynomial (relative error eps = Exp2Poly3::max_rel_error), far above fp32
/// rounding, which the correctly rounded naive fp32 run does not have. Perturbing each P_j by
/// (1 + delta_j), |delta_j| <= eps, moves out by at most 2 eps max|v| and lse by at most eps (first
/// order); gradients see it through O and lse: 4 eps max|grad| + the out term. For 16-bit inputs P
/// is rounded to the dtype (2^-9 / 2^-12 relative), which dominates eps: no slack.
struct Exp2Slack {
  double out = 0, lse = 0;
  double grad(const test::Mirror& ref) const {
    return lse > 0 ? 4.0 * lse * max_abs_written(ref) + out : 0.0;
  }
};

Exp2Slack exp2_slack(const Problem& p, const detail::FwdParams& fp) {
  if (fp.dtype != DType::kFP32) return {};
  Exp2Split split = cpu::default_exp2_split(fp.dtype);
  if (fp.exp2_fraction_given) {
    split = fp.exp2_split;
  } else if (p.spec.device == "cuda") {
    const detail::HopperFwdConfig* c = detail::hopper_fwd_bucket(fp.headdim, fp.headdim_v);
    if (c) split = c->exp2_split;
  }
  if (split.emulated == 0) return {};
  double vmax = 0;
  for (int64_t i = 0; i < p.v.numel(); ++i)
    if (std::isfinite(p.v.get(i))) vmax = std::max(vmax, double(std::abs(p.v.get(i))));
  const double eps = Exp2Poly3::max_rel_error;
  return {2.0 * eps * vmax, eps};
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
  const Mirrors ref = run_naive(bp, src, true);
  const Mirrors naive = run_naive(bp, src, false);
  const Exp2Slack slack = exp2_slack(src, bp);
  const DType dt = bp.dtype;

  std::vector<test::Accuracy> acc;
  acc.push_back(test::check_accuracy("out", tested.out, poisoned.out, ref.o, naive.o, dt, slack.out));
  acc.push_back(test::check_accuracy("lse", tested.lse, poisoned.lse, ref.l, naive.l, DType::kFP32,
                                     slack.lse));
  if (src.spec.backward) {
    acc.push_back(test::check_accuracy("dq", tested.dq, poisoned.dq, ref.gq, naive.gq, dt,
                                       slack.grad(ref.gq)));
    acc.push_back(test::check_accuracy("dk", tested.dk, poisoned.dk, ref.gk, naive.gk, dt,
                                       slack.grad(ref.gk)));
    acc.push_back(test::check_accuracy("dv", tested.dv, poisoned.dv, ref.gv, naive.gv, dt,
                                       slack.grad(ref.gv)));
    if (src.spec.sink)
      acc.push_back(test::check_accuracy("dsink", tested.dsink, poisoned.dsink, ref.gs, naive.gs,
                                         DType::kFP32, slack.grad(ref.gs)));
  }
  return acc;
}

}  // namespace fa4::cli
