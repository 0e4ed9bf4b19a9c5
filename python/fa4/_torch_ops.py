"""torch integration: the custom ops ``fa4::fwd`` / ``fa4::bwd`` and autograd through fa4's backward.

The ops are registered with ``torch.library.custom_op`` (no C++ extension, no compilation against
torch): the real kernels call libfa4 through ctypes, the fake kernels give shapes to
``torch.compile`` / FakeTensor tracing, and ``register_autograd`` connects the backward, so
``torch.compile(fullgraph=True)`` traces through fa4 with no graph break.

Eager calls on plain CPU/CUDA tensors skip the dispatcher (it cost more host time than a short
kernel runs): they call the same implementation directly, with autograd through an equivalent
``torch.autograd.Function`` (first-order only, like the op's). Traced or intercepted calls keep
the op: torch.compile / export, ``torch.jit.trace``, active TorchDispatchMode / TorchFunctionMode
(FlopCounterMode, ``with torch.device(...)``, ...) and tensor subclasses other than nn.Parameter.
``torch.func`` transforms are not supported on either route.

CUDA tensors run on ``torch.cuda.current_stream()`` of their device; CPU tensors run the CPU
FlashAttention-4 implementation. Where libfa4 has no kernel (e.g. the CUDA backward before it
exists) the call raises fa4.UnsupportedError, a NotImplementedError; fa4 never falls back silently.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _capi, _core

_FN_FWD = "fa4::fwd"
_FN_BWD = "fa4::bwd"


def _last_dim_contiguous(x: Tensor) -> Tensor:
    # libfa4 needs stride 1 on the last dim; other strides are free, so only that case is copied
    # (e.g. autograd's expanded gradients, which have stride 0 everywhere).
    if x.dim() > 0 and x.size(-1) > 1 and x.stride(-1) != 1:
        return x.contiguous()
    return x


def _options(fn, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
             softmax_scale, causal, window_size_left, window_size_right, softcap,
             rescale_threshold, exp2_emulation_fraction, backend, deterministic, streams=None):
    return _core.CallOptions(
        fn, softmax_scale=softmax_scale, causal=causal,
        window_size=(window_size_left, window_size_right), softcap=softcap, sink=sink,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        rescale_threshold=rescale_threshold, exp2_emulation_fraction=exp2_emulation_fraction,
        backend=backend, deterministic=deterministic, streams=streams)


class _DeviceGuard:
    """Makes the tensor's CUDA device current for the call (a no-op for CPU tensors)."""

    def __init__(self, x: Tensor):
        # Entering torch.cuda.device costs a few microseconds per call: skip it when x's device
        # is already current (the common case).
        switch = x.device.type == "cuda" and x.device.index != torch.cuda.current_device()
        self._ctx = torch.cuda.device(x.device) if switch else None

    def __enter__(self):
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def _is_varlen(cu_seqlens_q, cu_seqlens_k) -> bool:
    return cu_seqlens_q is not None or cu_seqlens_k is not None


def _fwd_outputs(q: Tensor, v: Tensor, varlen: bool, fake: bool):
    out_shape, lse_shape = _core.output_shapes(q.shape, v.shape, varlen, _FN_FWD)
    if fake or not varlen:
        return (q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32))
    # Varlen rows outside every sequence are left untouched by the library: define them.
    return (q.new_zeros(out_shape),
            torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device))


def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, sink: Optional[Tensor],
              cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
              seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
              softmax_scale: Optional[float], causal: bool, window_size_left: int,
              window_size_right: int, softcap: float, rescale_threshold: Optional[float],
              exp2_emulation_fraction: Optional[float], backend: str,
              deterministic: bool) -> tuple[Tensor, Tensor]:
    """fa4 forward: (out, lse). Layouts of include/fa4/attention.h (batched, or varlen when
    cu_seqlens are given). `deterministic` is only carried to the backward."""
    q, k, v = (_last_dim_contiguous(x) for x in (q, k, v))
    out, lse = _fwd_outputs(q, v, _is_varlen(cu_seqlens_q, cu_seqlens_k), fake=False)
    streams = {}
    opts = _options(_FN_FWD, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right,
                    softcap, rescale_threshold, exp2_emulation_fraction, backend, deterministic,
                    streams)
    with _DeviceGuard(q):
        ts = [_core.describe(x, n, _FN_FWD, streams)
              for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
        _capi.forward(*ts, opts.struct)
    return out, lse


fwd = torch.library.custom_op(_FN_FWD, _fwd_impl, mutates_args=())


@fwd.register_fake
def _fwd_fake(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
              softmax_scale, causal, window_size_left, window_size_right, softcap,
              rescale_threshold, exp2_emulation_fraction, backend, deterministic):
    return _fwd_outputs(q, v, _is_varlen(cu_seqlens_q, cu_seqlens_k), fake=True)


def _bwd_outputs(q, k, v, sink, varlen: bool, fake: bool):
    # dq/dk/dv: contiguous, same dtype as q/k/v. Varlen rows outside every sequence and dk/dv rows
    # past seqused_k are untouched by the library, and their true gradient is 0: zero-fill them.
    make = (lambda x: x.new_empty(x.shape)) if (fake or not varlen) else (
        lambda x: x.new_zeros(x.shape))
    dsink_shape = (sink.shape[0],) if sink is not None else (0,)
    dsink = q.new_empty(dsink_shape, dtype=torch.float32)
    return make(q), make(k), make(v), dsink


def _bwd_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
              sink: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
              cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor], max_seqlen_q: int,
              max_seqlen_k: int, softmax_scale: Optional[float], causal: bool,
              window_size_left: int, window_size_right: int, softcap: float,
              rescale_threshold: Optional[float], exp2_emulation_fraction: Optional[float],
              backend: str, deterministic: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """fa4 backward: (dq, dk, dv, dsink); dsink has shape (0,) when there is no sink."""
    dout, q, k, v, out = (_last_dim_contiguous(x) for x in (dout, q, k, v, out))
    dq, dk, dv, dsink = _bwd_outputs(q, k, v, sink, _is_varlen(cu_seqlens_q, cu_seqlens_k),
                                     fake=False)
    streams = {}
    opts = _options(_FN_BWD, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right,
                    softcap, rescale_threshold, exp2_emulation_fraction, backend, deterministic,
                    streams)
    with _DeviceGuard(q):
        ts = [_core.describe(x, n, _FN_BWD, streams)
              for x, n in ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"), (out, "out"),
                           (lse, "lse"), (dq, "dq"), (dk, "dk"), (dv, "dv"))]
        tsink = _core.describe(dsink, "dsink", _FN_BWD, streams) if sink is not None else None
        _capi.backward(*ts, tsink, opts.struct)
    return dq, dk, dv, dsink


