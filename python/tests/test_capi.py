"""Tests of the C ABI itself (include/fa4/c_api.h) through ctypes: the versioned options struct,
NULL and out-of-range arguments, and the thread-local last-error message."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import fa4
from fa4 import _capi, _core


def _views(b=1, s=8, h=2, d=16):
    """(arrays, fa4_tensor views of them). The views do not own memory: callers must keep
    `arrays` referenced for as long as the views are used."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((b, s, h, d)).astype(np.float32) for _ in range(3)]
    arrays += [np.full((b, s, h, d), 7.0, np.float32), np.full((b, h, s), 7.0, np.float32)]
    views = [_core.describe(a, n, "test") for a, n in zip(arrays, ["q", "k", "v", "out", "lse"])]
    return arrays, views


def _call(views, options):
    lib = _capi.library()
    ptr = ctypes.byref(options) if options is not None else None
    return lib.fa4_forward(*[ctypes.byref(t) for t in views], ptr)


def test_abi_version_and_defaults():
    lib = _capi.library()
    assert lib.fa4_abi_version() == _capi.C_API_VERSION
    assert ctypes.sizeof(_capi.Tensor) == 96 and ctypes.sizeof(_capi.Options) == 88
    o = _capi.default_options()
    assert o.struct_size == ctypes.sizeof(_capi.Options)
    assert (o.causal, o.window_size_left, o.window_size_right, o.backend) == (0, -1, -1, 0)
    assert o.rescale_threshold == 8.0 and not o.has_softmax_scale
    assert lib.fa4_status_name(1) == b"invalid_argument"
    assert lib.fa4_status_name(99) == b"unknown_error"


def test_null_options_means_defaults():
    arrays, views = _views()
    assert _call(views, None) == _capi.STATUS_OK
    assert _capi.library().fa4_last_error() == b""
    assert np.isfinite(arrays[3]).all() and not np.all(arrays[3] == 7.0)


def test_null_tensor_is_named():
    arrays, views = _views()  # keep the arrays alive: the views point into them
    lib = _capi.library()
    args = [ctypes.byref(t) for t in views]
    args[1] = None
    assert lib.fa4_forward(*args, None) == _capi.STATUS_INVALID_ARGUMENT
    assert lib.fa4_last_error() == b"fa4_forward: k is NULL"


def test_options_struct_size_rules():
    arrays, views = _views()
    o = _capi.default_options()
    o.struct_size = 40  # smaller than the v1 struct: an uninitialised or foreign struct
    assert _call(views, o) == _capi.STATUS_INVALID_ARGUMENT
    assert b"fa4_options_init" in _capi.library().fa4_last_error()

    # A caller built against a newer header: a larger struct whose extra bytes are zero (= the
    # defaults of fields this library does not know) is accepted...
    class Newer(ctypes.Structure):
        _fields_ = [("v1", _capi.Options), ("future_field", ctypes.c_int64)]

    n = Newer()
    assert _capi.library().fa4_options_init(ctypes.byref(n.v1), ctypes.sizeof(Newer)) == 0
    assert n.v1.struct_size == ctypes.sizeof(Newer) and n.future_field == 0
    assert _call(views, n.v1) == _capi.STATUS_OK
    # ...but a non-zero unknown field is a request this library would ignore: refused.
    n.future_field = 1
    arrays[3][...] = 7.0
    assert _call(views, n.v1) == _capi.STATUS_UNSUPPORTED
    assert b"unknown to this library" in _capi.library().fa4_last_error()
    assert np.all(arrays[3] == 7.0)


@pytest.mark.parametrize("field,value,message", [
    ("causal", 2, b"options.causal = 2 must be 0 or 1"),
    ("has_softmax_scale", -1, b"options.has_softmax_scale = -1 must be 0 or 1"),
    ("backend", 9, b"options.backend = 9 is not an fa4_backend value"),
])
def test_option_ranges(field, value, message):
    arrays, views = _views()
    o = _capi.default_options()
    setattr(o, field, value)
    assert _call(views, o) == _capi.STATUS_INVALID_ARGUMENT
    assert message in _capi.library().fa4_last_error()
    assert np.all(arrays[3] == 7.0)


