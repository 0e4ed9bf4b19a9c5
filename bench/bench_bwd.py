#!/usr/bin/env python3
"""Backward attention benchmark: fa4's Hopper backward next to torch SDPA (cuDNN and FLASH backends)
and, where it is installed, upstream FlashAttention-4 (flash_attn.cute), in ONE process, on one GPU,
timed with triton.testing.do_bench (median, CUDA events), interleaved rounds.

What is timed is the backward alone: torch.autograd.grad of a saved forward output (retain_graph),
the same for every contender. FLOPs = 2.5 x the forward's 2*b*h*sq*sk*(d + dv) (x0.5 causal).
Shapes (FA3/FA4 papers): batch*seqlen = 16k tokens, num_heads*headdim = 2048, head dims 64/128/256,
seqlen 512..16k, causal and not; Llama-3.1-8B (GQA 32/8, d128, causal 8k); DeepSeek-V3 (16 heads,
q/k 192, v 128, causal 8k; not with --quick); deterministic vs not. On request (--headdims) the
standard rows also run at 192 and 192x128 (q/k 192, v 128), with 16 heads (DeepSeek-V3's).

Usage (on the GPU machine, from the repo root):
    PYTHONPATH=python FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/bench_bwd.py OUT.json [--quick] [--rounds N]
        [--headdims 64,128,256[,192,192x128]]
Writes OUT.json (git commit, GPU, clocks, date, versions, rows) and OUT.png.
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# upstream_fa4_func: upstream FlashAttention-4 (None where it is not installed)
from bench_fwd import (agreement, bench, fa4_layout, interleaved_rounds, run_meta, tflops, upstream_fa4_func,  # noqa: E402
                       upstream_fa4_version)

import fa4  # noqa: E402

ROUNDS = 3


def grad_call(fwd, inputs, dout):
    """A call that runs only the backward of fwd(*inputs) (its forward is run once, here)."""
    out = fwd()
    if isinstance(out, tuple):
        out = out[0]
    return lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True)


def random_dout(q, v):
    """A random output gradient of o's shape (q's, with v's head dim)."""
    return torch.randn(*q.shape[:-1], v.shape[-1], device=q.device, dtype=q.dtype)


def contenders(q, k, v, causal, deterministic=False):
    """name -> (backward-only call, context); SDPA backends that refuse the shape are left out."""
    dout = random_dout(q, v)
    fns = {"fa4": grad_call(lambda: fa4.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic),
                            (q, k, v), dout)}
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    gqa = qt.shape[1] != kt.shape[1]
    # SDPA's causal mask is top-left aligned, fa4's bottom-right: equal only for square rows.
    assert not causal or qt.shape[2] == kt.shape[2], "causal SDPA rows need seqlen_q == seqlen_k"
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel([be]):
                call = grad_call(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa),
                                 (qt, kt, vt), dout.transpose(1, 2).contiguous())
                call()
            fns[name] = call
        except Exception:
            pass
    if upstream_fa4_func is not None:
        try:
            call = grad_call(lambda: upstream_fa4_func(q, k, v, causal=causal, deterministic=deterministic),
                             (q, k, v), dout)
            call()
            fns["upstream_fa4"] = call
        except Exception as e:
            print(f"# upstream_fa4 failed: {str(e).splitlines()[0][:160]}", file=sys.stderr)
    return fns


def gradient_results(fns):
    """Each contender's (dq, dk, dv) once, in fa4's (batch, seqlen, heads, headdim) layout (SDPA's
    transposed back); None for a contender that fails here."""
    res = {}
    for name, f in fns.items():
        try:
            res[name] = tuple(fa4_layout(name, g) for g in f())
        except Exception as e:
            print(f"# {name} gradient check failed: {str(e).splitlines()[0][:120]}", file=sys.stderr)
            res[name] = None
    return res


def time_row(r, fns, flops):
    """Median over ROUNDS rounds, each running every contender once (bench/rounds.py's order); first
    r["max_rel_diff_vs_fa4"], every contender's dq, dk, dv against fa4's (bench_fwd.agreement)."""
    r["max_rel_diff_vs_fa4"] = agreement(gradient_results(fns))
    times = interleaved_rounds({n: (lambda f=f: bench(f)) for n, f in fns.items()}, ROUNDS)
    for n in ["fa4", "cudnn", "flash", "upstream_fa4"]:
        r[n] = tflops(flops, statistics.median(times[n])) if times.get(n) else None
    r["rounds"] = ROUNDS
    r["ratio_cudnn"] = round(r["fa4"] / r["cudnn"], 3) if r["fa4"] and r["cudnn"] else None
    r["ratio_upstream_fa4"] = round(r["fa4"] / r["upstream_fa4"], 3) if r["fa4"] and r["upstream_fa4"] else None
    return r


