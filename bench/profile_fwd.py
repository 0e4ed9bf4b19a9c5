#!/usr/bin/env python3
"""Two forward passes (at least) of every bench_fwd.py contender (bench_fwd.contenders: fa4,
SDPA's cuDNN and FLASH, upstream FlashAttention-4 where installed) on one shape, for a profiler to
attach to (bench/device_run.sh FNCU=1 runs ncu over it). Made for the short causal shapes, where the
forward stays below cuDNN (bench/results/README.md): ncu's launch statistics say each
contender's grid, block, registers and shared memory per CTA (so CTAs per SM), its sections
how busy the tensor pipe is and where the warps wait.

Usage: PYTHONPATH=python FA4_LIBRARY=... python3 bench/profile_fwd.py [headdim] [causal 0|1] [seqlen]
       [overrides]
overrides: fa4's kernel-choice overrides for the run, e.g. "lpt=1&schedule=static" (bench_fwd.set_overrides).
bf16, num_heads = 2048 // headdim, batch = 16384 // seqlen (bench_fwd.py's standard rows); each
contender's first call is warm-up for a profiler that filters on kernel names (fa4: fwd_kernel).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fwd import contenders, set_overrides  # noqa: E402  (same directory)

d = int(sys.argv[1]) if len(sys.argv) > 1 else 64
causal = len(sys.argv) <= 2 or sys.argv[2] == "1"
s = int(sys.argv[3]) if len(sys.argv) > 3 else 512
b, h = max(1, 16384 // s), 2048 // d
if len(sys.argv) > 4 and sys.argv[4]:
    import fa4._capi
    set_overrides(fa4._capi.library(), **dict(kv.split("=", 1) for kv in sys.argv[4].split("&")))
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
fns = contenders(q, k, v, causal)  # (the SDPA backends and upstream run once here; failing ones are left out)
for call, ctx in fns.values():
    for _ in range(2):
        with ctx():
            call()
torch.cuda.synchronize()
print(f"profile_fwd: d{d} causal={causal} seqlen {s} batch {b} heads {h}: {', '.join(fns)}")
