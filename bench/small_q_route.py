#!/usr/bin/env python3
"""Which kernel a batched forward with few query rows per KV head should run on: GPU time per call
of fa4.flash_attn_func forced onto the forward kernel (override small_q = fwd) and onto the decode
kernel (small_q = decode; its row tile by the rows, and forced to 16 and to 64 rows: override
decode_tile), next to SDPA cuDNN, from torch.profiler's kernel records
(bench/kernel_times.py). The data behind the selector's rule (src/hopper/hopper_api.cu
small_q_on_decode) and the decode's tile rule (decode/launch_decode.h decode_tile): the column
"auto_kernel" says where the selector sends the shape.

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/small_q_route.py OUT.json
    ... --shape 1,64,1024,32,8,64,0      (batch,seqlen_q,seqlen_k,heads,heads_kv,headdim,causal; repeatable)
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa4
from bench_fwd import hopper_overrides, run_meta
from kernel_times import kernel_times

# (batch, seqlen_q, seqlen_k, heads, heads_kv, headdim, causal)
SHAPES = [(1, 1, 1024, 32, 8, 128, False), (1, 1, 8192, 32, 8, 128, False), (8, 1, 8192, 32, 8, 128, False),
          (64, 1, 2048, 32, 8, 128, False), (1, 4, 8192, 32, 8, 128, True), (8, 4, 4096, 32, 8, 128, True),
          (1, 8, 8192, 32, 8, 128, True), (1, 12, 8192, 32, 8, 128, True),
          (1, 16, 4096, 32, 8, 128, True), (1, 32, 4096, 32, 8, 128, True), (1, 16, 4096, 8, 1, 128, True),
          (1, 128, 1024, 8, 8, 64, True), (1, 128, 4096, 8, 8, 128, True), (1, 128, 8192, 16, 16, 128, True),
          (4, 64, 4096, 16, 16, 128, True), (8, 128, 2048, 16, 16, 64, True), (1, 64, 16384, 32, 32, 128, True),
          (2, 8, 32768, 64, 8, 128, True),
          # Non-causal with several row tiles per KV head: the forward splits its keys over the SMs
          # (stream-K, core/stream_k.h), as it does for the causal rows above whose query rows are
          # one forward tile per head and whose keys are long enough; each decode row tile re-reads
          # the head's K and V.
          (1, 128, 32768, 16, 16, 128, False), (1, 128, 8192, 16, 16, 128, False),
          (1, 64, 16384, 32, 32, 128, False), (1, 32, 8192, 32, 8, 128, False), (1, 16, 32768, 32, 8, 128, False),
          (2, 128, 4096, 8, 8, 64, False)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--shape", action="append", default=[],
                    help="batch,seqlen_q,seqlen_k,heads,heads_kv,headdim,causal (repeatable): these shapes instead")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] or SHAPES
    rows = []
    for (b, sq, sk, h, hkv, d, causal) in shapes:
        causal = bool(causal)
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        call = lambda: fa4.flash_attn_func(q, k, v, causal=causal)
        row = {"batch": b, "seqlen_q": sq, "seqlen_k": sk, "num_heads": h, "num_heads_kv": hkv, "headdim": d,
               "causal": causal,
               "auto_kernel": fa4.forward_support(q, k, v, torch.empty_like(q),
                                                  torch.empty(b, h, sq, device="cuda"), causal=causal)[1]}
        for route in ("fwd", "decode"):
            with hopper_overrides(small_q=route):
                row[route + "_us"] = round(sum(kernel_times(call).values()), 2)
        for tile in ("16", "64"):
            with hopper_overrides(small_q="decode", decode_tile=tile):
                row["decode" + tile + "_us"] = round(sum(kernel_times(call).values()), 2)
        # cuDNN without a mask (its causal is top-left): the same work for one query, more for several
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            row["cudnn_us"] = round(sum(kernel_times(lambda: F.scaled_dot_product_attention(
                qt, kt, vt, enable_gqa=h != hkv)).values()), 2)
        row["fwd_over_decode"] = round(row["fwd_us"] / row["decode_us"], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out_json, "w") as f:
        json.dump({"meta": run_meta(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
