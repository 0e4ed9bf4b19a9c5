#!/usr/bin/env python3
"""A/B timing of several libfa4 builds (kernel variants) in ONE process, interleaved with cuDNN.

Tuning tool for the Hopper forward kernel: each variant is a libfa4.so built from a different
tuning-table row or kernel change. All variants, plus torch SDPA's cuDNN backend, are timed on the
same inputs in rounds (the order per round: bench/rounds.py) so clock and thermal drift hit every
column alike; the reported time is the median over rounds of triton's do_bench median.
Every variant's output is compared with cuDNN's first and the max abs difference is printed and
stored next to its time, so a broken variant shows up in the same line.

Usage (on the GPU machine, repo root):
    PYTHONPATH=python python3 bench/ab_variants.py OUT.json base=path/libfa4.so new=other/libfa4.so
With --backward the backward alone is timed (torch.autograd.grad of an output each variant
computed, retain_graph; FLOPs x 2.5), against cuDNN's backward, and dq is compared with cuDNN's;
each variant's dk and dv (and dq with --deterministic) are also compared bitwise with the first
variant's (a change that should not alter results, e.g. skipped products of zero padding).
A variant may also force libfa4's kernel choices for its calls (any name of bench_fwd.OVERRIDES,
e.g. lpt, schedule, epilogue, bwd_lpt_band, decode_warps; the others go back to auto):
    static=path/libfa4.so?schedule=static&lpt=1      banded=path/libfa4.so?bwd_lpt_band=16&bwd_walk=desc
--deterministic (with --backward) runs fa4 in deterministic mode; --shape replaces the shape list
(its head dims must be in --headdims).
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa4
from bench_fwd import (VARLEN_LENS, attended_pairs, bench, sdpa_fn, set_overrides, sh, tflops,  # same directory
                       varlen_batch)
from fa4 import _capi
from rounds import schedule

# (headdim, causal, seqlen, num_heads, num_heads_kv[, headdim_v]); batch = 16384 // seqlen.
SHAPES = [
    (128, False, 4096, 16, 16), (128, False, 8192, 16, 16), (128, False, 16384, 16, 16),
    (128, True, 4096, 16, 16), (128, True, 8192, 16, 16), (128, True, 16384, 16, 16),
    (128, True, 8192, 32, 8),  # Llama-3.1-8B prefill, batch 2 (16k tokens)
    (64, False, 8192, 32, 32), (64, True, 8192, 32, 32),
    (256, False, 8192, 8, 8), (256, True, 8192, 8, 8),
    (96, False, 8192, 16, 16), (96, True, 8192, 16, 16),
    (192, False, 8192, 8, 8), (192, True, 8192, 8, 8),
    (192, False, 8192, 8, 8, 128), (192, True, 8192, 8, 8, 128),
]
# --small: short sequences, where per-tile and per-call costs dominate.
SMALL_SHAPES = [
    (128, False, 512, 16, 16), (128, True, 512, 16, 16), (128, False, 1024, 16, 16),
    (128, True, 1024, 16, 16), (64, False, 512, 32, 32), (64, True, 512, 32, 32),
    (256, True, 512, 8, 8),
]


def load(path):
    lib = ctypes.CDLL(path)
    _capi._declare(lib)
    return lib


def parse(spec):
    """name=path[?override=value&override=value] -> (name, path, {override: value})."""
    name, rest = spec.split("=", 1)
    path, _, query = rest.partition("?")
    env = dict(kv.split("=", 1) for kv in query.split("&")) if query else {}
    return name, path, env


_in_use = None  # (lib, env) of the last use(): timed loops call use() before every call


def use(lib, env):
    """Routes fa4's calls to `lib` with exactly `env`'s overrides forced."""
    global _in_use
    if _in_use is not None and _in_use[0] is lib and _in_use[1] == env:
        return
    if _in_use is not None and _in_use[0] is not lib:
        set_overrides(_in_use[0])  # the library left behind goes back to its own choices
    _capi._lib = lib
    set_overrides(lib, **env)
    _in_use = (lib, env)


def backward_row(libs, q, k, v, causal, rounds, deterministic=False):
    """Backward-only times of every variant and cuDNN on (q, k, v), interleaved rounds. Where cuDNN
    refuses the shape (e.g. headdim != headdim_v) the fa4 columns only, dq checked against math SDPA."""
    b, s, h, d = q.shape
    hkv, dv = k.shape[2], v.shape[-1]
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    dout = torch.randn(b, s, h, dv, device=q.device, dtype=q.dtype)  # o's shape
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    dot = dout.transpose(1, 2).contiguous()
    fns = {}
    try:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o_ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=h != hkv)
            dq_ref = torch.autograd.grad(o_ref, (qt,), dot, retain_graph=True)[0].transpose(1, 2)
        fns["cudnn"] = lambda: torch.autograd.grad(o_ref, (qt, kt, vt), dot, retain_graph=True)
    except RuntimeError as e:
        print(f"# bwd d{d}x{dv}: no cuDNN ({str(e).splitlines()[0][:80]}); dq reference = math SDPA")
        with sdpa_kernel([SDPBackend.MATH]):
            o_ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=h != hkv)
            dq_ref = torch.autograd.grad(o_ref, (qt,), dot)[0].transpose(1, 2)
    errs, grads, same = {}, {}, {}
    first = next(iter(libs))  # the variant the others are compared with bitwise
    for name, (lib, env) in libs.items():
        use(lib, env)
        out = fa4.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
        grads[name] = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        errs[name] = float((grads[name][0].float() - dq_ref.float()).abs().max())
        # Bitwise against the first variant: dk and dv always (each is one CTA's registers); dq only
        # in deterministic mode (otherwise the order of its reduce-adds varies from run to run).
        same[name] = {t: bool(torch.equal(a, b)) for t, a, b in zip(("dq", "dk", "dv"), grads[name], grads[first])
                      if t != "dq" or deterministic}
        fns[name] = (lambda lib_=lib, env_=env, out_=out: (use(lib_, env_),
                                                          torch.autograd.grad(out_, (q, k, v), dout, retain_graph=True)))
    names = list(fns)
    times = {n: [] for n in names}
    for n in schedule(names, rounds):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]) if n == "cudnn" else contextlib.nullcontext():
            times[n].append(bench(fns[n]))
    flops = 2.5 * 2 * b * h * s * s * (d + dv) * (0.5 if causal else 1.0)  # 2.5 x the forward's
    tf = {n: tflops(flops, statistics.median(t)) for n, t in times.items()}
    ratio = {n: round(tf[n] / tf["cudnn"], 3) if "cudnn" in tf else None for n in tf if n != "cudnn"}
    row = {"direction": "bwd", "deterministic": deterministic, "headdim": d, "headdim_v": dv, "causal": causal,
           "seqlen": s, "batch": b, "num_heads": h, "num_heads_kv": hkv, "tflops": tf,
           "max_abs_err_dq_vs_cudnn" if "cudnn" in fns else "max_abs_err_dq_vs_math": errs,
           "bitwise_vs_" + first: same, "ratio_vs_cudnn": ratio}
    del grads
    print(f"bwd{' det' if deterministic else ''} d{d}x{dv} causal={causal!s:5} s={s:5} h={h}/{hkv} " +
          " ".join(f"{n}:{tf[n]:6.1f}" for n in names) + " | " +
          " ".join(f"{n}/cudnn=" + (f"{ratio[n]:.3f}" if ratio[n] is not None else "n/a") for n in libs) +
          " | dq maxerr " + " ".join(f"{errs[n]:.1e}" for n in libs) +
          " | bitwise " + " ".join(f"{n}:" + ",".join(t for t, eq in same[n].items() if eq) for n in libs),
          flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("variants", nargs="+", help="name=path/to/libfa4.so")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds per row (default: one period of bench/rounds.py for the row's "
                         "contenders, e.g. 6 for cuDNN and two builds, 4 with FLASH too: everyone after everyone "
                         "equally often within rounds)")
    ap.add_argument("--headdims", default=None,
                    help="comma list of q/k head dims (192 covers 192x128; default 64,128, or with --shape "
                         "the shapes' own, so that the varlen rows need no other bucket)")
    ap.add_argument("--small", action="store_true", help="short-sequence shapes instead")
    ap.add_argument("--backward", action="store_true", help="time the backward")
    ap.add_argument("--deterministic", action="store_true", help="with --backward: fa4 in deterministic mode")
    ap.add_argument("--shape", action="append", default=[],
                    help="headdim,causal(0|1),seqlen,num_heads,num_heads_kv[,headdim_v[,seqlen_k]]: these shapes "
                         "instead (repeatable; batch = max(1, 16384 // seqlen_k); a seqlen_k above seqlen "
                         "makes seqlen the query rows: a chunk against a longer cache; causal, its mask is "
                         "bottom-right, which SDPA's cuDNN does not take: FlashAttention-2 through SDPA in its "
                         "place, the variants checked against math SDPA with the mask spelled out)")
    args = ap.parse_args()
    if args.deterministic and not args.backward:
        ap.error("--deterministic needs --backward (the forward has no deterministic mode to time)")
    variants = [parse(v) for v in args.variants]
    loaded = {}
    libs = {}
    for name, path, env in variants:
        if path not in loaded:
            loaded[path] = load(path)
        libs[name] = (loaded[path], env)
    if args.headdims is None:
        args.headdims = ",".join(sorted({spec.split(",")[0] for spec in args.shape}, key=int)) if args.shape else "64,128"
    hds = {int(h) for h in args.headdims.split(",")}
    gpu = torch.cuda.get_device_name()
    rows = []
    shapes = SMALL_SHAPES if args.small else SHAPES
    if args.shape:
        shapes = []
        for spec in args.shape:
            fields = [int(x) for x in spec.split(",")]
            if len(fields) not in (5, 6, 7):
                ap.error(f"--shape {spec}: 5 to 7 comma-separated fields")
            d_, c_, s_, h_, hkv_, *rest_ = fields
            if d_ not in hds:
                ap.error(f"--shape {spec}: head dim {d_} is not in --headdims {args.headdims}")
            shapes.append((d_, bool(c_), s_, h_, hkv_, *rest_))
    for d, causal, s, h, hkv, *rest in shapes:
        if d not in hds:
            continue
        dv = rest[0] if rest else d
        sk = rest[1] if len(rest) > 1 else s
        if sk != s and args.backward:
            print(f"# d{d} {s} x {sk}: chunk shapes are forward-only here; skipped")
            continue
        if sk < s:  # rows that see no key: the math reference would give NaN there
            print(f"# d{d} {s} x {sk}: seqlen_k must be at least seqlen; skipped")
            continue
        b = max(1, 16384 // sk)
        torch.manual_seed(0)
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, sk, hkv, dv, device="cuda", dtype=torch.bfloat16)
        if args.backward:
            rows.append(backward_row(libs, q, k, v, causal, args.rounds, args.deterministic))
            continue
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

        def cudnn():
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=h != hkv)
        fns = {}
        reference = "cudnn"
        try:
            if causal and sk != s:  # SDPA's is_causal is top-left: its cuDNN would time another mask
                raise RuntimeError("causal with seqlen_q != seqlen_k")
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ref = cudnn().transpose(1, 2)
            fns["cudnn"] = cudnn
        except RuntimeError as e:  # e.g. headdim != headdim_v: fa4 columns only, checked against math
            print(f"# d{d}x{dv} {s} x {sk}: no cuDNN ({str(e).splitlines()[0][:80]}); reference = math SDPA")
            reference = "math"
            # fa4's causal mask: query i sees keys j <= i + sk - s (bottom-right)
            mask = (torch.arange(sk, device="cuda")[None, :] <= torch.arange(s, device="cuda")[:, None] + sk - s
                    if causal else None)
            with sdpa_kernel([SDPBackend.MATH]):
                ref = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask,
                                                     enable_gqa=h != hkv).transpose(1, 2)
        if causal and sk != s:  # FlashAttention-2 through SDPA (lower-right CausalBias) instead
            flash = sdpa_fn(q, k, v, causal, SDPBackend.FLASH_ATTENTION)
            if flash:
                fns["flash"] = flash
        errs = {}
        for name, (lib, env) in libs.items():
            use(lib, env)
            out = fa4.flash_attn_func(q, k, v, causal=causal)
            errs[name] = float((out.float() - ref.float()).abs().max())
            fns[name] = (lambda lib_=lib, env_=env: (use(lib_, env_),
                                                    fa4.flash_attn_func(q, k, v, causal=causal)))
        names = list(fns)
        times = {n: [] for n in names}
        for n in schedule(names, args.rounds):
            backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}.get(n)
            with sdpa_kernel([backend]) if backend else contextlib.nullcontext():
                times[n].append(bench(fns[n]))
        flops = 2 * b * h * attended_pairs(s, sk, causal) * (d + dv)
        tf = {n: tflops(flops, statistics.median(t)) for n, t in times.items()}
        row = {"headdim": d, "headdim_v": dv, "causal": causal, "seqlen": s, "seqlen_k": sk, "batch": b, "num_heads": h,
               "num_heads_kv": hkv, "tflops": tf, "reference": reference,
               "max_abs_err_vs_cudnn" if reference == "cudnn" else "max_abs_err_vs_math": errs,
               "ratio_vs_cudnn": {n: round(tf[n] / tf["cudnn"], 3) if "cudnn" in tf else None
                                  for n in tf if n != "cudnn"}}
        rows.append(row)
        print(f"d{d}x{dv} causal={causal!s:5} s={s:5}{'' if sk == s else f' x {sk}'} h={h}/{hkv} " +
              " ".join(f"{n}:{tf[n]:6.1f}" for n in names) + " | " +
              " ".join(f"{n}/cudnn=" + (f"{row['ratio_vs_cudnn'][n]:.3f}" if row['ratio_vs_cudnn'][n] else "n/a")
                       for n in libs) +
              " | maxerr " + " ".join(f"{errs[n]:.1e}" for n in libs), flush=True)
    # A varlen batch (fa4 variants only: SDPA has no packed-varlen cuDNN path to compare with) per
    # head dim 64 / 128 / 256 of --headdims; with --backward its backward alone (FLOPs x 2.5).
    for d in (64, 128, 256):
        if d in hds:
            rows.append(varlen_row(libs, args, d))
    clocks = sh("nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu "
                "--format=csv,noheader")
    with open(args.out_json, "w") as f:
        json.dump({"date": datetime.datetime.now().isoformat(), "gpu": gpu, "clocks_after": clocks,
                   "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                   "variants": {n: p + ("?" + "&".join(f"{k}={v}" for k, v in e.items()) if e else "")
                                for n, p, e in variants},
                   "rounds": args.rounds or "one period of bench/rounds.py per row", "rows": rows}, f, indent=1)


def varlen_row(libs, args, headdim):
    """The varlen batch of bench_fwd.varlen_batch (causal, head dim `headdim`) on every variant,
    interleaved rounds."""
    run_varlen, flops = varlen_batch(torch.bfloat16, backward=args.backward, deterministic=args.deterministic,
                                     headdim=headdim)
    times = {n: [] for n in libs}
    for name in schedule(libs, args.rounds):
        use(*libs[name])
        times[name].append(bench(run_varlen))
    tf = {n: tflops(flops, statistics.median(t)) for n, t in times.items()}
    kind = ("varlen_bwd_det" if args.deterministic else "varlen_bwd") if args.backward else "varlen"
    # Each variant's outputs (the backward's dq, dk, dv) against the first variant's: a broken one shows.
    outs = {}
    for name, (lib, env) in libs.items():
        use(lib, env)
        got = run_varlen()
        outs[name] = [x.float() for x in (got if isinstance(got, (tuple, list)) else (got,))]
    first = next(iter(outs.values()))
    diff = {n: max(float((a - b).abs().max()) for a, b in zip(o, first)) for n, o in outs.items()}
    print(f"{kind} d{headdim} causal " + " ".join(f"{n}:{tf[n]:6.1f}" for n in libs)
          + " | max abs diff vs first " + " ".join(f"{diff[n]:.1e}" for n in libs), flush=True)
    return {"kind": kind, "lens": VARLEN_LENS, "headdim": headdim, "causal": True, "tflops": tf,
            "max_abs_diff_vs_first": diff}


if __name__ == "__main__":
    main()
