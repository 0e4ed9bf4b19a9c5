#!/usr/bin/env python3
"""Fit the polynomial of fa4's software exp2 (src/core/exp2.h, exp2_emulated).

    p(f) = 1 + c1*f + c2*f^2 + c3*f^3  ~  2^f   on [0, 1]

Minimax in RELATIVE error (the result is scaled by 2^floor(x) afterwards, which keeps the relative
error), constant term fixed at exactly 1 so that p(0) = 1 and exp2_emulated(integer) is exact.
Source of the scheme: FlashAttention-4 (arXiv 2603.05451) Sec. 3; upstream fits the same problem
with Sollya fpminimax. We do not depend on Sollya:

  1. real-coefficient minimax by a linear program on a dense grid (scipy.optimize.linprog):
       minimise e  s.t.  |p(f_i) - 2^f_i| <= e * 2^f_i  for every grid point f_i;
  2. round the coefficients to float32 (round to nearest);
  3. optionally polish: try every float32 neighbour within +-K ulps of each coefficient and keep the
     set whose float32 evaluation (Horner with fused multiply-add, exactly as exp2.h does it) has the
     smallest max relative error on a dense grid of float32 f values.

Developer tool (not run in CI). Needs numpy and scipy.
    python3 scripts/fit_exp2_poly.py                # fit + polish, print the coefficients
    python3 scripts/fit_exp2_poly.py --emit-cpp     # also print the C++ constexpr lines
"""
import argparse
import itertools
import sys

import numpy as np
from scipy.optimize import linprog

DEGREE = 3


def lp_minimax(degree: int, grid_points: int):
    """Real coefficients c1..c_degree minimising max |p(f)/2^f - 1| with p(0) = 1 on a grid."""
    f = np.linspace(0.0, 1.0, grid_points)
    y = np.exp2(f)
    powers = np.stack([f ** k for k in range(1, degree + 1)], axis=1)  # (n, degree)
    n = len(f)
    # variables: c1..c_degree, e.   p - y <= e*y  and  y - p <= e*y, with p = 1 + powers @ c
    a_ub = np.vstack([np.hstack([powers, -y[:, None]]), np.hstack([-powers, -y[:, None]])])
    b_ub = np.concatenate([y - 1.0, 1.0 - y])
    cost = np.zeros(degree + 1)
    cost[-1] = 1.0
    bounds = [(None, None)] * degree + [(0.0, None)]
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if not res.success:
        sys.exit(f"linprog failed: {res.message}")
    assert a_ub.shape == (2 * n, degree + 1)
    return res.x[:degree], res.x[degree]


def fma32(a, b, c):
    """float32 fused multiply-add: a*b is exact in float64 (24+24 bits); the sum is rounded once in
    float64 and once more to float32. That double rounding can differ from a true fmaf only when
    the float64 sum lands exactly on a float32 halfway point: negligible for ranking candidates
    (the C++ test measures the real error of the real code)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def eval_f32(coeffs32, f32):
    """Horner in float32 with fma, the same operation order as exp2_emulated."""
    acc = np.full_like(f32, coeffs32[-1])
    for c in reversed(coeffs32[:-1]):
        acc = fma32(acc, f32, np.full_like(f32, c))
    return fma32(acc, f32, np.full_like(f32, np.float32(1.0)))


def max_rel_err_f32(coeffs32, f32):
    p = eval_f32(coeffs32, f32).astype(np.float64)
    y = np.exp2(f32.astype(np.float64))
    return float(np.max(np.abs(p - y) / y))


def f32_grid(count: int):
    """count float32 values spread over [0, 1), plus the float32 neighbours of the ends."""
    g = np.linspace(0.0, 1.0, count, endpoint=False).astype(np.float32)
    extra = np.array([0.0, np.nextafter(np.float32(1.0), np.float32(0.0))], dtype=np.float32)
    return np.unique(np.concatenate([g, extra]))


def hexf(c) -> str:
    """C++ hex-float literal of a float32 value (exact), trailing zero digits dropped."""
    mant, exp = float(c).hex().split("p")
    return f"{mant.rstrip('0').rstrip('.')}p{exp}"


def ulp_neighbours(c: np.float32, k: int):
    out = [c]
    lo = hi = c
    for _ in range(k):
        lo = np.nextafter(lo, np.float32(-np.inf))
        hi = np.nextafter(hi, np.float32(np.inf))
        out += [lo, hi]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", type=int, default=20001, help="LP grid points on [0,1]")
    ap.add_argument("--polish-ulps", type=int, default=4, help="search +-K float32 ulps (0 = off)")
    ap.add_argument("--polish-grid", type=int, default=1 << 15, help="f values used while polishing")
    ap.add_argument("--check-grid", type=int, default=1 << 22, help="f values for the final report")
    ap.add_argument("--emit-cpp", action="store_true", help="print the C++ constexpr lines")
    args = ap.parse_args()

    c_real, e_real = lp_minimax(DEGREE, args.grid)
    print(f"LP minimax (real coefficients), degree {DEGREE}, p(0)=1:")
    for k, c in enumerate(c_real, 1):
        print(f"  c{k} = {c:.17g}")
    print(f"  max relative error (grid) = {e_real:.6e}")

    c32 = np.array(c_real, dtype=np.float32)
    polish = f32_grid(args.polish_grid)
    best = (max_rel_err_f32(c32, polish), tuple(c32))
    print(f"rounded to float32: max relative error (float32 Horner) = {best[0]:.6e}")
    if args.polish_ulps > 0:
        cands = [ulp_neighbours(c, args.polish_ulps) for c in c32]
        for combo in itertools.product(*cands):
            err = max_rel_err_f32(np.array(combo, dtype=np.float32), polish)
            if err < best[0]:
                best = (err, combo)
        print(f"polished (+-{args.polish_ulps} ulps): max relative error = {best[0]:.6e}")

    final = np.array(best[1], dtype=np.float32)
    check = f32_grid(args.check_grid)
    err = max_rel_err_f32(final, check)
    print(f"final coefficients (float32), max relative error on {len(check)} f values = {err:.6e}")
    for k, c in enumerate(final, 1):
        print(f"  c{k} = {hexf(c)}  ({float(c):.9g})")
    if args.emit_cpp:
        print("// generated by: python3 scripts/fit_exp2_poly.py --emit-cpp")
        print(f"// max relative error of p(f) vs 2^f on [0,1) (float32 Horner): {err:.3e}")
        print("static constexpr float c0 = 0x1p+0f;")
        for k, c in enumerate(final, 1):
            print(f"static constexpr float c{k} = {hexf(c)}f;  // {float(c):.9g}")


if __name__ == "__main__":
    main()
