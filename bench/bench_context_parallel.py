#!/usr/bin/env python3
"""Context-parallel scaling: fa4.context_parallel.ring_attention on W ranks (one process per GPU,
NCCL; or CPU processes on gloo with --cpu, for a smoke run), causal zigzag, Llama-3-8B heads
(32 q / 8 kv, d128, bf16), batch 1, total sequence 32k..512k.

Per total length: median time per call of the ring, forward and forward + backward; for the
forward also the same ring with no transfer (compute: blocks and merges on the rank's own k/v)
and the transfers alone (W - 1 k/v exchanges; comm); hidden = (compute + comm - ring) / comm,
the fraction of the transfer time the forward overlaps; per-GPU TFLOP/s (causal FLOPs of the
whole sequence / W / time, forward 4 * S^2 * h * d / 2, backward 2.5x) of the ring and of the
no-transfer ring (what one GPU does with its share). Rank 0 writes OUT.json.

Usage (on the GPU machine):
    PYTHONPATH=python FA4_LIBRARY=build-dev/src/libfa4.so torchrun --nproc_per_node=8 \\
        bench/bench_context_parallel.py OUT.json [--seqlens 32768,131072,524288]
    ... torchrun --nproc_per_node=2 bench/bench_context_parallel.py OUT.json --cpu --seqlens 512
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import fa4
from fa4 import context_parallel as cp

H, HKV, D = 32, 8, 128


class _NoTransfer:
    """A ring that moves nothing: start() hands back the tensors it was given, so the ring's
    compute (blocks and merges) runs on the rank's own k/v with the same shapes."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def start(self, tensors):
        return [], list(tensors)

    def wait(self, transfer):
        return tuple(transfer[1])

    def complete_in_flight(self):
        pass


def timer(fn, reps, cuda):
    times = []
    for _ in range(reps):
        dist.barrier()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("--seqlens", default="32768,65536,131072,262144,524288")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu", action="store_true", help="gloo on CPU tensors (smoke run)")
    args = ap.parse_args()
    cuda = not args.cpu
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dtype = torch.bfloat16
    rows = []
    for s in (int(x) for x in args.seqlens.split(",")):
        local = s // world
        g = torch.Generator(device=dev).manual_seed(rank)
        q = torch.randn(1, local, H, D, device=dev, dtype=dtype, generator=g).requires_grad_()
        k = torch.randn(1, local, HKV, D, device=dev, dtype=dtype, generator=g).requires_grad_()
        v = torch.randn(1, local, HKV, D, device=dev, dtype=dtype, generator=g).requires_grad_()
        dout = torch.randn_like(q)

        def ring_fwd():
            with torch.no_grad():
                cp.ring_attention(q, k, v, causal=True)

        def ring_fwd_bwd():
            out = cp.ring_attention(q, k, v, causal=True)
            torch.autograd.grad(out, (q, k, v), dout)

        plan = cp._Plan(q, True, None, None)
        opts = dict(softmax_scale=None, softcap=0.0, deterministic=False, backend="auto",
                    rescale_threshold=None, exp2_emulation_fraction=None)

        def compute_fwd():  # the ring forward, merges included, with no transfer (own k/v kept)
            with torch.no_grad():
                cp._ring_forward(q, k, v, None, _NoTransfer(rank, world), plan, opts)

        def comm():
            ring = cp._Ring(None)
            kv = (k.detach(), v.detach())
            for _ in range(world - 1):
                kv = ring.wait(ring.start(kv))

        r = {"world": world, "seqlen": s, "seqlen_local": local}
        for name, fn in (("ring_fwd", ring_fwd), ("ring_fwd_bwd", ring_fwd_bwd),
                         ("compute_fwd", compute_fwd), ("comm", comm)):
            fn()  # warm-up
            r[name + "_ms"] = round(timer(fn, args.reps, cuda) * 1e3, 3)
        flops = 4 * s * s * H * D / 2 / world  # causal forward, one rank's share
        r["tflops_per_gpu_fwd"] = round(flops / (r["ring_fwd_ms"] / 1e3) / 1e12, 1)
        r["tflops_per_gpu_fwd_bwd"] = round(3.5 * flops / (r["ring_fwd_bwd_ms"] / 1e3) / 1e12, 1)
        r["tflops_no_transfer_fwd"] = round(flops / (r["compute_fwd_ms"] / 1e3) / 1e12, 1)
        r["hidden_fraction_fwd"] = (round((r["compute_fwd_ms"] + r["comm_ms"] - r["ring_fwd_ms"])
                                          / r["comm_ms"], 3) if r["comm_ms"] > 0 else None)
        rows.append(r)
        if rank == 0:
            print(json.dumps(r), flush=True)
    if rank == 0:
        meta = {"torch": torch.__version__, "fa4": fa4.version(), "backend": "nccl" if cuda else "gloo",
                "device": torch.cuda.get_device_name(dev) if cuda else "cpu"}
        with open(args.out_json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
