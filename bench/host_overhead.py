#!/usr/bin/env python3
"""Host time per fa4 call, and what it does to short kernels, next to torch SDPA's cuDNN backend.

For a kernel shorter than the host work of one call, back-to-back calls are limited by the host,
and triton's do_bench (which flushes L2 between calls) hides or exposes that cost depending on
whether the GPU is still busy with the flush: the measured time of one library jumps between two
values. This script measures (a) the host time per call at a tiny shape, for fa4's eager route
(fa4.flash_attn_func; also on its ctypes host path instead of the C one, fa4._fastpath), its
custom-op route (torch.ops.fa4.fwd, which torch.compile uses and every
eager call used before 0c7650c), libfa4's C entry point alone and SDPA cuDNN; (b) short d128
shapes with do_bench four times in a row and with events around 50 back-to-back calls; (c) the
serving shapes (a 128-query chunk over 1024 keys, one decode query over 1024 keys with GQA 32/8):
time per eager call back to back and per replay of the call captured in a CUDA graph (the decode
shape also through fa4.flash_attn_with_kvcache, the KV-cache route; fa4 also merging through global
scratch, with that scratch retained by fa4 and owned by the graph; fa4 on its ctypes host
path), the host's time to issue a
replay and the idle GPU time between replays, and the node types of that graph (kernels, and any
memset or graph-memory alloc/free nodes a replay also launches).

--cpu measures (a) only, on CPU tensors of shape (1, 1, 1, 8) where the CPU kernel is ~1 us: the
same Python path minus the CUDA-only steps (current stream and device lookups, the CUDA
allocator), for work on the host code without a GPU. libfa4_forward_support is libfa4's argument
checking without a kernel: libfa4_fa4_forward minus it is the CPU kernel's share.

Usage (on the GPU machine, repo root):
    PYTHONPATH=python FA4_LIBRARY=build-hopper/src/libfa4.so python3 bench/host_overhead.py OUT.json
Anywhere (a CPU-only libfa4 will do):
    PYTHONPATH=python FA4_LIBRARY=build/src/libfa4.so python3 bench/host_overhead.py --cpu OUT.json
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import statistics
import time

import torch
import torch.nn.functional as F

import fa4
from fa4 import _capi, _core, _torch_ops
from rounds import schedule  # same directory


def _sync():
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def host_us(fn, n=400, rounds=1):
    """Mean host time per call (us) over n calls issued back to back (GPU work is negligible);
    with rounds > 1, the median of that many such means."""
    for _ in range(200):  # fewer left the first shape measured in a process ~1.5x slow (H200 host)
        fn()
    _sync()
    means = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        means.append((time.perf_counter() - t) / n * 1e6)
        _sync()
    return round(statistics.median(means), 2)


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


def host_rows(device, dt, host):
    """Host time at (1, 128, 16, 128) on CUDA or (1, 1, 1, 8) on CPU: fa4's routes, libfa4 alone,
    describing the five tensors, and SDPA (cuDNN on CUDA, the default backend on CPU)."""
    shape = [1, 128, 16, 128] if device == "cuda" else [1, 1, 1, 8]
    b, s, h, d = shape
    q, k, v = (torch.randn(*shape, device=device, dtype=dt) for _ in range(3))
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    out, lse = torch.empty_like(q), torch.empty(b, h, s, device=device, dtype=torch.float32)
    opts = _torch_ops._options("host", None, None, None, None, 0, 0, None, True, -1, 0, 0.0, None,
                               None, "auto", False)

    def describe_all():  # the five fa4_tensor views of one forward call, each with its own stream lookup
        return [_core.describe(x, n, "host") for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]

    ts = describe_all()
    name_buf = ctypes.create_string_buffer(256)
    lib = _capi.library()

    def sdpa_us(causal):
        """SDPA's host time; on CUDA its cuDNN backend, the backend context entered once, outside
        the timed loop (as a caller that picks a backend would)."""
        call = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        if device != "cuda":
            return host(call)
        with cudnn_only():
            return host(call)

    rows = []
    for causal in (False, True):
        row = {"kind": "host_us", "device": device, "shape": shape, "causal": causal,
               "fa4_eager": host(lambda: fa4.flash_attn_func(q, k, v, causal=causal)),
               "fa4_custom_op": host(lambda: op_route(q, k, v, causal)),
               ("cudnn" if device == "cuda" else "sdpa"): sdpa_us(causal),
               "fa4_eager_requires_grad": host(lambda: fa4.flash_attn_func(qg, kg, vg, causal=causal)),
               "fa4_fastpath": fastpath_loaded()}
        with ctypes_path():
            row["fa4_eager_ctypes"] = host(lambda: fa4.flash_attn_func(q, k, v, causal=causal))
        rows.append(row)
    rows.append({"kind": "host_us_parts", "device": device,
                 "libfa4_fa4_forward": host(lambda: _capi.forward(*ts, opts.struct)),
                 "libfa4_forward_support": host(lambda: lib.fa4_forward_support(
                     *ts, opts.struct, name_buf, 256)),
                 "describe_5_tensors_uncached_stream": host(describe_all),
                 "call_options": host(lambda: _torch_ops._options(
                     "host", None, None, None, None, 0, 0, None, True, -1, 0, 0.0, None, None,
                     "auto", False))})
    return rows


# The serving shapes of the layers issue: (name, batch, seqlen_q, seqlen_k, heads, heads_kv, d).
SERVING_SHAPES = [("prefill_chunk", 1, 128, 1024, 8, 8, 64), ("decode", 1, 1, 1024, 32, 8, 128)]


def per_call_us(fn, n=200):
    """Wall time per call (us) of n calls issued back to back, synchronised at the end: the host
    cost or the GPU time, whichever bounds."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        res.append((time.perf_counter() - t) / n * 1e6)
    return round(statistics.median(res), 2)