def test_tensor_field_ranges():
    arrays, views = _views()  # keep the arrays alive: the views point into them
    views[0].dtype = 17
    assert _call(views, None) == _capi.STATUS_INVALID_ARGUMENT
    assert b"q.dtype = 17" in _capi.library().fa4_last_error()
    arrays, views = _views()  # keep the arrays alive: the views point into them
    views[2].ndim = 9
    assert _call(views, None) == _capi.STATUS_INVALID_ARGUMENT
    assert b"v.ndim = 9" in _capi.library().fa4_last_error()
    arrays, views = _views()  # keep the arrays alive: the views point into them
    views[4].device_type = 5
    assert _call(views, None) == _capi.STATUS_INVALID_ARGUMENT
    assert b"lse.device_type = 5" in _capi.library().fa4_last_error()


def test_last_error_is_thread_local_and_cleared_by_success():
    good_arrays, good = _views()
    bad_arrays, bad = _views()
    bad[1].shape[3] = 8  # k headdim != q headdim
    lib = _capi.library()
    assert _call(bad, None) == _capi.STATUS_INVALID_ARGUMENT
    main_message = lib.fa4_last_error()
    assert b"headdim" in main_message
    seen = {}

    def other():
        seen["before"] = lib.fa4_last_error()
        seen["status"] = _call(good, None)
        seen["after"] = lib.fa4_last_error()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == {"before": b"", "status": 0, "after": b""}
    assert lib.fa4_last_error() == main_message  # untouched by the other thread
    assert _call(good, None) == 0 and lib.fa4_last_error() == b""


def test_status_maps_to_exception_classes():
    for code, cls, base in [(1, fa4.InvalidArgumentError, ValueError),
                            (2, fa4.UnsupportedError, NotImplementedError),
                            (3, fa4.CudaError, RuntimeError), (4, fa4.NoDeviceError, RuntimeError),
                            (5, fa4.InternalError, RuntimeError)]:
        assert _capi._ERROR_CLASSES[code] is cls and issubclass(cls, base)
        assert issubclass(cls, fa4.Fa4Error) and cls.code == code


def test_forward_support_kernel_name_truncation():
    arrays, views = _views()  # keep the arrays alive: the views point into them
    lib = _capi.library()
    buf = ctypes.create_string_buffer(5)
    assert lib.fa4_forward_support(*[ctypes.byref(t) for t in views], None, buf, 5) == 0
    assert buf.value == b"cpu:"  # "cpu::flash_forward" cut to 4 chars + NUL


@pytest.mark.parametrize("backend", [3, 2])  # CUDA backend on CPU tensors; reference on fp32
def test_forward_support_status_equals_forward_status(backend):
    arrays, views = _views()
    lib = _capi.library()
    o = _capi.default_options()
    o.backend = backend
    support = lib.fa4_forward_support(*[ctypes.byref(t) for t in views], ctypes.byref(o), None, 0)
    support_msg = lib.fa4_last_error()
    status = _call(views, o)
    assert support == status, (support, support_msg, status, lib.fa4_last_error())
    if status != 0:
        assert support_msg == lib.fa4_last_error()


def _field_by_field(data, dtype, shape, strides, device_type=0, device_index=0, stream=None):
    """The fa4_tensor built one ctypes field at a time (what _core.describe packs in one call)."""
    t = _capi.Tensor()
    t.data, t.dtype, t.ndim = data, dtype, len(shape)
    for d, (n, s) in enumerate(zip(shape, strides)):
        t.shape[d], t.stride[d] = n, s
    t.device_type, t.device_index, t.stream = device_type, device_index, stream
    return t


def test_describe_packs_every_field():
    base = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    for a in (base, base[::-1, :, ::2], base.transpose(2, 0, 3, 1), base[0, 1], base[0, 0, 0],
              np.zeros((), np.float16), np.zeros((3, 0), np.int32)):
        item = a.itemsize
        want = _field_by_field(a.ctypes.data, _core._numpy_dtype_code(a.dtype), a.shape,
                               [s // item for s in a.strides])
        assert bytes(_core.describe(a, "x", "test")) == bytes(want), a.shape
    with pytest.raises(fa4.InvalidArgumentError,
                       match=r"test: x has 5 dims \(1, 1, 1, 1, 1\); fa4 tensors have at most 4"):
        _core.describe(np.zeros((1,) * 5, np.float32), "x", "test")


def test_default_options_copy_equals_options_init():
    assert bytes(_capi.new_options()) == bytes(_capi.default_options())
    a, b = _capi.new_options(), _capi.new_options()
    a.causal = 1  # each call is a fresh struct
    assert b.causal == 0 and bytes(_capi.new_options()) == bytes(_capi.default_options())
