#!/usr/bin/env python3
"""Forward attention benchmark: fa4's Hopper kernel next to torch SDPA (cuDNN and FLASH backends)
and, where it is installed, upstream FlashAttention-4 (flash_attn.cute), in ONE process, on one GPU,
timed with triton.testing.do_bench (median, CUDA events).

Shapes (FA3/FA4 papers' convention): batch*seqlen = 16k tokens, num_heads*headdim = 2048, head
dims 64/128/256, seqlen 512..16k, causal and not; Llama-3.1-8B prefill (32 q heads, 8 kv heads,
d128, causal, seqlen 8k); few query tiles with long keys (split-KV); a varlen batch; and an
ablation of the FA4 knobs (exp2 emulation share, lazy rescaling tau, tile schedule and the stream-K
split of the last round through libfa4's overrides: set_overrides below). FLOPs = 4*b*h*sq*sk*d (x0.5 causal).

Usage (on the GPU machine, from the repo root; --rounds N interleaved rounds per comparison, default 3):
    PYTHONPATH=python FA4_LIBRARY=build-hopper/src/libfa4.so python3 bench/bench_fwd.py OUT.json [--quick]
Writes OUT.json (git commit, GPU, clocks, date, versions, rows) and OUT.png (plot).
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

import fa4
from fa4 import _capi
from rounds import schedule  # same directory

try:  # upstream FlashAttention-4 (CuTe DSL), shared/peers/install_upstream_fa4.sh
    from flash_attn.cute import flash_attn_func as upstream_fa4_func
    from flash_attn.cute import flash_attn_varlen_func as upstream_fa4_varlen_func
except Exception:  # not installed here
    upstream_fa4_func = upstream_fa4_varlen_func = None


def upstream_fa4_kvcache_fn(q, k_cache, v_cache, cache_seqlens=None, page_table=None, causal=False):
    """Upstream FlashAttention-4's KV-cache form of a call (None where it is not installed): its
    varlen entry on a dense (batch, seqlen_k, heads_kv, d) or paged (num_pages, page_size,
    heads_kv, d) cache with seqused_k and page_table, pack-GQA its default. Its Hopper forward has no
    split-KV (num_splits 1) and reads pages that are not one key tile with cp.async. Returns a
    callable giving out (batch, seqlen_q, heads, d)."""
    if upstream_fa4_varlen_func is None:
        return None

    def fn():
        o = upstream_fa4_varlen_func(q, k_cache, v_cache, seqused_k=cache_seqlens, page_table=page_table,
                                     causal=causal)
        return o[0] if isinstance(o, tuple) else o
    return fn


def upstream_fa4_version():
    """The installed upstream FlashAttention-4's version (PyPI flash-attn-4), "unknown" where its
    metadata cannot be read, None where it is not importable: the results JSON's meta."""
    if upstream_fa4_func is None:
        return None
    import importlib.metadata
    try:
        return importlib.metadata.version("flash-attn-4")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def sh(cmd):
    try:
        return subprocess.check_output(cmd, shell=True, text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return None


def run_meta():
    """What a results JSON records about the run: date, commit, GPU, clocks, versions."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        # FA4_GIT_COMMIT (the commit the library was built from) wins: the device's copy of the
        # tree may carry a stale .git.
        "git_commit": os.environ.get("FA4_GIT_COMMIT") or sh("git rev-parse HEAD"),
        "git_dirty": None if os.environ.get("FA4_GIT_COMMIT") else bool(sh("git status --porcelain")),
        "gpu": torch.cuda.get_device_name(),
        "clocks": sh("nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu --format=csv"),
        "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "triton": triton.__version__,
        "cuda": torch.version.cuda, "fa4": fa4.version(),
    }


# libfa4's kernel-choice overrides (src/common/overrides.h), and the environment variables that
# builds from before them read per call instead.
OVERRIDES = {"lpt": "FA4_HOPPER_LPT", "schedule": "FA4_HOPPER_SCHED", "epilogue": "FA4_HOPPER_EPILOGUE",
             "stream_k": "FA4_HOPPER_STREAMK", "small_q": None,
             "bwd_lpt_band": None, "stream_k_min_share": None, "bwd_walk": None, "decode_cluster": None, "decode_tile": None,
             "decode_warps": None, "capture_scratch": None, "pack_gqa": None}  # small_q, bwd_*,
# stream_k_min_share, decode_*, capture_*, pack_gqa: no environment variable. (decode_append_delay_us,
# a test's hook that slows the append, is left out: it is no kernel choice.)


def set_overrides(lib, **switches):
    """Sets `lib`'s kernel-choice overrides to `switches` (e.g. schedule="static", lpt="1") and every
    other one back to the selector's choice."""
    bad = set(switches) - set(OVERRIDES)
    if bad:
        raise ValueError(f"unknown overrides {sorted(bad)}; known: {sorted(OVERRIDES)}")
    setter = getattr(lib, "fa4_internal_set_override", None)
    if setter is None:  # an older build: it reads the environment per call
        for name, env in OVERRIDES.items():
            if env is None:
                if name in switches:
                    raise RuntimeError(f"override {name} needs a libfa4 with fa4_internal_set_override")
            elif name in switches:
                os.environ[env] = switches[name]
            else:
                os.environ.pop(env, None)
        return
    setter.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    setter.restype = ctypes.c_int32
    for name in OVERRIDES:
        status = setter(name.encode(), switches.get(name, "auto").encode())
        # A knob newer than the library may be unknown to it: an error only where it was asked for.
        if status != 0 and (name in switches or OVERRIDES[name] is not None):
            raise RuntimeError(f"fa4_internal_set_override({name}): " + lib.fa4_last_error().decode())


@contextlib.contextmanager
def hopper_overrides(**switches):
    """The loaded libfa4 with `switches` forced for the block (hopper_overrides(schedule="static",
    lpt="1")); every override is back on the selector's choice afterwards."""
    lib = _capi.library()
    set_overrides(lib, **switches)
    try:
        yield
    finally:
        set_overrides(lib, **{name: "auto" for name in switches})


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def interleaved_rounds(timers, rounds):
    """Runs every timer (name -> zero-argument call returning ms) once per round, `rounds`
    rounds, in rounds.round_order's order (every position and every predecessor equally often over
    rounds.period(n) rounds) so clock and thermal drift hit all contenders alike. A
    timer that raises is reported on stderr and its round skipped (a backend failing mid-run keeps
    the run). Returns name -> list of ms."""
    times = {n: [] for n in timers}
    for n in schedule(timers, rounds):
        try:
            times[n].append(timers[n]())
        except Exception as e:
            print(f"# {n} failed: {str(e).splitlines()[0][:120]}", file=sys.stderr)
    return times


def _bench_in(ctx, fn):
    with ctx():
        return bench(fn)


# A contender whose result differs from fa4's by more than this share of fa4's largest magnitude
# computes another function (a mask aligned elsewhere, a dropped option): its time is no comparison.
AGREEMENT_LIMIT = 0.05


def agreement(results, reference="fa4"):
    """name -> max |x - ref| / max |ref| over the tensors of each contender's result against
    `reference`'s (results: name -> tuple of tensors in one layout; None where a contender gave
    none). Prints a warning for each contender past AGREEMENT_LIMIT. The timed kernels are checked
    this way once per row; fa4's own accuracy is its test suite's job (and check_close's)."""
    ref = results[reference]
    if ref is None:  # (the reference failed on this row: nothing to compare, the run goes on)
        return {name: None for name in results if name != reference}
    out = {}
    for name, got in results.items():
        if name == reference or got is None:
            continue
        diffs = [float((a.float() - b.float()).abs().max()) / (float(b.float().abs().max()) or 1.0)
                 for a, b in zip(got, ref)]
        worst = float("nan") if any(d != d for d in diffs) else max(diffs, default=0.0)
        out[name] = round(worst, 5)
        if not worst <= AGREEMENT_LIMIT:  # (NaN too)
            print(f"# {name} disagrees with {reference}: max diff {worst:.3g} of its largest value",
                  file=sys.stderr)
    return out


SDPA_CONTENDERS = ("cudnn", "flash")  # torch SDPA's backends: (batch, heads, seqlen, headdim) tensors


def fa4_layout(name, t):
    """Contender `name`'s tensor t in fa4's (batch, seqlen, heads, headdim) layout."""
    return t.transpose(1, 2) if name in SDPA_CONTENDERS else t


def forward_results(fns):
    """Each contender's forward output once (in its context), as fa4's (batch, seqlen, heads,
    headdim) layout: SDPA's (batch, heads, seqlen, headdim) transposed, upstream's (out, lse) cut
    to out. A contender that fails here gives None."""
    res = {}
    for name, (fn, ctx) in fns.items():
        try:
            with ctx():
                o = fn()
            o = o[0] if isinstance(o, tuple) else o
            res[name] = (fa4_layout(name, o),)
        except Exception as e:
            print(f"# {name} output check failed: {str(e).splitlines()[0][:120]}", file=sys.stderr)
            res[name] = None
    return res


def tflops(flops, ms):
    return round(flops / ms / 1e9, 1)


VARLEN_LENS = [8192, 4096, 2048, 1024, 512, 256, 128, 77, 3000, 1]


def attended_pairs(sq, sk, causal):
    """(query, key) pairs a forward of sq queries over sk keys computes, for its FLOPs: all of them;
    causal and square, half (the convention of the square rows of record); a causal chunk
    (sk > sq, bottom-right) exactly: query i sees sk - sq + i + 1 keys."""
    if not causal:
        return sq * sk
    return sq * sq * 0.5 if sq == sk else sq * (sk - sq) + sq * (sq + 1) // 2


def varlen_batch(dt, backward=False, deterministic=False, headdim=128):
    """The benchmark's varlen batch (16 heads, causal; d128 unless `headdim`): (call running fa4 on
    it, FLOPs). With backward, the call is the backward alone (autograd.grad of one forward's output,
    run now; FLOPs x 2.5), returning (dq, dk, dv); it runs on the fa4 library in use when it is
    called."""
    lens = VARLEN_LENS
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
    qv, kv, vv = (torch.randn(sum(lens), 16, headdim, device="cuda", dtype=dt, requires_grad=backward)
                  for _ in range(3))
    flops = sum(4 * 16 * s * s * headdim * 0.5 for s in lens)
    if not backward:
        return (lambda: fa4.flash_attn_varlen_func(qv, kv, vv, cu, cu, max(lens), max(lens), causal=True)), flops
    out = fa4.flash_attn_varlen_func(qv, kv, vv, cu, cu, max(lens), max(lens), causal=True, deterministic=deterministic)
    dout = torch.randn_like(out)
    return (lambda: torch.autograd.grad(out, (qv, kv, vv), dout, retain_graph=True)), 2.5 * flops


def time_fa4(q, k, v, causal, **kw):
    return bench(lambda: fa4.flash_attn_func(q, k, v, causal=causal, **kw))


def sdpa_fn(q, k, v, causal, backend):
    """A call of torch SDPA restricted to `backend` on (q, k, v), or None where the backend fails."""
    # SDPA takes (b, h, s, d); give it its natural contiguous layout. GQA via enable_gqa.
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    gqa = qt.shape[1] != kt.shape[1]
    # SDPA's is_causal is top-left aligned, fa4's causal bottom-right: equal only for square rows.
    # Otherwise torch's lower-right CausalBias, which SDPA hands to its FLASH backend (FlashAttention-2
    # masks bottom-right natively); it has no cuDNN route (it would fall back to another backend).
    mask = None
    if causal and qt.shape[2] != kt.shape[2]:
        if backend != SDPBackend.FLASH_ATTENTION:
            return None
        mask = causal_lower_right(qt.shape[2], kt.shape[2])

    def fn():
        if mask is not None:
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
    try:
        with sdpa_kernel([backend]):
            fn()
        return fn
    except Exception:
        return None


def contenders(q, k, v, causal):
    """name -> (forward call, context it runs in): fa4, SDPA's cuDNN and FLASH backends, upstream
    FlashAttention-4; a backend that fails on (q, k, v) or is not installed is left out."""
    fns = {"fa4": (lambda: fa4.flash_attn_func(q, k, v, causal=causal), contextlib.nullcontext)}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        fn = sdpa_fn(q, k, v, causal, be)
        if fn:
            fns[name] = (fn, lambda be=be: sdpa_kernel([be]))
    if upstream_fa4_func is not None:
        up_fn = lambda: upstream_fa4_func(q, k, v, causal=causal)
        try:
            up_fn()
            fns["upstream_fa4"] = (up_fn, contextlib.nullcontext)
        except Exception as e:
            print(f"# upstream_fa4 failed: {str(e).splitlines()[0][:120]}", file=sys.stderr)
    return fns


ROUNDS = 3  # set by --rounds


def time_vs_sdpa(r, q, k, v, causal, flops, no_split=False):
    """Time fa4, torch SDPA's cuDNN and FLASH backends and upstream FlashAttention-4 on (q, k, v) and
    fill row r: r["fa4"] and r["fa4_kernel"] (the kernel the selector runs), r["max_rel_diff_vs_fa4"]
    (agreement: every contender's output against fa4's, before the timing); with no_split,
    r["fa4_no_split"] (fa4 again on the forward kernel without the stream-K split: overrides
    stream_k 0 and small_q fwd, so the small-query route cannot send it to the decode kernel);
    r["cudnn"], r["flash"], r["upstream_fa4"] (None where the backend fails or is not installed);
    all in TFLOP/s for `flops`; then r["ratio_cudnn"] = fa4/cudnn and r["ratio_upstream_fa4"] =
    fa4/upstream_fa4 (None without the other). Each is the median over ROUNDS rounds that run every
    contender once, in bench/rounds.py's order, so clock and thermal drift hit all of them alike
    (one pass measured cuDNN 7-12% apart between neighbouring runs). Returns r."""
    fns = contenders(q, k, v, causal)
    if no_split:  # right after fa4, as in the rows' key order
        fns = {"fa4": fns["fa4"],
               "fa4_no_split": (fns["fa4"][0], lambda: hopper_overrides(stream_k="0", small_q="fwd")),
               **fns}
    r["fa4_kernel"] = kernel_name(q, k, v, causal)
    r["max_rel_diff_vs_fa4"] = agreement(forward_results(fns))
    times = interleaved_rounds({n: (lambda fn=fn, ctx=ctx: _bench_in(ctx, fn)) for n, (fn, ctx) in fns.items()},
                               ROUNDS)
    # Every contender gets a key (None if it could not be timed), fa4_no_split only when asked for.
    for n in ["fa4"] + (["fa4_no_split"] if no_split else []) + ["cudnn", "flash", "upstream_fa4"]:
        r[n] = tflops(flops, statistics.median(times[n])) if times.get(n) else None
    r["rounds"] = ROUNDS
    r["ratio_cudnn"] = round(r["fa4"] / r["cudnn"], 3) if r["fa4"] and r["cudnn"] else None
    r["ratio_upstream_fa4"] = (round(r["fa4"] / r["upstream_fa4"], 3)
                               if r["fa4"] and r["upstream_fa4"] else None)
    return r


def kernel_name(q, k, v, causal):
    """The kernel fa4's selector runs for this call (fa4.forward_support), or the reason it
    refuses."""
    if q.dim() != 4:
        return None  # (batched rows only)
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=q.device)
    return fa4.forward_support(q, k, v, out, lse, causal=causal)[1]


