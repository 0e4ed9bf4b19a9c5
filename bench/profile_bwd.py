#!/usr/bin/env python3
"""Two backward passes each of fa4, SDPA's cuDNN and (where installed) upstream FlashAttention-4 on
one shape, for a profiler to attach to (bench/device_run.sh NCU=1 runs ncu over it).

Usage: PYTHONPATH=python FA4_LIBRARY=... python3 bench/profile_bwd.py [headdim] [causal 0|1] [seqlen]
bf16, 16 heads, batch 16384 // seqlen; the forward and the first backward of each are warm-up for
a profiler that filters on the kernel names (fa4: bwd_kernel; cuDNN: *flash_bprop*).
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa4

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
causal = len(sys.argv) > 2 and sys.argv[2] == "1"
s = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
b, h = max(1, 16384 // s), 16
q, k, v = [torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]


def first(x):
    return x[0] if isinstance(x, tuple) else x


o = first(fa4.flash_attn_func(q, k, v, causal=causal))
do = torch.randn_like(o)
for _ in range(2):
    torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

qt, kt, vt = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v)]
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    dot = do.transpose(1, 2).contiguous()
    for _ in range(2):
        torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)

try:  # upstream FlashAttention-4 (CuTe DSL), shared/peers/install_upstream_fa4.sh
    from flash_attn.cute import flash_attn_func as upstream
except ImportError:
    upstream = None
if upstream is not None:
    qu, ku, vu = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    ou = first(upstream(qu, ku, vu, causal=causal))
    for _ in range(2):
        torch.autograd.grad(ou, (qu, ku, vu), do, retain_graph=True)
torch.cuda.synchronize()
print(f"profile_bwd: d{d} causal={causal} seqlen {s} batch {b}, upstream {'ran' if upstream else 'not installed'}")
