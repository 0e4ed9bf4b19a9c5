"""Context parallelism: ring attention over a torch.distributed process group (torch only).

A sequence too long for one device is cut along seqlen over the ranks of a process group. Each rank
keeps its slice of q and passes its k/v slice around the ring (rank r sends to r + 1 and receives
from r - 1), so after world_size steps every query slice has met every key slice; the partial
outputs are merged by their log-sum-exp. The backward walks the same ring: k/v travel again, and the
dk/dv accumulators travel with them, so each returns to its owner after world_size steps. This is
ring attention (Liu et al., arXiv 2310.01889) with the load-balanced "zigzag" sharding for causal
masks used by ring-flash-attention and Megatron-LM's context parallelism.

Causal attention needs the zigzag layout: the sequence is cut into 2 x world_size chunks and rank r
holds chunks r and 2 x world_size - 1 - r (:func:`shard_sequence`), so every rank has the same
amount of work. Against rank s's k/v slice, rank r's queries then see:

* s == r: both own chunks, causally (one causal fa4 call on the local slices);
* s < r: the first of s's chunks fully, the second not at all (one non-causal call, half the keys);
* s > r: nothing from the first of r's chunks; the second sees both of s's chunks fully (one
  non-causal call, half the queries).

Non-causal attention works with any equal-sized shards (contiguous or zigzag).

Each block is one fa4 call (the CPU FlashAttention-4 implementation or the Hopper kernels, by the
tensors' device); blocks are merged in fp32 with the rule of ``core/softmax.h`` ``merge_weight``: a
part whose lse is -inf has weight 0, so an empty part never produces a NaN, while a NaN from the
data stays NaN. The backward runs fa4's backward on each block with the final out and lse (fa4's
backward rebuilds P from lse and takes D = rowsum(dout * out) from the final out, so block gradients
add up exactly). Transfers are ``torch.distributed`` P2P ops (``batch_isend_irecv``), started before
the step's compute and waited for after it: on NCCL they run on NCCL's streams, overlapped with
the kernels; on gloo (CPU tensors) they run beside the CPU compute.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from . import _capi, _torch_ops

__all__ = ["ring_attention", "shard_sequence", "gather_sequence"]

_FN = "fa4.context_parallel.ring_attention"


def _world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise _capi.InvalidArgumentError(
            f"{_FN}: torch.distributed is not initialized (call torch.distributed."
            "init_process_group first)")
    return dist.get_rank(group), dist.get_world_size(group)


def _chunks(world: int, rank: int, zigzag: bool) -> tuple[int, ...]:
    return (rank, 2 * world - 1 - rank) if zigzag else (rank,)


def shard_sequence(x: Tensor, group=None, *, zigzag: bool = True, dim: int = 1) -> Tensor:
    """This rank's slice of a full-sequence tensor (no communication).

    Args:
        x: the whole tensor, e.g. q/k/v (batch, seqlen, heads, headdim); the same on every rank.
        group: the process group (default: the world).
        zigzag: cut seqlen into 2 x world_size equal chunks and keep chunks rank and
            2 x world_size - 1 - rank (needed by causal ring_attention); else world_size
            contiguous chunks and keep chunk rank.
        dim: the sequence dim.

    Returns:
        A contiguous tensor, seqlen / world_size long along dim.

    Raises:
        InvalidArgumentError (ValueError) if seqlen is not a multiple of 2 x world_size (zigzag)
        or world_size.
    """
    rank, world = _world(group)
    parts = 2 * world if zigzag else world
    if x.shape[dim] % parts:
        raise _capi.InvalidArgumentError(
            f"fa4.context_parallel.shard_sequence: x.shape[{dim}] = {x.shape[dim]} must be a "
            f"multiple of {parts} ({'2 x ' if zigzag else ''}world_size {world})")
    chunks = x.chunk(parts, dim)
    return torch.cat([chunks[c] for c in _chunks(world, rank, zigzag)], dim).contiguous()


def gather_sequence(x: Tensor, group=None, *, zigzag: bool = True, dim: int = 1) -> Tensor:
    """The whole tensor from every rank's slice (all_gather; the inverse of shard_sequence).

    Args:
        x: this rank's slice (same shape on every rank), laid out as shard_sequence made it.
        group, zigzag, dim: as given to shard_sequence.

    Returns:
        The full tensor, world_size x x.shape[dim] long along dim, on every rank.
    """
    rank, world = _world(group)
    parts = 2 * world if zigzag else world
    if zigzag and x.shape[dim] % 2:
        raise _capi.InvalidArgumentError(
            f"fa4.context_parallel.gather_sequence: x.shape[{dim}] = {x.shape[dim]} must be even "
            "(two zigzag chunks per rank)")
    x = x.contiguous()
    slices = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(slices, x, group=group)
    ordered: list[Optional[Tensor]] = [None] * parts
    for r, s in enumerate(slices):
        for c, piece in zip(_chunks(world, r, zigzag), s.chunk(len(_chunks(world, r, zigzag)), dim)):
            ordered[c] = piece
    return torch.cat(ordered, dim)


# ---- the ring ------------------------------------------------------------------------------------
class _Ring:
    """This rank's neighbours in a group: sends go to rank + 1, receives come from rank - 1."""

    def __init__(self, group):
        self.group = group
        self.rank, self.world = _world(group)
        to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = to_global((self.rank + 1) % self.world)
        self.prev = to_global((self.rank - 1) % self.world)

    def start(self, tensors: Sequence[Tensor]):
        """Sends tensors to the next rank and receives the previous rank's (same shapes). Returns
        (requests, received buffers); wait() before reading the buffers or writing the tensors."""
        ops, bufs = [], []
        for t in tensors:
            buf = torch.empty_like(t)
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group))
            bufs.append(buf)
        return dist.batch_isend_irecv(ops), bufs


