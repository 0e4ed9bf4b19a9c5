// src/common/validate.cpp — user arguments -> FwdParams / BwdParams (see validate.h).
//
// Order of checks: each view on its own (ndim, extents, strides, data), then the layout mode
// (batched / varlen), ranks, dtypes, devices, the contiguous head dim, every shape relation through
// one table of named dims, the per-dim rules (heads, head dims), the options, the auxiliary
// tensors (sink, cu_seqlens, seqused_k), then the CONTENTS of host-resident cu_seqlens /
// seqused_k, because indices that disagree with the tensor sizes would read or write out of bounds
// (case C35; device-resident ones are checked by the kernel, see below), and last the memory of
// the tensors each direction writes (check_outputs_apart: the forward's out and lse, the
// backward's gradients; out and lse are the backward's inputs).
// Nothing is written anywhere; the caller runs an implementation only after this returns.
#include "common/validate.h"
#include "common/validate_checks.h"
#include "core/constants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace fa4::detail {
namespace checks {
namespace {

/// Sufficient for no two elements of t to share an address: each dim of extent > 1, by
/// increasing stride (ties: the inner dim first), steps past every element of the dims before it.
/// (Strides are checked non-negative and their span fits int64 before this runs.) No allocation:
/// it runs on every call.
bool distinct_addresses(const TensorView& t) {
  int dims[TensorView::kMaxDims];
  int n = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (t.shape[d] <= 1) continue;
    int i = n++;  // insertion sort, stable
    for (; i > 0 && t.stride[dims[i - 1]] > t.stride[d]; --i) dims[i] = dims[i - 1];
    dims[i] = d;
  }
  int64_t reach = 0;  // the inner dims' largest offset
  for (int i = 0; i < n; ++i) {
    const int d = dims[i];
    if (t.stride[d] <= reach) return false;
    reach += (t.shape[d] - 1) * t.stride[d];
  }
  return true;
}

/// The bytes [lo, hi] of a view and whether its elements fill them; empty: no data or no element.
struct ByteRange {
  uintptr_t lo = 0, hi = 0;
  bool dense = false, empty = true;
};
ByteRange byte_range(const TensorView& t) {
  ByteRange r;
  if (t.data == nullptr) return r;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] == 0) return r;  // (an empty view's strides are not checked: never used here)
  int64_t span = 0, numel = 1;  // the largest element offset; the element count
  for (int d = 0; d < t.ndim; ++d) {
    numel *= t.shape[d];
    if (t.shape[d] > 1) span += (t.shape[d] - 1) * t.stride[d];
  }
  const int64_t elem = dtype_size(t.dtype);
  r.empty = false;
  r.lo = reinterpret_cast<uintptr_t>(t.data);
  r.hi = r.lo + uintptr_t((span + 1) * elem - 1);
  r.dense = span + 1 == numel && distinct_addresses(t);
  return r;
}

/// Whether some element of t has a byte in [lo, hi], for a view whose dims nest
/// (distinct_addresses): by the dims of extent > 1 from the largest stride in, only the (at most
/// two) blocks that [lo, hi] cuts need a look inside; a block between them lies wholly in it.
bool element_in(const TensorView& t, uintptr_t lo, uintptr_t hi) {
  int dims[TensorView::kMaxDims];
  int n = 0;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] <= 1) continue;
    int i = n++;  // by decreasing stride
    for (; i > 0 && t.stride[dims[i - 1]] < t.stride[d]; --i) dims[i] = dims[i - 1];
    dims[i] = d;
  }
  const int64_t elem = dtype_size(t.dtype);
  int64_t reach[TensorView::kMaxDims + 1];  // bytes from a block's first to past its last byte
  reach[n] = elem;
  for (int i = n - 1; i >= 0; --i)
    reach[i] = reach[i + 1] + (t.shape[dims[i]] - 1) * t.stride[dims[i]] * elem;
  const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
  // [lo, hi] relative to the view's first byte, clipped to its bytes (the callers' ranges meet).
  const int64_t want_lo = lo > base ? int64_t(lo - base) : 0;
  const int64_t want_hi = std::min(int64_t(hi - std::min(hi, base)), reach[0] - 1);
  if (hi < base || want_lo > want_hi) return false;
  auto meets = [&](auto&& self, int i, int64_t off) -> bool {
    if (i == n) return off <= want_hi && off + elem - 1 >= want_lo;
    const int64_t step = t.stride[dims[i]] * elem, inner = reach[i + 1];
    // Blocks j with [off + j step, off + j step + inner - 1] meeting [want_lo, want_hi].
    const int64_t first = want_lo - off - inner + 1;
    int64_t j_lo = first <= 0 ? 0 : (first + step - 1) / step;
    int64_t j_hi = want_hi < off ? -1 : (want_hi - off) / step;
    j_hi = std::min(j_hi, t.shape[dims[i]] - 1);
    if (j_lo > j_hi) return false;
    if (j_hi - j_lo >= 2) return true;  // block j_lo + 1 lies wholly inside
    return self(self, i + 1, off + j_lo * step) || (j_hi > j_lo && self(self, i + 1, off + j_hi * step));
  };
  return meets(meets, 0, 0);
}

