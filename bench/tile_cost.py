#!/usr/bin/env python3
"""Per-tile fixed cost of the forward kernel, fa4 next to cuDNN (an H200 diagnostic).

The query side is held fixed (batch x seqlen_q x num_heads, i.e. a fixed number of query tiles of
the bucket's tile_m rows) while seqlen_k grows, non-causal, bf16. For each kernel the median times are fitted (least
squares) with

    time(seqlen_k) = a + b * seqlen_k

b is the steady-state cost of the key loop per key; a is what does not grow with the keys: each
tile's pipeline fill and drain (Q load, first Q K^T and softmax without overlap, last P V,
epilogue), the partly idle last round of tiles, and the launch. Reported: a in microseconds, a per
round of tiles (tiles / SMs, what one CTA pays per tile), and a as a share of the time at
seqlen_k = seqlen_q. fa4 and cuDNN are timed interleaved in one process, like bench/ab_variants.py.

--backward does the same for the backward (bench_bwd.py's contenders: fa4, cuDNN, FLASH, upstream
FlashAttention-4 where installed): the key side is fixed (batch x seqlen_k x num_heads, i.e. a
fixed number of key tiles of 128 keys) while seqlen_q grows; a is then each key tile's fixed cost
(K/V load, dK/dV store, fill and drain) plus the partly idle last round, and b the cost per 1k
queries (the walk, and the pre/postprocess, which grow with the queries).

Usage (GPU machine, repo root):
    PYTHONPATH=python python3 bench/tile_cost.py OUT.json [--headdim 128] [--rounds 3] [--backward]
"""
import argparse
import json
import pathlib
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa4
from bench_fwd import bench, interleaved_rounds, run_meta  # same directory

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "scripts"))
from generate_kernels import bwd_tile_n as bwd_tile_n_rows, config_rows  # noqa: E402  (the parsers of the tuning tables)

BATCH, SEQLEN_Q = 4, 4096
SEQLENS_K = [1024, 2048, 4096, 8192, 16384]
def bwd_tile_n(headdim):
    """Keys per backward tile of the (headdim, headdim) bucket, from the backward tuning table."""
    rows = bwd_tile_n_rows()
    if (headdim, headdim) not in rows:
        raise SystemExit(f"tile_cost.py: no ({headdim}, {headdim}) row in the backward tuning table")
    return rows[(headdim, headdim)]


def tile_m(headdim):
    """Query rows per tile of the (headdim, headdim) bucket, from the kernel's tuning table."""
    for d, dv, tm in config_rows():
        if d == headdim and dv == headdim:
            return tm
    raise SystemExit(f"tile_cost.py: no ({headdim}, {headdim}) row in the tuning table")


def fit_line(xs, ys):
    """Least-squares (a, b) of y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def sweep_forward(d, heads, rounds):
    """Median ms per contender per seqlen_k: the query side fixed, the keys growing."""
    torch.manual_seed(0)
    q = torch.randn(BATCH, SEQLEN_Q, heads, d, device="cuda", dtype=torch.bfloat16)
    qt = q.transpose(1, 2).contiguous()
    ms = {"fa4": {}, "cudnn": {}}
    for sk in SEQLENS_K:
        k, v = (torch.randn(BATCH, sk, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        kt, vt = (x.transpose(1, 2).contiguous() for x in (k, v))
        fns = {"fa4": lambda: fa4.flash_attn_func(q, k, v),
               "cudnn": lambda: F.scaled_dot_product_attention(qt, kt, vt)}
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            err = float((fns["fa4"]().float() - fns["cudnn"]().transpose(1, 2).float()).abs().max())
            times = {n: [] for n in fns}
            for r in range(rounds):
                for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
                    times[n].append(bench(fns[n]))
        for n in fns:
            ms[n][sk] = statistics.median(times[n])
        print(f"d{d} seqlen_k={sk:6} fa4 {ms['fa4'][sk]:.4f} ms  cuDNN {ms['cudnn'][sk]:.4f} ms  "
              f"max |fa4 - cuDNN| {err:.1e}", flush=True)
    return ms


def sweep_backward(d, heads, rounds):
    """Median ms of the backward alone per contender per seqlen_q: the key side fixed (SEQLEN_Q
    keys), the queries growing."""
    from bench_bwd import contenders  # same directory; imports upstream FlashAttention-4 if present
    torch.manual_seed(0)
    k, v = (torch.randn(BATCH, SEQLEN_Q, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    ms = {}
    for sq in SEQLENS_K:
        q = torch.randn(BATCH, sq, heads, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        fns = contenders(q, k, v, causal=False)
        times = interleaved_rounds({n: (lambda f=f: bench(f)) for n, f in fns.items()}, rounds)
        ran = [n for n in fns if times[n]]
        for n in ran:
            ms.setdefault(n, {})[sq] = statistics.median(times[n])
        print(f"d{d} backward seqlen_q={sq:6} " + "  ".join(f"{n} {ms[n][sq]:.4f} ms" for n in ran), flush=True)
    return {n: t for n, t in ms.items() if len(t) == len(SEQLENS_K)}  # contenders that ran every length


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backward", action="store_true", help="the backward: keys fixed, queries growing")
    args = ap.parse_args()
    d = args.headdim
    heads = 2048 // d
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if args.backward:
        tiles = BATCH * heads * -(-SEQLEN_Q // bwd_tile_n(d))
        ms = sweep_backward(d, heads, args.rounds)
        unit, swept = "queries", "seqlen_q"
    else:
        tiles = BATCH * heads * -(-SEQLEN_Q // tile_m(d))
        ms = sweep_forward(d, heads, args.rounds)
        unit, swept = "keys", "seqlen_k"
    fits = {}
    for n, t in ms.items():
        a, b = fit_line(SEQLENS_K, [t[s] for s in SEQLENS_K])
        resid = max(abs(t[s] - (a + b * s)) / t[s] for s in SEQLENS_K)
        fits[n] = {"a_us": round(a * 1e3, 2), f"b_us_per_1k_{unit}": round(b * 1e6, 2),
                   "a_per_tile_round_us": round(a * 1e3 / (tiles / sms), 3),
                   "a_share_at_4k": round(a / t[SEQLEN_Q], 4), "max_rel_residual": round(resid, 4)}
        print(f"{n:12} a = {fits[n]['a_us']:8.2f} us ({fits[n]['a_per_tile_round_us']:.3f} us per round of "
              f"{sms} tiles, {100 * fits[n]['a_share_at_4k']:.1f}% of {swept} = {SEQLEN_Q}); "
              f"b = {fits[n][f'b_us_per_1k_{unit}']:.2f} us per 1k {unit}; worst fit residual "
              f"{100 * resid:.2f}%", flush=True)
    with open(args.out_json, "w") as f:
        json.dump({"meta": run_meta(), "direction": "backward" if args.backward else "forward", "headdim": d,
                   "batch": BATCH, "fixed_seqlen": SEQLEN_Q, "num_heads": heads, "tiles": tiles, "sms": sms,
                   "swept": swept, "seqlens": SEQLENS_K,
                   "median_ms": {n: {str(s): t[s] for s in SEQLENS_K} for n, t in ms.items()},
                   "fit": fits}, f, indent=1)


if __name__ == "__main__":
    main()
