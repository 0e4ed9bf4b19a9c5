"""torch tests: forward + autograd vs a float64 torch reference, custom-op checks, torch.compile
with no graph break, CUDA (where a GPU is present). Skipped, loudly, where torch is missing."""

from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: torch tests skipped")

import fa4  # noqa: E402
from torch_reference import EPS, ref_attention  # noqa: E402
from torch_reference import assert_rule as _assert_rule  # noqa: E402
from torch_reference import max_err as _err  # noqa: E402
from torch_reference import randn as _randn  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU: CUDA tests skipped")
# fp32 runs with the software exp2 off: its ~2e-4 relative error is below 16-bit rounding but not
# fp32's (see test_numpy.py, FP32_EXACT_EXP2).
def _exp2_opts(dtype):
    return dict(exp2_emulation_fraction=0.0) if dtype == torch.float32 else {}


@pytest.fixture
def gen(request):
    g = torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
    return g


CASES = [
    dict(b=2, sq=40, sk=70, h=4, hkv=2, d=32),
    dict(b=1, sq=64, sk=64, h=4, hkv=1, d=64, causal=True),
    dict(b=2, sq=33, sk=90, h=2, hkv=2, d=32, window_size=(10, 4)),
    dict(b=1, sq=50, sk=60, h=4, hkv=2, d=32, causal=True, softcap=3.0, sink=True),
]
CASE_IDS = ["gqa", "causal_mqa", "window", "softcap_sink"]


def _run_case(gen, dtype, device, cfg):
    cfg = dict(cfg)
    b, sq, sk, h, hkv, d = (cfg.pop(n) for n in ("b", "sq", "sk", "h", "hkv", "d"))
    q = _randn(gen, (b, sq, h, d), dtype, device, True)
    k = _randn(gen, (b, sk, hkv, d), dtype, device, True)
    v = _randn(gen, (b, sk, hkv, d), dtype, device, True)
    if cfg.pop("sink", False):
        cfg["sink"] = _randn(gen, (h,), torch.float32, device, True)
    return q, k, v, cfg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cfg", CASES, ids=CASE_IDS)
def test_cpu_forward_and_autograd_match_fp64(gen, dtype, cfg):
    q, k, v, opts = _run_case(gen, dtype, "cpu", cfg)
    out, lse = fa4.flash_attn_func(q, k, v, return_lse=True, **opts, **_exp2_opts(dtype))
    assert out.dtype == dtype and lse.dtype == torch.float32 and not lse.requires_grad
    o64, l64 = ref_attention(q, k, v, **opts)
    op, lp = ref_attention(q, k, v, upcast=False, **opts)
    _assert_rule("out", out, o64, op, dtype)
    _assert_rule("lse", lse, l64, lp.float(), torch.float32, atol_scale=4.0)

    dout = _randn(gen, out.shape, dtype)
    inputs = [q, k, v] + ([opts["sink"]] if "sink" in opts else [])
    g = torch.autograd.grad(out, inputs, dout)
    g64 = torch.autograd.grad(o64, inputs, dout.double())
    gp = torch.autograd.grad(op, inputs, dout)
    for name, a, r, p in zip(["dq", "dk", "dv", "dsink"], g, g64, gp):
        assert a.dtype == (torch.float32 if name == "dsink" else dtype), (name, a.dtype)
        _assert_rule(name, a, r, p, dtype if name != "dsink" else torch.float32, atol_scale=4.0)


def test_cpu_varlen_autograd(gen):
    lens_q, lens_k = [9, 0, 33], [9, 12, 40]
    h, hkv, d = 4, 2, 32
    cu_q = torch.tensor([0, 9, 9, 42], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 21, 61], dtype=torch.int32)
    q = _randn(gen, (42, h, d), torch.float32, requires_grad=True)
    k = _randn(gen, (61, hkv, d), torch.float32, requires_grad=True)
    v = _randn(gen, (61, hkv, d), torch.float32, requires_grad=True)
    out = fa4.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                     exp2_emulation_fraction=0.0)
    dout = _randn(gen, out.shape, torch.float32)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    # Per-sequence batched references, stitched together.
    for bq, bk in ((slice(0, 9), slice(0, 9)), (slice(9, 9), slice(9, 21)), (slice(9, 42), slice(21, 61))):
        qs, ks, vs = (x.detach()[s][None].requires_grad_() for x, s in ((q, bq), (k, bk), (v, bk)))
        o64, _ = ref_attention(qs, ks, vs, causal=True)
        op, _ = ref_attention(qs, ks, vs, causal=True, upcast=False)
        _assert_rule("out", out[bq], o64[0], op[0], torch.float32)
        if qs.shape[1] == 0:
            assert torch.all(dk[bk] == 0) and torch.all(dv[bk] == 0)  # keys nobody sees
            continue
        g64 = torch.autograd.grad(o64, (qs, ks, vs), dout[bq][None].double())
        gp = torch.autograd.grad(op, (qs, ks, vs), dout[bq][None])
        for name, a, r, p in zip(["dq", "dk", "dv"], (dq[bq], dk[bk], dv[bk]), g64, gp):
            _assert_rule(name, a, r[0], p[0], torch.float32, atol_scale=4.0)


