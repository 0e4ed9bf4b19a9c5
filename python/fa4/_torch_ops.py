"""torch integration: the custom ops ``fa4::fwd`` / ``fa4::bwd`` and autograd through fa4's backward.

The ops are registered with ``torch.library.custom_op`` (no C++ extension, no compilation against
torch): the real kernels call libfa4 through fa4._fastpath (C against Python's headers; see below)
or ctypes, the fake kernels give shapes to ``torch.compile`` / FakeTensor tracing, and
``register_autograd`` connects the backward, so ``torch.compile(fullgraph=True)`` traces through
fa4 with no graph break.

Eager calls on plain CPU/CUDA tensors skip the dispatcher (it cost more host time than a short
kernel runs): they call the same implementation directly, with autograd through an equivalent
``torch.autograd.Function`` (first-order only, like the op's). Traced or intercepted calls keep
the op: torch.compile / export, ``torch.jit.trace``, active TorchDispatchMode / TorchFunctionMode
(FlopCounterMode, ``with torch.device(...)``, ...) and tensor subclasses other than nn.Parameter.
``torch.func`` transforms are not supported on either route.

CUDA tensors run on ``torch.cuda.current_stream()`` of their device (forward and backward: the
Hopper kernels); CPU tensors run the CPU FlashAttention-4 implementation. Where libfa4 has no
kernel (e.g. a CUDA head dim that is no multiple of 8) the call raises fa4.UnsupportedError, a
NotImplementedError; fa4 never falls back silently.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import _capi, _core

_FN_FWD = "fa4::fwd"
_FN_BWD = "fa4::bwd"


def _last_dim_contiguous(x: Tensor) -> Tensor:
    # libfa4 reads an input's memory as it is: a view with torch's lazy negative bit (the imaginary
    # part of a conjugate, torch._neg_view) is materialised first. libfa4 needs stride 1 on the
    # last dim; other strides are free, so only that case is copied (e.g. autograd's expanded
    # gradients, which have stride 0 everywhere).
    if x.is_neg():
        x = x.resolve_neg()
    shape = x.shape
    if shape and shape[-1] > 1 and x.stride()[-1] != 1:
        return x.contiguous()
    return x


# Options without tensors (no sink, no varlen indices) depend on the scalars only and libfa4 only
# reads them: built once per distinct set of scalars (a dict lookup instead of ~2 us of ctypes
# field writes per call), at most _OPTIONS_CACHE_SIZE sets kept.
_OPTIONS_CACHE: dict = {}
_OPTIONS_CACHE_SIZE = 256


def _options(fn, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
             softmax_scale, causal, window_size_left, window_size_right, softcap,
             rescale_threshold, exp2_emulation_fraction, backend, deterministic, streams=None):
    key = None
    if sink is None and cu_seqlens_q is None and cu_seqlens_k is None and seqused_k is None:
        # type() in the key: True and 1 (or 1 and 1.0) hash alike, and must not share a check.
        key = (max_seqlen_q, type(max_seqlen_q), max_seqlen_k, type(max_seqlen_k), softmax_scale,
               causal, window_size_left, type(window_size_left), window_size_right,
               type(window_size_right), softcap, rescale_threshold, exp2_emulation_fraction,
               backend, deterministic)
        try:
            hit = _OPTIONS_CACHE.get(key)
        except TypeError:  # an unhashable argument: built (and checked) every time
            hit = key = None
        if hit is not None:
            return hit
    # By position: CallOptions(fn, softmax_scale, causal, window_size, softcap, sink,
    # cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, rescale_threshold,
    # exp2_emulation_fraction, backend, deterministic, streams).
    opts = _core.CallOptions(
        fn, softmax_scale, causal, (window_size_left, window_size_right), softcap, sink,
        cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, rescale_threshold,
        exp2_emulation_fraction, backend, deterministic, streams)
    if key is not None:
        if len(_OPTIONS_CACHE) >= _OPTIONS_CACHE_SIZE:
            _OPTIONS_CACHE.clear()
        _OPTIONS_CACHE[key] = opts
    return opts


# torch.cuda.current_device() minus its Python-level lazy-init check: the C function initialises
# CUDA itself when needed (and a CUDA tensor exists, so it has been). Public call as the fallback.
_current_cuda_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


def _device_switch(x: Tensor):
    """torch.cuda.device(x.device) if x is a CUDA tensor of a device that is not the current one,
    else None. Entering torch.cuda.device costs a few microseconds per call, so the common case
    (a CPU tensor, or x's device already current) builds no context manager at all."""
    if x.is_cuda and x.get_device() != _current_cuda_device():
        return torch.cuda.device(x.device)
    return None


def _is_varlen(cu_seqlens_q, cu_seqlens_k) -> bool:
    return cu_seqlens_q is not None or cu_seqlens_k is not None


def _fwd_outputs(q: Tensor, v: Tensor, varlen: bool, fake: bool):
    out_shape, lse_shape = _core.output_shapes(q.shape, v.shape, varlen)
    if fake:
        out = (torch.empty_like(q, memory_format=torch.contiguous_format)
               if out_shape == q.shape else q.new_empty(out_shape))
        return out, q.new_empty(lse_shape, dtype=torch.float32)
    if not varlen:
        # The cheapest allocations with the same result (host time per call, bench/host_overhead.py):
        # empty_like when out has q's shape (headdim_v = headdim), without the memory_format
        # argument when q is contiguous (out is then contiguous too; only the strides of size-1
        # dims may differ); the factory with the sizes as arguments rather than new_empty with a
        # shape tuple.
        if out_shape == q.shape:
            out = (torch.empty_like(q) if q.is_contiguous()
                   else torch.empty_like(q, memory_format=torch.contiguous_format))
        else:
            out = q.new_empty(out_shape)
        return out, torch.empty(*lse_shape, dtype=torch.float32, device=q.device)
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
    cu_seqlens are given). `deterministic` is only carried to the backward. The errors name the
    op: :func:`_fwd_named` with the op's name."""
    return _fwd_named(_FN_FWD, q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k,
                      max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size_left,
                      window_size_right, softcap, rescale_threshold, exp2_emulation_fraction,
                      backend, deterministic)