/// Whether an element of a and an element of b share a byte, by a pruned search: the offset
/// between two elements, b's first byte minus a's, is (b.data - a.data) plus a sum over the dims
/// of both views of index x byte stride (a's indices negated), which must land in
/// [-(b's element size - 1), a's element size - 1]. Dims of equal stride (two slices of one
/// buffer) merge into one. By decreasing stride, each dim tries only the indices from which the
/// inner dims' sums can still reach the target; where every dim's stride exceeds the inner dims'
/// span that is at most three per dim. 1: a shared byte; 0: none; -1: more than kSteps tries
/// (strides of the two views that do not nest into each other), undecided.
int lattice_overlap(const TensorView& a, const TensorView& b) {
  constexpr int kSteps = 2048;
  using Wide = __int128;  // address differences and index x stride sums of two int64 spans
  struct Term {
    int64_t step, lo, hi;  // byte stride; index range
  };
  Term terms[2 * TensorView::kMaxDims];
  int n = 0;
  auto add = [&](const TensorView& t, bool negate) {
    const int64_t elem = dtype_size(t.dtype);
    for (int d = 0; d < t.ndim; ++d) {
      if (t.shape[d] <= 1 || t.stride[d] == 0) continue;
      const int64_t step = t.stride[d] * elem, lo = negate ? 1 - t.shape[d] : 0, hi = negate ? 0 : t.shape[d] - 1;
      int i = 0;
      while (i < n && terms[i].step != step) ++i;
      if (i < n) {
        terms[i].lo += lo;
        terms[i].hi += hi;
      } else {
        terms[n++] = {step, lo, hi};
      }
    }
  };
  add(a, true);
  add(b, false);
  for (int i = 1; i < n; ++i)  // by decreasing step (insertion sort: at most 8 terms)
    for (int j = i; j > 0 && terms[j - 1].step < terms[j].step; --j) std::swap(terms[j - 1], terms[j]);
  Wide below_lo[2 * TensorView::kMaxDims + 1], below_hi[2 * TensorView::kMaxDims + 1];  // inner sums' range
  below_lo[n] = below_hi[n] = 0;
  for (int i = n - 1; i >= 0; --i) {
    below_lo[i] = below_lo[i + 1] + Wide(terms[i].lo) * terms[i].step;
    below_hi[i] = below_hi[i + 1] + Wide(terms[i].hi) * terms[i].step;
  }
  const Wide gap = Wide(reinterpret_cast<uintptr_t>(b.data)) - Wide(reinterpret_cast<uintptr_t>(a.data));
  auto floor_div = [](Wide x, int64_t d) { return x >= 0 ? x / d : -((-x + d - 1) / d); };
  int steps = 0;
  // Whether the dims from i on can sum into [want_lo, want_hi]: 1, 0, or -1 out of steps.
  auto search = [&](auto&& self, int i, Wide want_lo, Wide want_hi) -> int {
    if (i == n) return want_lo <= 0 && 0 <= want_hi;
    const Term& t = terms[i];
    const Wide first = std::max<Wide>(t.lo, -floor_div(below_hi[i + 1] - want_lo, t.step));
    const Wide last = std::min<Wide>(t.hi, floor_div(want_hi - below_lo[i + 1], t.step));
    for (Wide j = first; j <= last; ++j) {
      if (++steps > kSteps) return -1;
      const int r = self(self, i + 1, want_lo - j * t.step, want_hi - j * t.step);
      if (r != 0) return r;
    }
    return 0;
  };
  return search(search, 0, -gap - (dtype_size(b.dtype) - 1), -gap + (dtype_size(a.dtype) - 1));
}

/// views_overlap with the views' byte ranges already at hand (check_outputs_apart has them).
bool ranges_overlap(const TensorView& a, const ByteRange& ra, const TensorView& b, const ByteRange& rb) {
  if (ra.empty || rb.empty || ra.hi < rb.lo || rb.hi < ra.lo) return false;
  if (ra.lo == rb.lo || (ra.dense && rb.dense)) return true;
  // One dense and the other nesting: element_in is exact and takes a few steps whatever the strides.
  if (ra.dense && distinct_addresses(b)) return element_in(b, ra.lo, ra.hi);
  if (rb.dense && distinct_addresses(a)) return element_in(a, rb.lo, rb.hi);
  const int r = lattice_overlap(a, b);
  if (r >= 0) return r == 1;
  // Undecided: an end element of the strided one inside the dense one's range (provable).
  auto end_in = [](const ByteRange& s, const ByteRange& d) {
    return (s.lo >= d.lo && s.lo <= d.hi) || (s.hi >= d.lo && s.hi <= d.hi);
  };
  return (ra.dense && end_in(rb, ra)) || (rb.dense && end_in(ra, rb));
}

}  // namespace

bool views_overlap(const TensorView& a, const TensorView& b) {
  return ranges_overlap(a, byte_range(a), b, byte_range(b));
}