def test_noncontiguous_grad_and_inputs(gen):
    # out.sum() gives an expanded (stride 0) gradient; q is a transposed view.
    base = _randn(gen, (1, 4, 24, 32), torch.float32)
    q = base.transpose(1, 2).requires_grad_()
    k = _randn(gen, (1, 24, 4, 32), torch.float32, requires_grad=True)
    v = _randn(gen, (1, 24, 4, 32), torch.float32, requires_grad=True)
    fa4.flash_attn_func(q, k, v, causal=True, exp2_emulation_fraction=0.0).sum().backward()
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    ref_attention(q2, k2, v2, causal=True)[0].sum().backward()
    for a, r in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        assert _err(a, r) < 1e-4


def test_errors_are_fa4_errors(gen):
    q = _randn(gen, (1, 8, 2, 16), torch.float32)
    with pytest.raises(fa4.InvalidArgumentError, match="float64"):
        fa4.flash_attn_func(q.double(), q.double(), q.double())
    with pytest.raises(fa4.InvalidArgumentError, match=r"headdim"):
        fa4.flash_attn_func(q, q[..., :8], q)
    with pytest.raises(fa4.InvalidArgumentError, match="numpy"):
        fa4.flash_attn_func(q, q.numpy(), q)
    with pytest.raises(fa4.InvalidArgumentError, match=r"causal = 'yes' must be a bool"):
        fa4.flash_attn_func(q, q, q, causal="yes")
    with pytest.raises(fa4.InvalidArgumentError, match=r"deterministic = None must be a bool"):
        fa4.flash_attn_func(q, q, q, deterministic=None)
    with pytest.raises(fa4.InvalidArgumentError, match=r"causal = 'yes' must be a bool"):
        fa4.flash_attn_with_kvcache(q, q, q, causal="yes")
    cu = torch.tensor([0, 8], dtype=torch.int64)
    with pytest.raises(fa4.InvalidArgumentError, match=r"cu_seqlens_q must be torch\.int32$"):
        fa4.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8)
    with pytest.raises(fa4.InvalidArgumentError, match=r"sink must be torch\.float32$"):
        fa4.flash_attn_func(q, q, q, sink=torch.zeros(2, dtype=torch.float64))
    # Rank errors name the tensor as the library does, on both routes (eager and the custom op).
    with pytest.raises(fa4.InvalidArgumentError, match=r"^fa4::forward: q\.ndim = 3 \(shape \(8, 2, 16\)\) must be 4"):
        fa4.flash_attn_func(q[0], q, q)
    with pytest.raises(fa4.InvalidArgumentError, match=r"^fa4::forward: v\.ndim = 3 .* must be 4: v is"):
        torch.ops.fa4.fwd(q, q, q[0], None, None, None, None, 0, 0, None, False, -1, -1, 0.0, None,
                          None, "auto", False)
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4::forward_with_kvcache: v_cache\.ndim = 3 .* must be 4: v_cache is"):
        fa4.flash_attn_with_kvcache(q, q, q[0])


def _public_calls(q):
    """The three public functions on one small problem (q as q, k and v), by name, each taking
    the options as keywords."""
    cu = torch.tensor([0, q.shape[1]], dtype=torch.int32)
    s = q.shape[1]
    return {
        "fa4.flash_attn_func": lambda **kw: fa4.flash_attn_func(q, q, q, **kw),
        "fa4.flash_attn_varlen_func": lambda **kw: fa4.flash_attn_varlen_func(
            q[0], q[0], q[0], cu, cu, s, s, **kw),
        "fa4.flash_attn_with_kvcache": lambda **kw: fa4.flash_attn_with_kvcache(q, q, q, **kw),
    }