def _fwd_named(fn, q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
               max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right, softcap,
               rescale_threshold, exp2_emulation_fraction, backend, deterministic):
    """:func:`_fwd_impl` whose errors start with `fn`: on the eager route the public function the
    user called; in the op its own name (the op's schema carries no name, so calls that keep the
    op, under torch.compile, a mode or a tensor subclass, name fa4::fwd)."""
    # stride()[-1:]: one call per tensor in the common case (and () for a 0-D one, checked later)
    if (q.stride()[-1:] != (1,) or k.stride()[-1:] != (1,) or v.stride()[-1:] != (1,)
            or q.is_neg() or k.is_neg() or v.is_neg()):
        q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    out, lse = _fwd_outputs(q, v, cu_seqlens_q is not None or cu_seqlens_k is not None, fake=False)
    streams = {}
    opts = _options(fn, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                    max_seqlen_k, softmax_scale, causal, window_size_left, window_size_right,
                    softcap, rescale_threshold, exp2_emulation_fraction, backend, deterministic,
                    streams)
    switch = _device_switch(q)
    if switch is None:
        _run_fwd(fn, q, k, v, out, lse, opts, streams)
    else:
        with switch:
            _run_fwd(fn, q, k, v, out, lse, opts, streams)
    return out, lse


# ---- the C host path (python/fa4/_fastpath.c) -----------------------------------------------------
# fa4._fastpath describes the tensors and calls libfa4 in one call (4-9 us less per eager call than
# the ctypes path below on the H200 machine, bench/host_overhead.py). Set up on the first call
# (libfa4 loads lazily); None: no such module beside the library, and every call takes the ctypes
# path. A call it cannot describe (a dtype, device or rank fa4 does not take) also takes the ctypes
# path, which raises the error naming the tensor.
_UNSET = object()
# (fa4._fastpath.call, {C function name: address}, the library those addresses are in) or None
_fast = _UNSET


def _fast_setup():
    global _fast
    module = _capi.fastpath()
    if module is None:
        _fast = None
        return None
    # (Only CUDA tensors ask for a stream, and they exist only where CUDA does: no CUDA check here,
    # which would start the driver in CPU-only processes.)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _core.current_cuda_stream
    module.init(dict(_core._torch_dtype_codes()), raw_stream)
    _fast = _fast_entries(module.call)
    return _fast