TensorView check_view(const Checker& c, const TensorView& t, const char* name, bool is_output) {
  if (t.ndim < 0 || t.ndim > TensorView::kMaxDims)
    c.invalid(name, ".ndim = ", t.ndim, " must be in [0, ", TensorView::kMaxDims, "]");
  int64_t numel = 1;  // overflow-checked: the implementations index with int64
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] >= 0 && __builtin_mul_overflow(numel, t.shape[d], &numel))
      c.invalid(name, " has shape ", t.shape_string(), " whose element count overflows int64");
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] < 0) c.invalid(name, ".shape[", d, "] = ", t.shape[d], " must be >= 0");
    if (t.shape[d] > 1 && t.stride[d] < 0 && numel != 0)
      c.invalid(name, ".stride[", d, "] = ", t.stride[d], " is negative; negative strides are not "
                "supported");
    if (is_output && t.shape[d] > 1 && t.stride[d] == 0 && numel != 0)
      c.invalid(name, ".stride[", d, "] = 0 on a dim of size ", t.shape[d], ": an output must not "
                "map two elements to one address");
  }
  if (dtype_size(t.dtype) == 0)
    c.invalid(name, ".dtype = ", static_cast<int>(t.dtype), " is not an fa4::DType value");
  // The bytes the view spans from its first element, overflow-checked: the implementations and
  // the TMA descriptors address with int64 byte offsets.
  if (numel != 0) {
    int64_t span = 0, step = 0;
    for (int d = 0; d < t.ndim; ++d)
      if (t.shape[d] > 1 && (__builtin_mul_overflow(t.shape[d] - 1, t.stride[d], &step) ||
                             __builtin_add_overflow(span, step, &span)))
        c.invalid(name, " has shape ", t.shape_string(), " and strides whose address range overflows int64");
    if (__builtin_mul_overflow(span, dtype_size(t.dtype), &span))
      c.invalid(name, " has shape ", t.shape_string(), " and strides whose byte range overflows int64");
  }
  if (t.data != nullptr && reinterpret_cast<uintptr_t>(t.data) % uintptr_t(dtype_size(t.dtype)) != 0)
    c.invalid(name, ".data is not aligned to its element size (", dtype_size(t.dtype), " bytes)");
  if (t.data == nullptr && numel > 0)
    c.invalid(name, ".data is null but ", name, " has shape ", t.shape_string());
  if (t.device.type != DeviceType::kCPU && t.device.type != DeviceType::kCUDA)
    c.invalid(name, ".device.type = ", static_cast<int>(t.device.type), " is not kCPU or kCUDA");
  if (t.device.type == DeviceType::kCUDA && t.device.index < 0)
    c.invalid(name, ".device.index = ", t.device.index, " must be >= 0");
  TensorView n = t;
  // An empty view addresses nothing, so none of its strides matter (NumPy reports all-zero
  // strides for empty arrays): all of them are replaced, as for size-1 dims below.
  const bool empty = numel == 0;
  int64_t inner = 1;  // row-major stride of dim d given the normalised inner dims
  for (int d = t.ndim - 1; d >= 0; --d) {
    if (n.shape[d] <= 1 || empty) n.stride[d] = inner;
    inner = n.stride[d] * (n.shape[d] > 1 ? n.shape[d] : 1);
  }
  return n;
}

void check_outputs_apart(const Checker& c, std::initializer_list<const Named*> outputs,
                         std::initializer_list<const Named*> inputs,
                         std::initializer_list<std::pair<const Named*, const Named*>> in_place) {
  // Runs on every call: fixed arrays, each range computed once, messages built only on failure.
  constexpr int kMax = 16;
  const Named* named[kMax];
  ByteRange range[kMax];
  int n = 0;
  const int n_out = int(outputs.size());
  for (std::initializer_list<const Named*> list : {outputs, inputs})
    for (const Named* x : list) {
      if (n == kMax) c.fail(ErrorCode::kInternal, "check_outputs_apart: more than ", kMax, " tensors");
      named[n] = x;
      range[n++] = x ? byte_range(x->t) : ByteRange{};
    }
  auto same_view = [](const TensorView& a, const TensorView& b) {
    if (a.data != b.data || a.dtype != b.dtype || a.ndim != b.ndim) return false;
    for (int d = 0; d < a.ndim; ++d)
      if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.stride[d] != b.stride[d])) return false;
    return true;
  };
  auto allowed = [&](const Named* o, const Named* x) {
    for (const auto& [po, px] : in_place)
      if (po == o && px == x) return same_view(o->t, x->t);
    return false;
  };
  auto overlap = [&](int i, int j) { return ranges_overlap(named[i]->t, range[i], named[j]->t, range[j]); };
  for (int i = 0; i < n_out; ++i) {
    if (range[i].empty) continue;
    const Named* o = named[i];
    const TensorView& t = o->t;
    if (!range[i].dense && !distinct_addresses(t)) {
      std::ostringstream strides;
      for (int d = 0; d < t.ndim; ++d) strides << (d ? ", " : "(") << t.stride[d];
      strides << (t.ndim ? ")" : "()");
      c.invalid(o->name, " has shape ", t.shape_string(), " and strides ", strides.str(),
                " under which elements may share an address: an output's dims, taken by increasing "
                "stride, must each step past every element of the dims inside them");
    }
    for (int j = i + 1; j < n; ++j) {
      const Named* x = named[j];
      if (range[j].empty || !(x->t.device == t.device)) continue;
      if (overlap(i, j) && !allowed(o, x))
        c.invalid(o->name, " and ", x->name, " share memory: an output must not overlap another "
                  "tensor of the call");
    }
  }
}

void check_dtype_is(const Checker& c, const Named& x, DType want, const char* why) {
  if (x.t.dtype != want)
    c.invalid(x.name, ".dtype = ", dtype_name(x.t.dtype), " must be ", dtype_name(want), " (",
              why, ")");
}

void check_same_device(const Checker& c, const Named& x, const Named& ref) {
  if (!(x.t.device == ref.t.device)) {
    auto where = [](const Device& d) {
      return d.type == DeviceType::kCPU ? std::string("cpu") : "cuda:" + std::to_string(d.index);
    };
    c.invalid(x.name, " is on ", where(x.t.device), " but ", ref.name, " is on ",
              where(ref.t.device), "; all tensors of one call must be on the same device");
  }
  // fa4 enqueues on q's stream; a tensor produced on another stream would be read unordered.
  if (x.t.device.type == DeviceType::kCUDA && x.t.device.stream != ref.t.device.stream)
    c.invalid(x.name, ".device.stream differs from ", ref.name, ".device.stream; all tensors of one "
              "call must name the same CUDA stream (fa4 runs on it)");
}