def _wait(reqs) -> None:
    for r in reqs:
        r.wait()


def _merge(out: Tensor, lse: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    """out/lse <- the merge of the states (out, lse) and (out_b, lse_b), in place.

    out: fp32 (batch, s, heads, dv), normalised; lse: fp32 (batch, heads, s), natural log, -inf
    for an empty state. core/softmax.h's rule: weights exp(lse_x - m) with m the larger lse, 0 for
    an lse of -inf (so two empty states stay empty: out 0, lse -inf); a NaN propagates."""
    m = torch.maximum(lse, lse_b)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse - m), torch.exp(lse_b - m)
    l = w_a + w_b
    inv = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
    ca, cb = (w_a * inv).transpose(1, 2).unsqueeze(-1), (w_b * inv).transpose(1, 2).unsqueeze(-1)
    out.mul_(ca).add_(out_b.float() * cb)
    lse.copy_(m + torch.log(l))


def _blocks(ring: _Ring, step: int, causal: bool, half: int):
    """(query rows, key rows, causal) of step's block as slices of the local q and of the k/v slice
    held at that step (from rank (rank - step) mod world); see the module docstring."""
    src = (ring.rank - step) % ring.world
    everything = slice(None)
    if not causal:
        return everything, everything, False
    if src == ring.rank:
        return everything, everything, True
    if src < ring.rank:
        return everything, slice(0, half), False
    return slice(half, None), everything, False


def _fwd_block(q, k, v, causal, o):
    return _torch_ops._fwd_impl(q, k, v, None, None, None, None, 0, 0, o["softmax_scale"], causal,
                                -1, -1, o["softcap"], o["rescale_threshold"],
                                o["exp2_emulation_fraction"], o["backend"], o["deterministic"])


