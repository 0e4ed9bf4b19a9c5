#!/usr/bin/env python3
"""Where the host time of one eager fa4 call goes: the CUDA runtime and driver calls it makes (from
torch.profiler's CUPTI records, which see every library of the process, libfa4 included) and the
host time of the call's parts, at the serving shapes of bench/host_overhead.py and the (1, 128,
16, 128) shape of its host rows, causal and not.

Per shape and mask: us per call of the whole eager call (fa4.flash_attn_func), of allocating out
and lse, of the C host path with the outputs given (fa4._fastpath: describe + libfa4), of libfa4's
fa4_forward alone on tensors described once (ctypes) and of its fa4_forward_support (the checks and
the kernel choice, no launch); and the runtime / driver calls of one call: [calls per fa4 call,
us per fa4 call summed over them] by name (under the profiler, whose records slow every call: the
counts are exact, the times relative). The decode shape also through fa4.flash_attn_with_kvcache
(causal only: one query sees every key either way). A diagnostic, not a benchmark of record.

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench FA4_LIBRARY=build-dev/src/libfa4.so python3 bench/host_trace.py OUT.json
"""
import ctypes
import json
import re
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import fa4
from fa4 import _capi, _core, _torch_ops
from host_overhead import host_us

# (name, batch, seqlen_q, seqlen_k, heads, heads_kv, d)
SHAPES = [("prefill_chunk", 1, 128, 1024, 8, 8, 64), ("decode", 1, 1, 1024, 32, 8, 128),
          ("host_rows", 1, 128, 128, 16, 16, 128)]
CALLS = 50
_API = re.compile(r"^cu[A-Z]|^cuda[A-Z]")


def api_calls(fn):
    """{runtime / driver call name: [calls per fn call, us per fn call]} over CALLS calls."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and _API.match(e.name):
            per[e.name][0] += 1
            per[e.name][1] += e.cpu_time_total
    # the trailing synchronize is not the calls'
    per.pop("cudaDeviceSynchronize", None)
    return {k: [round(c / CALLS, 2), round(t / CALLS, 2)] for k, (c, t) in sorted(per.items())}


def parts(q, k, v, causal):
    b, sq, h, _ = q.shape
    out, lse = torch.empty(*q.shape[:3], v.shape[-1], device="cuda", dtype=q.dtype), \
        torch.empty(b, h, sq, device="cuda", dtype=torch.float32)
    opts = _torch_ops._options("host", None, None, None, None, 0, 0, None, causal, -1, 0 if causal else -1,
                               0.0, None, None, "auto", False, {})
    ts = [_core.describe(x, n, "host") for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    name_buf = ctypes.create_string_buffer(256)
    lib = _capi.library()
    host = lambda fn: host_us(fn, n=400, rounds=5)
    _capi.check(lib.fa4_forward_support(*ts, opts.struct, name_buf, 256))  # (a refused shape raises)
    return {
        "eager_us": host(lambda: fa4.flash_attn_func(q, k, v, causal=causal)),
        "outputs_us": host(lambda: _torch_ops._fwd_outputs(q, v, False, False)),
        "run_fwd_us": host(lambda: _torch_ops._run_fwd("host", q, k, v, out, lse, opts, {})),
        "libfa4_forward_us": host(lambda: _capi.forward(*ts, opts.struct)),
        "libfa4_forward_support_us": host(lambda: lib.fa4_forward_support(*ts, opts.struct, name_buf, 256)),
        "kernel": name_buf.value.decode(),
        "api_calls_eager": api_calls(lambda: fa4.flash_attn_func(q, k, v, causal=causal)),
        "api_calls_libfa4": api_calls(lambda: _capi.forward(*ts, opts.struct)),
    }


def main():
    rows = []
    for name, b, sq, sk, h, hkv, d in SHAPES:
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for causal in (True, False):
            row = {"shape": name, "batch": b, "seqlen_q": sq, "seqlen_k": sk, "num_heads": h,
                   "num_heads_kv": hkv, "headdim": d, "causal": causal}
            row.update(parts(q, k, v, causal))
            rows.append(row)
            print(json.dumps(row), flush=True)
        if sq == 1:  # the KV-cache route of the decode shape
            lens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
            call = lambda: fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)
            row = {"shape": name + "_kvcache", "eager_us": host_us(call, n=400, rounds=5),
                   "api_calls_eager": api_calls(call)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    json.dump({"meta": {"fa4": fa4.version(), "gpu": torch.cuda.get_device_name()}, "rows": rows},
              open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
