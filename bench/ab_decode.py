#!/usr/bin/env python3
"""A/B of several libfa4 builds' decode (KV-cache) calls in ONE process, interleaved with SDPA cuDNN:
kernel time per call (torch.profiler, the sum of a call's kernels, bench/kernel_times.py), the
median over --rounds rounds in bench/rounds.py's order. The decode counterpart of
bench/ab_variants.py (which times forwards and backwards); a tuning tool, not a benchmark of
record (back-to-back calls; no L2 flush unless --flush). Paged shapes use pages in random order;
cuDNN (SDPA has no paged path) runs on the same keys as a dense cache. Each variant's output is
compared with cuDNN's (max abs difference), so a broken variant shows in its line.

Usage (GPU machine, repo root; bench/device_run.sh DAB=1 runs it on OLD / new / VARIANTS):
    PYTHONPATH=python:bench python3 bench/ab_decode.py OUT.json old=build-old/src/libfa4.so new=build-dev/src/libfa4.so
    ... --shape 8,131072,32,8,128,16        (batch,seqlen_k,heads,heads_kv,headdim,page_size; repeatable)
    ... --shape 8,131072,32,8,128,16,1      (the same with the pages in pool order, not shuffled)
    ... --fill 0.25     every sequence holds a quarter of its cache's capacity (cache_seqlens), as a
                        serving engine's preallocated cache does; cuDNN runs on those keys only
    ... --flush write   L2 flushed before every call by writing 256 MB (triton's do_bench, so
                        bench_decode.py: the evictions then also write those dirty lines back)
    ... --flush read    ... by reading 256 MB (L2 then full of clean lines); the flush's kernels
                        are not counted either way (bench/results/history.md compares the two)
    ... --append 1      fa4's calls append each sequence's last key (k, v given, cache_seqlens one
                        less): the append kernel's time is counted with the attention's (the same
                        values are written to the same rows every call); cuDNN attends as before
    ... --graph         fa4's calls replayed from a CUDA graph of 20 calls, timed between events
                        (launch gaps and kernels that overlap, e.g. a programmatic dependent's
                        prologue under the append, count as a serving engine sees them)
"""
import argparse
import json
import statistics

import torch
from torch.nn.attention import SDPBackend

import fa4
from ab_variants import load, parse, use
from bench_decode import _in, make_problem
from bench_fwd import sdpa_fn
from kernel_times import kernel_names, kernel_times
from rounds import schedule

# (batch, seqlen_k, heads, heads_kv, headdim, page_size: 0 = dense), one query per sequence
SHAPES = [
    (1, 131072, 32, 8, 128, 0), (1, 131072, 32, 8, 128, 16), (8, 131072, 32, 8, 128, 0), (8, 131072, 32, 8, 128, 16),
    (8, 8192, 32, 8, 128, 0), (8, 8192, 32, 8, 128, 16), (32, 32768, 32, 8, 128, 0), (32, 32768, 32, 8, 128, 16),
    (8, 32768, 32, 8, 128, 64), (1, 32768, 32, 8, 128, 16), (1, 8192, 32, 8, 128, 1), (1, 8192, 32, 8, 64, 16),
    (1, 8192, 32, 8, 64, 0), (1, 32768, 8, 1, 128, 16), (1, 1024, 32, 8, 128, 0), (1, 8192, 32, 8, 128, 0),
]


GRAPH_CALLS = 20