void check_ndim(const Checker& c, const Named& x, int want, const char* layout) {
  if (x.t.ndim != want)
    c.invalid(x.name, ".ndim = ", x.t.ndim, " (shape ", x.t.shape_string(), ") must be ", want,
              ": ", layout);
}

void check_last_contiguous(const Checker& c, const Named& x) {
  const int d = x.t.ndim - 1;
  if (d >= 0 && x.t.shape[d] > 1 && x.t.stride[d] != 1)
    c.invalid(x.name, ".stride[", d, "] = ", x.t.stride[d], " must be 1: the last dim of ",
              x.name, " must be contiguous");
}

int32_t to_int32(const Checker& c, const DimTable& dims, const char* dim) {
  const int64_t v = dims.get(dim);
  if (v > kInt32Max)
    c.fail(ErrorCode::kUnsupported, dims.source(dim), " (", dim, ") = ", v,
           " exceeds the int32 limit ", kInt32Max);
  return static_cast<int32_t>(v);
}

std::vector<int32_t> read_int32_host(const Named& x) {
  const int64_t n = x.t.shape[0];
  std::vector<int32_t> h(static_cast<size_t>(n));
  if (n > 0) std::memcpy(h.data(), x.t.data, static_cast<size_t>(n) * sizeof(int32_t));
  return h;
}

void check_float_dtypes(const Checker& c, const Named& q,
                        std::initializer_list<const Named*> same) {
  if (q.t.dtype == DType::kFP8E4M3)
    c.fail(ErrorCode::kUnsupported, "q.dtype = fp8_e4m3 is reserved and not supported yet; use "
           "bf16, fp16 or fp32");
  if (q.t.dtype != DType::kBF16 && q.t.dtype != DType::kFP16 && q.t.dtype != DType::kFP32)
    c.invalid("q.dtype = ", dtype_name(q.t.dtype), " must be bf16, fp16 or fp32");
  for (const Named* x : same)
    if (x->t.dtype != q.t.dtype)
      c.invalid(x->name, ".dtype = ", dtype_name(x->t.dtype), " must equal q.dtype = ",
                dtype_name(q.t.dtype));
}

void resolve_heads(const Checker& c, const DimTable& dims, const Named& q, const char* k_name,
                   FwdParams& p) {
  const int32_t num_heads = to_int32(c, dims, "num_heads");
  const int32_t num_heads_kv = to_int32(c, dims, "num_heads_kv");
  if (num_heads_kv <= 0) c.invalid(dims.source("num_heads_kv"), " (num_heads_kv) = 0 must be >= 1");
  if (num_heads <= 0) c.invalid(dims.source("num_heads"), " (num_heads) = 0 must be >= 1");
  if (num_heads % num_heads_kv != 0)
    c.invalid("num_heads = ", num_heads, " (q.shape) must be a multiple of num_heads_kv = ",
              num_heads_kv, " (", k_name, ".shape): query head h uses kv head h / (num_heads / "
              "num_heads_kv)");
  for (const char* hd : {"headdim", "headdim_v"}) {
    const int64_t d = dims.get(hd);
    if (d < 1) c.invalid(dims.source(hd), " (", hd, ") = ", d, " must be >= 1");
    if (d > kMaxHeadDim)
      c.fail(ErrorCode::kUnsupported, dims.source(hd), " (", hd, ") = ", d,
             " is not supported; the maximum is ", kMaxHeadDim);
  }
  p.dtype = q.t.dtype;
  p.device = q.t.device;
  p.num_heads = num_heads;
  p.num_heads_kv = num_heads_kv;
  p.headdim = static_cast<int32_t>(dims.get("headdim"));
  p.headdim_v = static_cast<int32_t>(dims.get("headdim_v"));
}