def check_grads(q, k, v, causal):
    """Max abs error of fa4's dq/dk/dv against SDPA's math backend in fp32 on the same inputs."""
    dout = random_dout(q, v)
    g = torch.autograd.grad(fa4.flash_attn_func(q, k, v, causal=causal), (q, k, v), dout)
    q32, k32, v32 = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    g32 = torch.autograd.grad(o, (q32, k32, v32), dout.float().transpose(1, 2))
    return max(float((a.float() - b.transpose(1, 2)).abs().max()) for a, b in zip(g, g32))


STANDARD_HEADDIMS = {"64": (64, 64), "128": (128, 128), "256": (256, 256), "192": (192, 192),
                     "192x128": (192, 128)}


def parse_headdims(text):
    """'64,128,192x128' -> [(64, 64), (128, 128), (192, 128)] (headdim, headdim_v); ValueError
    for anything that is not a key of STANDARD_HEADDIMS."""
    names = [x.strip() for x in text.split(",")]
    bad = [x for x in names if x not in STANDARD_HEADDIMS]
    if not names or bad:
        raise ValueError(f"each of {', '.join(STANDARD_HEADDIMS)}; got {text!r}")
    return [STANDARD_HEADDIMS[x] for x in names]


def standard_heads(d):
    """num_heads of a standard row: 2048 / headdim (FA3/FA4 papers), 16 for q/k 192 (DeepSeek-V3)."""
    return 16 if d == 192 else 2048 // d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--quick", action="store_true", help="seqlen 1k-16k, no deterministic rows")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--headdims", default="64,128,256",
                    help="comma-separated head dims of the standard rows: 64, 128, 256, 192, 192x128 (q/k x v)")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    try:
        dims = parse_headdims(args.headdims)
    except ValueError as e:
        ap.error(f"--headdims: {e}")
    hdims = [d for d, dv in dims if d == dv]  # the rows below that take a square head dim
    global ROUNDS
    ROUNDS = args.rounds
    meta = run_meta()
    meta["upstream_fa4"] = upstream_fa4_version()
    print(json.dumps(meta), flush=True)
    rows = []
    dt = torch.bfloat16

    def add(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    seqlens = [1024, 4096, 8192, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    for hdim, hdim_v in dims:
        nheads = standard_heads(hdim)
        for causal in [False, True]:
            for seqlen in seqlens:
                batch = 16384 // seqlen
                q, k = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dt, requires_grad=True)
                        for _ in range(2))
                v = torch.randn(batch, seqlen, nheads, hdim_v, device="cuda", dtype=dt, requires_grad=True)
                flops = 2.5 * 2 * batch * nheads * seqlen * seqlen * (hdim + hdim_v) * (0.5 if causal else 1.0)
                r = {"kind": "standard", "hdim": hdim, "hdim_v": hdim_v, "causal": causal, "seqlen": seqlen,
                     "batch": batch, "nheads": nheads}
                try:  # e.g. a bucket this build did not compile: reported, and the rows after it still run
                    if seqlen == seqlens[0]:
                        r["max_abs_err_vs_fp32"] = check_grads(q, k, v, causal)
                    add(time_row(r, contenders(q, k, v, causal), flops))
                except fa4.Fa4Error as e:
                    print(f"# standard row {hdim}x{hdim_v} causal={causal} {seqlen} failed: "
                          f"{str(e).splitlines()[0][:160]}", file=sys.stderr)
                del q, k, v

    # Llama-3.1-8B training shape: 32 q heads, 8 kv heads, d128, causal, seqlen 8k.
    if 128 in hdims:
        q = torch.randn(1, 8192, 32, 128, device="cuda", dtype=dt, requires_grad=True)
        k, v = (torch.randn(1, 8192, 8, 128, device="cuda", dtype=dt, requires_grad=True) for _ in range(2))
        flops = 2.5 * 4 * 32 * 8192 * 8192 * 128 * 0.5
        add(time_row({"kind": "llama3.1-8b", "hdim": 128, "causal": True, "seqlen": 8192, "batch": 1, "nheads": 32},
                     contenders(q, k, v, True), flops))
        del q, k, v

    # DeepSeek-V3 attention shape (MLA prefill: q/k head dim 192 = 128 + 64 rope, v 128), 16 heads,
    # causal 8k. Every hdim run (it is not one of the standard rows); a contender or the row itself
    # failing is reported and skipped, so that the rows before it are still written.
    if not args.quick:
        try:
            q, k = (torch.randn(1, 8192, 16, 192, device="cuda", dtype=dt, requires_grad=True) for _ in range(2))
            v = torch.randn(1, 8192, 16, 128, device="cuda", dtype=dt, requires_grad=True)
            flops = 2.5 * 2 * 16 * 8192 * 8192 * (192 + 128) * 0.5
            add(time_row({"kind": "deepseek-192x128", "hdim": 192, "hdim_v": 128, "causal": True, "seqlen": 8192,
                          "batch": 1, "nheads": 16}, contenders(q, k, v, True), flops))
            del q, k, v
        except Exception as e:
            print(f"# deepseek-192x128 row failed: {str(e).splitlines()[0][:160]}", file=sys.stderr)

    # Deterministic mode against the default, same inputs, interleaved.
    det_rows = [(128, True), (128, False), (64, True), (256, True)] if not args.quick else [(128, True), (256, True)]
    for hdim, causal in [(h, c) for h, c in det_rows if h in hdims]:
        nheads = 2048 // hdim
        q, k, v = (torch.randn(2, 8192, nheads, hdim, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
        flops = 2.5 * 4 * 2 * nheads * 8192 * 8192 * hdim * (0.5 if causal else 1.0)
        fns = {"fa4": contenders(q, k, v, causal)["fa4"], "fa4_det": contenders(q, k, v, causal, True)["fa4"]}
        names = list(fns)
        times = interleaved_rounds({n: (lambda f=f: bench(f)) for n, f in fns.items()}, ROUNDS)
        r = {"kind": "deterministic", "hdim": hdim, "causal": causal, "seqlen": 8192, "batch": 2, "nheads": nheads}
        for n in names:
            r[n] = tflops(flops, statistics.median(times[n]))
        r["ratio_det"] = round(r["fa4_det"] / r["fa4"], 3)
        add(r)
        del q, k, v

    json.dump({"meta": meta, "rows": rows}, open(args.out_json, "w"), indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        std = [r for r in rows if r["kind"] == "standard"]
        fig, axes = plt.subplots(2, len(dims), figsize=(5 * len(dims), 7), squeeze=False)
        for ci, causal in enumerate([False, True]):
            for hi, (hdim, hdim_v) in enumerate(dims):
                ax = axes[ci][hi]
                sel = [r for r in std if (r["hdim"], r["hdim_v"]) == (hdim, hdim_v) and r["causal"] == causal]
                for key in ("fa4", "cudnn", "flash", "upstream_fa4"):
                    if any(r.get(key) for r in sel):
                        ax.plot([r["seqlen"] for r in sel], [r[key] or 0 for r in sel], marker="o", label=key)
                ax.set_xscale("log", base=2)
                ax.set_title(f"bwd d{hdim}{'' if hdim_v == hdim else f'x{hdim_v}'} {'causal' if causal else 'non-causal'}")
                ax.set_xlabel("seqlen")
                ax.set_ylabel("TFLOP/s")
                ax.legend()
        fig.suptitle(f"{meta['gpu']} bf16 backward")
        fig.tight_layout()
        fig.savefig(os.path.splitext(args.out_json)[0] + ".png", dpi=90)
    except Exception as e:
        print("plot failed:", e, file=sys.stderr)
    print("\n%-7s %-6s %-6s %7s %7s %7s %8s %6s %6s" % ("hdim", "causal", "seqlen", "fa4", "cudnn", "flash", "upstream",
                                                    "x_cudnn", "x_up"))
    for r in rows:
        if r["kind"] in ("standard", "llama3.1-8b", "deepseek-192x128"):
            dv = r.get("hdim_v", r["hdim"])
            label = str(r["hdim"]) + ("" if dv == r["hdim"] else f"x{dv}")
            print("%-7s %-6s %-6d %7s %7s %7s %8s %6s %6s" % (label, r["causal"], r["seqlen"], r["fa4"], r["cudnn"],
                                                          r["flash"], r["upstream_fa4"], r["ratio_cudnn"],
                                                          r["ratio_upstream_fa4"]))
        else:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