def graph_timer(fn, replays=5):
    """A timer of `fn` captured GRAPH_CALLS times in one CUDA graph: us per call over `replays`
    replays between two events."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timer():
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / (replays * GRAPH_CALLS)
    return timer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("variants", nargs="+",
                    help="name=path/to/libfa4.so[?override=value&...] (num_splits=N: the calls' split count)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="interleaved rounds per row (default: one period of bench/rounds.py for the row's "
                         "contenders, e.g. 6 for cuDNN and two builds: everyone after everyone equally often "
                         "within rounds)")
    ap.add_argument("--shape", action="append", default=[],
                    help="batch,seqlen_k,heads,heads_kv,headdim,page_size[,in_order] (repeatable): these shapes "
                         "instead; in_order 1: the pages in pool order (default: shuffled)")
    ap.add_argument("--fill", type=float, default=1.0,
                    help="cache_seqlens = this share of seqlen_k (the cache's capacity); cuDNN gets those keys")
    ap.add_argument("--flush", choices=["none", "write", "read"], default="none",
                    help="flush L2 before every call (not timed) by writing or by reading 256 MB")
    ap.add_argument("--append", type=int, default=0,
                    help="fa4's calls append each sequence's last N keys in place (k, v given)")
    ap.add_argument("--graph", action="store_true",
                    help="fa4's calls timed as replays of a CUDA graph of %d calls (GPU time per call between "
                         "events: launch gaps and overlapping kernels as a serving engine sees them) instead of "
                         "the sum of their kernels' times; cuDNN's as before (its captured calls failed)" % GRAPH_CALLS)
    args = ap.parse_args()
    if args.graph and args.flush != "none":
        raise SystemExit("--graph replays fa4's calls back to back: no L2 flush between them (drop --flush)")
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] or SHAPES
    # A variant's num_splits (its spec's "?num_splits=N") is the call's argument, not an override.
    libs = {n: (load(p), e, int(e.pop("num_splits", 0))) for n, p, e in map(parse, args.variants)}
    gen = torch.Generator(device="cuda").manual_seed(0)
    flush = None
    if args.flush != "none":
        buf = torch.zeros(64 << 20, dtype=torch.float32, device="cuda")  # 256 MB
        flush = buf.zero_ if args.flush == "write" else (lambda: buf.sum())
    flush_names = kernel_names(flush) if flush else set()

    def timed(fn):
        if flush is None:
            return kernel_times(fn)
        return kernel_times(lambda: (flush(), fn()), exclude=flush_names)

    def check_apart(name, fn):  # a contender's own kernel must not be taken for the flush's
        shared = kernel_names(fn) & flush_names
        if shared:
            raise RuntimeError(f"{name} launches the L2 flush's kernels {sorted(shared)}: its times would miss them")
    rows = []
    for shape in shapes:
        if len(shape) not in (6, 7):
            raise SystemExit(f"--shape {','.join(map(str, shape))}: 6 or 7 fields")
        b, sk, h, hk, d, page, in_order = (shape + (0,))[:7]
        in_order = bool(in_order and page)
        q, kc, vc, lens, table, (k, v) = make_problem(b, sk, 1, h, hk, d, page, torch.bfloat16, gen,
                                                      shuffle=not in_order)
        used = max(1, min(sk, int(sk * args.fill)))
        if used < sk:
            lens.fill_(used)
            k, v = k[:, :used], v[:, :used]
        # --append N: the last N keys come as k / v and are written back to their rows every call.
        app = min(args.append, used)
        # (Copies: a slice of one sequence's keys is contiguous already, and may be the cache's own memory.)
        new_kv = ((k[:, used - app:used].clone(), v[:, used - app:used].clone()) if app else (None, None))
        cache_lens = lens - app
        sdpa = sdpa_fn(q, k, v, False, SDPBackend.CUDNN_ATTENTION)
        if sdpa is None:
            raise RuntimeError(f"cuDNN refuses batch {b}, seqlen_k {sk}, heads {h}/{hk}, d{d}")

        def cudnn():
            return _in(SDPBackend.CUDNN_ATTENTION, sdpa)
        fns = {"cudnn": cudnn}
        ref = cudnn().transpose(1, 2).float()
        err = {}
        for n, (lib, env, splits) in libs.items():
            use(lib, env)
            err[n] = float((fa4.flash_attn_with_kvcache(q, kc, vc, *new_kv, cache_seqlens=cache_lens, page_table=table,
                                                        num_splits=splits).float() - ref).abs().max())
            fns[n] = (lambda lib_=lib, env_=env, s_=splits: (use(lib_, env_), fa4.flash_attn_with_kvcache(
                q, kc, vc, *new_kv, cache_seqlens=cache_lens, page_table=table, num_splits=s_)))
        names = list(fns)
        if flush:
            for n in names:
                check_apart(n, fns[n])
        graphs = {n: graph_timer(fns[n]) for n in libs} if args.graph else {}
        times = {n: [] for n in names}
        for n in schedule(names, args.rounds):
            times[n].append(graphs[n]() if n in graphs else sum(timed(fns[n]).values()))
        us = {n: round(statistics.median(t), 2) for n, t in times.items()}
        rows.append({"batch": b, "seqlen_k": sk, "cache_seqlens": used, "appended": app, "l2_flush": args.flush,
                     "fa4_timing": "graph replay" if args.graph else "kernel sum", "heads": h,
                     "heads_kv": hk, "headdim": d, "page_size": page, "pages_in_order": in_order,
                     "num_splits": {n: splits for n, (_, _, splits) in libs.items()},
                     "us": us, "ratio_vs_cudnn": {n: round(us["cudnn"] / us[n], 3) for n in libs},
                     "max_abs_err_vs_cudnn": err})
        used_s = ("" if used == sk else f" used {used}") + (f" append {app}" if app else "") + (" graph" if args.graph else "")
        order = " in order" if in_order else ""
        print(f"b{b} kv{sk}{used_s} {h}/{hk} d{d} page{page}{order}: " + " ".join(f"{n} {us[n]:.2f}" for n in names)
              + " | x cudnn " + " ".join(f"{n} {us['cudnn'] / us[n]:.3f}" for n in libs)
              + " | err " + " ".join(f"{err[n]:.1e}" for n in libs), flush=True)
        del q, kc, vc, k, v, sdpa, ref, new_kv, graphs
        torch.cuda.empty_cache()
    with open(args.out_json, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
