#!/usr/bin/env python3
"""Two backward passes of every bench_bwd.py contender (fa4, SDPA's cuDNN and FLASH, upstream
FlashAttention-4 where installed) on one shape, for a profiler to attach to
(bench/device_run.sh NCU=1 runs ncu over it).

Usage: PYTHONPATH=python FA4_LIBRARY=... python3 bench/profile_bwd.py [headdim] [causal 0|1] [seqlen] [overrides]
overrides: fa4's kernel-choice overrides for the run, e.g. "lpt=1&bwd_walk=desc" (bench_fwd.set_overrides).
bf16, 16 heads, batch 16384 // seqlen; each contender's forward (run once when its call is made)
and first backward are warm-up for a profiler that filters on the kernel names (fa4: bwd_kernel;
cuDNN: *flash_bprop*).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_bwd import contenders  # noqa: E402  (same directory)
from bench_fwd import set_overrides  # noqa: E402

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
causal = len(sys.argv) > 2 and sys.argv[2] == "1"
s = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
b, h = max(1, 16384 // s), 16
if len(sys.argv) > 4 and sys.argv[4]:
    import fa4._capi
    set_overrides(fa4._capi.library(), **dict(kv.split("=", 1) for kv in sys.argv[4].split("&")))
q, k, v = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
fns = contenders(q, k, v, causal)
for name, call in fns.items():
    for _ in range(2):
        call()
torch.cuda.synchronize()
print(f"profile_bwd: d{d} causal={causal} seqlen {s} batch {b}: {', '.join(fns)}")