void resolve_scalar_options(const Checker& c, const AttentionOptions& o, FwdParams& p) {
  if (o.softmax_scale.has_value()) {
    const float s = *o.softmax_scale;
    if (!std::isfinite(s) || !(s > 0.0f))
      c.invalid("options.softmax_scale = ", s, " must be finite and > 0");
    p.softmax_scale = s;
  } else {
    // Case C32: the default uses the real head dim of q/k, never headdim_v or a padded value.
    p.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.headdim)));
  }
  p.softmax_scale_log2 = static_cast<float>(static_cast<double>(p.softmax_scale) * kLog2eF64);
  // The kernels scale scores in log2 units (softmax_scale * log2(e)), and under softcap by
  // softmax_scale / softcap and softcap * log2(e): each must be a finite float.
  if (!std::isfinite(p.softmax_scale_log2))
    c.invalid("options.softmax_scale = ", p.softmax_scale,
              " must be at most FLT_MAX / log2(e) (about 2.36e38): softmax_scale * log2(e) is not a "
              "finite float");
  if (!std::isfinite(o.softcap) || !(o.softcap >= 0.0f))
    c.invalid("options.softcap = ", o.softcap, " must be finite and >= 0 (0 = off)");
  // (softmax_scale / softcap normal, not subnormal: the GPU flushes subnormals to 0.)
  if (o.softcap > 0.0f &&
      (!std::isfinite(static_cast<float>(static_cast<double>(o.softcap) * kLog2eF64)) ||
       !std::isnormal(p.softmax_scale / o.softcap)))
    c.invalid("options.softcap = ", o.softcap, " with softmax_scale = ", p.softmax_scale,
              " is out of range: softcap * log2(e) must be a finite float and softmax_scale / "
              "softcap a finite float of at least FLT_MIN");
  p.softcap = o.softcap;

  // Case C08: -1 is the only "unbounded" sentinel; any other negative value would be read as an
  // empty band, so it is rejected rather than interpreted.
  if (o.window_size_left < -1)
    c.invalid("options.window_size_left = ", o.window_size_left,
              " must be -1 (unbounded) or >= 0");
  if (o.window_size_right < -1)
    c.invalid("options.window_size_right = ", o.window_size_right,
              " must be -1 (unbounded) or >= 0");
  if (o.causal && o.window_size_right != -1 && o.window_size_right != 0)
    c.invalid("options.causal with options.window_size_right = ", o.window_size_right,
              ": causal means window_size_right = 0; pass -1 or 0, or drop causal");
  p.causal = o.causal;
  p.mask.window_left = o.window_size_left;
  p.mask.window_right = o.causal ? 0 : o.window_size_right;

  if (!std::isfinite(o.rescale_threshold) || o.rescale_threshold < 0.0f ||
      o.rescale_threshold > kMaxRescaleThreshold)
    c.invalid("options.rescale_threshold = ", o.rescale_threshold, " must be in [0, ",
              kMaxRescaleThreshold, "] (log2 units; 0 = always rescale)");
  p.rescale_threshold = o.rescale_threshold;

  if (o.exp2_emulation_fraction.has_value()) {
    const float f = *o.exp2_emulation_fraction;
    const float scaled = f * static_cast<float>(kExp2FractionDenominator);  // exact for k/16
    if (!std::isfinite(f) || f < 0.0f || f > 1.0f || scaled != std::floor(scaled))
      c.invalid("options.exp2_emulation_fraction = ", f, " must be a multiple of 1/",
                kExp2FractionDenominator, " in [0, 1]");
    p.exp2_fraction_given = true;
    p.exp2_emulation = Exp2Emulation{kExp2FractionDenominator, static_cast<int32_t>(scaled)};
  }

}

void resolve_sink(const Checker& c, const AttentionOptions& o, const Named& q, DimTable& dims,
                  FwdParams& p) {
  if (o.sink.has_value()) {
    const Named sink{"sink", check_view(c, *o.sink, "sink")};
    check_ndim(c, sink, 1, "sink is (num_heads,)");
    check_dtype_is(c, sink, DType::kFP32, "sink is always fp32");
    check_same_device(c, sink, q);
    check_last_contiguous(c, sink);
    dims.visit(sink, {"num_heads"});
    p.sink = static_cast<const float*>(sink.t.data);
  }
}

void set_batched_strides(const Named& q, const Named& k, const Named& v, const Named& out,
                         const Named& lse, FwdParams& p) {
  p.q_stride = {q.t.stride[0], q.t.stride[1], q.t.stride[2]};
  p.k_stride = {k.t.stride[0], k.t.stride[1], k.t.stride[2]};
  p.v_stride = {v.t.stride[0], v.t.stride[1], v.t.stride[2]};
  p.out_stride = {out.t.stride[0], out.t.stride[1], out.t.stride[2]};
  p.lse_batch_stride = lse.t.stride[0];
  p.lse_head_stride = lse.t.stride[1];
  p.lse_row_stride = lse.t.stride[2];
}

}  // namespace checks

using namespace checks;

