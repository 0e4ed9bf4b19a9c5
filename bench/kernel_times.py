#!/usr/bin/env python3
"""Per-kernel GPU time of one decode (KV-cache) call, fa4 next to SDPA cuDNN, from torch.profiler
(CUPTI kernel records): which of a call's kernels (append, decode; cuDNN's two) costs what,
and the gaps between them. A diagnostic for bench/bench_decode.py's ratios, not a benchmark of
record (no L2 flush between calls; back-to-back calls overlap their launch costs).

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/kernel_times.py OUT.json
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

CALLS = 20
# (batch, seqlen_k, seqlen_q, heads, heads_kv, d, page_size)
SHAPES = [(1, 1024, 1, 32, 8, 128, 0), (1, 8192, 1, 32, 8, 128, 0), (1, 32768, 1, 32, 8, 128, 0),
          (1, 131072, 1, 32, 8, 128, 0), (8, 8192, 1, 32, 8, 128, 0), (8, 8192, 1, 32, 8, 128, 16),
          (1, 8192, 1, 8, 1, 128, 0), (1, 32768, 1, 8, 1, 128, 0), (1, 8192, 1, 32, 8, 64, 0),
          (32, 8192, 1, 32, 8, 128, 0), (8, 32768, 1, 32, 8, 128, 0), (128, 8192, 1, 32, 8, 128, 0),
          (32, 8192, 1, 32, 8, 64, 0)]

SWEEP_SHAPES = [(1, 1024, 1, 32, 8, 128, 0), (1, 2048, 1, 32, 8, 128, 0), (1, 8192, 1, 32, 8, 128, 0),
                (1, 32768, 1, 32, 8, 128, 0), (1, 8192, 1, 8, 1, 128, 0), (1, 8192, 1, 32, 8, 64, 0)]
SWEEP_SPLITS = [0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]


def kernel_times(fn):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:60]].append(e.device_time_total)
    # us per call of each kernel (mean over the calls)
    return {k: round(sum(v) / CALLS, 2) for k, v in per.items()}


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
        rows.append(r)
        print(json.dumps(r), flush=True)
        del q, kc, vc, k, v, qt, kt, vt
        torch.cuda.empty_cache()
    # The split count's trade-off (more CTAs in flight against a longer merge), fa4 alone.
    sweep = []
    for (batch, seqlen_k, seqlen_q, heads, heads_kv, d, page) in SWEEP_SHAPES:
        q, kc, vc, lens, table, _ = make_problem(batch, seqlen_k, seqlen_q, heads, heads_kv, d, page,
                                                 torch.bfloat16, gen)
        r = {"batch": batch, "seqlen_k": seqlen_k, "heads": heads, "heads_kv": heads_kv, "hdim": d, "us": {}}
        for n in SWEEP_SPLITS:
            t = kernel_times(lambda: fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=n))
            r["us"][n] = round(sum(t.values()), 2)
        sweep.append(r)
        print(json.dumps(r), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"rows": rows, "split_sweep": sweep}, f, indent=1)


if __name__ == "__main__":
    main()