def capture(fn):
    """fn captured in a CUDA graph (after an eager warm-up call), replayed once."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_times(g, n=200):
    """n replays of g back to back: (time per replay, the larger of the host's and the GPU's; the
    host's time to issue one replay), us."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        g.replay()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t2 - t0) / n * 1e6, (t1 - t0) / n * 1e6


def graph_idle_us(g, replays=50):
    """Median idle GPU time between two back-to-back replays' kernels (CUPTI): what a replay costs
    beyond its kernels where the host keeps up (launch work, and the tracking of the user objects a
    graph holds); where the host is slower than the kernels, its issue time shows here too."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            g.replay()
        torch.cuda.synchronize()
    ev = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    k = len(ev) // replays  # kernels (and memsets) per replay
    if k == 0 or len(ev) % replays:  # a record missing or extra: the replays cannot be told apart
        return None
    idle = [ev[(i + 1) * k][0] - max(x[1] for x in ev[i * k:(i + 1) * k]) for i in range(replays - 1)]
    return round(statistics.median(idle), 2)


# CUgraphNodeType (cuda.h) of the node kinds a captured attention call may hold.
_NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
               7: "event_record", 10: "mem_alloc", 11: "mem_free"}


def graph_node_census(fn):
    """{node type: count} of one call captured in a CUDA graph, read with the driver API from
    torch's cudaGraph_t: what a replay launches besides the kernels (memsets, graph-memory
    alloc/free nodes). {"error": why} where this torch does not hand out its graph."""
    try:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(g):
            fn()
        handle = ctypes.c_void_p(g.raw_cuda_graph())
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_size_t(0)
        if cuda.cuGraphGetNodes(handle, None, ctypes.byref(count)) != 0:
            raise RuntimeError("cuGraphGetNodes failed")
        nodes = (ctypes.c_void_p * max(count.value, 1))()
        if cuda.cuGraphGetNodes(handle, nodes, ctypes.byref(count)) != 0:
            raise RuntimeError("cuGraphGetNodes failed")
        census = {}
        for i in range(count.value):
            t = ctypes.c_int(-1)
            if cuda.cuGraphNodeGetType(ctypes.c_void_p(nodes[i]), ctypes.byref(t)) != 0:
                raise RuntimeError("cuGraphNodeGetType failed")
            name = _NODE_TYPES.get(t.value, str(t.value))
            census[name] = census.get(name, 0) + 1
        return census
    except Exception as e:  # a diagnostic: never fails the run
        return {"error": (str(e).splitlines() or [type(e).__name__])[0][:100]}


def graph_owned_scratch():
    """libfa4's decode merging through global scratch, its captured scratch owned by the graph
    (overrides decode_cluster = 0, capture_scratch = graph), entered once around a timing (a libfa4
    without the override raises, recorded as the contender's error)."""
    from bench_fwd import hopper_overrides  # same directory
    return hopper_overrides(decode_cluster="0", capture_scratch="graph")


def global_merge():
    """libfa4's decode with every split's partial merged through global scratch (override
    decode_cluster = 0), entered once around a timing."""
    from bench_fwd import hopper_overrides  # same directory
    return hopper_overrides(decode_cluster="0")


@contextlib.contextmanager
def ctypes_path():
    """fa4's eager calls on the ctypes path (python/fa4/_torch_ops.py) instead of the C host path
    (fa4._fastpath), entered once around a timing: that path's A/B in one process (a tree without
    the C path takes the ctypes path either way)."""
    has = hasattr(_torch_ops, "_fast")
    saved = _torch_ops._fast if has else None
    if has:
        _torch_ops._fast = None
    try:
        yield
    finally:
        if has:
            _torch_ops._fast = saved


def fastpath_loaded() -> bool:
    """True if this process's fa4 has its C host path (fa4._fastpath) beside its libfa4."""
    return hasattr(_capi, "fastpath") and _capi.fastpath() is not None


def cudnn_only():
    """torch SDPA restricted to its cuDNN backend (entered once around a timing, not per call)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.CUDNN_ATTENTION])


def serving_parts(q, k, v, fa4_call):
    """Host time (us per call, back to back, no sync inside) of the parts of fa4's eager call at a
    serving shape: the whole call, libfa4's fa4_forward on tensors described once (and with the
    decode's cluster merge off), describing the five tensors, allocating out and lse."""
    b, sq, h, _ = q.shape
    out, lse = torch.empty_like(q), torch.empty(b, h, sq, device="cuda", dtype=torch.float32)
    opts = _torch_ops._options("host", None, None, None, None, 0, 0, None, True, -1, 0, 0.0, None,
                               None, "auto", False)
    named = ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))
    ts = [_core.describe(x, n, "host") for x, n in named]
    host = lambda fn: host_us(fn, n=400, rounds=5)
    parts = {"fa4_host_us": host(fa4_call),
             "fa4_part_libfa4_us": host(lambda: _capi.forward(*ts, opts.struct))}
    try:
        with global_merge():
            parts["fa4_part_libfa4_global_merge_us"] = host(lambda: _capi.forward(*ts, opts.struct))
    except RuntimeError as e:  # a libfa4 without the override
        parts["fa4_part_libfa4_global_merge_error"] = str(e).splitlines()[0][:120]
    parts["fa4_part_describe_5_us"] = host(lambda: [_core.describe(x, n, "host") for x, n in named])
    parts["fa4_part_outputs_us"] = host(lambda: (torch.empty_like(q), q.new_empty((b, h, sq), dtype=torch.float32)))
    return parts


