#!/usr/bin/env python3
"""Per-kernel GPU time of one decode (KV-cache) call, fa4 next to SDPA cuDNN, from torch.profiler
(CUPTI kernel records): which of a call's kernels (append, decode; cuDNN's two) costs what,
and the gaps between them. A diagnostic for bench/bench_decode.py's ratios, not a benchmark of
record (no L2 flush between calls; back-to-back calls overlap their launch costs).

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/kernel_times.py OUT.json [--no-sweep]
Two builds' runs side by side: bench/compare_kernel_times.py OLD.json NEW.json.
"""
import json
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import fa4
from bench_decode import make_problem
from bench_fwd import hopper_overrides

CALLS = 20
# (batch, seqlen_k, seqlen_q, heads, heads_kv, d, page_size)
SHAPES = [(1, 1024, 1, 32, 8, 128, 0), (1, 8192, 1, 32, 8, 128, 0), (1, 32768, 1, 32, 8, 128, 0),
          (1, 131072, 1, 32, 8, 128, 0), (8, 8192, 1, 32, 8, 128, 0), (8, 8192, 1, 32, 8, 128, 16),
          (1, 8192, 1, 8, 1, 128, 0), (1, 32768, 1, 8, 1, 128, 0), (1, 8192, 1, 32, 8, 64, 0),
          (32, 8192, 1, 32, 8, 128, 0), (8, 32768, 1, 32, 8, 128, 0), (128, 8192, 1, 32, 8, 128, 0),
          (32, 8192, 1, 32, 8, 64, 0)]

SWEEP_SHAPES = [(1, 1024, 1, 32, 8, 128, 0), (1, 2048, 1, 32, 8, 128, 0), (1, 8192, 1, 32, 8, 128, 0),
                (1, 32768, 1, 32, 8, 128, 0), (1, 8192, 1, 8, 1, 128, 0), (1, 32768, 1, 8, 1, 128, 0),
                (1, 8192, 1, 32, 8, 64, 0)]
SWEEP_SPLITS = [0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256]
# us: the default (the splits of a tile merge in their thread-block cluster where the count allows);
# us_global_merge: every split's partial through global scratch (override decode_cluster = 0).


def kernel_times(fn, exclude=()):
    """us per call of each kernel fn launches (mean over CALLS calls), by the first 60 characters of
    its name; kernels whose full name is in `exclude` left out."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in exclude:
            per[e.name[:60]].append(e.device_time_total)
    return {k: round(sum(v) / CALLS, 2) for k, v in per.items()}


def kernel_names(fn):
    """Full names of the kernels (and memsets) one call of fn launches."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


def global_merge_times(fn):
    """kernel_times(fn) with every split's partial through global scratch (override decode_cluster
    = 0); None for a libfa4 without that override."""
    try:
        with hopper_overrides(decode_cluster="0"):
            return kernel_times(fn)
    except RuntimeError:
        return None


def main():
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for (batch, seqlen_k, seqlen_q, heads, heads_kv, d, page) in SHAPES:
        q, kc, vc, lens, table, (k, v) = make_problem(batch, seqlen_k, seqlen_q, heads, heads_kv, d, page,
                                                      torch.bfloat16, gen)
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

        def cudnn(qt=qt, kt=kt, vt=vt):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=heads != heads_kv)
        r = {"batch": batch, "seqlen_k": seqlen_k, "seqlen_q": seqlen_q, "heads": heads, "heads_kv": heads_kv,
             "hdim": d, "page_size": page,
             "fa4": kernel_times(lambda: fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table)),
             "cudnn": kernel_times(cudnn)}
        r["fa4_global_merge"] = global_merge_times(
            lambda: fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table))
        rows.append(r)
        print(json.dumps(r), flush=True)
        del q, kc, vc, k, v, qt, kt, vt
        torch.cuda.empty_cache()
    # The split count's trade-off (more CTAs in flight against a longer merge), fa4 alone.
    sweep = []
    for (batch, seqlen_k, seqlen_q, heads, heads_kv, d, page) in ([] if "--no-sweep" in sys.argv else SWEEP_SHAPES):
        q, kc, vc, lens, table, _ = make_problem(batch, seqlen_k, seqlen_q, heads, heads_kv, d, page,
                                                 torch.bfloat16, gen)
        r = {"batch": batch, "seqlen_k": seqlen_k, "heads": heads, "heads_kv": heads_kv, "hdim": d, "us": {},
             "us_global_merge": {}}
        for n in SWEEP_SPLITS:
            call = lambda: fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=n)
            r["us"][n] = round(sum(kernel_times(call).values()), 2)
            g = global_merge_times(call)
            r["us_global_merge"][n] = g and round(sum(g.values()), 2)
        sweep.append(r)
        print(json.dumps(r), flush=True)
    # The fixed cost of a call against its per-key cost: one split (a CTA per KV head walks every
    # key), batch 1, GQA 32/8, d128, at growing lengths; length 0 (cache_seqlens = 0) is the
    # launch, the prologue and the epilogue alone.
    fixed = []
    q, kc, vc, lens, _, _ = make_problem(1, 2048, 1, 32, 8, 128, 0, torch.bfloat16, gen)
    for n_keys in (0, 64, 128, 256, 512, 1024, 2048):
        lens.fill_(n_keys)
        r = {"seqlen_k": n_keys, "us": {}}
        for n in (1, 16):
            r["us"][n] = round(sum(kernel_times(lambda: fa4.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=lens, num_splits=n)).values()), 2)
        fixed.append(r)
        print(json.dumps(r), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"rows": rows, "split_sweep": sweep, "fixed_cost": fixed}, f, indent=1)


if __name__ == "__main__":
    main()