namespace {

/// cu_seqlens contents: starts at 0, non-decreasing, each length <= max_seqlen, ends within the
/// packed tensor. Returns the per-sequence lengths.
std::vector<int64_t> check_cu_seqlens(const Checker& c, const std::vector<int32_t>& cu,
                                      const char* name, int64_t total, const char* total_src,
                                      int32_t max_seqlen, const char* max_name) {
  if (cu[0] != 0) c.invalid(name, "[0] = ", cu[0], " must be 0");
  std::vector<int64_t> len(cu.size() - 1);
  for (size_t b = 0; b + 1 < cu.size(); ++b) {
    const int64_t l = int64_t(cu[b + 1]) - cu[b];
    if (l < 0)
      c.invalid(name, "[", b + 1, "] = ", cu[b + 1], " < ", name, "[", b, "] = ", cu[b],
                ": cu_seqlens must be non-decreasing");
    if (l > max_seqlen)
      c.invalid("sequence ", b, " has length ", name, "[", b + 1, "] - ", name, "[", b, "] = ", l,
                " > options.", max_name, " = ", max_seqlen);
    len[b] = l;
  }
  if (cu.back() > total)
    c.invalid(name, "[", cu.size() - 1, "] = ", cu.back(), " exceeds ", total_src, " = ", total,
              ": cu_seqlens must stay within the packed rows");
  return len;
}

/// q, k, v, out and lse as checked (check_view), for the rule on which tensors may share memory.
struct FwdViews {
  Named q, k, v, out, lse;
};

/// Every check of make_fwd_params and every field it fills, but not its rule on the outputs'
/// memory: out and lse are the forward's outputs but the backward's inputs (`out_lse_written`
/// false: they may then repeat elements, e.g. broadcast with stride 0, as any input may), so each
/// direction states that rule itself. Sets `views` to the checked tensors.
FwdParams check_fwd_args(const Checker& c, const TensorView& q_in, const TensorView& k_in,
                         const TensorView& v_in, const TensorView& out_in,
                         const TensorView& lse_in, const AttentionOptions& o, FwdViews& views,
                         bool out_lse_written) {
  views = {{"q", check_view(c, q_in, "q")},
           {"k", check_view(c, k_in, "k")},
           {"v", check_view(c, v_in, "v")},
           {"out", check_view(c, out_in, "out", out_lse_written)},
           {"lse", check_view(c, lse_in, "lse", out_lse_written)}};
  const Named &q = views.q, &k = views.k, &v = views.v, &out = views.out, &lse = views.lse;

  // ---- layout mode and ranks ----
  if (o.cu_seqlens_q.has_value() != o.cu_seqlens_k.has_value())
    c.invalid("options.", o.cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q",
              " is missing: varlen needs both cu_seqlens_q and cu_seqlens_k, or neither");
  const bool varlen = o.cu_seqlens_q.has_value();
  if (varlen) {
    check_ndim(c, q, 3, "varlen q is (total_q, num_heads, headdim)");
    check_ndim(c, k, 3, "varlen k is (total_k, num_heads_kv, headdim)");
    check_ndim(c, v, 3, "varlen v is (total_k, num_heads_kv, headdim_v)");
    check_ndim(c, out, 3, "varlen out is (total_q, num_heads, headdim_v)");
    check_ndim(c, lse, 2, "varlen lse is (num_heads, total_q)");
  } else {
    check_ndim(c, q, 4, "q is (batch, seqlen_q, num_heads, headdim); pass cu_seqlens for varlen");
    check_ndim(c, k, 4, "k is (batch, seqlen_k, num_heads_kv, headdim)");
    check_ndim(c, v, 4, "v is (batch, seqlen_k, num_heads_kv, headdim_v)");
    check_ndim(c, out, 4, "out is (batch, seqlen_q, num_heads, headdim_v)");
    check_ndim(c, lse, 3, "lse is (batch, num_heads, seqlen_q)");
  }

  // ---- dtypes ----
  check_float_dtypes(c, q, {&k, &v, &out});
  check_dtype_is(c, lse, DType::kFP32, "lse is always fp32");

  // ---- devices and the contiguous head dim ----
  for (const Named* x : {&k, &v, &out, &lse}) check_same_device(c, *x, q);
  for (const Named* x : {&q, &k, &v, &out}) check_last_contiguous(c, *x);

  // ---- shape relations ----
  DimTable dims(c);
  if (varlen) {
    dims.visit(q, {"total_q", "num_heads", "headdim"});
    dims.visit(k, {"total_k", "num_heads_kv", "headdim"});
    dims.visit(v, {"total_k", "num_heads_kv", "headdim_v"});
    dims.visit(out, {"total_q", "num_heads", "headdim_v"});
    dims.visit(lse, {"num_heads", "total_q"});
  } else {
    dims.visit(q, {"batch", "seqlen_q", "num_heads", "headdim"});
    dims.visit(k, {"batch", "seqlen_k", "num_heads_kv", "headdim"});
    dims.visit(v, {"batch", "seqlen_k", "num_heads_kv", "headdim_v"});
    dims.visit(out, {"batch", "seqlen_q", "num_heads", "headdim_v"});
    dims.visit(lse, {"batch", "num_heads", "seqlen_q"});
  }

  // ---- heads and head dims (case C21, C28, C34), options, sink ----
  FwdParams p;
  resolve_heads(c, dims, q, "k", p);
  p.is_varlen = varlen;
  resolve_scalar_options(c, o, p);
  resolve_sink(c, o, q, dims, p);

  // ---- sequence structure ----
  if (!varlen) {
    if (o.seqused_k.has_value())
      c.invalid("options.seqused_k is only supported with varlen (cu_seqlens_q/k)");
    struct MaxSeqlen { int32_t given; const char* name; const char* dim; };
    for (const MaxSeqlen& m : {MaxSeqlen{o.max_seqlen_q, "max_seqlen_q", "seqlen_q"},
                               MaxSeqlen{o.max_seqlen_k, "max_seqlen_k", "seqlen_k"}})
      if (m.given != 0 && m.given != dims.get(m.dim))
        c.invalid("options.", m.name, " = ", m.given, " is only used with varlen; leave it 0 (or ",
                  "equal to ", dims.source(m.dim), " = ", dims.get(m.dim), ")");
    p.batch = to_int32(c, dims, "batch");
    p.seqlen_q = to_int32(c, dims, "seqlen_q");
    p.seqlen_k = to_int32(c, dims, "seqlen_k");
    p.total_q = int64_t(p.batch) * p.seqlen_q;
    p.total_k = int64_t(p.batch) * p.seqlen_k;
    set_batched_strides(q, k, v, out, lse, p);
  } else {
    const Named cu_q{"cu_seqlens_q", check_view(c, *o.cu_seqlens_q, "cu_seqlens_q")};
    const Named cu_k{"cu_seqlens_k", check_view(c, *o.cu_seqlens_k, "cu_seqlens_k")};
    for (const Named* x : {&cu_q, &cu_k}) {
      check_ndim(c, *x, 1, "cu_seqlens are (batch + 1,)");
      check_dtype_is(c, *x, DType::kInt32, "cu_seqlens are int32");
      check_same_device(c, *x, q);
      check_last_contiguous(c, *x);
    }
    if (cu_q.t.shape[0] < 1)
      c.invalid("cu_seqlens_q.shape[0] = 0 must be >= 1 (it holds batch + 1 offsets)");
    if (cu_k.t.shape[0] != cu_q.t.shape[0])
      c.invalid("cu_seqlens_k.shape[0] = ", cu_k.t.shape[0], " must equal cu_seqlens_q.shape[0] = ",
                cu_q.t.shape[0], " (batch + 1)");
    if (cu_q.t.shape[0] - 1 > kInt32Max)
      c.fail(ErrorCode::kUnsupported, "cu_seqlens_q.shape[0] - 1 (batch) exceeds the int32 limit");
    p.batch = static_cast<int32_t>(cu_q.t.shape[0] - 1);
    std::optional<Named> used;
    if (o.seqused_k.has_value()) {
      used = Named{"seqused_k", check_view(c, *o.seqused_k, "seqused_k")};
      check_ndim(c, *used, 1, "seqused_k is (batch,)");
      check_dtype_is(c, *used, DType::kInt32, "seqused_k is int32");
      check_same_device(c, *used, q);
      check_last_contiguous(c, *used);
      if (used->t.shape[0] != p.batch)
        c.invalid("seqused_k.shape[0] = ", used->t.shape[0], " must equal batch = ", p.batch,
                  " (cu_seqlens_q.shape[0] - 1)");
    }
    if (p.batch > 0 && o.max_seqlen_q <= 0)
      c.invalid("options.max_seqlen_q = ", o.max_seqlen_q, " must be > 0 for varlen with batch ",
                p.batch);
    if (p.batch > 0 && o.max_seqlen_k <= 0)
      c.invalid("options.max_seqlen_k = ", o.max_seqlen_k, " must be > 0 for varlen with batch ",
                p.batch);
    if (o.max_seqlen_q < 0 || o.max_seqlen_k < 0)
      c.invalid("options.max_seqlen_q / max_seqlen_k must be >= 0");

    // Contents (case C35). Host-resident indices are checked here, before anything runs. Device-
    // resident ones cannot be read without a host sync per call (and not at all under CUDA graph
    // capture): the kernel checks the same rules for every sequence, computes nothing for one that
    // breaks them, and reports it through fa4::check_async_errors (src/hopper/shared/device_state.h).
    if (!cu_q.t.is_cuda()) {
      const std::vector<int32_t> hq = read_int32_host(cu_q);
      const std::vector<int32_t> hk = read_int32_host(cu_k);
      check_cu_seqlens(c, hq, "cu_seqlens_q", dims.get("total_q"), "q.shape[0] (total_q)",
                       o.max_seqlen_q, "max_seqlen_q");
      const std::vector<int64_t> len_k =
          check_cu_seqlens(c, hk, "cu_seqlens_k", dims.get("total_k"), "k.shape[0] (total_k)",
                           o.max_seqlen_k, "max_seqlen_k");
      if (used) {
        const std::vector<int32_t> hu = read_int32_host(*used);
        for (size_t b = 0; b < hu.size(); ++b)
          if (hu[b] < 0 || hu[b] > len_k[b])
            c.invalid("seqused_k[", b, "] = ", hu[b], " must be in [0, ", len_k[b],
                      "] (the length of key sequence ", b, " from cu_seqlens_k)");
      }
    }
    if (used) p.seqused_k = static_cast<const int32_t*>(used->t.data);
    p.cu_seqlens_q = static_cast<const int32_t*>(cu_q.t.data);
    p.cu_seqlens_k = static_cast<const int32_t*>(cu_k.t.data);
    p.seqlen_q = o.max_seqlen_q;
    p.seqlen_k = o.max_seqlen_k;
    p.total_q = dims.get("total_q");
    p.total_k = dims.get("total_k");
    p.q_stride = {0, q.t.stride[0], q.t.stride[1]};
    p.k_stride = {0, k.t.stride[0], k.t.stride[1]};
    p.v_stride = {0, v.t.stride[0], v.t.stride[1]};
    p.out_stride = {0, out.t.stride[0], out.t.stride[1]};
    p.lse_batch_stride = 0;
    p.lse_head_stride = lse.t.stride[0];
    p.lse_row_stride = lse.t.stride[1];
  }

  p.q = q.t.data;
  p.k = k.t.data;
  p.v = v.t.data;
  p.out = out.t.data;
  p.lse = static_cast<float*>(lse.t.data);
  return p;
}

}  // namespace

