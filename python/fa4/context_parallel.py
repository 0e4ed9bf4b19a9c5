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

Packed sequences (flash-attn's varlen layout, ``cu_seqlens``) are cut per sequence, each the same
way, so every rank holds 1 / world_size of every sequence; the first half of each sequence's keys
is taken with ``seqused_k`` and its second-half queries by an index (host-computed from
``cu_seqlens``, which therefore lives on the CPU).

Each block is one fa4 call (the CPU FlashAttention-4 implementation or the Hopper kernels, by the
tensors' device); blocks are merged in fp32 with the rule of ``core/softmax.h`` ``merge_weight``: a
part whose lse is -inf has weight 0, so an empty part never produces a NaN, while a NaN from the
data stays NaN. The backward runs fa4's backward on each block with the final out and lse (fa4's
backward rebuilds P from lse and takes D = rowsum(dout * out) from the final out, so block gradients
add up exactly). Transfers are ``torch.distributed`` P2P ops (``batch_isend_irecv``), started before
the step's compute and waited for after it: on gloo (CPU tensors) they run beside the CPU compute;
on NCCL they are meant to run on NCCL's streams, overlapped with the kernels. The NCCL path is not
tested on more than one GPU (the tests run gloo, in 2 and 4 CPU processes).

Not checked (it would cost a collective per call): that every rank passes slices of one shape and
the same options, and that causal inputs really are zigzag slices. A shape mismatch may abort one
rank in gloo while another computes on a partly received slice, or hang NCCL; slices of one byte
size but another shape or dtype give wrong results unnoticed, as do non-zigzag slices with
causal=True. An error that every rank
raises (fa4 refusing an option in a block call) leaves the group usable: the transfers already
started are completed before it propagates.
"""

from __future__ import annotations

import operator
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from . import _capi, _core, _torch_ops

__all__ = ["ring_attention", "shard_sequence", "gather_sequence"]

_FN = "fa4.context_parallel.ring_attention"


def _world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise _capi.InvalidArgumentError(
            f"{_FN}: torch.distributed is not initialized (call torch.distributed."
            "init_process_group first)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise _capi.InvalidArgumentError(f"{_FN}: this process is not a member of the given group")
    return rank, dist.get_world_size(group)


def _chunks(world: int, rank: int, zigzag: bool) -> tuple[int, ...]:
    return (rank, 2 * world - 1 - rank) if zigzag else (rank,)


def _integer(c) -> Optional[int]:
    """c as an int if it is one (int, NumPy integer, integer 0-D CPU tensor), else None; a bool is
    not (True would be read as a length of 1), nor a tensor on a GPU (reading it would wait for
    the device)."""
    if isinstance(c, bool) or (isinstance(c, Tensor) and (c.device.type != "cpu" or c.dtype == torch.bool)):
        return None
    try:
        return operator.index(c)
    except TypeError:
        return None


def _host_cu(cu_seqlens, fn: str) -> Tensor:
    """cu_seqlens as an int64 CPU tensor, checked: integers, 1-D, from 0, non-decreasing."""
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.device.type != "cpu":
            raise _capi.InvalidArgumentError(
                f"{fn}: cu_seqlens must be on the CPU (or a list): the sequence boundaries decide "
                "the slices on the host, without a device sync")
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or (
                cu_seqlens.dtype == torch.bool):
            # Converting would truncate 7.5 to 7: a different layout than the one given.
            raise _capi.InvalidArgumentError(
                f"{fn}: cu_seqlens must hold integers, got a {cu_seqlens.dtype} tensor")
        cu = cu_seqlens.to(torch.int64)
    else:
        try:
            values = list(cu_seqlens)
        except TypeError:
            raise _capi.InvalidArgumentError(
                f"{fn}: cu_seqlens must be a 1-D integer tensor or a sequence of ints, got "
                f"{type(cu_seqlens).__name__} {cu_seqlens!r}") from None
        ints = [_integer(c) for c in values]
        if None in ints:
            raise _capi.InvalidArgumentError(f"{fn}: cu_seqlens must hold integers, got {values!r}")
        cu = torch.tensor(ints, dtype=torch.int64)
    if cu.dim() != 1 or cu.numel() < 1 or int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
        raise _capi.InvalidArgumentError(
            f"{fn}: cu_seqlens must be 1-D, start at 0 and not decrease; got {cu.tolist()}")
    return cu


def _layout(x: Tensor, cu_seqlens, dim: Optional[int], fn: str):
    """(cu_seqlens checked as a CPU tensor or None, the sequence dim: 1 batched, 0 packed unless
    given); cu_seqlens[-1] must be x's length along that dim."""
    if not isinstance(x, Tensor):
        raise _capi.InvalidArgumentError(f"{fn}: x must be a torch.Tensor, got {type(x).__name__}")
    cu = _host_cu(cu_seqlens, fn) if cu_seqlens is not None else None
    given = (0 if cu is not None else 1) if dim is None else dim
    # A bool is an int to Python (dim=True would mean 1); a float or an out-of-range dim would
    # fail later with torch's message, which does not name the argument.
    dim = _integer(given)
    if dim is None or not -x.dim() <= dim < x.dim():
        raise _capi.InvalidArgumentError(
            f"{fn}: dim = {given!r} must be an int in [{-x.dim()}, {x.dim()}) (x is {x.dim()}-D)")
    if cu is not None and int(cu[-1]) != x.shape[dim]:
        raise _capi.InvalidArgumentError(
            f"{fn}: cu_seqlens[-1] = {int(cu[-1])} must equal x.shape[{dim}] = {x.shape[dim]}")
    return cu, dim


def _seq_pieces(x: Tensor, dim: int, cu: Optional[Tensor]) -> list[Tensor]:
    """x split into its sequences along dim (one piece without cu_seqlens)."""
    if cu is None:
        return [x]
    return list(x.split((cu[1:] - cu[:-1]).tolist(), dim))


def shard_sequence(x: Tensor, group=None, *, zigzag: bool = True, dim: Optional[int] = None,
                   cu_seqlens=None) -> Tensor:
    """This rank's slice of a full-sequence tensor (no communication).

    Args:
        x: the whole tensor, the same on every rank: batched, e.g. q/k/v (batch, seqlen, heads,
            headdim) with dim 1; or packed sequences (total, heads, headdim) with cu_seqlens and
            dim 0, each sequence cut on its own.
        group: the process group (default: the world).
        zigzag: cut each sequence into 2 x world_size equal chunks and keep chunks rank and
            2 x world_size - 1 - rank (needed by causal ring_attention); else world_size
            contiguous chunks and keep chunk rank.
        dim: the sequence dim (default 1, or 0 with cu_seqlens).
        cu_seqlens: packed layout: the whole sequences' cumulative lengths (CPU int tensor or a
            list, [0, ..., total]); the slice's are cu_seqlens // world_size.

    Returns:
        A contiguous tensor: each sequence 1 / world_size as long along dim.

    Raises:
        InvalidArgumentError (ValueError) if a sequence length is not a multiple of
        2 x world_size (zigzag) or world_size, or cu_seqlens is malformed.
    """
    fn = "fa4.context_parallel.shard_sequence"
    zigzag = _core._bool(zigzag, "zigzag", fn)
    cu, dim = _layout(x, cu_seqlens, dim, fn)
    rank, world = _world(group)
    parts = 2 * world if zigzag else world
    out = []
    for piece in _seq_pieces(x, dim, cu):
        if piece.shape[dim] % parts:
            raise _capi.InvalidArgumentError(
                f"{fn}: a sequence of length {piece.shape[dim]} (x.shape[{dim}] or a cu_seqlens "
                f"length) must be a multiple of {parts} ({'2 x ' if zigzag else ''}world_size {world})")
        chunks = piece.split(piece.shape[dim] // parts, dim) if piece.shape[dim] else [piece] * parts
        out += [chunks[c] for c in _chunks(world, rank, zigzag)]
    return torch.cat(out, dim).contiguous() if out else x.narrow(dim, 0, 0).contiguous()


def gather_sequence(x: Tensor, group=None, *, zigzag: bool = True, dim: Optional[int] = None,
                    cu_seqlens=None) -> Tensor:
    """The whole tensor from every rank's slice (all_gather; the inverse of shard_sequence).

    Args:
        x: this rank's slice (same shape on every rank), laid out as shard_sequence made it.
        group, zigzag, dim: as given to shard_sequence.
        cu_seqlens: packed layout: the SLICE's cumulative lengths (the whole ones // world_size).

    Returns:
        The full tensor, world_size times as long along dim, on every rank. Not differentiable
        (torch.distributed.all_gather): gather results for evaluation or checking, and take
        gradients through ring_attention's per-rank output.
    """
    fn = "fa4.context_parallel.gather_sequence"
    zigzag = _core._bool(zigzag, "zigzag", fn)
    cu, dim = _layout(x, cu_seqlens, dim, fn)
    rank, world = _world(group)
    per_rank = len(_chunks(world, rank, zigzag))
    for piece in _seq_pieces(x, dim, cu):
        if piece.shape[dim] % per_rank:
            raise _capi.InvalidArgumentError(
                f"{fn}: a slice of length {piece.shape[dim]} must be even (two zigzag chunks per rank)")
    x = x.contiguous()
    slices = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(slices, x, group=group)
    by_rank = [_seq_pieces(sl, dim, cu) for sl in slices]
    out = []
    for i in range(len(by_rank[0])):
        ordered: list[Optional[Tensor]] = [None] * (per_rank * world)
        for r in range(world):
            piece = by_rank[r][i]
            n = piece.shape[dim] // per_rank
            for c, chunk in zip(_chunks(world, r, zigzag), piece.split(n, dim) if n else [piece] * per_rank):
                ordered[c] = chunk
        out += ordered
    return torch.cat(out, dim) if out else x.narrow(dim, 0, 0).contiguous()


# ---- the ring ------------------------------------------------------------------------------------
class _Ring:
    """This rank's neighbours in a group: sends go to rank + 1, receives come from rank - 1."""

    def __init__(self, group):
        self.group = group
        self.rank, self.world = _world(group)
        to_global = (lambda r: dist.get_global_rank(group, r)) if group is not None else (lambda r: r)
        self.next = to_global((self.rank + 1) % self.world)
        self.prev = to_global((self.rank - 1) % self.world)
        self._in_flight: list = []  # transfers started and not waited for

    def start(self, tensors: Sequence[Tensor]):
        """Sends tensors to the next rank and receives the previous rank's (same shapes). Returns
        the transfer; wait() for it before reading its buffers or writing the tensors."""
        ops, bufs = [], []
        for t in tensors:
            buf = torch.empty_like(t)
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group))
            bufs.append(buf)
        transfer = (dist.batch_isend_irecv(ops), bufs)
        self._in_flight.append(transfer)
        return transfer

    def wait(self, transfer) -> tuple:
        """Waits for a transfer; returns its received buffers."""
        self._in_flight = [t for t in self._in_flight if t is not transfer]
        try:
            for r in transfer[0]:
                r.wait()
        except Exception:
            # The communication itself failed: waiting for the other transfers could only add a
            # timeout each.
            self._in_flight = []
            raise
        return tuple(transfer[1])

    def complete_in_flight(self) -> None:
        """After an error in a step's compute (fa4 refusing an option, say): waits for the
        transfers still in flight before the error propagates. Every rank started them before
        its compute, so they complete; abandoned, they stay half-done on the connections and the
        next call on this group hangs (gloo: a send timeout)."""
        in_flight, self._in_flight = self._in_flight, []
        for reqs, _ in in_flight:
            for r in reqs:
                r.wait()


