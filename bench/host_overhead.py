#!/usr/bin/env python3
"""Host time per fa4 call, and what it does to short kernels, next to torch SDPA's cuDNN backend.

For a kernel shorter than the host work of one call, back-to-back calls are limited by the host,
and triton's do_bench (which flushes L2 between calls) hides or exposes that cost depending on
whether the GPU is still busy with the flush: the measured time of one library jumps between two
values. This script measures (a) the host time per call at a tiny shape, for fa4's eager route
(fa4.flash_attn_func), its custom-op route (torch.ops.fa4.fwd, which torch.compile uses and every
eager call used before 0c7650c), libfa4's C entry point alone and SDPA cuDNN; (b) short d128
shapes with do_bench four times in a row and with events around 50 back-to-back calls.

Usage (on the GPU machine, repo root):
    PYTHONPATH=python FA4_LIBRARY=build-hopper/src/libfa4.so python3 bench/host_overhead.py OUT.json
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import fa4
from bench_fwd import run_meta, tflops  # same directory
from fa4 import _capi, _core, _torch_ops


def host_us(fn, n=400):
    """Mean host time per call (us) over n calls issued back to back (GPU work is negligible)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return round(us, 1)


def back_to_back_ms(fn, n=50):
    """GPU time per call (ms) with n calls in flight: the host cost shows only if it is the bound."""
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    res = []
    for _ in range(5):
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        res.append(s.elapsed_time(e) / n)
    return statistics.median(res)


def op_route(q, k, v, causal):
    return torch.ops.fa4.fwd(q, k, v, None, None, None, None, 0, 0, None, causal, -1,
                             0 if causal else -1, 0.0, None, None, "auto", False)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    args = ap.parse_args()
    meta = run_meta()
    dt = torch.bfloat16
    rows = []

    def add(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=dt) for _ in range(3))
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    out, lse = torch.empty_like(q), torch.empty(1, 16, 128, device="cuda", dtype=torch.float32)
    opts = _torch_ops._options("host", None, None, None, None, 0, 0, None, True, -1, 0, 0.0, None,
                               None, "auto", False)
    def describe_all():  # the five fa4_tensor views of one forward call, each with its own stream lookup
        return [_core.describe(x, n, "host") for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]

    ts = describe_all()
    for causal in (False, True):
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            cudnn = host_us(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
        add({"kind": "host_us", "shape": [1, 128, 16, 128], "causal": causal,
             "fa4_eager": host_us(lambda: fa4.flash_attn_func(q, k, v, causal=causal)),
             "fa4_custom_op": host_us(lambda: op_route(q, k, v, causal)),
             "cudnn": cudnn})
    add({"kind": "host_us_parts", "libfa4_fa4_forward": host_us(lambda: _capi.forward(*ts, opts.struct)),
         "describe_5_tensors_uncached_stream": host_us(describe_all)})

    for s, causal in [(512, True), (512, False), (1024, True)]:
        b = 16384 // s
        q, k, v = (torch.randn(b, s, 16, 128, device="cuda", dtype=dt) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        flops = 4 * b * 16 * s * s * 128 * (0.5 if causal else 1.0)

        def cudnn_call():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        calls = {"fa4_eager": lambda: fa4.flash_attn_func(q, k, v, causal=causal),
                 "fa4_custom_op": lambda: op_route(q, k, v, causal), "cudnn": cudnn_call}
        row = {"kind": "short_shape", "hdim": 128, "seqlen": s, "batch": b, "causal": causal}
        for name, fn in calls.items():
            row[name + "_do_bench_x4"] = [tflops(flops, triton.testing.do_bench(
                fn, warmup=25, rep=100, return_mode="median")) for _ in range(4)]
            row[name + "_back_to_back"] = tflops(flops, back_to_back_ms(fn))
        add(row)
    json.dump({"meta": meta, "rows": rows}, open(args.out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
