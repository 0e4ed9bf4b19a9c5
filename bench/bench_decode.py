#!/usr/bin/env python3
"""Decode (KV-cache) benchmark: fa4.flash_attn_with_kvcache next to torch SDPA (cuDNN and FLASH
backends) in ONE process, on one GPU, timed with triton.testing.do_bench (median, CUDA events),
interleaved rounds (the contenders' order per round: bench/rounds.py).

Metric: GB/s of K+V read (batch x seqlen_k x num_heads_kv x (headdim + headdim_v) x 2 bytes per
call: the bytes a decode step must stream) and microseconds per call. SDPA gets dense (b, h, s, d)
K/V with enable_gqa (its natural layout); fa4 gets its cache layout, dense (b, s, h_kv, d) or paged
(num_pages, page_size, h_kv, d) with a shuffled page table. Upstream FlashAttention-4, where
installed (shared/peers), gets fa4's cache through its varlen entry (seqused_k, page_table; its
Hopper forward has no split-KV). FlashInfer is not installed on the benchmark machine (no row).

Timing: eager calls of every contender (ratios), plus fa4's and upstream's calls replayed from a
CUDA graph (fa4_graph, upstream_fa4_graph: GPU time, as a serving engine runs decode; host costs are
bench/host_overhead.py's; ratio_upstream_fa4_graph compares the two replays).

Shapes: GQA 32/8 d128, batch 1/8/32/128, KV 1k..128k (at most 2M cached tokens per call: every
layout's copy must fit), dense and paged (16; --quick) plus seqlen_q 4 and page 64 (full run), and
GQA 8/1 d128, 32/8 d64, 16/4 d256 at batch 1 and 32, KV 8k and 32k, dense and page 16.

Usage (on the GPU machine, from the repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/bench_decode.py OUT.json [--quick]
Writes OUT.json (run metadata + rows) and OUT.png.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa4
from bench_fwd import (agreement, bench, fa4_layout, interleaved_rounds, run_meta, sdpa_fn, upstream_fa4_kvcache_fn,
                       upstream_fa4_version)

ROUNDS = 3


def make_problem(batch, seqlen_k, seqlen_q, heads, heads_kv, d, page_size, dt, gen, shuffle=True):
    q = torch.randn(batch, seqlen_q, heads, d, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(batch, seqlen_k, heads_kv, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(batch, seqlen_k, heads_kv, d, device="cuda", dtype=dt, generator=gen)
    lens = torch.full((batch,), seqlen_k, device="cuda", dtype=torch.int32)
    if not page_size:
        return q, k, v, lens, None, (k, v)
    kp, vp, table = page_pool(k, v, page_size, gen, shuffle)
    return q, kp, vp, lens, table, (k, v)


def page_pool(k, v, page_size, gen, shuffle=True):
    """Dense k, v (batch, seqlen_k, heads_kv, d) as a page pool in shuffled order (shuffle=False:
    in order, sequence after sequence, as a fresh pool hands them out): (k_pool, v_pool,
    page_table), logical page i of sequence b in physical page page_table[b, i] (int32); the last
    page of a sequence zero-padded past seqlen_k."""
    batch, seqlen_k, heads_kv, d = k.shape
    pages_per_seq = (seqlen_k + page_size - 1) // page_size
    num_pages = batch * pages_per_seq
    perm = (torch.randperm(num_pages, device="cuda", generator=gen) if shuffle
            else torch.arange(num_pages, device="cuda")).to(torch.int32)
    table = perm.view(batch, pages_per_seq)
    kp = torch.empty(num_pages, page_size, heads_kv, d, device="cuda", dtype=k.dtype)
    vp = torch.empty_like(kp)
    pad = pages_per_seq * page_size - seqlen_k
    kk = F.pad(k, (0, 0, 0, 0, 0, pad)).view(batch, pages_per_seq, page_size, heads_kv, d)
    vv = F.pad(v, (0, 0, 0, 0, 0, pad)).view(batch, pages_per_seq, page_size, heads_kv, d)
    kp[table.long()] = kk
    vp[table.long()] = vv
    return kp, vp, table


def time_row(r, batch, seqlen_k, seqlen_q, heads, heads_kv, d, page_size, dt, gen):
    q, kc, vc, lens, table, (k, v) = make_problem(batch, seqlen_k, seqlen_q, heads, heads_kv, d, page_size, dt, gen)
    fa4_fn = lambda: fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)
    # Sanity: fa4 against SDPA's math backend in fp32 on the same keys.
    ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                         v.transpose(1, 2).float(), enable_gqa=heads != heads_kv).transpose(1, 2)
    r["max_abs_err_vs_fp32"] = float((fa4_fn().float() - ref).abs().max())
    del ref
    # Eager calls, every contender; plus fa4's call captured in a CUDA graph and replayed, as a
    # serving engine runs a decode step (GPU time without the host cost of an eager call, which at
    # the smallest sizes exceeds the kernels' time; bench/host_overhead.py measures that cost).
    # SDPA is not replayed from a graph: a captured cuDNN call at KV 8k hit an illegal memory
    # access on the H200 (torch 2.11, cuDNN 9.19), which ends the process.
    # SDPA's backend is chosen once around its timed calls (sdpa_kernel's enter/exit costs ~8 us
    # of host time, which fa4's calls do not pay).
    graph_fn = graphed(fa4_fn)
    timers = {"fa4": lambda: bench(fa4_fn), "fa4_graph": lambda: bench(graph_fn)}
    results = {"fa4": (fa4_fn(),)}
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        fn = sdpa_fn(q, k, v, False, be)
        if fn:
            timers[name] = (lambda fn=fn, be=be: _in(be, lambda: bench(fn)))
            results[name] = (fa4_layout(name, _in(be, fn)),)
    # Upstream FlashAttention-4 on the same cache (no split-KV on Hopper), eager and replayed.
    up_fn = upstream_fa4_kvcache_fn(q, kc, vc, cache_seqlens=lens, page_table=table)
    if up_fn is not None:
        try:
            results["upstream_fa4"] = (up_fn(),)
            timers["upstream_fa4"] = lambda: bench(up_fn)
        except Exception as e:
            print(f"# upstream_fa4 failed: {str(e).splitlines()[0][:160]}", file=sys.stderr)
            up_fn = None
    if up_fn is not None:
        try:
            up_graph = graphed(up_fn)
            timers["upstream_fa4_graph"] = lambda: bench(up_graph)
        except Exception as e:  # (the eager timing stays; a failed capture may leave its stream current)
            cause = e.__context__ or e
            print(f"# upstream_fa4 graph capture failed: {str(cause).splitlines()[0][:160]}", file=sys.stderr)
            torch.cuda.set_stream(torch.cuda.default_stream())
    # The contenders' outputs against fa4's (bench_fwd.agreement), before the timing.
    r["max_rel_diff_vs_fa4"] = agreement(results)
    times = interleaved_rounds(timers, ROUNDS)
    gbytes = batch * seqlen_k * heads_kv * 2 * d * q.element_size() / 1e9
    for n in ("fa4", "fa4_graph", "cudnn", "flash", "upstream_fa4", "upstream_fa4_graph"):
        ms = statistics.median(times[n]) if times.get(n) else None
        r[n + "_us"] = round(ms * 1e3, 1) if ms else None
        r[n + "_gbs"] = round(gbytes / (ms / 1e3), 0) if ms else None
    r["rounds"] = ROUNDS
    r["ratio_cudnn"] = round(r["cudnn_us"] / r["fa4_us"], 3) if r["fa4_us"] and r["cudnn_us"] else None
    r["ratio_flash"] = round(r["flash_us"] / r["fa4_us"], 3) if r["fa4_us"] and r["flash_us"] else None
    # Graph replay against graph replay: upstream's eager call is host-bound at small sizes.
    r["ratio_upstream_fa4_graph"] = (round(r["upstream_fa4_graph_us"] / r["fa4_graph_us"], 3)
                                     if r["fa4_graph_us"] and r["upstream_fa4_graph_us"] else None)
    return r


def graphed(fn):
    """g.replay of `fn` captured in a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def _in(backend, fn):
    """fn() with SDPA restricted to `backend` (the timing above, bench/ab_decode.py and
    decode_split_sweep.py run their SDPA calls through this)."""
    with sdpa_kernel([backend]):
        return fn()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--quick", action="store_true", help="GQA 32/8 d128 seqlen_q 1 only, fewer shapes")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    global ROUNDS
    ROUNDS = max(1, args.rounds)
    meta = run_meta()
    meta["upstream_fa4"] = upstream_fa4_version()
    print(json.dumps(meta), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    batches = [1, 8, 32, 128]
    kvs = [1024, 8192, 32768, 131072]
    # (heads, heads_kv, d, seqlen_qs, page sizes, batches, kv lengths)
    plan = [(32, 8, 128, [1], [0, 16], batches, kvs)]
    if not args.quick:
        plan = [(32, 8, 128, [1, 4], [0, 16, 64], batches, kvs)] + [
            (h, hkv, d, [1], [0, 16], [1, 32], [8192, 32768]) for h, hkv, d in ((8, 1, 128), (32, 8, 64), (16, 4, 256))]
    rows = []
    for heads, heads_kv, d, seqlen_qs, pages, bs, ks in plan:
        for sq in seqlen_qs:
            for batch in bs:
                for sk in ks:
                    if batch * sk > 2 * 1024 * 1024:  # K, V, the paged and the SDPA copies must fit
                        continue
                    for ps in pages:
                        r = {"heads": heads, "heads_kv": heads_kv, "hdim": d, "seqlen_q": sq, "batch": batch,
                             "seqlen_k": sk, "page_size": ps}
                        try:
                            time_row(r, batch, sk, sq, heads, heads_kv, d, ps, dt, gen)
                        except Exception as e:
                            r["error"] = str(e).splitlines()[0][:200]
                        rows.append(r)
                        print(json.dumps(r), flush=True)
                        torch.cuda.empty_cache()
    with open(args.out_json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\n{'h/hkv':>6} {'d':>4} {'sq':>3} {'b':>4} {'kv':>7} {'page':>4} {'fa4 GB/s':>9} {'cudnn':>7} "
          f"{'flash':>7} {'fa4 us':>8} {'graph us':>8} {'cudnn us':>8} {'x cudnn':>7} {'up graph':>8} {'x up':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['heads']}/{r['heads_kv']} d{r['hdim']} b{r['batch']} kv{r['seqlen_k']} page{r['page_size']}: {r['error']}")
            continue
        print(f"{r['heads']:>3}/{r['heads_kv']:<2} {r['hdim']:>4} {r['seqlen_q']:>3} {r['batch']:>4} {r['seqlen_k']:>7} "
              f"{r['page_size']:>4} {r['fa4_gbs']!s:>9} {r['cudnn_gbs']!s:>7} {r['flash_gbs']!s:>7} "
              f"{r['fa4_us']!s:>8} {r['fa4_graph_us']!s:>8} {r['cudnn_us']!s:>8} {r['ratio_cudnn']!s:>7} "
              f"{r['upstream_fa4_graph_us']!s:>8} {r['ratio_upstream_fa4_graph']!s:>6}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        sel = [r for r in rows if "error" not in r and r["heads"] == 32 and r["hdim"] == 128 and r["seqlen_q"] == 1]
        fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.5), sharey=True)
        for ax, batch in zip(axes, batches):
            for key, style in (("fa4", "-o"), ("cudnn", "--s"), ("flash", ":^"), ("upstream_fa4_graph", "-.d")):
                for ps in sorted({r["page_size"] for r in sel}):
                    pts = [(r["seqlen_k"], r[key + "_gbs"]) for r in sel
                           if r["batch"] == batch and r["page_size"] == ps and r[key + "_gbs"]]
                    if pts and (key == "fa4" or ps == 0):
                        ax.plot(*zip(*pts), style, label=f"{key}" + (f" page{ps}" if key == "fa4" and ps else ""))
            ax.set_xscale("log", base=2)
            ax.set_title(f"batch {batch}, GQA 32/8 d128")
            ax.set_xlabel("KV length")
        axes[0].set_ylabel("GB/s of K+V")
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(args.out_json.rsplit(".", 1)[0] + ".png", dpi=110)
    except Exception as e:  # the plot is a convenience; the JSON is the record
        print(f"# plot failed: {e}", file=sys.stderr)


if __name__ == "__main__":
    main()
