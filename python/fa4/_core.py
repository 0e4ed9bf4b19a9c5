"""Array -> fa4_tensor conversion, option building and the framework-neutral entry points.

Arrays are NumPy ndarrays (CPU) or torch Tensors (CPU or CUDA); both are described to the C ABI
as views, without copies. The layouts and rules are those of include/fa4/attention.h.
"""

from __future__ import annotations

import ctypes
import struct
import sys

from . import _capi
from ._capi import Fa4Error, InvalidArgumentError, LibraryNotFoundError

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


def _torch_dtype_codes():
    global _TORCH_DTYPE_CODES
    if _TORCH_DTYPE_CODES is None:
        torch = _torch()
        _TORCH_DTYPE_CODES = {
            torch.bfloat16: _capi.DTYPE_BF16,
            torch.float16: _capi.DTYPE_FP16,
            torch.float32: _capi.DTYPE_FP32,
            torch.int32: _capi.DTYPE_INT32,
        }
    return _TORCH_DTYPE_CODES


def _torch_dtype_code(dtype):
    return _torch_dtype_codes().get(dtype)


def _struct_packers():
    """pack_into of a whole fa4_tensor for each ndim 0..MAX_DIMS: one call writes every field
    (unused shape/stride entries zero), a fifth of the time of setting the ctypes fields one by
    one. The format follows the struct's own field offsets, so it cannot drift from _capi.Tensor."""
    T = _capi.Tensor
    assert (T.data.offset, T.dtype.offset, T.ndim.offset, T.shape.offset, T.stride.offset,
            T.device_type.offset, T.device_index.offset, T.stream.offset,
            ctypes.sizeof(T)) == (0, 8, 12, 16, 16 + 8 * _capi.MAX_DIMS,
                                  16 + 16 * _capi.MAX_DIMS, 20 + 16 * _capi.MAX_DIMS,
                                  24 + 16 * _capi.MAX_DIMS, 32 + 16 * _capi.MAX_DIMS)
    packers = []
    for n in range(_capi.MAX_DIMS + 1):
        pad = f"{8 * (_capi.MAX_DIMS - n)}x" if n < _capi.MAX_DIMS else ""
        fmt = "=Qii" + f"{n}q" + pad + f"{n}q" + pad + "iiQ"
        packer = struct.Struct(fmt)
        assert packer.size == ctypes.sizeof(T)
        packers.append(packer.pack_into)
    return tuple(packers)


_PACK = _struct_packers()
_BACKENDS = _capi.BACKENDS
_MAX_DIMS = _capi.MAX_DIMS
_Tensor = _capi.Tensor
_DEVICE_CPU, _DEVICE_CUDA = _capi.DEVICE_CPU, _capi.DEVICE_CUDA
_raw_stream = None  # current-stream lookup, resolved on first use (torch may lack CUDA)


def current_cuda_stream(index: int) -> int:
    """Handle (cudaStream_t as an int) of torch's current stream on CUDA device `index`.

    torch._C._cuda_getCurrentRawStream returns it directly (what torch's own generated code
    calls); torch.cuda.current_stream(i).cuda_stream builds a Stream object first, several
    microseconds per call. The public call is the fallback where the private one is missing."""
    global _raw_stream
    get = _raw_stream
    if get is None:
        torch = _torch()
        get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if get is None:
            def get(i):
                return torch.cuda.current_stream(i).cuda_stream
        _raw_stream = get
    return get(index)


# Tensors that hold indices (int32 only); every other tensor holds values (bf16 / fp16 / fp32).
_INDEX_TENSORS = frozenset(("cu_seqlens_q", "cu_seqlens_k", "seqused_k", "cache_seqlens",
                            "cache_batch_idx", "page_table"))


def _dtype_message(fn: str, name: str, dtype, int32_name: str, fp32_name: str,
                   value_names: str) -> str:
    """The error for a dtype fa4 has no code for: the rule of this tensor's kind."""
    if name in _INDEX_TENSORS:
        return f"{fn}: {name}.dtype = {dtype} is not supported; {name} must be {int32_name}"
    if name in ("lse", "sink", "dsink"):
        return f"{fn}: {name}.dtype = {dtype} is not supported; {name} must be {fp32_name}"
    return f"{fn}: {name}.dtype = {dtype} is not supported; use {value_names}"


