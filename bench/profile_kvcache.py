#!/usr/bin/env python3
"""Calls of one KV-cache shape for a profiler to attach to (ncu filters on kernel names): fa4's
KV-cache call on a paged cache (which kernel runs is fa4's choice: the gathering forward for chunks
on small pages), fa4's forward on the same keys dense, and upstream FlashAttention-4's call on the
same paged cache where installed. Made to see where the gathering forward's time goes against the
dense forward's (ncu's warp states and source counters, `ncu_source_top.py`).

Usage: PYTHONPATH=python:bench FA4_LIBRARY=... python3 bench/profile_kvcache.py
       batch,seqlen_k,seqlen_q,heads,heads_kv,headdim,causal [page_size] [which]
which: a comma list of kvcache, dense, up (default all three); each runs twice (the first is
warm-up, e.g. ncu --launch-skip).
"""
import sys

import torch

import fa4
from bench_decode import page_pool
from bench_fwd import upstream_fa4_kvcache_fn

b, sk, sq, h, hkv, d, causal = (int(x) for x in sys.argv[1].split(","))
page_size = int(sys.argv[2]) if len(sys.argv) > 2 else 16
which = (sys.argv[3] if len(sys.argv) > 3 else "kvcache,dense,up").split(",")
assert sk % page_size == 0, "seqlen_k must be a multiple of the page size (a padded page tail would be attended)"
gen = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
kp, vp, table = page_pool(k, v, page_size, gen)
calls = {"kvcache": lambda: fa4.flash_attn_with_kvcache(q, kp, vp, page_table=table, causal=bool(causal)),
         "dense": lambda: fa4.flash_attn_func(q, k, v, causal=bool(causal)),
         "up": upstream_fa4_kvcache_fn(q, kp, vp, page_table=table, causal=bool(causal))}
for name in which:
    if calls.get(name) is None:
        print(f"profile_kvcache: {name} is not available", flush=True)
        continue
    for _ in range(2):
        calls[name]()
torch.cuda.synchronize()
print(f"profile_kvcache: {sys.argv[1]} page {page_size}: {', '.join(which)}", flush=True)