FwdParams make_fwd_params(const TensorView& q_in, const TensorView& k_in, const TensorView& v_in,
                          const TensorView& out_in, const TensorView& lse_in,
                          const AttentionOptions& o, const char* fn) {
  const Checker c(fn);
  FwdViews t{};
  const FwdParams p = check_fwd_args(c, q_in, k_in, v_in, out_in, lse_in, o, t, /*out_lse_written=*/true);
  // The other tensors the kernels read: the sink and the varlen indices (the CPU re-reads them
  // per tile, so an output over them would change its own bounds mid-call).
  const OptionInputs in(o);
  // out may be q itself (in place, same layout, batched): a query row is read before its output
  // row is written, by every implementation. Not varlen: the CUDA forward's last query block of a
  // sequence loads the next sequence's first rows as padding, which in place may be output
  // already, and they join the block's rescale votes (the result would still be right, but not
  // bitwise repeatable).
  if (p.is_varlen)
    check_outputs_apart(c, {&t.out, &t.lse},
                        {&t.q, &t.k, &t.v, &in.sink, &in.cu_seqlens_q, &in.cu_seqlens_k, &in.seqused_k});
  else
    check_outputs_apart(c, {&t.out, &t.lse}, {&t.q, &t.k, &t.v, &in.sink}, {{&t.out, &t.q}});
  return p;
}

