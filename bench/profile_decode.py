#!/usr/bin/env python3
"""A few fa4 decode (KV-cache) calls per shape, for ncu: the kernel's throughput and stall reasons
at batch-1 shapes, where a call is bound by the latency of one CTA's key walk and its merge.

Usage (GPU machine, repo root), each shape "batch,seqlen_k,heads,heads_kv,headdim,num_splits[,page_size]"
(page_size 0 or absent: a dense cache):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so ncu --clock-control none \\
        -k regex:decode_kernel --section SpeedOfLight --section WarpStateStats \\
        python3 bench/profile_decode.py 1,1024,32,8,128,1 1,8192,32,8,128,0
With --global-merge the decode's cluster merge is off (override decode_cluster = 0).
"""
import argparse

import torch

import fa4
from bench_decode import make_problem
from bench_fwd import hopper_overrides

CALLS = 3  # ncu profiles each launch: the first warms up, the others are the readings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+", help="batch,seqlen_k,heads,heads_kv,headdim,num_splits[,page_size]")
    ap.add_argument("--global-merge", action="store_true")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    with hopper_overrides(decode_cluster="0" if args.global_merge else "auto"):
        for shape in args.shapes:
            batch, seqlen_k, heads, heads_kv, d, splits, page = ([int(x) for x in shape.split(",")] + [0])[:7]
            q, kc, vc, lens, table, _ = make_problem(batch, seqlen_k, 1, heads, heads_kv, d, page, torch.bfloat16, gen)
            for _ in range(CALLS):
                fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=splits)
            torch.cuda.synchronize()
            print(f"profiled {shape}", flush=True)


if __name__ == "__main__":
    main()