def _fast_entries(call):
    """(call, the loaded library's entry points by name, that library), the entry points also
    registered with the module, which then runs each only through its own prototype."""
    lib = _capi.library()
    names = ["fa4_forward", "fa4_backward", "fa4_forward_with_kvcache"]
    if getattr(_capi.fastpath(), "CALLS_WORKSPACE_SIZE", 0):
        names.append("fa4_backward_workspace_size")  # (a module older than the library lacks it)
    entries = {name: _capi.entry_address(name) for name in names if hasattr(lib, name)}
    register = getattr(_capi.fastpath(), "entries", None)  # (absent from an older module)
    if register is not None:  # call() then runs each entry through its own prototype only
        register(*(entries.get(n) for n in ("fa4_forward", "fa4_forward_with_kvcache", "fa4_backward",
                                            "fa4_backward_workspace_size")))
    return (call, entries, lib)


def _fast_call(name: str, tensors: tuple, trailing: tuple, kv: Optional[tuple] = None) -> bool:
    """True if fa4._fastpath ran libfa4's `name` (raising its error as the ctypes path would);
    False if the caller must take the ctypes path. kv: the KV-cache call's five index / append
    tensors (fa4_kvcache_args' pointers; trailing then holds the args struct they go into)."""
    global _fast
    fast = _fast if _fast is not _UNSET else _fast_setup()
    if fast is None:
        return False
    if fast[2] is not _capi._lib:  # another libfa4 swapped in (bench/ab_variants.py): its entries
        fast = _fast = _fast_entries(fast[0])
    entry = fast[1].get(name)
    if entry is None:
        return False
    status = fast[0](entry, tensors, trailing) if kv is None else fast[0](entry, tensors, trailing, kv)
    if status is None:
        return False
    if status:
        _capi.check(status)
    return True


def _run_fwd(fn, q, k, v, out, lse, opts, streams):
    if _fast_call("fa4_forward", (q, k, v, out, lse), (opts.address,)):
        return
    describe = _core.describe_torch
    _capi.forward(describe(q, "q", fn, streams), describe(k, "k", fn, streams),
                  describe(v, "v", fn, streams), describe(out, "out", fn, streams),
                  describe(lse, "lse", fn, streams), opts.struct)


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
    switch = _device_switch(q)
    if switch is None:
        _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, dsink, sink, opts, streams)
    else:
        with switch:
            _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, dsink, sink, opts, streams)
    return dq, dk, dv, dsink


# Below this, fa4's own per-stream cache holds the backward's workspace at no per-call cost
# (src/hopper/shared/device_state.h kEagerCachedMaxBytes); above it, the workspace comes from torch.
_TORCH_WORKSPACE_MIN_BYTES = 4 << 20


