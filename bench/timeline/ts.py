#!/usr/bin/env python3
"""Per-tile timeline of the d128 forward kernel (a diagnostic; see README.md in this folder).

Needs a libfa4 whose d128 bf16 kernel was built with tile_timeline.patch applied: thread 0 of each
consumer warpgroup of CTA 0 records clock64() at 16 points of its first 8 tiles and, at kernel
exit, writes the cycle counts (relative to the first record) into the first 256 floats of the LSE
buffer, which this script reads back. The output O and LSE of that call are NOT valid.

Usage (GPU machine, repo root):
    FA4_LIBRARY=path/to/patched/libfa4.so PYTHONPATH=python python3 bench/timeline/ts.py [seqlen]
"""
import statistics as st
import sys

import torch

import fa4

EVENTS = ["start", "q_ready", "k_ready", "qk0_done", "sm0_done", "loop_end", "pv_last", "finalize",
          "stmatrix", "fence", "bar", "tma_issue", "epi_done(lse)", "it5_turn", "it5_S_ready", "it5_end"]
ORDER = [0, 1, 2, 3, 4, 13, 14, 15, 5, 6, 7, 8, 9, 10, 11, 12]  # program order of the records


def main():
    s = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    b = max(1, 16384 // s)
    q, k, v = (torch.randn(b, s, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(5):
        fa4.flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    _, lse = fa4.flash_attn_func(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    t = lse.contiguous().view(-1)[:256].double().cpu().view(2, 8, 16)
    print(f"d128 non-causal, batch {b} x seqlen {s} x 16 heads: median over tiles 2..7 of CTA 0 of the "
          "cycles between consecutive records")
    for w in range(2):
        d = {f"{EVENTS[a]}->{EVENTS[c]}": int(st.median(float(t[w, i, c] - t[w, i, a]) for i in range(2, 8)))
             for a, c in zip(ORDER, ORDER[1:])}
        gap = int(st.median(float(t[w, i, 0] - t[w, i - 1, 12]) for i in range(2, 8)))
        print(f"warpgroup {w}: {d}, previous epi_done->start {gap}")


if __name__ == "__main__":
    main()