def serving_rows(add, rounds=7):
    """Eager calls and graph replays at the serving shapes, fa4 (causal, bottom-right) next to SDPA
    cuDNN. SDPA's is_causal is top-left: with 128 queries over 1024 keys it would let query i see
    keys 0..i (1-128 keys) where fa4's bottom-right mask shows 897-1024, so cuDNN runs unmasked,
    the closer amount of work (and with one query the two masks are the same: none)."""
    for name, b, sq, sk, h, hkv, d in SERVING_SHAPES:
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        fa4_call = lambda: fa4.flash_attn_func(q, k, v, causal=True)
        cudnn_call = lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=h != hkv)
        row = {"kind": "serving", "shape": name, "batch": b, "seqlen_q": sq, "seqlen_k": sk,
               "num_heads": h, "num_heads_kv": hkv, "headdim": d, "fa4_fastpath": fastpath_loaded()}
        contenders = [("fa4", fa4_call, contextlib.nullcontext), ("cudnn", cudnn_call, cudnn_only),
                      # the same call with the decode's cluster merge off (every split through global
                      # scratch): the A/B of that merge, in this process
                      ("fa4_global_merge", fa4_call, global_merge),
                      # and with its captured scratch owned by the graph (a CUDA user object) instead
                      # of retained by fa4: what the graph's user objects cost a replay (against
                      # fa4_global_merge: the same kernel, which keeps its scratch where the
                      # automatic choice merges in a cluster and needs none)
                      ("fa4_global_merge_graph_owned", fa4_call, graph_owned_scratch),
                      # the same call on the ctypes host path (no fa4._fastpath)
                      ("fa4_ctypes", fa4_call, ctypes_path)]
        if hasattr(fa4, "flash_attn_with_kvcache"):  # the KV-cache route (decode kernel), same mask
            lens = torch.full((b,), sk, device="cuda", dtype=torch.int32)
            contenders.append(("fa4_kvcache", lambda: fa4.flash_attn_with_kvcache(
                q, k, v, cache_seqlens=lens, causal=True), contextlib.nullcontext))
        row.update(serving_parts(q, k, v, fa4_call))
        graphs = {}
        for lib, fn, ctx in contenders:
            try:
                with ctx():  # (an override acts when the call is captured)
                    row[lib + "_eager_us"] = per_call_us(fn)
                    row[lib + "_kernels_us"] = kernels_us(fn)
                    row[lib + "_graph_nodes"] = graph_node_census(fn)
                    graphs[lib] = capture(fn)
            except RuntimeError as e:  # a backend that refuses the shape or the capture
                row[lib + "_error"] = str(e).splitlines()[0][:120]
        # The graphs' replays in interleaved rounds (bench/rounds.py's order): the host's speed
        # drifts within a run, and a lone timing per contender would carry that into the ratios.
        names = list(graphs)
        if not names:
            add(row)
            continue
        wall = {n: [] for n in names}
        issue = {n: [] for n in names}
        for n in schedule(names, rounds):
            w, i = replay_times(graphs[n])
            wall[n].append(w)
            issue[n].append(i)
        for n in names:
            row[n + "_graph_us"] = round(statistics.median(wall[n]), 2)
            row[n + "_graph_issue_us"] = round(statistics.median(issue[n]), 2)
            row[n + "_graph_idle_us"] = graph_idle_us(graphs[n])
        add(row)