def _with_torch_workspace(opts, tensors, streams, q):
    """(opts, the ctypes descriptions of `tensors` where the size query needed them, else None):
    opts with the CUDA backward's workspace taken from torch's caching allocator on the current
    stream (the stream fa4 runs on), so that memory (the dQ accumulator: 4 * (headdim + 2) bytes
    or more per query row and head, up to GBs) goes back to torch when the call returns instead
    of staying in fa4's pool. Only where that lower bound is past _TORCH_WORKSPACE_MIN_BYTES: the
    size query (a second validation, ~10 us) and the allocation are then small beside the
    kernels. opts itself otherwise, where the library predates the query, or where the query
    refuses the arguments (fa4_backward then reports its own error)."""
    if 4 * (q.numel() + 2 * (q.numel() // max(q.shape[-1], 1))) <= _TORCH_WORKSPACE_MIN_BYTES:
        return opts, None
    n = ctypes.c_uint64(0)
    ts = None
    try:
        if not _fast_call("fa4_backward_workspace_size", tensors, (opts.address, ctypes.addressof(n))):
            if not hasattr(_capi.library(), "fa4_backward_workspace_size"):
                return opts, None
            ts = _describe_bwd(tensors, streams)
            n.value = _capi.backward_workspace_size(*ts, opts.struct)
    except _capi.Fa4Error:
        return opts, ts
    if n.value == 0:
        return opts, ts
    workspace = torch.empty(((n.value + 255) // 256) * 64, dtype=torch.int32, device=q.device)
    if workspace.data_ptr() % 256:  # (an allocator without torch's 512-byte blocks)
        workspace = torch.empty(((n.value + 511) // 256) * 64, dtype=torch.int32, device=q.device)
        workspace = workspace[(-workspace.data_ptr() % 256) // 4:]
    return opts.with_workspace(workspace, _FN_BWD, streams), ts


_BWD_TENSOR_NAMES = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv", "dsink")


def _describe_bwd(tensors, streams):
    """The ctypes descriptions of fa4_backward's ten tensors (None: dsink not given)."""
    return [_core.describe_torch(x, name, _FN_BWD, streams) if x is not None else None
            for x, name in zip(tensors, _BWD_TENSOR_NAMES)]


def _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, dsink, sink, opts, streams):
    tensors = (dout, q, k, v, out, lse, dq, dk, dv, dsink if sink is not None else None)
    ts = None  # the ctypes descriptions, made at most once
    if q.is_cuda:
        opts, ts = _with_torch_workspace(opts, tensors, streams, q)
    if _fast_call("fa4_backward", tensors, (opts.address,)):
        return
    _capi.backward(*(ts or _describe_bwd(tensors, streams)), opts.struct)


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


_SECOND_ORDER_ERROR = (b"fa4: the attention backward is first-order only; differentiating its "
                       b"gradients (create_graph=True: a gradient penalty, a Hessian-vector "
                       b"product) is not supported")


def first_order_only(grads, *inputs):
    """The backward's gradients as they are; or, where autograd records the backward
    (create_graph=True) and one of `inputs` (the incoming gradient and the forward's
    differentiable inputs) requires grad, behind a node that raises once the second-order graph
    is used. Without it the gradients are constants to autograd and their second-order term is
    silently 0: torch's once_differentiable checks only the incoming gradient, which a gradient
    penalty's loss weights leave constant. Traced code (torch.compile) keeps the gradients as
    they are: it compiles the first-order backward only."""
    if (not torch.is_grad_enabled() or torch.compiler.is_compiling()
            or not any(t is not None and t.requires_grad for t in inputs)):
        return list(grads)
    live = [i for i, g in enumerate(grads) if g is not None]
    # The node also takes the inputs that require grad (its outputs for them are dropped): only
    # then does it sit on a path from the gradients to those inputs, so that autograd.grad(dq, q)
    # reaches it and raises. Behind detached copies alone, q was unreachable: "not used in the
    # graph", or None with allow_unused=True (a second derivative silently taken as absent).
    linked = [t for t in inputs if t is not None and t.requires_grad]
    raising = torch._C._functions.DelayedError(_SECOND_ORDER_ERROR, len(live) + len(linked))(
        *[grads[i].detach().requires_grad_() for i in live], *linked)
    if isinstance(raising, Tensor):
        raising = (raising,)
    raising = raising[:len(live)]
    grads = list(grads)
    for i, g in zip(live, raising):
        grads[i] = g
    return grads


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k, seqused_k = ctx.saved_tensors
    bwd_call = torch.ops.fa4.bwd if _use_custom_op(dout, q) else _bwd_impl
    with torch.no_grad():
        dq, dk, dv, dsink = bwd_call(dout, q, k, v, out, lse, sink, cu_seqlens_q, cu_seqlens_k,
                                     seqused_k, *ctx.scalars)
    grads = first_order_only([dq, dk, dv, dsink if sink is not None else None], dout, q, k, v, sink)
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
# Looked up once: each costs a few attribute lookups per call otherwise.
_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
_function_mode_enabled = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)


def _modes_active() -> bool:
    return _dispatch_stack_len() > 0 or _function_mode_enabled()


def _use_custom_op(*tensors) -> bool:
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or _modes_active():
        return True
    for t in tensors:
        # is_cuda / is_cpu: device.type without building a torch.device and a string.
        if t is not None and (type(t) not in _PLAIN_TENSOR_TYPES
                              or not (t.is_cuda or t.is_cpu)):
            return True
    return False


_N_FN_INPUTS = 9  # _FwdFunction's arguments: the 7 tensor slots of fa4::fwd, fn, the scalars


class _FwdFunction(torch.autograd.Function):
    """Eager autograd for _fwd_impl: the same saved state and backward as the custom op's.
    First-order only, like the op: a double backward raises instead of silently dropping the
    second-order term (first_order_only).

    The op's 11 scalar arguments come as one tuple: autograd.Function.apply costs ~0.1 us per
    argument, so 9 arguments instead of 19 save a microsecond per call. fn: the public function
    called, which the errors name."""

    @staticmethod
    def forward(ctx, q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, fn, scalars):
        inputs = (q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, *scalars)
        out, lse = _fwd_named(fn, *inputs)
        _setup_context(ctx, inputs, (out, lse))
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        return _backward(ctx, dout, dlse)[:_N_FN_INPUTS]


# ---- the user-facing torch path -------------------------------------------------------------------
def _float_options(fn, softmax_scale, softcap, rescale_threshold, exp2_emulation_fraction):
    """The float options as the NumPy path checks them (_core._float: the error names the option
    and fn; None or a string is never float()'d). Plain floats and None (the library's default)
    skip the check: host time per eager call matters here."""
    if type(softmax_scale) is not float and softmax_scale is not None:
        softmax_scale = _core._float(softmax_scale, "softmax_scale", fn)
    if type(softcap) is not float:
        softcap = _core._float(softcap, "softcap", fn)
    if type(rescale_threshold) is not float and rescale_threshold is not None:
        rescale_threshold = _core._float(rescale_threshold, "rescale_threshold", fn)
    if type(exp2_emulation_fraction) is not float and exp2_emulation_fraction is not None:
        exp2_emulation_fraction = _core._float(exp2_emulation_fraction, "exp2_emulation_fraction", fn)
    return softmax_scale, softcap, rescale_threshold, exp2_emulation_fraction


def attention(q, k, v, fn, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
              max_seqlen_q=0, max_seqlen_k=0, softmax_scale=None, causal=False,
              window_size=(-1, -1), softcap=0.0, sink=None, deterministic=False,
              rescale_threshold=None, exp2_emulation_fraction=None, backend="auto"):
    """The torch route of fa4.flash_attn_func / flash_attn_varlen_func. fa4/__init__.py passes the
    arguments by position (in this order): keyword passing cost a microsecond per call."""
    if not (isinstance(q, Tensor) and isinstance(k, Tensor) and isinstance(v, Tensor)):
        for name, x in (("q", q), ("k", k), ("v", v)):
            if not isinstance(x, Tensor):
                raise _capi.InvalidArgumentError(
                    f"{fn}: {name} is a {type(x).__name__}; q, k, v must all be torch.Tensor or "
                    "all numpy.ndarray")
    left, right = _core.normalize_window(window_size, fn)
    _core.backend_code(backend, fn)  # reject a bad name here, with this function's name
    softmax_scale, softcap, rescale_threshold, exp2_emulation_fraction = _float_options(
        fn, softmax_scale, softcap, rescale_threshold, exp2_emulation_fraction)
    scalars = (max_seqlen_q, max_seqlen_k, softmax_scale, _core._bool(causal, "causal", fn), left,
               right, softcap, rescale_threshold, exp2_emulation_fraction, backend,
               _core._bool(deterministic, "deterministic", fn))
    if _use_custom_op(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k):
        return torch.ops.fa4.fwd(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, *scalars)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (sink is not None and sink.requires_grad)):
        return _FwdFunction.apply(q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, fn,
                                  scalars)
    return _fwd_named(fn, q, k, v, sink, cu_seqlens_q, cu_seqlens_k, seqused_k, *scalars)


# ---- forward_with_kvcache (inference only) ---------------------------------------------------------
# No autograd: the op has no backward (fa4 has none for the KV-cache path); outputs never require
# grad. The caches are mutated in place when k/v are appended (declared to the op, so
# torch.compile / functionalization order the append correctly).
_FN_KV = "fa4::fwd_kvcache"


def _kvcache_outputs(q: Tensor, v_cache: Tensor):
    out_shape, lse_shape = _core.kvcache_output_shapes(q.shape, v_cache.shape)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


def _kvcache_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Optional[Tensor],
                  v_new: Optional[Tensor], cache_seqlens: Optional[Tensor],
                  cache_batch_idx: Optional[Tensor], page_table: Optional[Tensor],
                  sink: Optional[Tensor], softmax_scale: Optional[float], causal: bool,
                  window_size_left: int, window_size_right: int, softcap: float, num_splits: int,
                  rescale_threshold: Optional[float], exp2_emulation_fraction: Optional[float],
                  backend: str) -> tuple[Tensor, Tensor]:
    """fa4 forward_with_kvcache: (out, lse); appends k_new/v_new into k_cache/v_cache in place.
    Allocates only out and lse (CUDA-graph capturable: no host sync, no other allocation unless
    q, k_new or v_new has a non-contiguous last dim and is copied). The errors name the op:
    :func:`_kvcache_named` with the op's name."""
    return _kvcache_named(_FN_KV, q, k_cache, v_cache, k_new, v_new, cache_seqlens,
                          cache_batch_idx, page_table, sink, softmax_scale, causal,
                          window_size_left, window_size_right, softcap, num_splits,
                          rescale_threshold, exp2_emulation_fraction, backend)


def _kvcache_named(fn, q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx,
                   page_table, sink, softmax_scale, causal, window_size_left, window_size_right,
                   softcap, num_splits, rescale_threshold, exp2_emulation_fraction, backend):
    """:func:`_kvcache_impl` whose errors start with `fn` (as :func:`_fwd_named`)."""
    q = _last_dim_contiguous(q)
    if k_new is not None:
        k_new = _last_dim_contiguous(k_new)
    if v_new is not None:
        v_new = _last_dim_contiguous(v_new)
    out, lse = _kvcache_outputs(q, v_cache)
    streams = {}
    opts = _options(fn, sink, None, None, None, 0, 0, softmax_scale, causal,
                    window_size_left, window_size_right, softcap, rescale_threshold,
                    exp2_emulation_fraction, backend, False, streams)
    base = _kvcache_base(num_splits, fn)
    kv = (k_new, v_new, cache_seqlens, cache_batch_idx, page_table)
    switch = _device_switch(q)
    if switch is None:
        _run_kvcache(fn, q, k_cache, v_cache, out, lse, opts, base, kv, num_splits, streams)
    else:
        with switch:
            _run_kvcache(fn, q, k_cache, v_cache, out, lse, opts, base, kv, num_splits, streams)
    return out, lse


# fa4_kvcache_args without tensors (defaults + num_splits) by num_splits, for the C host path,
# which copies one and points its copy at the call's tensors: a dict lookup instead of building the
# struct and describing its tensors through ctypes (~4 us per call). At most 64 kept.
_KVCACHE_BASES: dict = {}


def _kvcache_base(num_splits, fn) -> _core.KVCacheCall:
    hit = _KVCACHE_BASES.get(num_splits) if type(num_splits) is int else None
    if hit is not None:
        return hit
    base = _core.KVCacheCall(fn, num_splits=num_splits)  # (checks num_splits)
    if type(num_splits) is int:
        if len(_KVCACHE_BASES) >= 64:
            _KVCACHE_BASES.clear()
        _KVCACHE_BASES[num_splits] = base
    return base


def _run_kvcache(fn, q, k_cache, v_cache, out, lse, opts, base, kv, num_splits, streams):
    if _fast_call("fa4_forward_with_kvcache", (q, k_cache, v_cache, out, lse),
                  (opts.address, base.address), kv):
        return
    args = _core.KVCacheCall(fn, *kv, num_splits, streams)
    describe = _core.describe_torch
    _capi.forward_with_kvcache(describe(q, "q", fn, streams),
                               describe(k_cache, "k_cache", fn, streams),
                               describe(v_cache, "v_cache", fn, streams),
                               describe(out, "out", fn, streams),
                               describe(lse, "lse", fn, streams), opts.struct, args.struct)


fwd_kvcache = torch.library.custom_op(_FN_KV, _kvcache_impl, mutates_args=("k_cache", "v_cache"))


@fwd_kvcache.register_fake
def _kvcache_fake(q, k_cache, v_cache, k_new, v_new, cache_seqlens, cache_batch_idx, page_table,
                  sink, softmax_scale, causal, window_size_left, window_size_right, softcap,
                  num_splits, rescale_threshold, exp2_emulation_fraction, backend):
    return _kvcache_outputs(q, v_cache)


@torch.compiler.disable
def _refuse_append_into_grad_caches(fn):
    # Raised outside any traced graph: dynamo of torch 2.11 cannot trace raising fa4's errors
    # (classes with two bases) and fails with an AssertionError instead of this ValueError.
    raise _capi.InvalidArgumentError(
        f"{fn}: k_cache / v_cache require grad; appending k/v writes them in place and has no "
        "gradient: append under torch.no_grad() or into caches that do not require grad")


def kvcache_attention(q, k_cache, v_cache, fn, k=None, v=None, cache_seqlens=None,
                      cache_batch_idx=None, page_table=None, softmax_scale=None, causal=False,
                      window_size=(-1, -1), softcap=0.0, sink=None, num_splits=0,
                      rescale_threshold=None, exp2_emulation_fraction=None, backend="auto"):
    """The torch route of fa4.flash_attn_with_kvcache (arguments by position, in this order)."""
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if x is not None and not isinstance(x, Tensor):
            raise _capi.InvalidArgumentError(
                f"{fn}: {name} is a {type(x).__name__}; q, k_cache, v_cache, k, v must all be "
                "torch.Tensor or all numpy.ndarray")
    left, right = _core.normalize_window(window_size, fn)
    _core.backend_code(backend, fn)  # reject a bad name here, with this function's name
    num_splits = _core._int32(num_splits, "num_splits", fn)
    if _core.is_int_seqlens(cache_seqlens):
        # One value for every sequence: an int32 tensor on q's device (an allocation and a fill
        # kernel on CUDA; under CUDA graph capture pass a tensor instead).
        value = _core._int32(int(cache_seqlens), "cache_seqlens", fn)
        cache_seqlens = torch.full((q.shape[0],), value, dtype=torch.int32, device=q.device)
    softmax_scale, softcap, rescale_threshold, exp2_emulation_fraction = _float_options(
        fn, softmax_scale, softcap, rescale_threshold, exp2_emulation_fraction)
    scalars = (softmax_scale, _core._bool(causal, "causal", fn), left, right, softcap, num_splits,
               rescale_threshold, exp2_emulation_fraction, backend)
    tensors = (q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, page_table, sink)
    appends = k is not None or v is not None
    if appends and torch.is_grad_enabled() and (k_cache.requires_grad or v_cache.requires_grad):
        # The append has no gradient (the KV-cache path is inference only): writing a cache that
        # autograd tracks would leave its graph describing the old values.
        _refuse_append_into_grad_caches(fn)
    if _use_custom_op(*tensors):
        return torch.ops.fa4.fwd_kvcache(*tensors, *scalars)
    if k_cache.is_neg() or v_cache.is_neg():
        # fa4 reads and appends to the caches' memory as it is; a lazy negation would make both
        # wrong, and resolving it would copy the whole cache.
        raise _capi.InvalidArgumentError(
            f"{fn}: k_cache / v_cache is a view with torch's lazy negative bit; pass "
            "cache.resolve_neg() (a copy) instead")
    if appends and not torch.is_inference_mode_enabled():
        # As torch's in-place ops: an inference tensor has no version counter, so autograd could
        # not see the write.
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            if cache.is_inference():
                raise _capi.InvalidArgumentError(
                    f"{fn}: {name} is an inference tensor (made under torch.inference_mode()); "
                    "appending k/v writes it in place, which torch allows only inside "
                    "torch.inference_mode()")
    result = _kvcache_named(fn, *tensors, *scalars)
    if appends:
        # Written in place, as the op declares (mutates_args): autograd then refuses a backward
        # that saved the caches' old values, as after any in-place torch op.
        for cache in (k_cache, v_cache):
            torch.autograd.graph.increment_version(cache)
    return result