def test_scalar_options_are_checked(gen):
    # Float options are checked as the NumPy path checks them, with an error naming the option and
    # the function: never float()'s TypeError for None, never a string silently parsed. return_lse
    # is a flag (a bool or 0 / 1), never Python truthiness.
    calls = _public_calls(_randn(gen, (1, 8, 2, 16), torch.float32))
    for fn, call in calls.items():
        for name, bad in (("softcap", None), ("softcap", "3"), ("softcap", True),
                          ("softmax_scale", "0.5"), ("rescale_threshold", "8"),
                          ("exp2_emulation_fraction", [0.5])):
            with pytest.raises(fa4.InvalidArgumentError,
                               match=rf"^{re.escape(fn)}: {name} = {re.escape(repr(bad))} must be a float$"):
                call(**{name: bad})
        for bad in ("yes", None, 2):
            with pytest.raises(fa4.InvalidArgumentError,
                               match=rf"^{re.escape(fn)}: return_lse = {re.escape(repr(bad))} must be a bool$"):
                call(return_lse=bad)
        # Numbers of other types are taken as their float value; 0 / 1 (and NumPy's) as flags.
        ref_out, ref_lse = call(softcap=3.0, softmax_scale=0.5, return_lse=True)
        for softcap, scale, flag in ((3, np.float32(0.5), 1), (np.float64(3.0), 0.5, np.True_)):
            out, lse = call(softcap=softcap, softmax_scale=scale, return_lse=flag)
            assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
        assert torch.equal(call(softcap=3, softmax_scale=0.5, return_lse=0), ref_out)


def test_tensor_options_are_refused(gen):
    # An option is a number: a torch tensor, 0-d and on the CPU too, is refused with an error naming
    # the option and the fix, and is never read (float() of a CUDA tensor waits for the GPU; a meta
    # tensor, which has no value to read, gets the same error).
    calls = _public_calls(_randn(gen, (1, 8, 2, 16), torch.float32))

    def refused(fn, what, kind, device="cpu", shape="()"):
        return (rf"^{re.escape(fn)}: {re.escape(what)} = a torch\.Tensor \(shape {re.escape(shape)}, "
                rf"device {device}\) must be an? {kind}, not a tensor: pass a Python {kind} "
                rf"\(e\.g\. its \.item\(\)\)$")

    for fn, call in calls.items():
        for name in ("softmax_scale", "softcap", "rescale_threshold", "exp2_emulation_fraction"):
            for t, device in ((torch.tensor(0.5), "cpu"), (torch.tensor(0.5, device="meta"), "meta")):
                with pytest.raises(fa4.InvalidArgumentError, match=refused(fn, name, "float", device)):
                    call(**{name: t})
        with pytest.raises(fa4.InvalidArgumentError, match=refused(fn, "softcap", "float", shape="(1,)")):
            call(softcap=torch.tensor([3.0]))
        for name in ("causal", "return_lse"):
            with pytest.raises(fa4.InvalidArgumentError, match=refused(fn, name, "bool")):
                call(**{name: torch.tensor(True)})
        with pytest.raises(fa4.InvalidArgumentError, match=refused(fn, "window_size[0]", "int")):
            call(window_size=(torch.tensor(4), -1))
    with pytest.raises(fa4.InvalidArgumentError,
                       match=refused("fa4.flash_attn_func", "deterministic", "bool")):
        calls["fa4.flash_attn_func"](deterministic=torch.tensor(False))
    with pytest.raises(fa4.InvalidArgumentError,
                       match=refused("fa4.flash_attn_with_kvcache", "num_splits", "int")):
        calls["fa4.flash_attn_with_kvcache"](num_splits=torch.tensor(1))
    with pytest.raises(fa4.InvalidArgumentError,
                       match=refused("fa4.flash_attn_varlen_func", "max_seqlen_q", "int")):
        x = torch.zeros(8, 2, 16)
        cu = torch.tensor([0, 8], dtype=torch.int32)
        fa4.flash_attn_varlen_func(x, x, x, cu, cu, torch.tensor(8), 8)


def test_errors_name_the_public_function(gen):
    # An error raised on the torch route names the function the user called, not the custom op
    # that may carry the call (fa4::fwd, fa4::fwd_kvcache), whether or not autograd records it;
    # a direct call of the op names the op. (The library's own errors name its function:
    # fa4::forward, fa4::forward_with_kvcache.)
    q = _randn(gen, (1, 8, 2, 16), torch.float32)
    q64 = q.double()
    cu, cu64 = torch.tensor([0, 8], dtype=torch.int32), torch.tensor([0, 8], dtype=torch.int64)
    for x in (q64, q64.clone().requires_grad_()):  # without and with autograd
        with pytest.raises(fa4.InvalidArgumentError,
                           match=r"^fa4\.flash_attn_func: q\.dtype = torch\.float64 is not supported"):
            fa4.flash_attn_func(x, x, x)
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4\.flash_attn_func: sink\.dtype = torch\.float64 is not supported"):
        fa4.flash_attn_func(q, q, q, sink=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4\.flash_attn_varlen_func: cu_seqlens_q\.dtype = torch\.int64"):
        fa4.flash_attn_varlen_func(q[0], q[0], q[0], cu64, cu64, 8, 8)
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4\.flash_attn_varlen_func: max_seqlen_k = '8' must be an int$"):
        fa4.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, "8")
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4\.flash_attn_with_kvcache: cache_seqlens\.dtype = torch\.int64 "
                             r"is not supported; cache_seqlens must be torch\.int32$"):
        fa4.flash_attn_with_kvcache(q, q, q, cache_seqlens=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4\.flash_attn_with_kvcache: q\.dtype = torch\.float64 is not supported"):
        fa4.flash_attn_with_kvcache(q64, q64, q64)
    # The ops called directly.
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4::fwd: q\.dtype = torch\.float64 is not supported"):
        torch.ops.fa4.fwd(q64, q64, q64, None, None, None, None, 0, 0, None, False, -1, -1, 0.0,
                          None, None, "auto", False)
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"^fa4::fwd_kvcache: cache_seqlens\.dtype = torch\.int64"):
        torch.ops.fa4.fwd_kvcache(q, q.clone(), q.clone(), None, None,
                                  torch.zeros(1, dtype=torch.int64), None, None, None, None, False,
                                  -1, -1, 0.0, 0, None, None, "auto")


