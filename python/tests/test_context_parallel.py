"""fa4.context_parallel: ring attention over gloo with 2 and 4 CPU processes against the float64
reference on the whole sequence, with the project's accuracy rule, forward (out, lse) and backward
(dq, dk, dv, dsink); causal (zigzag) and not, GQA/MQA, softcap, sink, packed sequences (varlen, a zero-length one
among them), a subgroup ring, a one-rank ring, deterministic bitwise repeats; the argument checks
made before the process group is touched, and a 3-rank ring that stays usable after a call fails.
Skipped, loudly, where torch or its gloo backend is missing."""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: context-parallel tests skipped")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is missing")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed has no gloo backend: context-parallel tests skipped",
                allow_module_level=True)
import torch.multiprocessing as mp  # noqa: E402

import fa4  # noqa: E402
from torch_reference import assert_rule, ref_attention  # noqa: E402

# (name, batch, seqlen (whole; "q/k" when they differ), heads, heads_kv, headdim, causal, softcap,
# dtype)
CASES = [
    ("gqa", 2, 96, 4, 2, 32, False, 0.0, torch.bfloat16),
    ("cross_lengths", 1, (32, 96), 4, 2, 32, False, 0.0, torch.bfloat16),
    ("causal_mqa", 1, 96, 4, 1, 64, True, 0.0, torch.bfloat16),
    ("causal_softcap_fp16", 2, 64, 2, 2, 32, True, 5.0, torch.float16),
    ("causal_fp32", 1, 64, 2, 1, 32, True, 0.0, torch.float32),
]
CAUSAL_MQA = CASES[2]


def _inputs(case, seed):
    _, b, s, h, hkv, d, _, _, dtype = case
    sq, sk = s if isinstance(s, tuple) else (s, s)
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(shape, generator=g).to(dtype)
                     for shape in ((b, sq, h, d), (b, sk, hkv, d), (b, sk, hkv, d), (b, sq, h, d)))
    return q, k, v, dout


def _check_case(case, group, seed, zigzag=True, sink=False, softmax_scale=None):
    """Runs one case on group's ring; every rank checks the gathered result. Non-causal cases may
    use contiguous shards (zigzag=False). sink: with sink logits (their gradient summed over the
    ranks, as the gradient all-reduce of training would). softmax_scale: given to both sides (the
    default 1/sqrt(headdim) otherwise)."""
    name, _, _, h, _, _, causal, softcap, dtype = case
    cp = fa4.context_parallel
    q, k, v, dout = _inputs(case, seed)
    sinks = None
    if sink:
        name += " sink"
        sinks = torch.randn(h, generator=torch.Generator().manual_seed(seed + 1)).requires_grad_()
    zigzag = zigzag or causal
    local = [cp.shard_sequence(x, group, zigzag=zigzag).requires_grad_(x is not dout)
             for x in (q, k, v, dout)]
    ql, kl, vl, doutl = local
    opts = dict(causal=causal, softcap=softcap, softmax_scale=softmax_scale)
    # fp32: the software exp2's ~2e-4 relative error is above fp32 rounding (test_torch.py).
    exp2 = dict(exp2_emulation_fraction=0.0) if dtype == torch.float32 else {}
    out_l, lse_l = cp.ring_attention(ql, kl, vl, group=group, return_lse=True, sink=sinks, **opts,
                                     **exp2)
    assert out_l.dtype == dtype and lse_l.dtype == torch.float32 and not lse_l.requires_grad
    grads_l = torch.autograd.grad(out_l, (ql, kl, vl) + ((sinks,) if sink else ()), doutl)
    if sink:
        dsink = grads_l[3].clone()
        dist.all_reduce(dsink, group=group)
        grads_l = grads_l[:3]
    gather = lambda x: cp.gather_sequence(x, group, zigzag=zigzag)  # noqa: E731
    out, dq, dk, dv = (gather(x) for x in (out_l, *grads_l))
    lse = cp.gather_sequence(lse_l, group, zigzag=zigzag, dim=2)

    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ins = (qr, kr, vr)
    if sink:
        opts["sink"] = sinks.detach().clone().requires_grad_()
        ins += (opts["sink"],)
    o64, l64 = ref_attention(qr, kr, vr, **opts)
    op, lp = ref_attention(qr, kr, vr, upcast=False, **opts)
    assert_rule(f"{name} out", out, o64, op, dtype)
    assert_rule(f"{name} lse", lse, l64, lp.float(), torch.float32, atol_scale=4.0)
    g64 = torch.autograd.grad(o64, ins, dout.double())
    gp = torch.autograd.grad(op, ins, dout)
    for gname, a, r, p in zip(("dq", "dk", "dv"), (dq, dk, dv), g64, gp):
        assert a.dtype == dtype
        assert_rule(f"{name} {gname}", a, r, p, dtype, atol_scale=4.0)
    if sink:
        assert_rule(f"{name} dsink", dsink, g64[3], gp[3], torch.float32, atol_scale=4.0)


