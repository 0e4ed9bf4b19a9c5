#!/usr/bin/env python3
"""Decode (KV-cache) calls with many query rows per KV head (chunked prefill, speculative decoding)
on one or more libfa4 builds in ONE process: kernel time per call (torch.profiler, the sum of a
call's kernels, bench/kernel_times.py), the median over --rounds rounds in bench/rounds.py's order,
for the automatic row tile and each forced one (override decode_tile: 16 narrow, 64 wide).
The measurements behind the wide tile's rule (src/hopper/decode/launch_decode.h decode_tile). A
tuning tool, not a benchmark of record: back-to-back calls, no L2 flush. Every variant's output is
compared with fp32 math SDPA on the same keys (bottom-right causal mask); its max abs error is printed.

Usage (GPU machine, repo root):
    PYTHONPATH=python:bench python3 bench/decode_tile_ab.py OUT.json new=build-dev/src/libfa4.so [old=...]
    ... --shape 1,8192,64,32,8,128,1   (batch,seqlen_k,seqlen_q,heads,heads_kv,headdim,causal; repeatable)
    ... --tiles auto,16,64,fwd,dec,cudnn,up   (auto = the library's own choice; fwd = fa4.flash_attn_func
                                        on the forward kernel (override small_q fwd), the same maths;
                                        auto-nopack / fwd-nopack: the same with override pack_gqa 0
                                        (the forward kernel's tiles one query head each);
                                        dec = the KV-cache call forced onto the decode kernel
                                        (override small_q decode); cudnn = SDPA's cuDNN backend, once,
                                        not per library; up = upstream FlashAttention-4 on the same
                                        cache, paged or not, where installed, once)
    ... --page-size 16                 (the KV-cache calls on a paged cache: the same keys in pages of
                                        16 rows, in shuffled order; seqlen_k a multiple of it)
The call is fa4.flash_attn_with_kvcache on a full cache (no cache_seqlens).
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F

import fa4
from ab_variants import load, parse, use
from kernel_times import kernel_times
from bench_decode import page_pool
from bench_fwd import sdpa_fn, upstream_fa4_kvcache_fn
from rounds import schedule
from torch.nn.attention import SDPBackend, sdpa_kernel

# (batch, seqlen_k, seqlen_q, heads, heads_kv, headdim, causal): rows per KV head 64-1024, narrow
# (tile, key block) steps per SM 8-496 on 132 SMs.
SHAPES = [
    (2, 8192, 32, 32, 8, 128, True), (1, 8192, 64, 32, 8, 128, True), (1, 16384, 64, 32, 8, 128, False),
    (1, 4096, 256, 16, 16, 128, True), (2, 16384, 128, 8, 1, 128, True), (2, 32768, 8, 64, 8, 128, False),
    (1, 8192, 64, 32, 8, 64, True), (4, 4096, 128, 32, 8, 64, True), (1, 4096, 512, 8, 8, 64, True),
    (1, 4096, 64, 32, 8, 128, True), (1, 2048, 256, 16, 16, 128, True), (1, 1024, 128, 8, 8, 64, True),
]


def reference(q, k, v, causal):
    h, hkv = q.shape[2], k.shape[2]
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    if hkv != h:
        kt, vt = kt.repeat_interleave(h // hkv, 1), vt.repeat_interleave(h // hkv, 1)
    mask = None
    if causal:  # bottom-right: query i sees keys up to i + seqlen_k - seqlen_q
        sq, sk = q.shape[1], k.shape[1]
        mask = torch.arange(sk, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + (sk - sq)
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).transpose(1, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_json")
    ap.add_argument("libs", nargs="+", help="name=path of a libfa4 build")
    ap.add_argument("--shape", action="append", default=[],
                    help="batch,seqlen_k,seqlen_q,heads,heads_kv,headdim,causal (repeatable)")
    ap.add_argument("--tiles", default="auto,16,64", help="what to time: auto, 16, 64, fwd, dec, auto-nopack, fwd-nopack, cudnn, up (see the docstring)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--page-size", type=int, default=0, help="KV-cache calls on a paged cache of this page size")
    args = ap.parse_args()
    libs = {}
    for spec in args.libs:
        name, path, _ = parse(spec)
        libs[name] = load(path)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] or SHAPES
    tiles = args.tiles.split(",")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for (b, sk, sq, h, hkv, d, causal) in shapes:
        causal = bool(causal)
        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        ref = reference(q, k, v, causal)
        kc, vc, page_table = k, v, None
        if args.page_size:  # (a full cache: no padded page tail, whose zero keys would be attended)
            assert sk % args.page_size == 0, "seqlen_k must be a multiple of --page-size"
            kc, vc, page_table = page_pool(k, v, args.page_size, gen)
        fns, errs = {}, {}
        if "cudnn" in tiles:  # SDPA: cuDNN, or FLASH (FlashAttention-2) where cuDNN lacks the mask
            for sname, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
                sfn = sdpa_fn(q, k, v, causal, be)
                if sfn:
                    def ref_fn(sfn=sfn, be=be):
                        with sdpa_kernel([be]):
                            return sfn().transpose(1, 2)
                    fns[sname] = ref_fn
                    errs[sname] = round(float((ref_fn().float() - ref).abs().max()), 5)
                    break
        up_fn = upstream_fa4_kvcache_fn(q, kc, vc, page_table=page_table, causal=causal) if "up" in tiles else None
        if "up" in tiles and up_fn is None:
            print("# up: upstream FlashAttention-4 is not installed", flush=True)
        if up_fn is not None:  # upstream FlashAttention-4, once, not per library
            try:
                errs["up"] = round(float((up_fn().float() - ref).abs().max()), 5)
                fns["up"] = up_fn
            except Exception as e:
                print(f"# up failed: {str(e).splitlines()[0][:160]}", flush=True)
        for name, lib in libs.items():
            for tile in tiles:
                if tile in ("cudnn", "up"):
                    continue
                env = {"auto": {}, "fwd": {"small_q": "fwd"}, "dec": {"small_q": "decode"},
                       "auto-nopack": {"pack_gqa": "0"}, "fwd-nopack": {"small_q": "fwd", "pack_gqa": "0"}
                       }.get(tile, {"decode_tile": tile})

                def fn(lib=lib, env=env, tile=tile):
                    use(lib, env)
                    if tile.startswith("fwd"):
                        return fa4.flash_attn_func(q, k, v, causal=causal)
                    return fa4.flash_attn_with_kvcache(q, kc, vc, page_table=page_table, causal=causal)

                key = f"{name}:{tile}"
                try:
                    errs[key] = round(float((fn().float() - ref).abs().max()), 5)
                except RuntimeError as e:  # e.g. an older build without this tile's override
                    print(f"# {key} left out: {str(e).splitlines()[0][:160]}", flush=True)
                    continue
                fns[key] = fn
        del ref
        times = {key: [] for key in fns}
        for key in schedule(fns, args.rounds):
            times[key].append(sum(kernel_times(fns[key]).values()))
        row = {"shape": {"batch": b, "seqlen_k": sk, "seqlen_q": sq, "heads": h, "heads_kv": hkv, "headdim": d,
                         "causal": causal},
               "kernel_us": {key: round(statistics.median(t), 2) for key, t in times.items()},
               "max_abs_err_vs_fp32": errs}
        rows.append(row)
        print(b, sk, sq, h, hkv, d, int(causal), " ".join(f"{k}={v}" for k, v in row["kernel_us"].items()),
              "| max err", max(errs.values()), flush=True)
    json.dump(rows, open(args.out_json, "w"), indent=1)


if __name__ == "__main__":
    main()