def test_compile_fullgraph_float_options(gen):
    # The option checks run in traced Python: float options given as the compiled function's
    # arguments (dynamo may make them symbolic after the first recompilation) and ints / NumPy
    # scalars as constants compile with no graph break and equal the eager calls.
    q = _randn(gen, (1, 16, 2, 32), torch.float32)

    def f(q, scale, softcap):
        return fa4.flash_attn_func(q, q, q, softmax_scale=scale, softcap=softcap, causal=True,
                                   exp2_emulation_fraction=0.0)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    for scale, softcap in ((0.25, 3.0), (0.3, 4.0), (0.35, 5.0)):
        torch.testing.assert_close(compiled(q, scale, softcap), f(q, scale, softcap), rtol=0, atol=0)
    g = torch.compile(lambda q: fa4.flash_attn_func(q, q, q, softcap=3, softmax_scale=np.float32(0.5),
                                                    return_lse=1)[0], fullgraph=True,
                      backend="aot_eager")
    torch.testing.assert_close(g(q), fa4.flash_attn_func(q, q, q, softcap=3.0, softmax_scale=0.5),
                               rtol=0, atol=0)


def test_describe_torch_packs_every_field():
    from fa4 import _capi, _core

    base = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    for x in (base, base[:, :, ::2], base.transpose(1, 2), base[0, 1], base[0, 0, 0],
              torch.zeros((), dtype=torch.bfloat16), torch.zeros(3, 0, dtype=torch.int32),
              base.half().expand(2, 3, 4, 5)[:, :1]):
        want = _capi.Tensor()
        want.data, want.dtype, want.ndim = x.data_ptr(), _core._torch_dtype_code(x.dtype), x.dim()
        for d in range(x.dim()):
            want.shape[d], want.stride[d] = x.shape[d], x.stride(d)
        want.device_type = _capi.DEVICE_CPU
        assert bytes(_core.describe(x, "x", "test")) == bytes(want), x.shape
    with pytest.raises(fa4.InvalidArgumentError, match=r"test: x has 5 dims \(1, 1, 1, 1, 1\)"):
        _core.describe(torch.zeros((1,) * 5), "x", "test")
    with pytest.raises(fa4.InvalidArgumentError,
                       match="test: x is on device 'meta'; fa4 takes CPU or CUDA tensors"):
        _core.describe(torch.zeros(2, device="meta"), "x", "test")
    with pytest.raises(fa4.InvalidArgumentError, match=r"test: x.dtype = torch.float64 is not"):
        _core.describe(torch.zeros(2, dtype=torch.float64), "x", "test")


def _op_args(gen, device="cpu", dtype=torch.float32):
    q = _randn(gen, (2, 16, 4, 32), dtype, device, True)
    k = _randn(gen, (2, 24, 2, 32), dtype, device, True)
    v = _randn(gen, (2, 24, 2, 32), dtype, device, True)
    sink = _randn(gen, (4,), torch.float32, device, True)
    return (q, k, v, sink, None, None, None, 0, 0, None, True, -1, -1, 0.0, None, 0.0, "auto",
            False)


def test_opcheck_fwd_and_bwd(gen):
    args = _op_args(gen)
    torch.library.opcheck(torch.ops.fa4.fwd.default, args)
    out, lse = torch.ops.fa4.fwd(*args)
    dout = torch.randn(out.shape, generator=gen)
    bargs = (dout, *[a.detach() for a in args[:3]], out.detach(), lse, args[3].detach(),
             *args[4:])
    torch.library.opcheck(torch.ops.fa4.bwd.default, bargs)