bwd = torch.library.custom_op(_FN_BWD, _bwd_impl, mutates_args=())


@bwd.register_fake
def _bwd_fake(dout, q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
              max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size_left,
              window_size_right, softcap, rescale_threshold, exp2_emulation_fraction, backend,
              deterministic):
    return _bwd_outputs(q, k, v, sink, _is_varlen(cu_seqlens_q, cu_seqlens_k), fake=True)


# ---- autograd -------------------------------------------------------------------------------------
_N_FWD_INPUTS = 18  # the number of fa4::fwd arguments; backward returns one gradient slot for each


def _setup_context(ctx, inputs, output):
    (q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, *scalars) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k)
    ctx.scalars = scalars  # max_seqlen_q ... deterministic, in fa4::fwd's order
    # lse is a by-product (fp32 log-sum-exp): fa4's backward takes no dlse, so lse is a constant
    # for autograd rather than a silently wrong gradient path.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k = ctx.saved_tensors
    bwd_call = torch.ops.fa4.bwd if _use_custom_op(dout, q) else _bwd_impl
    dq, dk, dv, dsink = bwd_call(dout, q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k,
                                 seqused_k, *ctx.scalars)
    grads = [dq, dk, dv, dsink if sink is not None else None]
    return tuple(grads + [None] * (_N_FWD_INPUTS - len(grads)))


torch.library.register_autograd(_FN_FWD, _backward, setup_context=_setup_context)


# ---- eager calls without the custom-op dispatcher -------------------------------------------------
# A call through torch.ops.fa4.fwd cost 179 us of host time on the H200 machine (torch 2.11), of
# which 15 us in libfa4 and 61 us describing the tensors (bench/host_overhead.py): more than a
# short attention kernel runs (d128 causal seqlen 512: ~140 us). Eager calls on plain CPU/CUDA
# tensors therefore run the same implementation directly, with autograd through an equivalent
# autograd.Function. Everything that must see the op keeps it: traced code (torch.compile, export,
# torch.jit.trace, which would otherwise record only the output allocations), dispatch and function
# modes (flop counters, debug modes, `with torch.device(...)`), and tensor subclasses (FakeTensor,
# DTensor, ...; nn.Parameter is a plain tensor here).
_PLAIN_TENSOR_TYPES = (Tensor, torch.nn.Parameter)


def _modes_active() -> bool:
    c = torch._C
    return (getattr(c, "_len_torch_dispatch_stack", lambda: 0)() > 0
            or getattr(c, "_is_torch_function_mode_enabled", lambda: False)())


def _use_custom_op(*tensors) -> bool:
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _modes_active():
        return True
    return any(t is not None and (type(t) not in _PLAIN_TENSOR_TYPES
                                  or t.device.type not in ("cuda", "cpu"))
               for t in tensors)


class _FwdFunction(torch.autograd.Function):
    """Eager autograd for _fwd_impl: the same saved state and backward as the custom op's.
    First-order only, like the op (whose backward op has no autograd formula): a double backward
    raises instead of silently dropping the second-order term."""

    @staticmethod
    def forward(ctx, *inputs):
        out, lse = _fwd_impl(*inputs)
        _setup_context(ctx, inputs, (out, lse))
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)


# ---- the user-facing torch path -------------------------------------------------------------------
def attention(q, k, v, *, fn, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
              max_seqlen_q=0, max_seqlen_k=0, softmax_scale=None, causal=False,
              window_size=(-1, -1), softcap=0.0, sink=None, deterministic=False,
              rescale_threshold=None, exp2_emulation_fraction=None, backend="auto"):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise _capi.InvalidArgumentError(
                f"{fn}: {name} is a {type(x).__name__}; q, k, v must all be torch.Tensor or all "
                "numpy.ndarray")
    left, right = _core.normalize_window(window_size, fn)
    _core.backend_code(backend, fn)  # reject a bad name here, with this function's name
    args = (q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
            None if softmax_scale is None else float(softmax_scale), bool(causal), left, right,
            float(softcap), None if rescale_threshold is None else float(rescale_threshold),
            None if exp2_emulation_fraction is None else float(exp2_emulation_fraction), backend,
            bool(deterministic))
    if _use_custom_op(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k):
        return torch.ops.fa4.fwd(*args)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sink)):
        return _FwdFunction.apply(*args)
    return _fwd_impl(*args)