def _merge(out: Tensor, lse: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    """out/lse <- the merge of the states (out, lse) and (out_b, lse_b), in place.

    out: fp32 (batch, s, heads, dv) or (total, heads, dv), normalised; lse: fp32 (batch, heads, s)
    or (heads, total), natural log, -inf
    for an empty state. core/softmax.h's rule: weights exp(lse_x - m) with m the larger lse, 0 for
    an lse of -inf (so two empty states stay empty: out 0, lse -inf); a NaN propagates."""
    m = torch.maximum(lse, lse_b)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse - m), torch.exp(lse_b - m)
    l = w_a + w_b
    inv = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
    # lse (b, h, s) or varlen (h, total) -> out's (b, s, h, 1) or (total, h, 1)
    ca, cb = (w_a * inv).transpose(-1, -2).unsqueeze(-1), (w_b * inv).transpose(-1, -2).unsqueeze(-1)
    out.mul_(ca).add_(out_b.float() * cb)
    lse.copy_(m + torch.log(l))


class _Rows:
    """The rows of q-like tensors (q, out, dout, dq; sequence dim `dim`) and the matching lse
    columns (dim `lse_dim`) that one block takes: all (index None), a slice (views), or an index
    tensor (copies; merged and added back by index)."""

    def __init__(self, index, dim: int, lse_dim: int):
        self.index, self.dim, self.lse_dim = index, dim, lse_dim

    def _take(self, x: Tensor, dim: int) -> Tensor:
        if self.index is None:
            return x
        if isinstance(self.index, slice):
            return x[(slice(None),) * dim + (self.index,)]
        return x.index_select(dim, self.index)

    def take(self, x: Tensor) -> Tensor:
        return self._take(x, self.dim)

    def take_lse(self, lse: Tensor) -> Tensor:
        return self._take(lse, self.lse_dim)

    def merge(self, out: Tensor, lse: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
        if self.index is None or isinstance(self.index, slice):
            _merge(self.take(out), self.take_lse(lse), out_b, lse_b)  # views: merged in place
            return
        o, l = self.take(out), self.take_lse(lse)
        _merge(o, l, out_b, lse_b)
        out.index_copy_(self.dim, self.index, o)
        lse.index_copy_(self.lse_dim, self.index, l)

    def add(self, acc: Tensor, g: Tensor) -> None:
        if self.index is None or isinstance(self.index, slice):
            self.take(acc).add_(g.float())
        else:
            acc.index_add_(self.dim, self.index, g.float())


class _Plan:
    """What each ring step computes, for the batched (b, s, h, d) or varlen (total, h, d) layout;
    see the module docstring for the three causal cases."""

    def __init__(self, q: Tensor, causal: bool, cu_seqlens, max_seqlen):
        self.causal, self.varlen = causal, cu_seqlens is not None
        self.all = _Rows(None, 0 if self.varlen else 1, 1 if self.varlen else 2)
        if not self.varlen:
            half = q.shape[1] // 2
            self.second_half = _Rows(slice(half, None), 1, 2)
            self.first_keys = slice(0, half)
            return
        # Varlen: each sequence's local slice is its two zigzag chunks; the first half of a
        # sequence's keys is expressed by seqused_k (no copy), its second-half queries by an index.
        lens = cu_seqlens[1:] - cu_seqlens[:-1]
        self.cu = cu_seqlens.to(device=q.device, dtype=torch.int32, non_blocking=True)
        self.max = int(max_seqlen)
        if not causal:
            return
        self.used_half = (lens // 2).to(device=q.device, dtype=torch.int32, non_blocking=True)
        self.cu_half = (cu_seqlens // 2).to(device=q.device, dtype=torch.int32, non_blocking=True)
        rows = torch.cat([torch.arange(int(c) + int(n) // 2, int(c) + int(n))
                          for c, n in zip(cu_seqlens[:-1], lens)]) if len(lens) else torch.zeros(0)
        self.second_half = _Rows(rows.to(device=q.device, dtype=torch.long, non_blocking=True), 0, 1)

    def step(self, src: int, rank: int):
        """(rows, key slice of the batched layout or None, fa4 varlen/mask arguments) of the block
        against the k/v slice of rank src."""
        if not self.varlen:
            args = dict(cu_q=None, cu_k=None, used_k=None, max_q=0, max_k=0)
            if not self.causal:
                return self.all, None, dict(args, causal=False)
            if src == rank:
                return self.all, None, dict(args, causal=True)
            if src < rank:
                return self.all, self.first_keys, dict(args, causal=False)
            return self.second_half, None, dict(args, causal=False)
        args = dict(cu_q=self.cu, cu_k=self.cu, used_k=None, max_q=self.max, max_k=self.max)
        if not self.causal:
            return self.all, None, dict(args, causal=False)
        if src == rank:
            return self.all, None, dict(args, causal=True)
        if src < rank:
            return self.all, None, dict(args, used_k=self.used_half, causal=False)
        return self.second_half, None, dict(args, cu_q=self.cu_half, max_q=self.max // 2, causal=False)


def _add_sink(out: Tensor, lse: Tensor, sink: Tensor) -> None:
    """The sink logit joins each row's denominator once, after the merge of every block (as
    core/softmax.h finalize_row does): lse' = log(exp(lse) + exp(sink_h)), out' = out exp(lse - lse').
    In place on fp32 out/lse (either layout: the head dim is lse's second to last)."""
    sk = sink.float().view(-1, 1)
    new = torch.logaddexp(lse, sk)
    scale = torch.where(new == float("-inf"), torch.zeros_like(new), torch.exp(lse - new))
    out.mul_(scale.transpose(-1, -2).unsqueeze(-1))
    lse.copy_(new)


def _dsink(dout: Tensor, out: Tensor, lse: Tensor, sink: Tensor) -> Tensor:
    """This rank's share of d loss / d sink: -sum over its rows of exp(sink_h - lse) * D, with
    D = rowsum(dout * out) (the sink's own dP is 0: it carries no value)."""
    d = (dout.float() * out.float()).sum(-1)  # (b, s, h) or (total, h)
    p = torch.exp(sink.float().view(-1, 1) - lse).transpose(-1, -2)
    return -(p * d).reshape(-1, d.shape[-1]).sum(0)


def _fa4_args(a: dict, o: dict):
    """fa4::fwd's arguments after (q, k, v, sink) (see _torch_ops._fwd_impl)."""
    return (a["cu_q"], a["cu_k"], a["used_k"], a["max_q"], a["max_k"], o["softmax_scale"], a["causal"],
            -1, -1, o["softcap"], o["rescale_threshold"], o["exp2_emulation_fraction"], o["backend"],
            o["deterministic"])


def _keys(x: Tensor, keys) -> Tensor:
    return x if keys is None else x[:, keys]


def _ring_forward(q: Tensor, k: Tensor, v: Tensor, sink: Optional[Tensor], ring: _Ring, plan: _Plan,
                  o: dict):
    rows = plan.all
    out = torch.zeros(q.shape[:-1] + v.shape[-1:], dtype=torch.float32, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if plan.varlen else (q.shape[0], q.shape[2], q.shape[1])
    lse = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device)
    kv = (k.contiguous(), v.contiguous())  # P2P ops send whole, dense tensors
    try:
        for step in range(ring.world):
            pending = ring.start(kv) if step + 1 < ring.world else None
            rows, keys, a = plan.step((ring.rank - step) % ring.world, ring.rank)
            ob, lb = _torch_ops._fwd_impl(rows.take(q), _keys(kv[0], keys), _keys(kv[1], keys),
                                          None, *_fa4_args(a, o))
            rows.merge(out, lse, ob, lb)
            if pending is not None:
                kv = ring.wait(pending)
    except Exception:
        ring.complete_in_flight()
        raise
    if sink is not None:
        _add_sink(out, lse, sink)
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, ring: _Ring, plan: _Plan, o: dict):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    # dk/dv of the k/v slice held at each step travel with it and are back home after world steps.
    dkv = (torch.zeros(k.shape, dtype=torch.float32, device=k.device),
           torch.zeros(v.shape, dtype=torch.float32, device=v.device))
    kv = (k.contiguous(), v.contiguous())
    dkv_pending = None
    try:
        for step in range(ring.world):
            kv_pending = ring.start(kv) if step + 1 < ring.world else None
            rows, keys, a = plan.step((ring.rank - step) % ring.world, ring.rank)
            gq, gk, gv, _ = _torch_ops._bwd_impl(
                rows.take(dout), rows.take(q), _keys(kv[0], keys), _keys(kv[1], keys),
                rows.take(out), rows.take_lse(lse).contiguous(), None, *_fa4_args(a, o))
            rows.add(dq, gq)
            if dkv_pending is not None:  # the accumulators of this step's slice, from rank - 1
                dkv = ring.wait(dkv_pending)
            _keys(dkv[0], keys).add_(gk.float())  # varlen: rows past seqused_k came back as 0
            _keys(dkv[1], keys).add_(gv.float())
            dkv_pending = ring.start(dkv) if ring.world > 1 else None
            if kv_pending is not None:
                kv = ring.wait(kv_pending)
        if dkv_pending is not None:
            dkv = ring.wait(dkv_pending)
    except Exception:
        ring.complete_in_flight()
        raise
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, ring, plan, o):
        out, lse = _ring_forward(q, k, v, sink, ring, plan, o)
        ctx.save_for_backward(q, k, v, out, lse, sink)
        ctx.ring, ctx.plan, ctx.o = ring, plan, o
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sink = ctx.saved_tensors
        with torch.no_grad():
            dout_c = dout.contiguous()
            # The blocks' backward with the final out/lse (sink included) gives exact dq/dk/dv.
            dq, dk, dv = _ring_backward(dout_c, q, k, v, out, lse, ctx.ring, ctx.plan, ctx.o)
            dsink = None
            if sink is not None and ctx.needs_input_grad[3]:
                dsink = _dsink(dout_c, out, lse, sink).to(sink.dtype)
        grads = _torch_ops.first_order_only([dq, dk, dv, dsink], dout, q, k, v, sink)
        return (*grads, None, None, None)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, *, group=None, causal: bool = False,
                   cu_seqlens=None, max_seqlen: Optional[int] = None,
                   softmax_scale: Optional[float] = None, softcap: float = 0.0,
                   sink: Optional[Tensor] = None, deterministic: bool = False,
                   return_lse: bool = False,
                   rescale_threshold: Optional[float] = None,
                   exp2_emulation_fraction: Optional[float] = None, backend: str = "auto"):
    """Exact attention over a sequence sharded along seqlen across a process group (ring attention).

    Every rank calls it with its own slices; the result is this rank's slice of what
    fa4.flash_attn_func would give on the whole sequence (up to rounding). Differentiable w.r.t.
    q, k and v (the backward is collective too: every rank must run it).

    Args:
        q: this rank's queries (batch, seqlen_local, num_heads, headdim), or packed sequences
            (total_local, num_heads, headdim) with cu_seqlens; bf16/fp16/fp32, CPU (gloo) or CUDA
            (NCCL) as the group's backend carries them.
        k, v: this rank's keys/values (batch, seqlen_local_k, num_heads_kv, headdim[_v]), or
            (total_local, ...) packed like q; GQA/MQA as in flash_attn_func. Every rank's k/v slice
            has the same shape.
        group: the process group (default: the world). Ranks are the ring's order.
        causal: causal mask over the whole sequence(s). Needs the zigzag layout of
            shard_sequence(zigzag=True) for q, k and v (seqlen_local_k == seqlen_local, even;
            packed: every sequence's slice even).
        cu_seqlens: packed layout: the slices' cumulative lengths (shard_sequence's cu_seqlens //
            world_size), the same on every rank, on the CPU (int tensor or list: the host decides
            the second-half rows from it without a device sync). max_seqlen: the longest slice.
        softmax_scale: default 1/sqrt(headdim). softcap: as in flash_attn_func (0 = off).
        sink: fp32 (num_heads,) sink logits, the same on every rank (flash_attn_func's): joins each
            row's denominator once. Its gradient is this rank's share (the sum over its rows),
            like every replicated parameter's under context parallelism: the gradient
            all-reduce over the ranks completes it.
        deterministic: bitwise-reproducible backward (fa4's deterministic block backward; the
            ring's accumulation order is fixed).
        return_lse: also return this rank's lse (batch, num_heads, seqlen_local), or (num_heads,
            total_local) packed, fp32, natural log.
        rescale_threshold, exp2_emulation_fraction, backend: as in flash_attn_func, for every
            block call (forward and backward); 'cpu_reference' for the forward only (its backward
            does not use the final out and lse the ring's block gradients need).

    Returns:
        out (batch, seqlen_local, num_heads, headdim_v), or (total_local, num_heads, headdim_v)
        packed, in q's dtype, [and lse, which is not
        differentiable (as in flash_attn_func)]. Block outputs and gradients come back from fa4
        in the input dtype and are merged/accumulated in fp32 (one rounding per block).

    Not supported: local windows (window_size).

    Raises:
        InvalidArgumentError (ValueError) for bad shapes or argument types (a flag that is not a
        bool, a missing or non-integer max_seqlen, cu_seqlens that are not integers), backend
        'cpu_reference' where gradients are needed, or an uninitialised torch.distributed.
        Errors of a block call are fa4's (they name the block's tensors). See the module
        docstring for what is not checked across ranks.
    """
    varlen = cu_seqlens is not None
    causal = _core._bool(causal, "causal", _FN)
    deterministic = _core._bool(deterministic, "deterministic", _FN)
    return_lse = _core._bool(return_lse, "return_lse", _FN)
    # The scalar options, checked as flash_attn_func checks them (the error names the option),
    # before anything touches the process group.
    o = dict(softmax_scale=None if softmax_scale is None
             else _core._float(softmax_scale, "softmax_scale", _FN),
             softcap=_core._float(softcap, "softcap", _FN), deterministic=deterministic,
             backend=backend,
             rescale_threshold=None if rescale_threshold is None
             else _core._float(rescale_threshold, "rescale_threshold", _FN),
             exp2_emulation_fraction=None if exp2_emulation_fraction is None
             else _core._float(exp2_emulation_fraction, "exp2_emulation_fraction", _FN))
    _core.backend_code(backend, _FN)  # a bad name is told with this function's name
    dims = 3 if varlen else 4
    layout = "(total, heads, headdim) with cu_seqlens" if varlen else "(batch, seqlen, heads, headdim)"
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != dims:
            raise _capi.InvalidArgumentError(f"{_FN}: {name} must be a {dims}-D torch.Tensor {layout}")
    seq = 0 if varlen else 1
    if k.shape[:seq + 2] != v.shape[:seq + 2] or q.shape[:seq] != k.shape[:seq]:
        raise _capi.InvalidArgumentError(
            f"{_FN}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: batch must agree "
            "and k, v must share their leading dims")
    if varlen:
        cu = _host_cu(cu_seqlens, _FN)
        if q.shape[0] != int(cu[-1]) or k.shape[0] != int(cu[-1]):
            raise _capi.InvalidArgumentError(
                f"{_FN}: q and k must hold cu_seqlens[-1] = {int(cu[-1])} rows (self-attention over "
                f"the same packed sequences), got {q.shape[0]} and {k.shape[0]}")
        lens = cu[1:] - cu[:-1]
        longest = int(lens.max()) if len(lens) else 0
        if max_seqlen is None:
            raise _capi.InvalidArgumentError(
                f"{_FN}: max_seqlen must be given with cu_seqlens (>= the longest slice, {longest})")
        # An int, a NumPy integer or an integer 0-D tensor (lens.max() of the CPU cu_seqlens), as
        # cu_seqlens' items; no float / str / bool (int() would truncate or accept them).
        given = max_seqlen
        max_seqlen = _integer(given)
        if max_seqlen is None:
            raise _capi.InvalidArgumentError(f"{_FN}: max_seqlen = {given!r} must be an int")
        max_seqlen = _core._int32(max_seqlen, "max_seqlen", _FN)
        if max_seqlen < longest:
            raise _capi.InvalidArgumentError(
                f"{_FN}: max_seqlen = {max_seqlen} must be >= the longest slice ({longest})")
        if causal and bool((lens % 2).any()):
            raise _capi.InvalidArgumentError(
                f"{_FN}: causal needs the zigzag layout: every sequence's slice must have an even "
                f"length, got {lens.tolist()}")
    elif causal and (q.shape[1] != k.shape[1] or q.shape[1] % 2):
        raise _capi.InvalidArgumentError(
            f"{_FN}: causal needs the zigzag layout (shard_sequence(zigzag=True)): q and k slices "
            f"of one even length, got seqlen_q {q.shape[1]}, seqlen_k {k.shape[1]}")
    elif max_seqlen is not None:
        raise _capi.InvalidArgumentError(f"{_FN}: max_seqlen is for the packed layout (with cu_seqlens)")
    plan = _Plan(q, causal, cu if varlen else None, max_seqlen)
    if sink is not None and (not isinstance(sink, Tensor) or sink.dim() != 1
                             or sink.shape[0] != q.shape[-2] or sink.dtype != torch.float32
                             or sink.device != q.device):
        raise _capi.InvalidArgumentError(
            f"{_FN}: sink must be an fp32 tensor of shape (num_heads,) = ({q.shape[-2]},) on q's "
            "device")
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or (
        sink is not None and sink.requires_grad))
    if needs_grad and backend == "cpu_reference":
        # The block gradients add up only where the backward rebuilds P from the lse it is given
        # (the final one) and takes D from the given out; the float64 oracle recomputes both for
        # the block's own keys.
        raise _capi.InvalidArgumentError(
            f"{_FN}: backend = 'cpu_reference' cannot run the ring's backward (the float64 oracle "
            "recomputes each block's out and lse instead of using the final ones); use 'cpu' or "
            "'auto', or call without gradients")
    ring = _Ring(group)
    if needs_grad:
        out, lse = _RingAttention.apply(q, k, v, sink, ring, plan, o)
    else:
        out, lse = _ring_forward(q, k, v, sink, ring, plan, o)
    return (out, lse) if return_lse else out