def _eager_vs_custom_op(gen, device, dtype, grads):
    """Eager calls skip the custom-op dispatcher (fa4._torch_ops.attention); they must give the
    same out, lse and (where a backward exists) gradients, bitwise, as torch.ops.fa4.fwd with its
    registered autograd."""
    args = _op_args(gen, device, dtype)
    q, k, v, sink = args[:4]
    out_op, lse_op = torch.ops.fa4.fwd(*args)
    out, lse = fa4.flash_attn_func(q, k, v, causal=True, sink=sink, return_lse=True,
                                   exp2_emulation_fraction=0.0)
    assert out.requires_grad and not lse.requires_grad
    # The eager call really took the bypass (an autograd.Function), the op its registered autograd.
    assert type(out.grad_fn).__name__ == "_FwdFunctionBackward"
    assert type(out_op.grad_fn).__name__ != "_FwdFunctionBackward"
    assert torch.equal(out, out_op) and torch.equal(lse, lse_op)
    if grads:
        w = torch.linspace(-1, 1, out.shape[-1], device=device)
        g_op = torch.autograd.grad((out_op.float() * w).sum(), (q, k, v, sink))
        g = torch.autograd.grad((out.float() * w).sum(), (q, k, v, sink))
        for a, b in zip(g, g_op):
            assert torch.equal(a, b)
    with torch.no_grad():  # no autograd graph at all on this path
        out_ng = fa4.flash_attn_func(q, k, v, causal=True, sink=sink, exp2_emulation_fraction=0.0)
    assert out_ng.grad_fn is None and torch.equal(out_ng, out_op)


def test_eager_path_matches_custom_op(gen):
    _eager_vs_custom_op(gen, "cpu", torch.float32, grads=True)


def test_negative_bit_views_are_read_negated(gen):
    # torch keeps some negations lazy (a view with the negative bit: the imaginary part of a
    # conjugate, torch._neg_view); fa4 reads memory, so such inputs are materialised first.
    q, k, v = (_randn(gen, (1, 9, 2, 16), torch.float32) for _ in range(3))
    want = fa4.flash_attn_func(q.neg(), k, v, causal=True)
    got = fa4.flash_attn_func(torch._neg_view(q), k, v, causal=True)
    assert torch.equal(got, want)
    qg = torch._neg_view(q).detach().requires_grad_()
    fa4.flash_attn_func(qg, k, torch._neg_view(v), causal=True).sum().backward()
    qr = q.neg().requires_grad_()
    fa4.flash_attn_func(qr, k, v.neg(), causal=True).sum().backward()
    assert torch.equal(qg.grad, qr.grad)
    kc = torch.zeros(1, 8, 2, 16)
    with pytest.raises(ValueError, match="negative bit"):
        fa4.flash_attn_with_kvcache(q[:, :1], torch._neg_view(kc), kc)


def test_eager_path_edge_cases(gen):
    q, k, v, sink = (a.detach() for a in _op_args(gen)[:4])
    kw = dict(causal=True, exp2_emulation_fraction=0.0)
    # Only the sink requires grad (a learnable nn.Parameter): still the bypass, and its gradient
    # equals the op route's.
    p = torch.nn.Parameter(sink.clone())
    out = fa4.flash_attn_func(q, k, v, sink=p, **kw)
    assert type(out.grad_fn).__name__ == "_FwdFunctionBackward"
    (g,) = torch.autograd.grad(out.sum(), (p,))
    p2 = sink.clone().requires_grad_()
    out_op, _ = torch.ops.fa4.fwd(q, k, v, p2, None, None, None, 0, 0, None, True, -1, 0, 0.0,
                                  None, 0.0, "auto", False)
    (g_op,) = torch.autograd.grad(out_op.sum(), (p2,))
    assert torch.equal(g, g_op)
    with torch.inference_mode():
        assert torch.equal(fa4.flash_attn_func(q, k, v, sink=sink, **kw), out_op.detach())
    # Second order: not supported on either route, and it must say so rather than drop the term.
    qg = q.clone().requires_grad_()
    for call in (lambda x: fa4.flash_attn_func(x, k, v, **kw),
                 lambda x: torch.ops.fa4.fwd(x, k, v, None, None, None, None, 0, 0, None, True, -1,
                                             0, 0.0, None, 0.0, "auto", False)[0]):
        (gq,) = torch.autograd.grad(call(qg).pow(2).sum(), (qg,), create_graph=True)
        with pytest.raises(RuntimeError, match="first-order only"):
            gq.pow(2).sum().backward()
        # A gradient penalty weights the output by a constant: the incoming gradient needs no
        # grad, the second-order term runs through q alone (torch's once_differentiable misses it).
        w = torch.randn_like(q)
        (gq,) = torch.autograd.grad((call(qg) * w).sum(), (qg,), create_graph=True)
        with pytest.raises(RuntimeError, match="first-order only"):
            gq.pow(2).sum().backward()
        # ... and so must autograd.grad towards an input (a Hessian-vector product): the raising
        # node lies on the path to q (behind detached copies alone, q was "not used in the graph",
        # and allow_unused=True returned None, a second derivative taken as absent).
        for unused in (False, True):
            with pytest.raises(RuntimeError, match="first-order only"):
                torch.autograd.grad(gq.pow(2).sum(), (qg,), retain_graph=True, allow_unused=unused)
        # create_graph=True alone is fine where the gradients are only read.
        (gq,) = torch.autograd.grad((call(qg) * w).sum(), (qg,), create_graph=True)
        (gq_ref,) = torch.autograd.grad((call(qg) * w).sum(), (qg,))
        assert torch.equal(gq.detach(), gq_ref)
    # torch.jit.trace must record the op, not just the output allocations of the bypass.
    traced = torch.jit.trace(lambda x: fa4.flash_attn_func(x, k, v, **kw), (q,), check_trace=False)
    torch.testing.assert_close(traced(2 * q), fa4.flash_attn_func(2 * q, k, v, **kw), rtol=0, atol=0)
    # A dispatch mode (here the flop counter) sees fa4::fwd.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Seen.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen():
        fa4.flash_attn_func(q, k, v, **kw)
    assert any("fa4.fwd" in o for o in Seen.ops), Seen.ops


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_no_graph_break(gen, backend):
    q, k, v, sink = _op_args(gen)[:4]

    def loss(q, k, v, sink):
        out = fa4.flash_attn_func(q, k, v, causal=True, sink=sink, exp2_emulation_fraction=0.0)
        return (out.float() * torch.linspace(-1, 1, out.shape[-1])).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True, backend=backend)  # raises on any graph break
    eager_grads = torch.autograd.grad(loss(q, k, v, sink), (q, k, v, sink))
    value = compiled(q, k, v, sink)
    comp_grads = torch.autograd.grad(value, (q, k, v, sink))
    torch.testing.assert_close(value, loss(q, k, v, sink))
    for a, b in zip(comp_grads, eager_grads):
        torch.testing.assert_close(a, b)


