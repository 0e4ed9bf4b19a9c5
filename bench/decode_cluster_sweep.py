#!/usr/bin/env python3
"""fa4's decode (KV-cache) call at batch-1 shapes for every power-of-two split count, each with the
splits' partials merged through global scratch (override decode_cluster = 0) and in thread-block
clusters (decode_cluster = 1: the largest cluster that divides the count), next to the automatic
choice: kernel time (torch.profiler, bench/kernel_times.py) and time per replay of the call captured
in a CUDA graph (median of 5 x 200 replays). The measurements behind the cluster rule and the split
count of short caches (src/hopper/decode/launch_decode.h). A tuning tool, not a benchmark of record.

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/decode_cluster_sweep.py OUT.json
    ... --shape 1,1024,32,8,128        (batch,seqlen_k,heads,heads_kv,d; repeatable)
"""
import argparse
import json
import statistics

import torch

import fa4
from bench_fwd import hopper_overrides
from host_overhead import capture, replay_times
from kernel_times import kernel_times

SHAPES = [(1, 1024, 32, 8, 128), (1, 2048, 32, 8, 128), (1, 4096, 32, 8, 128), (1, 8192, 8, 1, 128),
          (1, 1024, 8, 8, 64)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--shape", action="append", default=[], help="batch,seqlen_k,heads,heads_kv,d (repeatable)")
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] or SHAPES
    rows = []
    for b, sk, h, hk, d in shapes:
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        blocks = sk // 64
        cands = [(0, "auto")] + [(s, m) for s in (1, 2, 4, 8, 16, 32, 64, 128) if s <= blocks for m in ("0", "1")]
        for splits, merge in cands:
            def fn(splits=splits):
                return fa4.flash_attn_with_kvcache(q, k, v, num_splits=splits)
            try:
                with hopper_overrides(decode_cluster=merge):  # (acts when the call is launched or captured)
                    kt = round(sum(kernel_times(fn).values()), 2)
                    g = capture(fn)
                rt = round(statistics.median(replay_times(g)[0] for _ in range(5)), 2)
            except RuntimeError as e:
                kt, rt = None, str(e).splitlines()[0][:80]
            row = {"shape": [b, sk, h, hk, d], "num_splits": splits, "decode_cluster": merge,
                   "kernel_us": kt, "graph_replay_us": rt}
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump(rows, open(args.out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
