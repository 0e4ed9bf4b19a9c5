"""The torch side of the test oracle, shared by test_torch.py and test_kvcache.py: a batched
(b, s, h, d) attention reference in float64 (or in the input dtype, the "plain" implementation
whose error sets the bound) and the project's accuracy rule. Import after
pytest.importorskip("torch")."""

from __future__ import annotations

import torch

EPS = {torch.float32: torch.finfo(torch.float32).eps, torch.float16: 2.0**-10,
       torch.bfloat16: 2.0**-7}


def randn(gen, shape, dtype, device="cpu", requires_grad=False):
    x = torch.randn(shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    return x.requires_grad_(requires_grad)


def ref_attention(q, k, v, *, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  sink=None, upcast=True):
    """Batched (b, s, h, d) reference in torch; float64 when upcast, else q's dtype ("plain")."""
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    sq, sk, h, hkv = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    k = k.repeat_interleave(h // hkv, dim=2)
    v = v.repeat_interleave(h // hkv, dim=2)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    left, right = window_size
    if causal:
        right = 0
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    diag = i + sk - sq
    mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if left >= 0:
        mask &= j >= diag - left
    if right >= 0:
        mask &= j <= diag + right
    s = s.masked_fill(~mask, float("-inf"))
    if sink is not None:
        sink_col = sink.to(s.dtype)[None, :, None, None].expand(s.shape[0], h, sq, 1)
        lse = torch.logsumexp(torch.cat([s, sink_col], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - safe[..., None])
    out = torch.einsum("bhqk,bkhd->bqhd", p.to(v.dtype), v)
    return out, lse


def max_err(x, ref):
    x, ref = x.double(), ref.double()
    both = torch.isinf(ref) & (x == ref)
    d = torch.where(both, torch.zeros_like(ref), (x - ref).abs())
    return d.max().item() if d.numel() else 0.0


def assert_rule(name, got, ref, plain, dtype, atol_scale=2.0):
    err, base = max_err(got, ref), max_err(plain, ref)
    finite = ref[torch.isfinite(ref)]
    mag = max(1.0, finite.abs().max().item() if finite.numel() else 0.0)
    atol = atol_scale * EPS[dtype] * mag
    assert err <= 2 * base + atol, f"{name}: err {err:.3e} > 2 * plain {base:.3e} + {atol:.3e}"