def kernels_us(fn):
    """GPU time per call (us) summed over the call's kernels (bench/kernel_times.py: CUPTI records
    through torch.profiler): the floor a graph replay approaches, without launch gaps."""
    from kernel_times import kernel_times  # same directory
    return round(sum(kernel_times(fn).values()), 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--cpu", action="store_true",
                    help="host time of the call path on CPU tensors only (no GPU needed)")
    args = ap.parse_args()
    rows = []

    def add(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    if args.cpu:
        torch.set_num_threads(1)
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "device": "cpu", "torch": torch.__version__, "fa4": fa4.version()}
        for row in host_rows("cpu", torch.float32,
                             lambda fn: host_us(fn, n=20000, rounds=5)):
            add(row)
        json.dump({"meta": meta, "rows": rows}, open(args.out_json, "w"), indent=1)
        return

    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench_fwd import run_meta, tflops  # same directory

    meta = run_meta()
    dt = torch.bfloat16
    for row in host_rows("cuda", dt, lambda fn: host_us(fn, n=400, rounds=5)):
        add(row)
    serving_rows(add)

    for s, causal in [(512, True), (512, False), (1024, True)]:
        b = 16384 // s
        q, k, v = (torch.randn(b, s, 16, 128, device="cuda", dtype=dt) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        flops = 4 * b * 16 * s * s * 128 * (0.5 if causal else 1.0)

        # (call, context entered once around its timing: SDPA's backend choice costs ~8 us of
        # host time per enter/exit, which must not be charged to each of cuDNN's calls)
        calls = {"fa4_eager": (lambda: fa4.flash_attn_func(q, k, v, causal=causal), contextlib.nullcontext),
                 "fa4_custom_op": (lambda: op_route(q, k, v, causal), contextlib.nullcontext),
                 "cudnn": (lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal),
                           lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION]))}
        row = {"kind": "short_shape", "hdim": 128, "seqlen": s, "batch": b, "causal": causal}
        for name, (fn, ctx) in calls.items():
            with ctx():
                row[name + "_do_bench_x4"] = [tflops(flops, triton.testing.do_bench(
                    fn, warmup=25, rep=100, return_mode="median")) for _ in range(4)]
                row[name + "_back_to_back"] = tflops(flops, back_to_back_ms(fn))
        add(row)
    json.dump({"meta": meta, "rows": rows}, open(args.out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
