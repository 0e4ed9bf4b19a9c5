"""Array -> fa4_tensor conversion, option building and the framework-neutral entry points.

Arrays are NumPy ndarrays (CPU) or torch Tensors (CPU or CUDA); both are described to the C ABI
as views, without copies. The layouts and rules are those of include/fa4/attention.h.
"""

from __future__ import annotations

import ctypes
import sys

from . import _capi
from ._capi import InvalidArgumentError

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _torch():
    """torch if it is already imported (fa4 never imports torch for NumPy users)."""
    return sys.modules.get("torch")


def is_torch_tensor(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _numpy_dtype_code(dtype):
    import numpy as np

    if dtype == np.float16:
        return _capi.DTYPE_FP16
    if dtype == np.float32:
        return _capi.DTYPE_FP32
    if dtype == np.int32:
        return _capi.DTYPE_INT32
    try:  # bf16 is not a NumPy dtype; ml_dtypes provides one
        import ml_dtypes

        if dtype == ml_dtypes.bfloat16:
            return _capi.DTYPE_BF16
    except ImportError:
        pass
    return None


_TORCH_DTYPE_CODES = None  # built on first use: fa4 never imports torch itself


def _torch_dtype_code(dtype):
    global _TORCH_DTYPE_CODES
    if _TORCH_DTYPE_CODES is None:
        torch = _torch()
        _TORCH_DTYPE_CODES = {
            torch.bfloat16: _capi.DTYPE_BF16,
            torch.float16: _capi.DTYPE_FP16,
            torch.float32: _capi.DTYPE_FP32,
            torch.int32: _capi.DTYPE_INT32,
        }
    return _TORCH_DTYPE_CODES.get(dtype)


def describe(x, name: str, fn: str, streams=None) -> _capi.Tensor:
    """fa4_tensor view of a NumPy array or torch tensor `x` (named `name` in error messages).

    streams: optional dict {CUDA device index: current stream handle} shared by the tensors of
    one call, so the current stream is looked up once per device rather than once per tensor
    (a few microseconds each, which added up to a third of the per-call host time)."""
    t = _capi.Tensor()
    if is_torch_tensor(x):
        code = _torch_dtype_code(x.dtype)
        if code is None:
            raise InvalidArgumentError(
                f"{fn}: {name}.dtype = {x.dtype} is not supported; use torch.bfloat16, "
                f"torch.float16 or torch.float32 (int32 for cu_seqlens/seqused_k)")
        shape, strides = x.shape, x.stride()
        device = x.device
        if device.type == "cuda":
            t.device_type = _capi.DEVICE_CUDA
            index = device.index if device.index is not None else 0
            t.device_index = index
            stream = streams.get(index) if streams is not None else None
            if stream is None:
                stream = _torch().cuda.current_stream(device).cuda_stream
                if streams is not None:
                    streams[index] = stream
            t.stream = stream
        elif device.type == "cpu":
            t.device_type = _capi.DEVICE_CPU
        else:
            raise InvalidArgumentError(
                f"{fn}: {name} is on device '{device}'; fa4 takes CPU or CUDA tensors")
        t.data = x.data_ptr()
    else:
        import numpy as np

        if not isinstance(x, np.ndarray):
            raise InvalidArgumentError(
                f"{fn}: {name} is a {type(x).__name__}; fa4 takes numpy.ndarray or torch.Tensor")
        code = _numpy_dtype_code(x.dtype)
        if code is None:
            raise InvalidArgumentError(
                f"{fn}: {name}.dtype = {x.dtype} is not supported; use float16, float32 or "
                f"ml_dtypes.bfloat16 (int32 for cu_seqlens/seqused_k)")
        shape = x.shape
        item = x.itemsize
        if any(s % item for s in x.strides):
            raise InvalidArgumentError(
                f"{fn}: {name}.strides = {x.strides} bytes are not multiples of the element size "
                f"{item}; fa4 needs element-aligned strides")
        strides = tuple(s // item for s in x.strides)
        t.device_type = _capi.DEVICE_CPU
        t.data = x.ctypes.data
    if len(shape) > _capi.MAX_DIMS:
        raise InvalidArgumentError(
            f"{fn}: {name} has {len(shape)} dims {tuple(shape)}; fa4 tensors have at most "
            f"{_capi.MAX_DIMS}")
    t.dtype = code
    t.ndim = len(shape)
    for d, (n, s) in enumerate(zip(shape, strides)):
        t.shape[d] = n
        t.stride[d] = s
    return t


def _int32(value, what: str, fn: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
        except ImportError:
            pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"{fn}: {what} = {value!r} must be an int")
    if not _INT32_MIN <= value <= _INT32_MAX:
        # ctypes would silently wrap it; never pass a different value than asked for.
        raise InvalidArgumentError(f"{fn}: {what} = {value} does not fit in int32")
    return value


def _float(value, what: str, fn: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{fn}: {what} = {value!r} must be a float") from None


def normalize_window(window_size, fn: str):
    """(left, right) ints from flash-attn's (-1, -1) convention; None also means unbounded."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"{fn}: window_size = {window_size!r} must be a pair (left, right)") from None
    left = -1 if left is None else _int32(left, "window_size[0]", fn)
    right = -1 if right is None else _int32(right, "window_size[1]", fn)
    return left, right


def backend_code(backend, fn: str) -> int:
    if isinstance(backend, str) and backend in _capi.BACKENDS:
        return _capi.BACKENDS[backend]
    raise InvalidArgumentError(
        f"{fn}: backend = {backend!r} must be one of {sorted(_capi.BACKENDS)}")


class CallOptions:
    """fa4_options plus the fa4_tensor objects its pointers refer to (kept alive with it)."""

    def __init__(self, fn: str, *, softmax_scale=None, causal=False, window_size=(-1, -1),
                 softcap=0.0, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                 max_seqlen_q=0, max_seqlen_k=0, rescale_threshold=None,
                 exp2_emulation_fraction=None, backend="auto", deterministic=False, streams=None):
        o = _capi.default_options()
        if softmax_scale is not None:
            o.has_softmax_scale = 1
            o.softmax_scale = _float(softmax_scale, "softmax_scale", fn)  # fp32, as in the C++ API
        o.causal = 1 if bool(causal) else 0
        o.window_size_left, o.window_size_right = normalize_window(window_size, fn)
        o.softcap = _float(softcap, "softcap", fn)
        o.max_seqlen_q = _int32(max_seqlen_q, "max_seqlen_q", fn)
        o.max_seqlen_k = _int32(max_seqlen_k, "max_seqlen_k", fn)
        if rescale_threshold is not None:
            o.rescale_threshold = _float(rescale_threshold, "rescale_threshold", fn)
        if exp2_emulation_fraction is not None:
            o.has_exp2_emulation_fraction = 1
            o.exp2_emulation_fraction = _float(exp2_emulation_fraction,
                                               "exp2_emulation_fraction", fn)
        o.backend = backend_code(backend, fn)
        o.deterministic = 1 if bool(deterministic) else 0
        self._keep = []
        for field, value in (("sink", sink), ("cu_seqlens_q", cu_seqlens_q),
                             ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
            if value is not None:
                t = describe(value, field, fn, streams)
                self._keep.append(t)
                setattr(o, field, ctypes.pointer(t))
        self.struct = o


# ---- low-level entry points (caller-allocated outputs; NumPy or torch, no autograd) --------------
def forward(q, k, v, out, lse, **options) -> None:
    """Runs fa4_forward on caller-allocated `out` and `lse` (NumPy arrays or torch tensors).

    Shapes, dtypes and semantics: include/fa4/attention.h. Options are the keyword arguments of
    :func:`fa4.flash_attn_func` / :func:`fa4.flash_attn_varlen_func` (plus max_seqlen_q/k,
    cu_seqlens_q/k, seqused_k). Raises a :class:`fa4.Fa4Error` subclass; nothing is written then.
    """
    fn = "fa4.forward"
    opts = CallOptions(fn, **options)
    ts = [describe(x, n, fn) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    _capi.forward(*ts, opts.struct)


def backward(dout, q, k, v, out, lse, dq, dk, dv, dsink=None, **options) -> None:
    """Runs fa4_backward, writing caller-allocated dq, dk, dv (and dsink iff a sink is given).

    dk/dv are summed over the query heads sharing each KV head. Give the forward's options.
    """
    fn = "fa4.backward"
    opts = CallOptions(fn, **options)
    ts = [describe(x, n, fn) for x, n in ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"),
                                           (out, "out"), (lse, "lse"), (dq, "dq"), (dk, "dk"),
                                           (dv, "dv"))]
    tsink = describe(dsink, "dsink", fn) if dsink is not None else None
    _capi.backward(*ts, tsink, opts.struct)


def forward_support(q, k, v, out, lse, **options):
    """(True, kernel_name) if :func:`forward` would run on these arguments, else (False, reason).
    Runs nothing and writes nothing."""
    fn = "fa4.forward_support"
    opts = CallOptions(fn, **options)
    ts = [describe(x, n, fn) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    return _capi.forward_support(*ts, opts.struct)


# ---- output shapes shared by the NumPy path and the torch fake kernels --------------------------
def output_shapes(q_shape, v_shape, varlen: bool, fn: str):
    """(out shape, lse shape) for q/v shapes; raises for a q of the wrong rank (the C library
    checks everything else)."""
    want = 3 if varlen else 4
    if len(q_shape) != want or len(v_shape) != want:
        layout = ("(total_q, num_heads, headdim)" if varlen
                  else "(batch, seqlen_q, num_heads, headdim)")
        raise InvalidArgumentError(
            f"{fn}: q and v must be {want}-D, q {layout}; got q {tuple(q_shape)}, "
            f"v {tuple(v_shape)}")
    out_shape = tuple(q_shape[:-1]) + (v_shape[-1],)
    if varlen:
        lse_shape = (q_shape[1], q_shape[0])
    else:
        lse_shape = (q_shape[0], q_shape[2], q_shape[1])
    return out_shape, lse_shape


def numpy_forward(q, k, v, *, varlen: bool, fn: str, **options):
    """Allocates out/lse with NumPy and runs the forward. Varlen rows outside every sequence stay
    out = 0, lse = -inf (the library leaves them untouched)."""
    import numpy as np

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise InvalidArgumentError(
                f"{fn}: {name} is a {type(x).__name__}; q, k, v must all be numpy.ndarray or all "
                "torch.Tensor")
    out_shape, lse_shape = output_shapes(q.shape, v.shape, varlen, fn)
    if varlen:
        out = np.zeros(out_shape, dtype=q.dtype)
        lse = np.full(lse_shape, -np.inf, dtype=np.float32)
    else:
        out = np.empty(out_shape, dtype=q.dtype)
        lse = np.empty(lse_shape, dtype=np.float32)
    opts = CallOptions(fn, **options)
    ts = [describe(x, n, fn) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    _capi.forward(*ts, opts.struct)
    return out, lse