def check_close(q, k, v, causal):
    """Sanity check of the timed kernel against SDPA (math on fp32) on the same inputs."""
    o = fa4.flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal,
                                         enable_gqa=qt.shape[1] != kt.shape[1]).transpose(1, 2)
    return float((o.float() - ref).abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--quick", action="store_true", help="d64/d128 only, fewer seqlens, no ablation")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds per fa4/SDPA comparison (median); ablation rows run once")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    global ROUNDS
    ROUNDS = args.rounds
    meta = run_meta()
    meta["upstream_fa4"] = upstream_fa4_version()
    print(json.dumps(meta), flush=True)
    rows = []
    dt = torch.bfloat16
    hdims = [64, 128] if args.quick else [64, 128, 256]
    seqlens = [1024, 4096, 16384] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]

    def add(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    for hdim in hdims:
        nheads = 2048 // hdim
        for causal in [False, True]:
            for seqlen in seqlens:
                batch = 16384 // seqlen
                q, k, v = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dt) for _ in range(3))
                flops = 4 * batch * nheads * seqlen * seqlen * hdim * (0.5 if causal else 1.0)
                r = {"kind": "standard", "hdim": hdim, "causal": causal, "seqlen": seqlen, "batch": batch,
                     "nheads": nheads}
                time_vs_sdpa(r, q, k, v, causal, flops)
                if seqlen == seqlens[0]:
                    r["max_abs_err_vs_fp32"] = check_close(q, k, v, causal)
                add(r)
                del q, k, v

    if not args.quick:
        # Llama-3.1-8B prefill: 32 q heads, 8 kv heads, d128, causal, seqlen 8k.
        q = torch.randn(1, 8192, 32, 128, device="cuda", dtype=dt)
        k, v = (torch.randn(1, 8192, 8, 128, device="cuda", dtype=dt) for _ in range(2))
        flops = 4 * 32 * 8192 * 8192 * 128 * 0.5
        add(time_vs_sdpa({"kind": "llama3.1-8b", "hdim": 128, "causal": True, "seqlen": 8192, "batch": 1,
                          "nheads": 32}, q, k, v, True, flops))

        # Few query tiles, long keys (chunked prefill / prefix reuse): fewer tiles than SMs, where
        # fa4 splits the keys over the idle SMs (stream-K split-KV, core/stream_k.h).
        # Causal: bottom-right, query i sees keys up to sk - sq + i (a chunk of a prompt whose
        # earlier part is cached); cuDNN through SDPA has no such mask (FLASH and upstream only).
        for batch, sq, sk in [(1, 128, 32768), (2, 512, 16384)]:
            q = torch.randn(batch, sq, 16, 128, device="cuda", dtype=dt)
            k, v = (torch.randn(batch, sk, 16, 128, device="cuda", dtype=dt) for _ in range(2))
            for causal in (False, True):
                flops = 4 * batch * 16 * attended_pairs(sq, sk, causal) * 128
                add(time_vs_sdpa({"kind": "long_kv", "hdim": 128, "causal": causal, "seqlen_q": sq, "seqlen_k": sk,
                                  "batch": batch, "nheads": 16}, q, k, v, causal, flops, no_split=True))
            del q, k, v

        # Varlen batch: mixed lengths packed, d128, 16 heads, causal.
        run_varlen, flops = varlen_batch(dt)
        add({"kind": "varlen", "hdim": 128, "causal": True, "lens": VARLEN_LENS,
             "fa4": tflops(flops, bench(run_varlen))})

        # Ablation: d64 and d128, seqlen 4k (and causal for LPT).
        for hdim in [64, 128]:
            nheads = 2048 // hdim
            for causal in [False, True]:
                q, k, v = (torch.randn(4, 4096, nheads, hdim, device="cuda", dtype=dt) for _ in range(3))
                flops = 4 * 4 * nheads * 4096 * 4096 * hdim * (0.5 if causal else 1.0)
                # 0, 1/8, 1/4, 1/2 and the bucket's default (d128: 1/16; d64: 0) have compile-time
                # per-register code; any other share would time the kernel's runtime branch instead.
                for frac in [0.0, 0.0625, 0.125, 0.25, 0.5] if hdim == 128 else [0.0, 0.125, 0.25, 0.5]:
                    add({"kind": "ablation_exp2", "hdim": hdim, "causal": causal, "exp2_fraction": frac,
                         "fa4": tflops(flops, time_fa4(q, k, v, causal, exp2_emulation_fraction=frac))})
                for tau in [0.0, 8.0]:
                    add({"kind": "ablation_tau", "hdim": hdim, "causal": causal, "tau": tau,
                         "fa4": tflops(flops, time_fa4(q, k, v, causal, rescale_threshold=tau))})
                # Tile schedule: (claiming, order). static = CTA c takes tiles c, c+grid, ...;
                # dynamic = atomic tile counter (greedy). lpt = longest-first order + L2 sections.
                for sched, lpt in [("static", "0"), ("static", "1"), ("dynamic", "0"), ("dynamic", "1")]:
                    with hopper_overrides(schedule=sched, lpt=lpt):
                        add({"kind": "ablation_schedule", "hdim": hdim, "causal": causal, "sched": sched,
                             "lpt": lpt == "1", "fa4": tflops(flops, time_fa4(q, k, v, causal))})
                if not causal:  # stream-K tail split: these causal tiles do not all walk every key
                    for sk in ["0", "1"]:
                        with hopper_overrides(stream_k=sk):
                            add({"kind": "ablation_stream_k", "hdim": hdim, "causal": causal,
                                 "stream_k": sk == "1", "fa4": tflops(flops, time_fa4(q, k, v, causal))})
                del q, k, v

    json.dump({"meta": meta, "rows": rows}, open(args.out_json, "w"), indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        std = [r for r in rows if r["kind"] == "standard"]
        fig, axes = plt.subplots(2, len(hdims), figsize=(5 * len(hdims), 7), squeeze=False)
        for ci, causal in enumerate([False, True]):
            for hi, hdim in enumerate(hdims):
                ax = axes[ci][hi]
                sel = [r for r in std if r["hdim"] == hdim and r["causal"] == causal]
                xs = [r["seqlen"] for r in sel]
                for key in ("fa4", "cudnn", "flash", "upstream_fa4"):
                    if any(r.get(key) for r in sel):
                        ax.plot(xs, [r.get(key) or 0 for r in sel], marker="o", label=key)
                ax.set_xscale("log", base=2)
                ax.set_title(f"fwd d{hdim} {'causal' if causal else 'non-causal'}")
                ax.set_xlabel("seqlen")
                ax.set_ylabel("TFLOP/s")
                ax.legend()
        fig.suptitle(f"{meta['gpu']} bf16 forward")
        fig.tight_layout()
        fig.savefig(os.path.splitext(args.out_json)[0] + ".png", dpi=90)
    except Exception as e:  # the JSON is the result; the plot is a convenience
        print("plot failed:", e, file=sys.stderr)
    print("\n%-8s %-5s %-6s %7s %7s %7s %8s %6s %6s" % ("hdim", "causal", "seqlen", "fa4", "cudnn", "flash",
                                                      "upstream", "x cudnn", "x up"))
    for r in rows:
        if r["kind"] == "standard":
            cells = (r["hdim"], r["causal"], r["seqlen"], r["fa4"], r["cudnn"], r["flash"], r["upstream_fa4"],
                     r["ratio_cudnn"], r["ratio_upstream_fa4"])
            print("%-8d %-5s %-6d %7s %7s %7s %8s %6s %6s" % cells)
        elif r["kind"] != "standard":
            print(json.dumps(r))


if __name__ == "__main__":
    main()