# Packed sequences (a zero-length one among them); every length a multiple of 2 x 4.
VARLEN_LENS = [48, 0, 16, 32]


def _ref_varlen(q, k, v, lens, **opts):
    """The float64 (or plain) reference per sequence, packed: out (total, h, d), lse (h, total)."""
    outs, lses, start = [], [], 0
    for n in lens:
        sl = slice(start, start + n)
        o, l = ref_attention(q[sl][None], k[sl][None], v[sl][None], **opts)
        outs.append(o[0])
        lses.append(l[0])
        start += n
    return torch.cat(outs), torch.cat(lses, dim=1)


def _check_varlen(group, seed, causal, zigzag):
    cp = fa4.context_parallel
    world = dist.get_world_size(group)
    dtype, h, hkv, d = torch.bfloat16, 4, 2, 32
    total = sum(VARLEN_LENS)
    cu = [0]
    for n in VARLEN_LENS:
        cu.append(cu[-1] + n)
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(shape, generator=g).to(dtype)
                     for shape in ((total, h, d), (total, hkv, d), (total, hkv, d), (total, h, d)))
    zigzag = zigzag or causal
    shard = lambda x: cp.shard_sequence(x, group, zigzag=zigzag, dim=0, cu_seqlens=cu)  # noqa: E731
    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    cu_l = [c // world for c in cu]
    out_l, lse_l = cp.ring_attention(ql, kl, vl, group=group, causal=causal, cu_seqlens=cu_l,
                                     max_seqlen=max(VARLEN_LENS) // world, return_lse=True)
    grads_l = torch.autograd.grad(out_l, (ql, kl, vl), shard(dout))
    gather = lambda x, dim=0: cp.gather_sequence(x, group, zigzag=zigzag, dim=dim, cu_seqlens=cu_l)  # noqa: E731
    out, dq, dk, dv = (gather(x) for x in (out_l, *grads_l))
    lse = gather(lse_l, dim=1)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    o64, l64 = _ref_varlen(qr, kr, vr, VARLEN_LENS, causal=causal)
    op, lp = _ref_varlen(qr, kr, vr, VARLEN_LENS, causal=causal, upcast=False)
    name = f"varlen {'causal' if causal else 'full'} zigzag={zigzag}"
    assert_rule(f"{name} out", out, o64, op, dtype)
    assert_rule(f"{name} lse", lse, l64, lp.float(), torch.float32, atol_scale=4.0)
    g64 = torch.autograd.grad(o64, (qr, kr, vr), dout.double())
    gp = torch.autograd.grad(op, (qr, kr, vr), dout)
    for gname, a, r, p in zip(("dq", "dk", "dv"), (dq, dk, dv), g64, gp):
        assert_rule(f"{name} {gname}", a, r, p, dtype, atol_scale=4.0)


def _worker(rank, world, init_file, seed):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    torch.set_num_threads(1)
    try:
        for i, case in enumerate(CASES):
            _check_case(case, None, seed + i, zigzag=world == 4)  # non-causal: contiguous at 2
        _check_case(CAUSAL_MQA, None, seed + 40, sink=True, softmax_scale=0.3)
        _check_case(CASES[0], None, seed + 41, zigzag=world == 4, sink=True)
        _check_varlen(None, seed + 50, causal=True, zigzag=True)
        _check_varlen(None, seed + 51, causal=False, zigzag=world == 4)
        # A subgroup ring (ranks {0, 2} and {1, 3} of four; {0} and {1} of two): peers are global
        # ranks, not group ranks. Every rank creates every group, in one order.
        parts = [list(range(world))[j::2] for j in range(2)]
        groups = [dist.new_group(p) for p in parts]
        mine = groups[rank % 2]
        _check_case(CAUSAL_MQA, mine, seed + 100)
        # Deterministic: bitwise-equal gradients over repeats (the ring's accumulation order is
        # fixed; on CPU the block backward is deterministic anyway, so this guards the ring).
        q, k, v, dout = _inputs(CAUSAL_MQA, seed + 200)
        cp = fa4.context_parallel
        runs = []
        for _ in range(3):
            ql, kl, vl = (cp.shard_sequence(x, None).requires_grad_() for x in (q, k, v))
            out = cp.ring_attention(ql, kl, vl, causal=True, deterministic=True)
            runs.append(torch.autograd.grad(out, (ql, kl, vl), cp.shard_sequence(dout, None)))
        for later in runs[1:]:
            for a, b in zip(runs[0], later):
                assert torch.equal(a, b), "deterministic ring backward differs between runs"
        # The options reach every block call, forward and backward (on CPU the deterministic
        # repeats above would pass without them).
        seen = []
        fwd, bwd = fa4._torch_ops._fwd_impl, fa4._torch_ops._bwd_impl
        # (_fa4_args order: ..., rescale_threshold, exp2_emulation_fraction, backend, deterministic)
        fa4._torch_ops._fwd_impl = lambda *a: seen.append(("fwd",) + a[-4:]) or fwd(*a)
        fa4._torch_ops._bwd_impl = lambda *a: seen.append(("bwd",) + a[-4:]) or bwd(*a)
        try:
            ql, kl, vl = (cp.shard_sequence(x, None).requires_grad_() for x in (q, k, v))
            out = cp.ring_attention(ql, kl, vl, causal=True, deterministic=True, backend="cpu",
                                    rescale_threshold=4.0, exp2_emulation_fraction=0.0)
            torch.autograd.grad(out, (ql, kl, vl), cp.shard_sequence(dout, None))
        finally:
            fa4._torch_ops._fwd_impl, fa4._torch_ops._bwd_impl = fwd, bwd
        assert [d for d, *_ in seen] == ["fwd"] * world + ["bwd"] * world, seen
        assert all(tuple(x) == (4.0, 0.0, "cpu", True) for _, *x in seen), seen
    finally:
        dist.destroy_process_group()


def test_merge_weights_empty_parts_and_nan():
    # The merge rule on its own (core/softmax.h's): an lse of -inf weighs 0, two empty states stay
    # empty (out 0, lse -inf, no NaN), a NaN state makes the row NaN.
    merge = fa4.context_parallel._merge
    inf = float("inf")
    lse = torch.tensor([[[-inf, -inf, 0.5, float("nan")]]])  # (b=1, h=1, s=4)
    lse_b = torch.tensor([[[-inf, 1.0, -inf, 0.0]]])
    out = torch.tensor([[[[0.0]], [[0.0]], [[2.0]], [[1.0]]]])  # (b, s, h, d=1)
    out_b = torch.tensor([[[[5.0]], [[3.0]], [[7.0]], [[1.0]]]])
    merge(out, lse, out_b, lse_b)
    assert out[0, 0, 0, 0] == 0 and lse[0, 0, 0] == -inf           # both empty
    assert out[0, 1, 0, 0] == 3 and lse[0, 0, 1] == 1.0            # only b
    assert out[0, 2, 0, 0] == 2 and lse[0, 0, 2] == 0.5            # only a
    assert torch.isnan(out[0, 3, 0, 0]) and torch.isnan(lse[0, 0, 3])
    # Two finite states: the logsumexp and the weighted mean.
    lse = torch.tensor([[[0.0]]])
    out = torch.tensor([[[[1.0]]]])
    merge(out, lse, torch.tensor([[[[3.0]]]]), torch.tensor([[[0.0]]]))
    assert torch.allclose(out, torch.tensor(2.0)) and torch.allclose(lse, torch.log(torch.tensor(2.0)))


def test_ring_attention_checks_scalar_options():
    # The options are checked before the process group is touched (none is initialised here), as
    # flash_attn_func checks them: the error names the option and the function.
    ring = fa4.context_parallel.ring_attention
    fn = r"fa4\.context_parallel\.ring_attention"
    q = torch.zeros(1, 4, 2, 16)
    for name, bad in (("softcap", None), ("softcap", "3"), ("softmax_scale", "0.5"),
                      ("rescale_threshold", "8"), ("exp2_emulation_fraction", True)):
        with pytest.raises(fa4.InvalidArgumentError, match=rf"^{fn}: {name} = .* must be a float$"):
            ring(q, q, q, **{name: bad})
    with pytest.raises(fa4.InvalidArgumentError, match=rf"^{fn}: return_lse = 'yes' must be a bool$"):
        ring(q, q, q, return_lse="yes")
    with pytest.raises(fa4.InvalidArgumentError, match=rf"^{fn}: backend = 'gpu' must be one of"):
        ring(q, q, q, backend="gpu")
    if not dist.is_initialized():  # valid options reach the process-group check
        with pytest.raises(fa4.InvalidArgumentError, match="not initialized"):
            ring(q, q, q, softcap=3, softmax_scale=0.5, return_lse=1)


def test_layout_arguments_are_checked():
    # Before the process group is touched (none is initialised here): a flag that is not a bool,
    # a dim that is not an int of x, and a max_seqlen / cu_seqlens that is not an integer are
    # errors naming the argument, never truncated or read by truthiness (zigzag="no" was True,
    # cu_seqlens [0, 7.5, 16] and max_seqlen 12.7 were cut to ints).
    cp = fa4.context_parallel
    x = torch.zeros(1, 8, 2, 16)
    err = fa4.InvalidArgumentError
    for fn in (cp.shard_sequence, cp.gather_sequence):
        name = rf"fa4\.context_parallel\.{fn.__name__}"
        for bad in ("no", None):
            with pytest.raises(err, match=rf"^{name}: zigzag = .* must be a bool$"):
                fn(x, zigzag=bad)
        for bad in (True, 1.0, 4):
            with pytest.raises(err, match=rf"^{name}: dim = .* must be an int in \[-4, 4\)"):
                fn(x, dim=bad)
    ring = cp.ring_attention
    fn = r"fa4\.context_parallel\.ring_attention"
    q = torch.zeros(16, 2, 16)
    for bad in (12.0, 12.7, "12", True):
        with pytest.raises(err, match=rf"^{fn}: max_seqlen = .* must be an int$"):
            ring(q, q, q, cu_seqlens=[0, 8, 16], max_seqlen=bad)
    # An integer 0-D tensor (lens.max() of the CPU cu_seqlens) is an int: the call gets past the
    # argument checks to the missing process group.
    with pytest.raises(Exception) as got:
        ring(q, q, q, cu_seqlens=[0, 8, 16], max_seqlen=torch.tensor(8))
    assert "max_seqlen" not in str(got.value)
    for bad in ([0, 7.5, 16], [0, True, 16], [0, torch.tensor(True), 16], torch.tensor([0.0, 8.0, 16.0])):
        with pytest.raises(err, match=rf"^{fn}: cu_seqlens must hold integers"):
            ring(q, q, q, cu_seqlens=bad, max_seqlen=9)
        with pytest.raises(err, match="shard_sequence: cu_seqlens must hold integers"):
            cp.shard_sequence(q, cu_seqlens=bad)
    with pytest.raises(err, match=rf"^{fn}: max_seqlen = .* must be an int$"):  # a 0-D bool tensor
        ring(q, q, q, cu_seqlens=[0, 8, 16], max_seqlen=torch.tensor(True))
    with pytest.raises(err, match=r"shard_sequence: dim = .* must be an int"):
        cp.shard_sequence(x, dim=torch.tensor(True))
    for fn_, call in ((fn, lambda: ring(q, q, q, cu_seqlens=16, max_seqlen=8)),
                      ("shard_sequence", lambda: cp.shard_sequence(q, cu_seqlens=16)),
                      ("gather_sequence", lambda: cp.gather_sequence(q, cu_seqlens=16))):
        with pytest.raises(err, match=rf"{fn_}: cu_seqlens must be a 1-D integer tensor or a sequence of ints"):
            call()


def test_cpu_reference_backend_is_forward_only():
    # The ring's block gradients add up only where the backward uses the final out and lse it is
    # given; the float64 oracle recomputes each block's own (its ring gradients were off by ~1).
    # Refused where gradients are needed, before the process group is touched (none here).
    ring = fa4.context_parallel.ring_attention
    q = torch.zeros(1, 4, 2, 16)
    qg = q.clone().requires_grad_()
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4\.context_parallel\.ring_attention: backend = 'cpu_reference' cannot run"):
        ring(qg, q, q, backend="cpu_reference")
    if not dist.is_initialized():  # without gradients the call goes on to the group check
        with pytest.raises(fa4.InvalidArgumentError, match="not initialized"):
            ring(q, q, q, backend="cpu_reference")
        with torch.no_grad(), pytest.raises(fa4.InvalidArgumentError, match="not initialized"):
            ring(qg, q, q, backend="cpu_reference")


def _error_worker(rank, world, init_file):
    # A short timeout: the failure this guards against is a hang.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    torch.set_num_threads(1)
    cp = fa4.context_parallel
    ql, kl, vl, doutl = (cp.shard_sequence(x, None) for x in _inputs(CAUSAL_MQA, 300))

    def run():
        q, k, v = (x.clone().requires_grad_() for x in (ql, kl, vl))
        out = cp.ring_attention(q, k, v, causal=True)
        return (out,) + torch.autograd.grad(out, (q, k, v), doutl)

    real_bwd = fa4._torch_ops._bwd_impl
    try:
        want = run()
        # fa4 refuses the option in the first block call, after the first k/v transfer started.
        with pytest.raises(fa4.InvalidArgumentError, match="softcap"):
            cp.ring_attention(ql, kl, vl, causal=True, softcap=-1.0)
        # A backward block failing at step 1, with the k/v and the dk/dv transfers in flight.
        calls = []

        def failing_bwd(*args):
            calls.append(None)
            if len(calls) == 2:
                raise RuntimeError("injected block failure")
            return real_bwd(*args)

        fa4._torch_ops._bwd_impl = failing_bwd
        with pytest.raises(RuntimeError, match="injected"):
            run()
        fa4._torch_ops._bwd_impl = real_bwd
        # The group is still usable: the same call gives the same result.
        for a, b in zip(want, run()):
            assert torch.equal(a, b)
    finally:
        fa4._torch_ops._bwd_impl = real_bwd
        dist.destroy_process_group()


def _spawn(world, seed):
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, os.path.join(d, "init"), seed), nprocs=world, join=True)


def test_ring_usable_after_a_failed_call():
    # An error in a step's compute (every rank raises it) must not leave transfers in flight:
    # abandoned, the next call on the group hung until gloo's send timeout. Three ranks: an odd
    # ring, with both transfers of a backward step in flight.
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_error_worker, args=(3, os.path.join(d, "init")), nprocs=3, join=True)


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_gloo_matches_fp64(world):
    _spawn(world, 1000 * world)
