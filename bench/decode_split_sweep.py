#!/usr/bin/env python3
"""Kernel time of fa4's decode (KV-cache) call at explicit split counts next to the automatic one
and SDPA cuDNN, per shape: the measurements behind the automatic split count
(src/hopper/decode/launch_decode.h decode_num_splits). A tuning tool, not a benchmark of record:
kernel times from torch.profiler (bench/kernel_times.py), back-to-back calls, no L2 flush (the
caches swept here are larger than the L2 except the shortest), best of --repeats passes.

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/decode_split_sweep.py OUT.json
    ... --shape 3,32768,1,32,8,128,0,0 --splits 0,4,5,8      (batch,seqlen_k,seqlen_q,heads,heads_kv,d,page,causal)
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa4
from bench_decode import make_problem
from kernel_times import kernel_times

# (batch, seqlen_k, seqlen_q, heads, heads_kv, d, page_size, causal), split counts (0 = automatic)
SHAPES = [
    ((1, 8192, 1, 32, 8, 128, 0, 0), [0, 16, 32]), ((1, 32768, 1, 32, 8, 128, 0, 0), [0, 16, 32]),
    ((1, 131072, 1, 32, 8, 128, 0, 0), [0, 16, 32]), ((3, 32768, 1, 32, 8, 128, 0, 0), [0, 4, 5, 8]),
    ((6, 32768, 1, 32, 8, 128, 0, 0), [0, 2, 4]), ((8, 8192, 1, 32, 8, 128, 0, 0), [0, 1, 2, 4]),
    ((9, 32768, 1, 32, 8, 128, 0, 0), [0, 1, 2, 3]), ((12, 8192, 1, 32, 8, 128, 0, 0), [0, 1, 2]),
    ((1, 131072, 1, 32, 8, 128, 16, 0), [0, 16, 32]), ((8, 131072, 1, 32, 8, 128, 16, 0), [0, 2, 4]),
    ((1, 8192, 1, 8, 1, 128, 0, 0), [0, 32, 64]), ((1, 131072, 1, 8, 1, 128, 0, 0), [0, 64, 96, 112]),
    ((1, 8192, 1, 32, 8, 64, 0, 0), [0, 16, 32]), ((1, 1024, 128, 8, 8, 64, 0, 1), [0, 2, 4]),
]


def cudnn_us(q, k, v, causal, gqa):
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    sq, sk = q.shape[1], k.shape[1]
    mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq) if causal else None  # bottom-right

    def call():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
    try:
        return round(sum(kernel_times(call).values()), 2)
    except RuntimeError as e:  # a shape cuDNN refuses
        return f"unsupported: {str(e)[:60]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--shape", action="append", default=[],
                    help="batch,seqlen_k,seqlen_q,heads,heads_kv,d,page_size,causal (repeatable; needs --splits)")
    ap.add_argument("--splits", default="0,16,32", help="split counts for --shape (0 = automatic)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    shapes = SHAPES
    if args.shape:
        splits = [int(x) for x in args.splits.split(",")]
        shapes = [(tuple(int(x) for x in s.split(",")), splits) for s in args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for (batch, sk, sq, h, hkv, d, page, causal), splits in shapes:
        q, kc, vc, lens, table, (k, v) = make_problem(batch, sk, sq, h, hkv, d, page, torch.bfloat16, gen)
        gb = batch * sk * hkv * 2 * d * 2 / 1e3  # K + V bytes / 1e3: GB/s from us
        r = {"batch": batch, "seqlen_k": sk, "seqlen_q": sq, "heads": h, "heads_kv": hkv, "hdim": d,
             "page_size": page, "causal": bool(causal), "cudnn_us": cudnn_us(q, k, v, causal, h != hkv), "fa4_us": {}}
        for _ in range(args.repeats):
            for n in splits:
                t = sum(kernel_times(lambda: fa4.flash_attn_with_kvcache(
                    q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=n, causal=bool(causal))).values())
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