# ---- CUDA (skipped without a GPU) ----------------------------------------------------------------
CUDA_CASES = [
    dict(b=2, sq=200, sk=333, h=4, hkv=2, d=64),
    dict(b=1, sq=300, sk=300, h=8, hkv=1, d=128, causal=True),
    dict(b=2, sq=130, sk=260, h=4, hkv=4, d=64, window_size=(40, 7)),
    dict(b=1, sq=1, sk=500, h=8, hkv=2, d=128, causal=True),
    dict(b=1, sq=150, sk=150, h=4, hkv=2, d=96, causal=True, softcap=3.0, sink=True),
]
CUDA_IDS = ["gqa", "causal_mqa", "window", "decode", "softcap_sink"]


# The library's reason for a head-dim bucket left out of a partial build (src/hopper/hopper_api.cu);
# the C++ GPU tests skip on the same substring (tests/gpu/gpu_test_util.cuh).
_NOT_COMPILED = "was not compiled in this build"


def _skip_without_forward_kernel(q, k, v, opts):
    """Skips (naming the reason) a case whose forward kernel this build left out: a head-dim bucket
    of a partial build (CMake FA4_HOPPER_HEADDIMS). Any other refusal fails the test: a full build
    has a kernel for every case here, so a refusal is a regression, never a skip."""
    ok, why = fa4.forward_support(q, k, v, torch.empty_like(q), torch.empty(
        q.shape[0], q.shape[2], q.shape[1], device="cuda"), **opts)
    if not ok:
        if _NOT_COMPILED in why:
            pytest.skip(f"no Hopper kernel for this case in this build: {why}")
        pytest.fail(f"fa4.forward_support refused a case the Hopper kernels must run: {why}")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cfg", CUDA_CASES, ids=CUDA_IDS)
def test_cuda_forward_matches_fp64(gen, dtype, cfg):
    if not fa4.has_cuda():
        pytest.fail("a CUDA GPU is present but libfa4 was built without CUDA")
    q, k, v, opts = _run_case(gen, dtype, "cuda", cfg)
    _skip_without_forward_kernel(q, k, v, opts)
    out, lse = fa4.flash_attn_func(q, k, v, return_lse=True, **opts)
    o64, l64 = ref_attention(q, k, v, **opts)
    op, lp = ref_attention(q, k, v, upcast=False, **opts)
    _assert_rule("out", out, o64, op, dtype)
    _assert_rule("lse", lse, l64, lp.float(), torch.float32, atol_scale=4.0)