def require_writeable(fn: str, *named) -> None:
    """Refuses a read-only NumPy array (a view of bytes, an mmap opened read-only, a broadcast
    view) among the (array, name) pairs a call writes; torch tensors and None pass."""
    for x, name in named:
        flags = getattr(x, "flags", None)
        if flags is not None and not getattr(flags, "writeable", True):
            raise InvalidArgumentError(
                f"{fn}: {name} is a read-only numpy.ndarray (flags.writeable is False); the call "
                "writes it")


def describe(x, name: str, fn: str, streams=None) -> _capi.Tensor:
    """fa4_tensor view of a NumPy array or torch tensor `x` (named `name` in error messages).

    streams: optional dict {CUDA device index: current stream handle} shared by the tensors of
    one call, so the current stream is looked up once per device rather than once per tensor."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return describe_torch(x, name, fn, streams)
    import numpy as np

    if not isinstance(x, np.ndarray):
        raise InvalidArgumentError(
            f"{fn}: {name} is a {type(x).__name__}; fa4 takes numpy.ndarray or torch.Tensor")
    code = _numpy_dtype_code(x.dtype)
    if code is None:
        raise InvalidArgumentError(_dtype_message(fn, name, x.dtype, "int32", "float32",
                                                  "float16, float32 or ml_dtypes.bfloat16"))
    shape = x.shape
    item = x.itemsize
    if any(s % item for s in x.strides):
        raise InvalidArgumentError(
            f"{fn}: {name}.strides = {x.strides} bytes are not multiples of the element size "
            f"{item}; fa4 needs element-aligned strides")
    strides = tuple(s // item for s in x.strides)
    data = x.ctypes.data
    n = len(shape)
    if n > _MAX_DIMS:
        raise InvalidArgumentError(
            f"{fn}: {name} has {n} dims {tuple(shape)}; fa4 tensors have at most {_MAX_DIMS}")
    t = _Tensor()
    _PACK[n](t, 0, data, code, n, *shape, *strides, _DEVICE_CPU, 0, 0)
    return t


def describe_torch(x, name: str, fn: str, streams=None) -> _capi.Tensor:
    """:func:`describe` of a torch tensor (the caller has checked that `x` is one)."""
    code = (_TORCH_DTYPE_CODES or _torch_dtype_codes()).get(x.dtype)
    if code is None:
        raise InvalidArgumentError(_dtype_message(fn, name, x.dtype, "torch.int32", "torch.float32",
                                                  "torch.bfloat16, torch.float16 or torch.float32"))
    shape, strides = x.shape, x.stride()
    if x.is_cuda:
        device_type = _DEVICE_CUDA
        index = x.get_device()
        if streams is None:
            stream = current_cuda_stream(index)
        else:
            stream = streams.get(index)
            if stream is None:
                stream = streams[index] = current_cuda_stream(index)
    elif x.is_cpu:
        device_type, index, stream = _DEVICE_CPU, 0, 0
    else:
        raise InvalidArgumentError(
            f"{fn}: {name} is on device '{x.device}'; fa4 takes CPU or CUDA tensors")
    data = x.data_ptr()
    n = len(shape)
    if n > _MAX_DIMS:
        raise InvalidArgumentError(
            f"{fn}: {name} has {n} dims {tuple(shape)}; fa4 tensors have at most {_MAX_DIMS}")
    t = _Tensor()
    _PACK[n](t, 0, data, code, n, *shape, *strides, device_type, index, stream or 0)
    return t


def _not_a(kind: str, value, what: str, fn: str) -> InvalidArgumentError:
    """The error for option `what` = `value` that is not a `kind` ("float", "int" or "bool"). A
    torch tensor or NumPy array (0-d too) is named as such, without its repr (a CUDA tensor's
    would copy it to the host): an option is one number, and reading it out of a CUDA tensor
    would wait for the GPU, so the caller converts it, once."""
    want = "an int" if kind == "int" else f"a {kind}"
    if is_torch_tensor(value):
        given = f"a torch.Tensor (shape {tuple(value.shape)}, device {value.device})"
        refused = "a tensor"
    else:
        np = sys.modules.get("numpy")
        if np is None or not isinstance(value, np.ndarray):
            return InvalidArgumentError(f"{fn}: {what} = {value!r} must be {want}")
        given, refused = f"a numpy.ndarray (shape {value.shape})", "an array"
    return InvalidArgumentError(f"{fn}: {what} = {given} must be {want}, not {refused}: pass a "
                                f"Python {kind} (e.g. its .item())")


def _int32(value, what: str, fn: str) -> int:
    """An int32 option as a Python int (NumPy integers too, and a 0-d NumPy array of an integer
    dtype: torch.compile traces NumPy scalars as 0-d arrays, as for _float). Bools, floats, torch
    tensors and arrays of one or more dims are refused (see _not_a); values outside int32 too."""
    if type(value) is int and _INT32_MIN <= value <= _INT32_MAX:  # the common case, first
        return value
    given = value
    np = sys.modules.get("numpy")
    if np is not None and (isinstance(value, np.integer) or (
            type(value) is np.ndarray and value.ndim == 0 and value.dtype.kind in "iu")):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _not_a("int", given, what, fn)
    if not _INT32_MIN <= value <= _INT32_MAX:
        # ctypes would silently wrap it; never pass a different value than asked for.
        raise InvalidArgumentError(f"{fn}: {what} = {value} does not fit in int32")
    return value


def _bool(value, what: str, fn: str) -> bool:
    """A flag: True / False (also NumPy's bool and the ints 0 / 1, the C ABI's values, and a 0-d
    NumPy array of them, as torch.compile traces NumPy scalars); anything else is an error rather
    than Python's truthiness (causal="no" would otherwise mean True), a torch tensor or a NumPy
    array of one or more dims too (see _not_a)."""
    if value is True or value is False:  # the common case, first
        return value
    if type(value) is int and (value == 0 or value == 1):
        return value == 1
    np = sys.modules.get("numpy")
    given = value
    if np is not None and type(value) is np.ndarray and value.ndim == 0 and value.dtype.kind in "biu":
        value = value[()]  # the NumPy scalar
    if np is not None and (isinstance(value, np.bool_)
                           or (isinstance(value, np.integer) and (value == 0 or value == 1))):
        return bool(value)
    raise _not_a("bool", given, what, fn)


# float32's rounding: |x| <= 2^-150 rounds to 0, |x| >= 2^128 - 2^103 to inf.
_F32_UNDERFLOW = 2.0 ** -150
_F32_OVERFLOW = 2.0 ** 128 - 2.0 ** 103
_INF = float("inf")


def _float(value, what: str, fn: str) -> float:
    """A real number as a Python float (ints and NumPy scalars too). Strings are refused although
    float() would parse them (softcap="3" is a mistake, not a number), bools (the flags' type), and
    torch tensors, 0-d ones too (float() of a CUDA tensor waits for the GPU; see _not_a); None and
    other non-numbers get this message naming the option, not float()'s, and so does a NumPy array
    of one or more dims (float() would take a one-element one). A 0-d NumPy array is taken as its
    value: torch.compile traces a NumPy scalar as one, so refusing it would refuse np.float32(0.5)
    in compiled code (_int32 and _bool take 0-d arrays of their kinds alike)."""
    if type(value) is float:  # the common case, first
        f = value
    else:
        f = None
        if not isinstance(value, (str, bytes, bytearray, bool)) and not is_torch_tensor(value):
            np = sys.modules.get("numpy")
            if np is None or not (isinstance(value, np.bool_)
                                  or (isinstance(value, np.ndarray) and value.ndim != 0)):
                try:
                    f = float(value)
                except OverflowError:  # an int past float64's range
                    f = _INF
                except (TypeError, ValueError):
                    pass
        if f is None:
            raise _not_a("float", value, what, fn)
    # The C ABI's options are float32: a finite value that would round to 0 or to inf there is
    # refused (softcap = 1e-50 would turn softcapping off). 0, NaN and a given inf go on to the
    # library's rules, which name them.
    if f == 0.0 or f != f or _F32_UNDERFLOW < abs(f) < _F32_OVERFLOW:
        return f
    if abs(f) == _INF and not isinstance(value, int):
        return f
    raise InvalidArgumentError(
        f"{fn}: {what} = {value!r} rounds to {'0' if abs(f) <= _F32_UNDERFLOW else 'inf'} in float32, "
        "the type of fa4's options")


def normalize_window(window_size, fn: str):
    """(left, right) ints from flash-attn's (-1, -1) convention; None also means unbounded."""
    if type(window_size) is tuple and len(window_size) == 2:  # fast path: two int32 ints
        left, right = window_size
        if (type(left) is int and type(right) is int and _INT32_MIN <= left <= _INT32_MAX
                and _INT32_MIN <= right <= _INT32_MAX):
            return left, right
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"{fn}: window_size = {window_size!r} must be a pair (left, right)") from None
    left = -1 if left is None else _int32(left, "window_size[0]", fn)
    right = -1 if right is None else _int32(right, "window_size[1]", fn)
    return left, right


