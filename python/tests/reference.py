"""NumPy references for the fa4 tests: a float64 oracle and a "plain same-precision" baseline.

Semantics are those of include/fa4/attention.h (bottom-right masks, GQA h -> h // group, softcap,
sink in the denominator only, rows with no visible key -> out 0, lse -inf or the sink).
The accuracy rule of the project: |fa4 - fp64| <= 2 * |plain - fp64| + tiny atol, where "plain" is
the naive algorithm at the inputs' precision (float32 arithmetic, with scores, P and outputs
rounded to the input dtype as a same-precision framework would store them).
"""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bf16 NumPy tests are skipped then
    ml_dtypes = None
    BF16 = None


def eps(dtype) -> float:
    if BF16 is not None and np.dtype(dtype) == BF16:
        return 2.0**-7
    return float(np.finfo(dtype).eps)


def visible(sq: int, sk: int, left: int, right: int, causal: bool) -> np.ndarray:
    """(sq, sk) bool: the one mask predicate, bottom-right aligned."""
    if causal:
        right = 0
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    m = np.ones((sq, sk), dtype=bool)
    if left >= 0:
        m &= j >= diag - left
    if right >= 0:
        m &= j <= diag + right
    return m


def _sequences(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k):
    """Yields (q rows slice or batch index, k rows, ...) for batched (4-D) or varlen (3-D)."""
    if cu_seqlens_q is None:
        for b in range(q.shape[0]):
            yield (b, slice(None)), (b, slice(None))
    else:
        for b in range(len(cu_seqlens_q) - 1):
            q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
            k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
            if seqused_k is not None:
                k1 = k0 + int(seqused_k[b])
            yield (slice(q0, q1),), (slice(k0, k1),)


def _head_forward(qh, kh, vh, scale, softcap, mask, sink_logit, ctype, rnd):
    s = rnd((qh.astype(ctype) @ kh.astype(ctype).T) * ctype(scale))
    if softcap > 0:
        s = rnd(ctype(softcap) * np.tanh(s / ctype(softcap)))
    s = np.where(mask, s, -np.inf)
    m = s.max(axis=1, initial=-np.inf)
    if sink_logit is not None:
        m = np.maximum(m, ctype(sink_logit))
    m_safe = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m_safe[:, None])
    denom = e.sum(axis=1)
    if sink_logit is not None:
        denom = denom + np.exp(ctype(sink_logit) - m_safe)
    with np.errstate(divide="ignore"):
        lse = np.where(denom > 0, m_safe + np.log(denom), -np.inf)
    p = np.where(mask, np.exp(s - np.where(np.isfinite(lse), lse, 0)[:, None]), 0)
    out = rnd(p).astype(ctype) @ vh.astype(ctype)
    return out, lse, p, s


def attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
              sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, dout=None,
              precision="fp64"):
    """Returns (out, lse) and, with dout, (out, lse, dq, dk, dv, dsink).

    precision="fp64": the oracle; "plain": float32 arithmetic with scores/P/outputs rounded to
    q's dtype. out/dq/dk/dv are float64 arrays either way (rounded values for "plain").
    """
    plain = precision == "plain"
    ctype = np.float32 if plain else np.float64
    rnd = (lambda x: x.astype(q.dtype).astype(ctype)) if plain else (lambda x: x)
    varlen = cu_seqlens_q is not None
    headdim = q.shape[-1]
    scale = softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(headdim)
    h, hkv = q.shape[-2], k.shape[-2]
    group = h // hkv
    left, right = window_size
    out = np.zeros(q.shape[:-1] + (v.shape[-1],), dtype=np.float64)
    lse = np.full((q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1]),
                  -np.inf)
    grads = dout is not None
    if grads:
        dq = np.zeros(q.shape, np.float64)
        dk = np.zeros(k.shape, np.float64)
        dv = np.zeros(v.shape, np.float64)
        dsink = np.zeros(h, np.float64)
    for qi, ki in _sequences(q, k, cu_seqlens_q, cu_seqlens_k, seqused_k):
        qs, ks, vs = q[qi], k[ki], v[ki]
        sq, sk = qs.shape[0], ks.shape[0]
        mask = visible(sq, sk, left, right, causal)
        for hh in range(h):
            kvh = hh // group
            sink_logit = None if sink is None else float(sink[hh])
            o, l, p, s = _head_forward(qs[:, hh], ks[:, kvh], vs[:, kvh], scale, softcap, mask,
                                       sink_logit, ctype, rnd)
            out[qi + (hh,)] = rnd(o)
            if varlen:
                lse[hh, qi[0]] = l
            else:
                lse[qi[0], hh, :] = l
            if not grads:
                continue
            do = dout[qi][:, hh].astype(ctype)
            dv[ki + (kvh,)] += rnd(rnd(p).T @ do)
            dp = do @ vs[:, kvh].astype(ctype).T
            d = (do * rnd(o)).sum(axis=1)  # a real backward reads the stored (rounded) out
            ds = p * (dp - d[:, None])
            if softcap > 0:
                ds = ds * np.where(mask, 1 - (s / softcap) ** 2, 0)
            ds = rnd(ds)
            dq[qi + (hh,)] = rnd(ctype(scale) * ds @ ks[:, kvh].astype(ctype))
            dk[ki + (kvh,)] += rnd(ctype(scale) * ds.T @ qs[:, hh].astype(ctype))
            if sink_logit is not None:
                finite = np.isfinite(l)
                p_sink = np.where(finite, np.exp(sink_logit - np.where(finite, l, 0)), 0)
                dsink[hh] -= (p_sink * d).sum()
    if grads:
        return out, lse, dq, dk, dv, dsink
    return out, lse


def max_err(x, ref) -> float:
    """max |x - ref| in float64; NaN if x has a NaN where ref has none (so NaN never passes)."""
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    both_inf = np.isinf(ref) & (x == ref)
    with np.errstate(invalid="ignore"):  # inf - inf where both are -inf: masked by both_inf
        diff = np.where(both_inf, 0.0, np.abs(x - ref))
    return float(np.max(diff, initial=0.0)) if not np.isnan(diff).any() else float("nan")


def assert_close_rule(name, got, ref, plain, dtype, atol_scale=2.0):
    """The project's accuracy rule: err(got) <= 2 * err(plain) + atol, atol = atol_scale * eps."""
    err = max_err(got, ref)
    base = max_err(plain, ref)
    magnitude = float(np.max(np.abs(np.where(np.isfinite(ref), ref, 0)), initial=0))
    atol = atol_scale * eps(dtype) * max(1.0, magnitude)
    assert err <= 2 * base + atol, (
        f"{name}: max err {err:.3e} > 2 * plain err {base:.3e} + atol {atol:.3e}")
    return err, base
