#!/usr/bin/env python3
"""Kernel time of fa4's decode (KV-cache) call at explicit split counts next to the automatic one
and SDPA cuDNN, per shape: the measurements behind the automatic split count
(src/hopper/decode/launch_decode.h decode_num_splits). A tuning tool, not a benchmark of record:
kernel times from torch.profiler (bench/kernel_times.py), back-to-back calls, no L2 flush (the
caches swept here are larger than the L2 except the shortest), best of --repeats passes.

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/decode_split_sweep.py OUT.json
    ... --shape 3,32768,1,32,8,128,0 --splits 0,4,5,8      (batch,seqlen_k,seqlen_q,heads,heads_kv,d,page)
    ... --override decode_tile=64 --override decode_cluster=0   (libfa4 overrides during fa4's calls)
Not causal: the split count reads only shapes, and SDPA's is_causal is not fa4's bottom-right mask.
"""
import argparse
import json

import torch
from torch.nn.attention import SDPBackend

import fa4
from bench_decode import _in, make_problem
from bench_fwd import hopper_overrides, sdpa_fn
from kernel_times import kernel_times

# (batch, seqlen_k, seqlen_q, heads, heads_kv, d, page_size), split counts (0 = automatic)
SHAPES = [
    ((1, 8192, 1, 32, 8, 128, 0), [0, 16, 32]), ((1, 32768, 1, 32, 8, 128, 0), [0, 16, 32]),
    ((1, 131072, 1, 32, 8, 128, 0), [0, 16, 32]), ((3, 32768, 1, 32, 8, 128, 0), [0, 4, 5, 8]),
    ((6, 32768, 1, 32, 8, 128, 0), [0, 2, 4]), ((8, 8192, 1, 32, 8, 128, 0), [0, 1, 2, 4]),
    ((9, 32768, 1, 32, 8, 128, 0), [0, 1, 2, 3]), ((12, 8192, 1, 32, 8, 128, 0), [0, 1, 2]),
    ((1, 131072, 1, 32, 8, 128, 16), [0, 16, 32]), ((8, 131072, 1, 32, 8, 128, 16), [0, 2, 4]),
    ((1, 8192, 1, 8, 1, 128, 0), [0, 32, 64]), ((1, 131072, 1, 8, 1, 128, 0), [0, 64, 96, 112]),
    ((1, 8192, 1, 32, 8, 64, 0), [0, 16, 32]), ((1, 1024, 128, 8, 8, 64, 0), [0, 2, 4]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--shape", action="append", default=[],
                    help="batch,seqlen_k,seqlen_q,heads,heads_kv,d,page_size (repeatable; the counts of --splits)")
    ap.add_argument("--splits", default="0,16,32", help="split counts for --shape (0 = automatic)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--override", action="append", default=[],
                    help="name=value of a libfa4 override (src/common/overrides.h) held during fa4's calls")
    args = ap.parse_args()
    overrides = dict(o.split("=", 1) for o in args.override)
    shapes = SHAPES
    if args.shape:
        splits = [int(x) for x in args.splits.split(",")]
        shapes = [(tuple(int(x) for x in s.split(",")), splits) for s in args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for (batch, sk, sq, h, hkv, d, page), splits in shapes:
        q, kc, vc, lens, table, (k, v) = make_problem(batch, sk, sq, h, hkv, d, page, torch.bfloat16, gen)
        gb = batch * sk * hkv * 2 * d * 2 / 1e3  # K + V bytes / 1e3: GB/s from us
        cudnn = sdpa_fn(q, k, v, False, SDPBackend.CUDNN_ATTENTION)  # None where cuDNN refuses the shape
        r = {"batch": batch, "seqlen_k": sk, "seqlen_q": sq, "heads": h, "heads_kv": hkv, "hdim": d,
             "page_size": page, "overrides": overrides, "cudnn_us": cudnn and round(sum(kernel_times(
                 lambda: _in(SDPBackend.CUDNN_ATTENTION, cudnn)).values()), 2), "fa4_us": {}}
        for _ in range(args.repeats):
            for n in splits:
                with hopper_overrides(**overrides):
                    t = sum(kernel_times(lambda: fa4.flash_attn_with_kvcache(
                        q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=n)).values())
                r["fa4_us"][n] = min(r["fa4_us"].get(n, float("inf")), round(t, 2))
        r["fa4_GBs"] = {n: round(gb / t) for n, t in r["fa4_us"].items()}
        rows.append(r)
        print(json.dumps(r), flush=True)
        del q, kc, vc, k, v
        torch.cuda.empty_cache()
    with open(args.out_json, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