def backend_code(backend, fn: str) -> int:
    code = _BACKENDS.get(backend) if type(backend) is str else None  # the common case, first
    if code is not None:
        return code
    if isinstance(backend, str) and backend in _capi.BACKENDS:
        return _capi.BACKENDS[backend]
    raise InvalidArgumentError(
        f"{fn}: backend = {backend!r} must be one of {sorted(_capi.BACKENDS)}")


class CallOptions:
    """fa4_options plus the fa4_tensor objects its pointers refer to (kept alive with it).

    The parameters may be given by position in this order (the torch ops do, to save the cost of
    keyword passing on every call)."""

    __slots__ = ("struct", "_keep", "address")

    def __init__(self, fn: str, softmax_scale=None, causal=False, window_size=(-1, -1),
                 softcap=0.0, sink=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                 max_seqlen_q=0, max_seqlen_k=0, rescale_threshold=None,
                 exp2_emulation_fraction=None, backend="auto", deterministic=False, streams=None):
        o = _capi.new_options()
        if softmax_scale is not None:
            o.has_softmax_scale = 1
            o.softmax_scale = _float(softmax_scale, "softmax_scale", fn)  # fp32, as in the C++ API
        o.causal = 1 if _bool(causal, "causal", fn) else 0
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
        o.deterministic = 1 if _bool(deterministic, "deterministic", fn) else 0
        self._keep = []
        if (sink is not None or cu_seqlens_q is not None or cu_seqlens_k is not None
                or seqused_k is not None):
            for field, value in (("sink", sink), ("cu_seqlens_q", cu_seqlens_q),
                                 ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
                if value is not None:
                    t = describe(value, field, fn, streams)
                    self._keep.append(t)
                    setattr(o, field, ctypes.pointer(t))
        self.struct = o
        self.address = ctypes.addressof(o)  # (fa4._fastpath.call takes addresses)

    def with_workspace(self, workspace, fn: str, streams=None) -> "CallOptions":
        """A copy whose options.workspace is `workspace` (kept alive with it); self is unchanged
        (the torch ops share cached options between calls)."""
        c = CallOptions.__new__(CallOptions)
        c.struct = type(self.struct).from_buffer_copy(self.struct)
        require_writeable(fn, (workspace, "workspace"))
        t = describe(workspace, "workspace", fn, streams)
        c._keep = self._keep + [t, workspace]
        c.struct.workspace = ctypes.pointer(t)
        c.address = ctypes.addressof(c.struct)
        return c


_default_kvcache_args_bytes = None  # fa4_kvcache_args_init's output, taken once (constants)


class KVCacheCall:
    """fa4_kvcache_args plus the fa4_tensor objects its pointers refer to (kept alive with it).
    Tensors are NumPy arrays or torch tensors (int32 for the index tensors); None = not given."""

    __slots__ = ("struct", "_keep", "address")

    def __init__(self, fn: str, k_new=None, v_new=None, cache_seqlens=None, cache_batch_idx=None,
                 page_table=None, num_splits=0, streams=None):
        global _default_kvcache_args_bytes
        b = _default_kvcache_args_bytes
        if b is None:
            b = _default_kvcache_args_bytes = bytes(_capi.new_kvcache_args())
        a = _capi.KVCacheArgs.from_buffer_copy(b)
        a.num_splits = _int32(num_splits, "num_splits", fn)
        self._keep = []
        for field, value in (("k_new", k_new), ("v_new", v_new), ("cache_seqlens", cache_seqlens),
                             ("cache_batch_idx", cache_batch_idx), ("page_table", page_table)):
            if value is not None:
                t = describe(value, field, fn, streams)
                self._keep.append(t)
                setattr(a, field, ctypes.pointer(t))
        self.struct = a
        self.address = ctypes.addressof(a)


def _check_ranks(fn: str, *tensors):
    """The C library's rank rule (src/common/validate.cpp check_ndim) in its words, for the tensors
    the outputs are shaped from, checked before anything is allocated: (name, shape, want,
    layout) each; fn is the library function whose rule it is, whichever route called."""
    for name, shape, want, layout in tensors:
        if len(shape) != want:
            raise InvalidArgumentError(
                f"{fn}: {name}.ndim = {len(shape)} (shape {tuple(shape)}) must be {want}: {layout}")


def kvcache_output_shapes(q_shape, v_cache_shape):
    """(out shape, lse shape) of forward_with_kvcache; raises for a q or v_cache that is not 4-D
    (the C library checks everything else)."""
    if len(q_shape) != 4 or len(v_cache_shape) != 4:
        _check_ranks("fa4::forward_with_kvcache",
                     ("q", q_shape, 4, "q is (batch, seqlen_q, num_heads, headdim); "
                      "forward_with_kvcache has no varlen layout"),
                     ("v_cache", v_cache_shape, 4, "v_cache is (batch_cache, seqlen_cache, "
                      "num_heads_kv, headdim_v), or paged (num_pages, page_size, num_heads_kv, "
                      "headdim_v)"))
    return ((q_shape[0], q_shape[1], q_shape[2], v_cache_shape[3]),
            (q_shape[0], q_shape[2], q_shape[1]))


def is_int_seqlens(value) -> bool:
    """True if cache_seqlens is a Python/NumPy integer (one value for every sequence)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.integer)


def numpy_forward_with_kvcache(q, k_cache, v_cache, *, fn: str, k_new=None, v_new=None,
                               cache_seqlens=None, cache_batch_idx=None, page_table=None,
                               num_splits=0, **options):
    """Allocates out/lse with NumPy and runs fa4_forward_with_kvcache (appending in place into
    the k_cache/v_cache arrays when k_new/v_new are given)."""
    import numpy as np

    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k_new),
                    ("v", v_new)):
        if x is not None and not isinstance(x, np.ndarray):
            raise InvalidArgumentError(
                f"{fn}: {name} is a {type(x).__name__}; q, k_cache, v_cache, k, v must all be "
                "numpy.ndarray or all torch.Tensor")
    if k_new is not None or v_new is not None:  # appended in place
        require_writeable(fn, (k_cache, "k_cache"), (v_cache, "v_cache"))
    out_shape, lse_shape = kvcache_output_shapes(q.shape, v_cache.shape)
    if is_int_seqlens(cache_seqlens):
        cache_seqlens = np.full((q.shape[0],), _int32(int(cache_seqlens), "cache_seqlens", fn),
                                dtype=np.int32)
    out = np.empty(out_shape, dtype=q.dtype)
    lse = np.empty(lse_shape, dtype=np.float32)
    opts = CallOptions(fn, **options)
    args = KVCacheCall(fn, k_new, v_new, cache_seqlens, cache_batch_idx, page_table, num_splits)
    ts = [describe(x, n, fn) for x, n in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"),
                                          (out, "out"), (lse, "lse"))]
    _capi.forward_with_kvcache(*ts, opts.struct, args.struct)
    return out, lse


# ---- low-level entry points (caller-allocated outputs; NumPy or torch, no autograd) --------------
def forward(q, k, v, out, lse, **options) -> None:
    """Runs fa4_forward on caller-allocated `out` and `lse` (NumPy arrays or torch tensors, no
    autograd). Batched: q (batch, seqlen_q, num_heads, headdim), k (batch, seqlen_k, num_heads_kv,
    headdim), v (batch, seqlen_k, num_heads_kv, headdim_v), out (batch, seqlen_q, num_heads,
    headdim_v) in q's dtype (bf16, fp16 or fp32), lse (batch, num_heads, seqlen_q) fp32, natural
    log; varlen (cu_seqlens_q/k given): the batch and seqlen dims become total_q / total_k rows and
    lse is (num_heads, total_q). Full rules: include/fa4/attention.h.

    Options (keywords): softmax_scale, causal, window_size, softcap, sink, cu_seqlens_q,
    cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, rescale_threshold,
    exp2_emulation_fraction, backend, deterministic, with :func:`fa4.flash_attn_func`'s meanings
    (there is no return_lse: lse is always written). Raises a :class:`fa4.Fa4Error` subclass, as
    flash_attn_func does (nothing is written then); TypeError for an unknown keyword.
    """
    fn = "fa4.forward"
    require_writeable(fn, (out, "out"), (lse, "lse"))
    opts = CallOptions(fn, **options)
    ts = [describe(x, n, fn) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    _capi.forward(*ts, opts.struct)


def backward(dout, q, k, v, out, lse, dq, dk, dv, dsink=None, **options) -> None:
    """Runs fa4_backward, writing caller-allocated dq, dk, dv (and dsink iff a sink is given; fp32
    (num_heads,)). dout, dq, dk, dv have the shapes and dtype of out, q, k, v (see :func:`forward`);
    out and lse are the forward's. dk/dv are summed over the query heads sharing each KV head.
    Give the forward's options (the same keywords; deterministic=True orders the dq additions so
    that repeated runs are bitwise equal). Raises a :class:`fa4.Fa4Error` subclass as
    :func:`forward` does (the CPU's InternalError for an lse that does not belong to these inputs
    comes after the gradients were written).
    """
    fn = "fa4.backward"
    require_writeable(fn, (dq, "dq"), (dk, "dk"), (dv, "dv"), (dsink, "dsink"))
    opts = CallOptions(fn, **options)
    ts = [describe(x, n, fn) for x, n in ((dout, "dout"), (q, "q"), (k, "k"), (v, "v"),
                                           (out, "out"), (lse, "lse"), (dq, "dq"), (dk, "dk"),
                                           (dv, "dv"))]
    tsink = describe(dsink, "dsink", fn) if dsink is not None else None
    _capi.backward(*ts, tsink, opts.struct)


def forward_support(q, k, v, out, lse, **options):
    """(True, kernel_name) if :func:`forward` would run on these arguments, else (False, reason):
    the message :func:`forward` would raise (an InvalidArgumentError's, an UnsupportedError's or a
    NoDeviceError's), for the arrays' own rules (dtype, rank, device) and the options' too. Runs
    nothing and writes nothing. Raises only what no call could get past: TypeError for an unknown
    keyword, LibraryNotFoundError without libfa4."""
    fn = "fa4.forward_support"
    try:
        opts = CallOptions(fn, **options)
        ts = [describe(x, n, fn) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"), (lse, "lse"))]
    except LibraryNotFoundError:
        raise
    except Fa4Error as e:
        return False, str(e)
    return _capi.forward_support(*ts, opts.struct)


# ---- output shapes shared by the NumPy path and the torch fake kernels --------------------------
def output_shapes(q_shape, v_shape, varlen: bool):
    """(out shape, lse shape) for q/v shapes; raises for a q or v of the wrong rank (the C library
    checks everything else, k's rank included)."""
    want = 3 if varlen else 4
    if len(q_shape) != want or len(v_shape) != want:
        if varlen:
            _check_ranks("fa4::forward", ("q", q_shape, 3, "varlen q is (total_q, num_heads, headdim)"),
                         ("v", v_shape, 3, "varlen v is (total_k, num_heads_kv, headdim_v)"))
        _check_ranks("fa4::forward",
                     ("q", q_shape, 4, "q is (batch, seqlen_q, num_heads, headdim); pass cu_seqlens "
                      "for varlen"),
                     ("v", v_shape, 4, "v is (batch, seqlen_k, num_heads_kv, headdim_v)"))
    if varlen:
        return (q_shape[0], q_shape[1], v_shape[2]), (q_shape[1], q_shape[0])
    return ((q_shape[0], q_shape[1], q_shape[2], v_shape[3]),
            (q_shape[0], q_shape[2], q_shape[1]))


def numpy_forward(q, k, v, *, varlen: bool, fn: str, **options):
    """Allocates out/lse with NumPy and runs the forward. Varlen rows outside every sequence stay
    out = 0, lse = -inf (the library leaves them untouched)."""
    import numpy as np

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray):
            raise InvalidArgumentError(
                f"{fn}: {name} is a {type(x).__name__}; q, k, v must all be numpy.ndarray or all "
                "torch.Tensor")
    out_shape, lse_shape = output_shapes(q.shape, v.shape, varlen)
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
