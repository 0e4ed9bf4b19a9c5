#!/usr/bin/env python3
"""Two forward passes of every bench_fwd.py contender (fa4, SDPA's cuDNN and FLASH, upstream
FlashAttention-4 where installed) on one shape, for a profiler to attach to
(bench/device_run.sh FNCU=1 runs ncu over it). Made for the short causal shapes, where the
forward stays below cuDNN (bench/results/README.md): ncu's launch statistics say each
contender's grid, block, registers and shared memory per CTA (so CTAs per SM), its sections
how busy the tensor pipe is and where the warps wait.

Usage: PYTHONPATH=python FA4_LIBRARY=... python3 bench/profile_fwd.py [headdim] [causal 0|1] [seqlen] [overrides]
overrides: fa4's kernel-choice overrides for the run, e.g. "lpt=1&schedule=static" (bench_fwd.set_overrides).
bf16, num_heads = 2048 // headdim, batch = 16384 // seqlen (bench_fwd.py's standard rows); each
contender's first call is warm-up for a profiler that filters on kernel names (fa4: fwd_kernel).
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fwd import set_overrides, upstream_fa4_func  # noqa: E402  (same directory)

import fa4  # noqa: E402

d = int(sys.argv[1]) if len(sys.argv) > 1 else 64
causal = len(sys.argv) <= 2 or sys.argv[2] == "1"
s = int(sys.argv[3]) if len(sys.argv) > 3 else 512
b, h = max(1, 16384 // s), 2048 // d
if len(sys.argv) > 4 and sys.argv[4]:
    import fa4._capi
    set_overrides(fa4._capi.library(), **dict(kv.split("=", 1) for kv in sys.argv[4].split("&")))
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))

fns = {"fa4": lambda: fa4.flash_attn_func(q, k, v, causal=causal)}
for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
    def call(be=be):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    fns[name] = call
if upstream_fa4_func is not None:
    fns["upstream_fa4"] = lambda: upstream_fa4_func(q, k, v, causal=causal)
ran = []
for name, call in fns.items():
    try:
        for _ in range(2):
            call()
        ran.append(name)
    except Exception as e:  # a backend that refuses the shape is left out, said here
        print(f"# {name} failed: {str(e).splitlines()[0][:120]}", file=sys.stderr)
torch.cuda.synchronize()
print(f"profile_fwd: d{d} causal={causal} seqlen {s} batch {b} heads {h}: {', '.join(ran)}")