def _ring_forward(q: Tensor, k: Tensor, v: Tensor, ring: _Ring, causal: bool, o: dict):
    b, s, h, _ = q.shape
    out = torch.zeros(b, s, h, v.shape[-1], dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, s), float("-inf"), dtype=torch.float32, device=q.device)
    kv = (k.contiguous(), v.contiguous())  # P2P ops send whole, dense tensors
    half = s // 2
    for step in range(ring.world):
        pending = ring.start(kv) if step + 1 < ring.world else None
        rows, keys, blk_causal = _blocks(ring, step, causal, half)
        ob, lb = _fwd_block(q[:, rows], kv[0][:, keys], kv[1][:, keys], blk_causal, o)
        _merge(out[:, rows], lse[:, :, rows], ob, lb)
        if pending is not None:
            _wait(pending[0])
            kv = tuple(pending[1])
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, ring: _Ring, causal: bool, o: dict):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    # dk/dv of the k/v slice held at each step travel with it and are back home after world steps.
    dkv = (torch.zeros(k.shape, dtype=torch.float32, device=k.device),
           torch.zeros(v.shape, dtype=torch.float32, device=v.device))
    kv = (k.contiguous(), v.contiguous())
    half = q.shape[1] // 2
    dkv_pending = None
    for step in range(ring.world):
        kv_pending = ring.start(kv) if step + 1 < ring.world else None
        rows, keys, blk_causal = _blocks(ring, step, causal, half)
        lse_rows = lse[:, :, rows].contiguous()
        gq, gk, gv, _ = _torch_ops._bwd_impl(
            dout[:, rows], q[:, rows], kv[0][:, keys], kv[1][:, keys], out[:, rows], lse_rows, None,
            None, None, None, 0, 0, o["softmax_scale"], blk_causal, -1, -1, o["softcap"],
            o["rescale_threshold"], o["exp2_emulation_fraction"], o["backend"], o["deterministic"])
        dq[:, rows] += gq.float()
        if dkv_pending is not None:  # the accumulators of this step's slice, from rank - 1
            _wait(dkv_pending[0])
            dkv = tuple(dkv_pending[1])
        dkv[0][:, keys] += gk.float()
        dkv[1][:, keys] += gv.float()
        dkv_pending = ring.start(dkv) if ring.world > 1 else None
        if kv_pending is not None:
            _wait(kv_pending[0])
            kv = tuple(kv_pending[1])
    if dkv_pending is not None:
        _wait(dkv_pending[0])
        dkv = tuple(dkv_pending[1])
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, causal, o):
        out, lse = _ring_forward(q, k, v, ring, causal, o)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.o = ring, causal, o
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.ring, ctx.causal, ctx.o)
        return dq, dk, dv, None, None, None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, group=None, causal: bool = False,
                   softmax_scale: Optional[float] = None, softcap: float = 0.0,
                   deterministic: bool = False, return_lse: bool = False,
                   rescale_threshold: Optional[float] = None,
                   exp2_emulation_fraction: Optional[float] = None, backend: str = "auto"):
    """Exact attention over a sequence sharded along seqlen across a process group (ring attention).

    Every rank calls it with its own slices; the result is this rank's slice of what
    fa4.flash_attn_func would give on the whole sequence (up to rounding). Differentiable w.r.t.
    q, k and v (the backward is collective too: every rank must run it).

    Args:
        q: this rank's queries (batch, seqlen_local, num_heads, headdim); bf16/fp16/fp32, CPU
            (gloo) or CUDA (NCCL) as the group's backend carries them.
        k, v: this rank's keys/values (batch, seqlen_local_k, num_heads_kv, headdim[_v]); GQA/MQA
            as in flash_attn_func. Every rank's k/v slice has the same shape.
        group: the process group (default: the world). Ranks are the ring's order.
        causal: causal mask over the whole sequence. Needs the zigzag layout of
            shard_sequence(zigzag=True) for q, k and v (seqlen_local_k == seqlen_local, even).
        softmax_scale: default 1/sqrt(headdim). softcap: as in flash_attn_func (0 = off).
        deterministic: bitwise-reproducible backward (fa4's deterministic block backward; the
            ring's accumulation order is fixed).
        return_lse: also return this rank's lse (batch, num_heads, seqlen_local), fp32, natural log.
        rescale_threshold, exp2_emulation_fraction, backend: as in flash_attn_func, for every
            block call (forward and backward).

    Returns:
        out (batch, seqlen_local, num_heads, headdim_v) in q's dtype, [and lse].

    Not taken (yet): local windows, sink, varlen (packed sequences).

    Raises:
        InvalidArgumentError (ValueError) for bad shapes or an uninitialised torch.distributed.
        Errors of a block call are fa4's (they name the block's tensors); a rank whose slices
        differ in shape from its neighbours' fails in torch.distributed.
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise _capi.InvalidArgumentError(
                f"{_FN}: {name} must be a 4-D torch.Tensor (batch, seqlen, heads, headdim)")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0]:
        raise _capi.InvalidArgumentError(
            f"{_FN}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: batch must agree "
            "and k, v must share (batch, seqlen, heads)")
    if causal and (q.shape[1] != k.shape[1] or q.shape[1] % 2):
        raise _capi.InvalidArgumentError(
            f"{_FN}: causal needs the zigzag layout (shard_sequence(zigzag=True)): q and k slices "
            f"of one even length, got seqlen_q {q.shape[1]}, seqlen_k {k.shape[1]}")
    ring = _Ring(group)
    o = dict(softmax_scale=None if softmax_scale is None else float(softmax_scale),
             softcap=float(softcap), deterministic=bool(deterministic), backend=backend,
             rescale_threshold=None if rescale_threshold is None else float(rescale_threshold),
             exp2_emulation_fraction=(None if exp2_emulation_fraction is None
                                      else float(exp2_emulation_fraction)))
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _RingAttention.apply(q, k, v, ring, bool(causal), o)
    else:
        out, lse = _ring_forward(q, k, v, ring, bool(causal), o)
    return (out, lse) if return_lse else out
