#!/usr/bin/env python3
"""Per-CTA phase timeline of the decode kernel: a diagnostic, see README.md in this folder.

Needs a libfa4 built from a tree patched by decode_timeline_patch.py. Per shape: the kernel's CUPTI
time, then from one call's stamps the median / max duration of each phase over the CTAs (clock64, at
each CTA's own clock rate) and the globaltimer stamps of the CTA that merged last (ns from the first CTA's start).

Usage (GPU machine, repo root):
    FA4_LIBRARY=path/to/patched/libfa4.so PYTHONPATH=python:bench python3 bench/timeline/decode_ts.py OUT.json
"""
import ctypes
import json
import sys

import numpy as np
import torch
import fa4
from fa4 import _capi
from bench_decode import make_problem
from bench_fwd import hopper_overrides
from kernel_times import kernel_times

lib = _capi.library()
fetch = lib.fa4_ts_fetch
fetch.argtypes = [ctypes.c_void_p, ctypes.c_int]
N = 8192 * 32
buf = np.zeros(N, dtype=np.uint64)
NAMES = ["seqlens", "first_blk", "loop", "wmerge+start_wait", "push", "csync", "cmerge", "arrive", "combine/end"]

def run(tag, batch, seqlen_k, heads, heads_kv, d, splits, page=0, cluster="auto", lens_val=None, reps=5):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, kc, vc, lens, table, _ = make_problem(batch, seqlen_k, 1, heads, heads_kv, d, page, torch.bfloat16, gen)
    if lens_val is not None:
        lens.fill_(lens_val)
    fn = lambda: fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, page_table=table, num_splits=splits)
    out = {"tag": tag}
    with hopper_overrides(decode_cluster=cluster):
        kt = kernel_times(fn)
        out["cupti_us"] = {k: v for k, v in kt.items() if "decode" in k}
        spans, crit, phase_all = [], [], []
        for r in range(reps):
            fetch(None, 1)
            torch.cuda.synchronize()
            fn(); torch.cuda.synchronize()
            fetch(buf.ctypes.data, 0)
            a = buf.reshape(8192, 32).astype(np.int64)
            used = a[:, 0] > 0
            t = a[used][:, :10]
            c = a[used][:, 16:26]
            last = a[used][:, 14] == 1
            t0 = t[:, 0].min()
            spans.append(t[:, 9].max() - t0)
            starts = t[:, 0] - t0
            # each CTA's SM clock from its own first and last stamps (globaltimer ns per clock64 cycle)
            ns_per_cycle = (t[:, 9] - t[:, 0]) / np.maximum(c[:, 9] - c[:, 0], 1)
            ph = []
            for k in range(1, 10):
                dk = []
                for i in range(len(c)):
                    prev = max(j for j in range(k) if c[i, j] > 0)
                    if c[i, k] > 0:
                        dk.append((c[i, k] - c[i, prev]) * ns_per_cycle[i])
                ph.append(dk)
            phase_all.append(ph)
            idx = np.where(last)[0]  # the CTAs that merged a tile: the one that finished last
            li = idx[np.argmax(t[idx, 9])] if len(idx) else np.argmax(t[:, 9])
            crit.append([int(x - t0) if x > 0 else -1 for x in t[li]])
        out["ctas"] = int(used.sum())
        out["span_ns"] = [int(x) for x in spans]
        out["start_spread_ns"] = [int(np.percentile(starts, p)) for p in (0, 50, 90, 100)]
        ph = phase_all[-1]
        out["phase_med_ns"] = {NAMES[k]: int(np.median(ph[k])) if ph[k] else None for k in range(9)}
        out["phase_max_ns"] = {NAMES[k]: int(np.max(ph[k])) if ph[k] else None for k in range(9)}
        out["crit_globaltimer_ns"] = crit[-1]
        out["n_iter"] = sorted(set(int(x) for x in a[used][:, 13]))[:6]
    pm, px = out["phase_med_ns"], out["phase_max_ns"]
    phases = " ".join(f"{k}={pm[k]}/{px[k]}" for k in NAMES if pm[k] is not None)
    print(f"{tag}: cupti {list(out['cupti_us'].values())} us, {out['ctas']} CTAs, span {min(out['span_ns'])} ns, "
          f"last merger {out['crit_globaltimer_ns']} | median/max ns {phases}", flush=True)
    return out

def main():
    res = []
    small = torch.zeros(16, device="cuda")
    print(json.dumps({"tiny_elementwise_cupti_us": kernel_times(lambda: small.add_(1))}), flush=True)
    S = [
        ("gqa81_8k_auto", 1, 8192, 8, 1, 128, 0, 0, "auto"),
        ("gqa81_8k_auto_global", 1, 8192, 8, 1, 128, 0, 0, "0"),
        ("gqa81_8k_s16_cluster", 1, 8192, 8, 1, 128, 16, 0, "1"),
        ("gqa81_8k_s32_global", 1, 8192, 8, 1, 128, 32, 0, "0"),
        ("gqa81_32k_auto", 1, 32768, 8, 1, 128, 0, 0, "auto"),
        ("gqa328_1k_auto", 1, 1024, 32, 8, 128, 0, 0, "auto"),
        ("gqa328_1k_cluster", 1, 1024, 32, 8, 128, 0, 0, "1"),
        ("gqa328_8k_auto", 1, 8192, 32, 8, 128, 0, 0, "auto"),
        ("gqa328_8k_auto_p16", 1, 8192, 32, 8, 128, 0, 16, "auto"),
    ]
    for s in S:
        res.append(run(*s))
    res.append(run("nokey_s16_global", 1, 1024, 32, 8, 128, 16, 0, "0", lens_val=0))
    res.append(run("nokey_s16_cluster", 1, 1024, 32, 8, 128, 16, 0, "1", lens_val=0))
    json.dump(res, open(sys.argv[1], "w"), indent=1)

if __name__ == "__main__":
    main()
