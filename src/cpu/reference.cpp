// src/cpu/reference.cpp — the float64 oracle (naive_attention.h with Real = double, no rounding),
// writing into the caller's tensors: out/dq/dk/dv rounded once to their dtype, lse/dsink to fp32.
#include "cpu/cpu_attention.h"
#include "cpu/naive_attention.h"

namespace fa4::cpu {
namespace {

/// Stores each float64 result, rounded once, at its element offset in the caller's tensor.
struct TensorWriter {
  const detail::BwdParams& p;  // for the forward only the FwdParams part is used
  void out(int64_t off, double x) const { detail::store_from_float(p.out, p.dtype, off, float(x)); }
  void lse(int64_t off, double x) const { p.lse[off] = float(x); }
  void dq(int64_t off, double x) const { detail::store_from_float(p.dq, p.dtype, off, float(x)); }
  void dk(int64_t off, double x) const { detail::store_from_float(p.dk, p.dtype, off, float(x)); }
  void dv(int64_t off, double x) const { detail::store_from_float(p.dv, p.dtype, off, float(x)); }
  void dsink(int32_t h, double x) const {
    if (p.dsink) p.dsink[h] = float(x);
  }
};

}  // namespace

void reference_forward(const detail::FwdParams& p) {
  detail::BwdParams bp{};
  static_cast<detail::FwdParams&>(bp) = p;
  TensorWriter w{bp};
  naive::forward<double>(p, naive::NoRounding{}, w);
}

void reference_backward(const detail::BwdParams& p) {
  TensorWriter w{p};
  naive::backward<double>(p, naive::NoRounding{}, w);
}

}  // namespace fa4::cpu