BwdParams make_bwd_params(const TensorView& dout_in, const TensorView& q_in,
                          const TensorView& k_in, const TensorView& v_in,
                          const TensorView& out_in, const TensorView& lse_in,
                          const TensorView& dq_in, const TensorView& dk_in,
                          const TensorView& dv_in, const BackwardOptions& o,
                          const std::optional<TensorView>& dsink_in, const char* fn) {
  const Checker c(fn);
  BwdParams p;
  FwdViews t{};  // out and lse are inputs here: only the gradients' rule below applies to them
  static_cast<FwdParams&>(p) =
      check_fwd_args(c, q_in, k_in, v_in, out_in, lse_in, o, t, /*out_lse_written=*/false);

  const Named dout{"dout", check_view(c, dout_in, "dout")};
  const Named dq{"dq", check_view(c, dq_in, "dq", /*is_output=*/true)};
  const Named dk{"dk", check_view(c, dk_in, "dk", /*is_output=*/true)};
  const Named dv{"dv", check_view(c, dv_in, "dv", /*is_output=*/true)};
  // Each gradient has the layout of its primal tensor (dout: of out).
  const struct { const Named* grad; const TensorView* like; const char* like_name; } pairs[] = {
      {&dout, &out_in, "out"}, {&dq, &q_in, "q"}, {&dk, &k_in, "k"}, {&dv, &v_in, "v"}};
  for (const auto& [g, like, like_name] : pairs) {
    if (g->t.ndim != like->ndim)
      c.invalid(g->name, ".ndim = ", g->t.ndim, " (shape ", g->t.shape_string(), ") must equal ",
                like_name, ".ndim = ", like->ndim);
    if (g->t.dtype != p.dtype)
      c.invalid(g->name, ".dtype = ", dtype_name(g->t.dtype), " must equal q.dtype = ",
                dtype_name(p.dtype));
    check_same_device(c, *g, t.q);
    check_last_contiguous(c, *g);
    for (int d = 0; d < like->ndim; ++d)
      if (g->t.shape[d] != like->shape[d])
        c.invalid(g->name, ".shape[", d, "] = ", g->t.shape[d], " must equal ", like_name,
                  ".shape[", d, "] = ", like->shape[d], " (", g->name, " has the layout of ",
                  like_name, ")");
  }

  if (o.sink.has_value() != dsink_in.has_value())
    c.invalid(o.sink ? "dsink is missing: options.sink is set, so backward needs dsink "
                       "(fp32, (num_heads,))"
                     : "dsink is given but options.sink is not set");
  std::optional<Named> dsink_named;
  if (dsink_in.has_value()) {
    const Named& dsink = dsink_named.emplace(Named{"dsink", check_view(c, *dsink_in, "dsink", /*is_output=*/true)});
    check_ndim(c, dsink, 1, "dsink is (num_heads,)");
    check_dtype_is(c, dsink, DType::kFP32, "dsink is always fp32");
    check_same_device(c, dsink, t.q);
    check_last_contiguous(c, dsink);
    if (dsink.t.shape[0] != p.num_heads)
      c.invalid("dsink.shape[0] = ", dsink.t.shape[0], " must equal num_heads = ", p.num_heads);
    p.dsink = static_cast<float*>(dsink.t.data);
  }

  auto rows = [&](const TensorView& t) -> RowStrides {
    return p.is_varlen ? RowStrides{0, t.stride[0], t.stride[1]}
                       : RowStrides{t.stride[0], t.stride[1], t.stride[2]};
  };
  p.dout = dout.t.data;
  p.dq = dq.t.data;
  p.dk = dk.t.data;
  p.dv = dv.t.data;
  p.dout_stride = rows(dout.t);
  p.dq_stride = rows(dq.t);
  p.dk_stride = rows(dk.t);
  p.dv_stride = rows(dv.t);
  p.deterministic = o.deterministic;
  std::optional<Named> workspace_named;
  if (o.workspace.has_value()) {
    const Named& ws = workspace_named.emplace(
        Named{"options.workspace", check_view(c, *o.workspace, "options.workspace", /*is_output=*/true)});
    check_ndim(c, ws, 1, "a 1-D buffer (any dtype)");
    check_same_device(c, ws, t.q);
    if (ws.t.shape[0] > 1 && ws.t.stride[0] != 1)
      c.invalid("options.workspace.stride[0] = ", ws.t.stride[0], " must be 1 (a contiguous buffer)");
    if (reinterpret_cast<uintptr_t>(ws.t.data) % 256 != 0)
      c.invalid("options.workspace.data must be a multiple of 256 bytes (the kernels' vector and "
                "bulk accesses)");
    p.has_workspace = true;
    p.workspace = ws.t.data;
    p.workspace_bytes = ws.t.shape[0] * dtype_size(ws.t.dtype);
  }
  // The gradients apart from each other and from every input (out and lse are inputs here).
  // dq may be q itself (in place): dq is written once q's rows are read (the CUDA postprocess;
  // the CPU's dq pass reads only the rows it writes). dk / dv in place of k / v are not: the
  // CPU's dq pass reads k after dk is written.
  const OptionInputs in(o);
  check_outputs_apart(c, {&dq, &dk, &dv, dsink_named ? &*dsink_named : nullptr,
                          workspace_named ? &*workspace_named : nullptr},
                      {&dout, &t.q, &t.k, &t.v, &t.out, &t.lse, &in.sink, &in.cu_seqlens_q,
                       &in.cu_seqlens_k, &in.seqused_k},
                      {{&dq, &t.q}});
  return p;
}

bool is_empty_problem(const FwdParams& p) {
  return p.batch == 0 || p.total_q == 0 || p.num_heads == 0;
}

}  // namespace fa4::detail
