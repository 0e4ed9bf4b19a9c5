#!/usr/bin/env python3
"""Two bench/kernel_times.py runs side by side (an A/B of two libfa4 builds, each run in its own
process; kernel times come from CUPTI, so the processes need not share the GPU at once): per row
fa4 old / new, old / new and cuDNN / new (time ratios, > 1: the new build is faster, as every
bench script reports), cuDNN of the new run; then the fixed-cost rows.

Usage (anywhere; no GPU, no torch):
    python3 bench/compare_kernel_times.py OLD.json NEW.json
"""
import json
import sys


def compare(old_json, new_json):
    """Prints the per-call kernel time (us) of two runs side by side (A/B of two builds, each run in
    its own process): fa4 old / new, old / new, cuDNN in the new run and cuDNN / new (> 1: new
    faster); then the fixed-cost rows."""
    old, new = (json.load(open(p)) for p in (old_json, new_json))
    key = lambda r: (r["batch"], r["seqlen_k"], r["heads"], r["heads_kv"], r["hdim"], r["page_size"])
    before = {key(r): r for r in old["rows"]}
    print("batch seqlen_k heads/kv d page | fa4 old  fa4 new  old/new | cudnn  cudnn/new")
    for r in new["rows"]:
        o = before.get(key(r))
        t_new, t_cudnn = sum(r["fa4"].values()), sum(r["cudnn"].values())
        t_old = sum(o["fa4"].values()) if o else float("nan")
        print(f"{r['batch']:5} {r['seqlen_k']:8} {r['heads']:5}/{r['heads_kv']:<2} {r['hdim']:4} {r['page_size']:4} | "
              f"{t_old:7.2f} {t_new:8.2f} {t_old / t_new:8.3f} | {t_cudnn:6.2f} {t_cudnn / t_new:9.3f}")
    for o, n in zip(old.get("fixed_cost", []), new.get("fixed_cost", [])):
        print(f"fixed cost, {n['seqlen_k']} keys, splits 1 / 16: old {o['us']} new {n['us']}")


if __name__ == "__main__":
    compare(sys.argv[1], sys.argv[2])