@needs_cuda
def test_cuda_runs_on_current_stream(gen):
    q = _randn(gen, (2, 256, 4, 64), torch.bfloat16, "cuda")
    expected = fa4.flash_attn_func(q, q, q, causal=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = fa4.flash_attn_func(q, q, q, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("cfg", CUDA_CASES, ids=CUDA_IDS)
def test_cuda_autograd_matches_fp64(gen, dtype, cfg):
    # The Hopper backward through torch autograd: dq, dk, dv (and dsink) against float64 autograd.
    if not fa4.has_cuda():
        pytest.fail("a CUDA GPU is present but libfa4 was built without CUDA")
    q, k, v, opts = _run_case(gen, dtype, "cuda", cfg)
    _skip_without_forward_kernel(q, k, v, opts)
    out = fa4.flash_attn_func(q, k, v, **opts)
    o64, _ = ref_attention(q, k, v, **opts)
    op, _ = ref_attention(q, k, v, upcast=False, **opts)
    dout = _randn(gen, out.shape, dtype, "cuda")
    inputs = [q, k, v] + ([opts["sink"]] if "sink" in opts else [])
    try:
        g = torch.autograd.grad(out, inputs, dout)
    except fa4.UnsupportedError as e:  # the backward's bucket left out of a partial build (d96 runs on d128's)
        if _NOT_COMPILED in str(e):
            pytest.skip(f"no Hopper backward kernel for this case in this build: {e}")
        raise
    g64 = torch.autograd.grad(o64, inputs, dout.double())
    gp = torch.autograd.grad(op, inputs, dout)
    for name, a, r, p in zip(["dq", "dk", "dv", "dsink"], g, g64, gp):
        assert torch.isfinite(a).all(), name
        _assert_rule(name, a, r, p, dtype if name != "dsink" else torch.float32, atol_scale=4.0)


@needs_cuda
def test_cuda_deterministic_backward_is_bitwise(gen):
    q, k, v = (_randn(gen, (1, 1024, 4, 64), torch.bfloat16, "cuda", True) for _ in range(3))
    dout = _randn(gen, (1, 1024, 4, 64), torch.bfloat16, "cuda")
    runs = [torch.autograd.grad(fa4.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
            for _ in range(5)]
    for r in runs[1:]:
        for a, b in zip(r, runs[0]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_backward_reads_broadcast_out_and_lse(gen, device):
    """out and lse are the backward's inputs: broadcast ones (stride 0) are read like any input.
    Two sequences with equal q, k, v and dout; the backward on sequence 0's out and lse expanded
    over the batch gives the bits of the backward on each sequence's own (which are NaN now)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = (_randn(gen, (1, 200, 4, 64), dtype, device).expand(2, -1, -1, -1).contiguous()
               for _ in range(3))
    dout = _randn(gen, (1, 200, 4, 64), dtype, device).expand(2, -1, -1, -1).contiguous()
    out, lse = torch.ops.fa4.fwd(q, k, v, None, None, None, None, 0, 0, None, True, -1, -1, 0.0,
                                 None, None, "auto", False)
    rest = (None, None, None, None, 0, 0, None, True, -1, -1, 0.0, None, None, "auto", False)
    want = torch.ops.fa4.bwd(dout, q, k, v, out, lse, *rest)
    out_b, lse_b = out[:1].expand(2, -1, -1, -1), lse[:1].expand(2, -1, -1)
    assert out_b.stride(0) == 0 and lse_b.stride(0) == 0
    out[1:] = float("nan")
    lse[1:] = float("nan")
    got = torch.ops.fa4.bwd(dout, q, k, v, out_b, lse_b, *rest)
    for a, b in zip(got[:3], want[:3]):
        assert not a.isnan().any() and torch.equal(a, b)


def test_release_cached_memory_device_argument():
    fa4.release_cached_memory(1 << 20)  # nothing cached there: a no-op
    for bad, rule in [("cpu", "is not a CUDA device"), (True, "must be a CUDA device index"),
                      (1.5, "is not a device"), ("gpu7", "is not a device")]:
        with pytest.raises(fa4.InvalidArgumentError, match=f"fa4.release_cached_memory: device = .* {rule}"):
            fa4.release_cached_memory(bad)
    with pytest.raises(fa4.InvalidArgumentError, match="device_index = -1 must be >= 0"):
        fa4.release_cached_memory(-1)
    # int32 in the C ABI: 2^32 wrapped to device 0, 2^32 - 1 to -1.
    for bad in (2 ** 32, 2 ** 32 - 1):
        for fn in (fa4.release_cached_memory, fa4.check_async_errors):
            with pytest.raises(fa4.InvalidArgumentError,
                               match=rf"fa4.{fn.__name__}: device = {bad} does not fit in int32"):
                fn(bad)


@needs_cuda
def test_cuda_backward_workspace_from_torch_and_release(gen):
    # The backward's workspace (a dQ accumulator of 2 x 2048 rows x 8 heads x 64 fp32, 8.4 MB, and
    # row statistics) comes from torch's caching allocator: torch's peak memory during the
    # backward covers it. fa4's own cache released between two runs (a smoke test of the call:
    # what it frees is checked by the C++ suite), the second gives the same bits.
    q, k, v = (_randn(gen, (2, 2048, 8, 64), torch.bfloat16, "cuda", True) for _ in range(3))
    dout = _randn(gen, (2, 2048, 8, 64), torch.bfloat16, "cuda")

    def run():
        out = fa4.flash_attn_func(q, k, v, causal=True, deterministic=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        grad_bytes = sum(g.numel() * g.element_size() for g in grads)
        assert torch.cuda.max_memory_allocated() - base >= grad_bytes + 2 * 2048 * 8 * 64 * 4
        return (out,) + grads

    first = run()
    fa4.release_cached_memory(q.device)
    second = run()
    fa4.release_cached_memory()
    for name, a, b in zip(["out", "dq", "dk", "dv"], first, second):
        assert torch.isfinite(a).all() and torch.equal(a, b), name


@needs_cuda
def test_cuda_eager_path_matches_custom_op(gen):
    _eager_vs_custom_op(gen, "cuda", torch.bfloat16, grads=True)


@needs_cuda
def test_cuda_compile_fullgraph(gen):
    q = _randn(gen, (2, 128, 4, 64), torch.bfloat16, "cuda")
    f = torch.compile(lambda q: fa4.flash_attn_func(q, q, q, causal=True) * 2, fullgraph=True)
    torch.testing.assert_close(f(q), fa4.flash_attn_func(q, q, q, causal=True) * 2)


@needs_cuda
def test_cuda_graph_capture_and_replay_split_kv(gen):
    # Few query tiles and long keys: the Hopper forward splits the keys over the idle SMs (stream-K,
    # a cooperative launch with scratch the kernel leaves zeroed, src/hopper/shared/device_state.h).
    # It must be capturable in a CUDA graph, and every replay must give the eager result bitwise,
    # on fresh inputs copied into the captured buffers. 256 query rows per KV head: more than the
    # selector sends to the decode kernel (hopper_api.cu kSmallQMaxRows), so the forward runs.
    q = _randn(gen, (1, 256, 4, 128), torch.bfloat16, "cuda")
    k = _randn(gen, (1, 8192, 4, 128), torch.bfloat16, "cuda")
    v = _randn(gen, (1, 8192, 4, 128), torch.bfloat16, "cuda")
    ok, kernel = fa4.forward_support(q, k, v, torch.empty_like(q), torch.empty(1, 4, 256, device="cuda"))
    assert ok and kernel.startswith("hopper::fwd_"), kernel
    for out in _replays_on_fresh_inputs(gen, lambda: fa4.flash_attn_func(q, k, v), (q, k, v)):
        o64, _ = ref_attention(q, k, v)
        op, _ = ref_attention(q, k, v, upcast=False)
        _assert_rule("out", out, o64, op, torch.bfloat16)


def _replays_on_fresh_inputs(gen, call, inputs, replays=2):
    """Captures call() (after a warm-up outside the capture) in a CUDA graph, then per replay:
    fresh random inputs copied into the captured buffers, the output poisoned, a replay that must
    equal an eager call bitwise. Yields the replayed output each time."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for _ in range(replays):
        for t in inputs:
            t.copy_(_randn(gen, tuple(t.shape), t.dtype, "cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call())
        yield out


@needs_cuda
def test_cuda_varlen_graph_capture_and_async_index_errors(gen):
    # Device-resident cu_seqlens are not read by the host (no sync per call), so a varlen call
    # captures in a CUDA graph; replays on fresh inputs give the eager result bitwise.
    lens_q, lens_k = [300, 1, 0, 700], [500, 900, 5, 700]
    cu_q = torch.tensor([0, 300, 301, 301, 1001], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 500, 1400, 1405, 2105], dtype=torch.int32, device="cuda")
    q = _randn(gen, (1001, 8, 128), torch.bfloat16, "cuda")
    k = _randn(gen, (2105, 2, 128), torch.bfloat16, "cuda")
    v = _randn(gen, (2105, 2, 128), torch.bfloat16, "cuda")
    args = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lens_q),
                max_seqlen_k=max(lens_k), causal=True)
    out = None
    for out in _replays_on_fresh_inputs(gen, lambda: fa4.flash_attn_varlen_func(q, k, v, **args),
                                        (q, k, v)):
        pass
    assert out is not None
    # A decreasing cu_seqlens_q: that sequence is skipped (rows untouched) and reported by the next
    # call on the device, which raises instead of running; then the record is clear.
    bad_q = torch.tensor([0, 300, 250, 301, 1001], dtype=torch.int32, device="cuda")
    fa4.flash_attn_varlen_func(q, k, v, **dict(args, cu_seqlens_q=bad_q))
    torch.cuda.synchronize()
    with pytest.raises(fa4.InvalidArgumentError, match="cu_seqlens_q must start at 0, be non-decreasing"):
        fa4.flash_attn_varlen_func(q, k, v, **args)
    fa4.check_async_errors(q.device)  # cleared by the report
    torch.cuda.synchronize()
    assert torch.equal(out, fa4.flash_attn_varlen_func(q, k, v, **args))
