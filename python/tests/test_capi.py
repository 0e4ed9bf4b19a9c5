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
    assert ctypes.sizeof(_capi.Tensor) == 96 and ctypes.sizeof(_capi.Options) == 96
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


# ---- fa4_forward_with_kvcache (ABI 3) ---------------------------------------------------------------
def _kv_views(with_append=True):
    """(arrays, views, args): a dense cache of capacity 6, two sequences with 2 and 4 cached keys,
    one appended key each. Keep `arrays` referenced while the views are used."""
    rng = np.random.default_rng(11)
    b, h, hkv, d, cap = 2, 4, 2, 8, 6
    arrays = [rng.standard_normal((b, 1, h, d)).astype(np.float32),
              rng.standard_normal((b, cap, hkv, d)).astype(np.float32),
              rng.standard_normal((b, cap, hkv, d)).astype(np.float32),
              np.full((b, 1, h, d), 7.0, np.float32), np.full((b, h, 1), 7.0, np.float32),
              rng.standard_normal((b, 1, hkv, d)).astype(np.float32),
              rng.standard_normal((b, 1, hkv, d)).astype(np.float32),
              np.array([2, 4], np.int32)]
    names = ["q", "k_cache", "v_cache", "out", "lse", "k_new", "v_new", "cache_seqlens"]
    views = [_core.describe(a, n, "test") for a, n in zip(arrays, names)]
    args = _capi.new_kvcache_args()
    if with_append:
        args.k_new, args.v_new = ctypes.pointer(views[5]), ctypes.pointer(views[6])
    args.cache_seqlens = ctypes.pointer(views[7])
    return arrays, views, args


def _kv_call(views, options, args):
    lib = _capi.library()
    return lib.fa4_forward_with_kvcache(*[ctypes.byref(t) for t in views[:5]],
                                        ctypes.byref(options) if options is not None else None,
                                        ctypes.byref(args) if args is not None else None)


def test_kvcache_args_struct_and_init():
    lib = _capi.library()
    assert ctypes.sizeof(_capi.KVCacheArgs) == 56
    a = _capi.new_kvcache_args()
    assert a.struct_size == 56 and a.num_splits == 0
    assert not any(getattr(a, f) for f in ("k_new", "v_new", "cache_seqlens", "cache_batch_idx",
                                           "page_table"))
    assert lib.fa4_kvcache_args_init(None, 56) == _capi.STATUS_INVALID_ARGUMENT
    assert lib.fa4_last_error() == b"fa4_kvcache_args_init: args is NULL"
    assert lib.fa4_kvcache_args_init(ctypes.byref(a), 8) == _capi.STATUS_INVALID_ARGUMENT
    assert b"smaller than the v3 fa4_kvcache_args" in lib.fa4_last_error()


def test_kvcache_appends_and_null_args_mean_full_cache():
    arrays, views, args = _kv_views()
    k0 = arrays[1].copy()
    assert _kv_call(views, None, args) == _capi.STATUS_OK, _capi.library().fa4_last_error()
    assert np.array_equal(arrays[1][0, 2], arrays[5][0, 0])
    assert np.array_equal(arrays[1][1, 4], arrays[5][1, 0])
    mask = np.ones(arrays[1].shape, bool)
    mask[0, 2] = mask[1, 4] = False
    assert np.array_equal(arrays[1][mask], k0[mask])  # nothing else written
    assert np.isfinite(arrays[3]).all() and not np.all(arrays[3] == 7.0)
    # NULL args: no append, every sequence holds the whole capacity.
    arrays[3][...] = 7.0
    assert _kv_call(views, None, None) == _capi.STATUS_OK
    assert not np.all(arrays[3] == 7.0)


def test_kvcache_args_struct_size_rules():
    arrays, views, args = _kv_views()

    class Newer(ctypes.Structure):
        _fields_ = [("v3", _capi.KVCacheArgs), ("future_field", ctypes.c_int64)]

    n = Newer()
    lib = _capi.library()
    assert lib.fa4_kvcache_args_init(ctypes.byref(n.v3), ctypes.sizeof(Newer)) == 0
    assert n.v3.struct_size == ctypes.sizeof(Newer)
    n.v3.cache_seqlens = args.cache_seqlens
    assert _kv_call(views, None, n.v3) == _capi.STATUS_OK
    n.future_field = 1
    arrays[3][...] = 7.0
    assert _kv_call(views, None, n.v3) == _capi.STATUS_UNSUPPORTED
    assert b"args sets fields unknown to this library" in lib.fa4_last_error()
    assert np.all(arrays[3] == 7.0)
    args.struct_size = 16
    assert _kv_call(views, None, args) == _capi.STATUS_INVALID_ARGUMENT
    assert b"fa4_kvcache_args_init" in lib.fa4_last_error()
    args.struct_size = ctypes.sizeof(_capi.KVCacheArgs)
    args.reserved = 1  # the padding word must stay 0
    assert _kv_call(views, None, args) == _capi.STATUS_INVALID_ARGUMENT
    assert b"args.reserved = 1 must be 0" in lib.fa4_last_error()
    assert np.all(arrays[3] == 7.0)


def test_kvcache_errors_name_the_tensor_and_write_nothing():
    arrays, views, args = _kv_views()
    lib = _capi.library()
    arrays[7][1] = 6  # capacity 6, one new key: at most 5 cached
    k0, v0 = arrays[1].copy(), arrays[2].copy()
    assert _kv_call(views, None, args) == _capi.STATUS_INVALID_ARGUMENT
    assert lib.fa4_last_error() == (b"fa4::forward_with_kvcache: cache_seqlens[1] = 6 must be in "
                                    b"[0, 5] (key_capacity 6 - seqlen_new 1): the cache holds "
                                    b"cache_seqlens[b] + seqlen_new keys of sequence b")
    assert np.array_equal(arrays[1], k0) and np.array_equal(arrays[2], v0)
    assert np.all(arrays[3] == 7.0) and np.all(arrays[4] == 7.0)
    args.k_new = None
    assert _kv_call(views, None, args) == _capi.STATUS_INVALID_ARGUMENT
    assert b"options.k_new is missing" in lib.fa4_last_error()
    o = _capi.default_options()
    o.max_seqlen_q = 1
    assert _kv_call(views, o, None) == _capi.STATUS_INVALID_ARGUMENT
    assert b"varlen q is not supported by forward_with_kvcache" in lib.fa4_last_error()


def test_kvcache_support_name_and_status():
    arrays, views, args = _kv_views()
    lib = _capi.library()
    buf = ctypes.create_string_buffer(64)
    k0 = arrays[1].copy()
    assert lib.fa4_forward_with_kvcache_support(*[ctypes.byref(t) for t in views[:5]], None,
                                                ctypes.byref(args), buf, 64) == 0
    assert buf.value == b"cpu::flash_forward_with_kvcache"
    assert np.array_equal(arrays[1], k0) and np.all(arrays[3] == 7.0)  # runs nothing
    o = _capi.default_options()
    o.backend = _capi.BACKENDS["cpu_reference"]
    assert _capi.forward_with_kvcache_support(*views[:5], o, args) == (
        True, "cpu::reference_forward_with_kvcache")
    o.backend = _capi.BACKENDS["cuda"]
    ok, why = _capi.forward_with_kvcache_support(*views[:5], o, args)
    assert not ok and why.startswith("fa4::forward_with_kvcache: options.backend = kCuda ('cuda') needs CUDA tensors")


def test_documented_leniencies_of_abi_v3():
    # What ABI v3 callers may rely on (c_api.h): a value without its has_ flag is not read, a CPU
    # tensor's device_index is not read, and check_async_errors of an index no kernel ran on is OK.
    arrays, views = _views()
    o = _capi.default_options()
    o.softmax_scale = 0.5  # has_softmax_scale = 0: the default scale
    assert _call(views, o) == _capi.STATUS_OK
    out_default = arrays[3].copy()
    arrays, views2 = _views()
    views2[1].device_index = 3
    assert _call(views2, None) == _capi.STATUS_OK
    np.testing.assert_array_equal(arrays[3], out_default)
    assert _capi.library().fa4_check_async_errors(-1) == _capi.STATUS_OK
    assert _capi.library().fa4_check_async_errors(1 << 20) == _capi.STATUS_OK


def test_release_cached_memory_index():
    lib = _capi.library()
    assert lib.fa4_release_cached_memory(-1) == _capi.STATUS_INVALID_ARGUMENT
    assert lib.fa4_last_error() == b"fa4::release_cached_memory: device_index = -1 must be >= 0"
    assert lib.fa4_release_cached_memory(1 << 20) == _capi.STATUS_OK  # nothing cached there
    assert lib.fa4_last_error() == b""


def test_v1_options_struct_and_workspace_rules():
    # A caller compiled against the v1-v3 header passes an 88-byte struct (no workspace field):
    # read as such, the library's own later fields keep their defaults. The forwards refuse a
    # workspace (a backward option); the CPU backward needs none (size 0) and leaves a given one
    # unused.
    lib = _capi.library()
    arrays, views = _views()
    o = _capi.default_options()
    o.struct_size = 88
    o.causal = 1
    junk = _capi.Tensor()  # past an 88-byte caller's struct: never read
    o.workspace = ctypes.pointer(junk)
    assert _call(views, o) == _capi.STATUS_OK
    o.workspace = None
    want = arrays[3].copy()
    # fa4_options_init for an 88-byte struct writes 88 bytes, not the 96 of this header's.
    buf = (ctypes.c_uint8 * ctypes.sizeof(_capi.Options))(*([0xAB] * ctypes.sizeof(_capi.Options)))
    assert lib.fa4_options_init(ctypes.cast(buf, ctypes.POINTER(_capi.Options)), 88) == 0
    assert list(buf[88:]) == [0xAB] * (ctypes.sizeof(_capi.Options) - 88)
    assert ctypes.cast(buf, ctypes.POINTER(_capi.Options)).contents.struct_size == 88
    o.struct_size = ctypes.sizeof(_capi.Options)
    raw = np.zeros(128, np.int32)
    buf = raw[(-raw.ctypes.data % 256) // 4:][:64]  # 256-byte aligned, as the rule asks
    ws = _core.describe(buf, "workspace", "test")
    o.workspace = ctypes.pointer(ws)
    assert _call(views, o) == _capi.STATUS_INVALID_ARGUMENT
    assert lib.fa4_last_error() == (b"fa4_forward: options.workspace is given, but only "
                                    b"fa4_backward takes a workspace")

    grads = [np.zeros_like(a) for a in arrays[:3]]
    dout = np.ones_like(arrays[3])
    bviews = ([_core.describe(dout, "dout", "test")] + views
              + [_core.describe(g, n, "test") for g, n in zip(grads, ["dq", "dk", "dv"])])
    n = ctypes.c_uint64(123)
    assert lib.fa4_backward_workspace_size(*[ctypes.byref(t) for t in bviews], None,
                                           ctypes.byref(o), ctypes.byref(n)) == _capi.STATUS_OK
    assert n.value == 0
    assert lib.fa4_backward(*[ctypes.byref(t) for t in bviews], None, ctypes.byref(o)) == 0
    np.testing.assert_array_equal(buf, 0)  # not used
    o.workspace = None
    grads_without = [g.copy() for g in grads]
    assert lib.fa4_backward(*[ctypes.byref(t) for t in bviews], None, ctypes.byref(o)) == 0
    for a, b in zip(grads, grads_without):
        np.testing.assert_array_equal(a, b)
    assert np.array_equal(arrays[3], want)
    assert lib.fa4_backward_workspace_size(*[ctypes.byref(t) for t in bviews], None,
                                           ctypes.byref(o), None) == _capi.STATUS_INVALID_ARGUMENT
    assert lib.fa4_last_error() == b"fa4_backward_workspace_size: bytes is NULL"
    off = raw[(-raw.ctypes.data % 256) // 4 + 1:][:32]  # 4 bytes past a multiple of 256
    o.workspace = ctypes.pointer(_core.describe(off, "workspace", "test"))
    assert lib.fa4_backward(*[ctypes.byref(t) for t in bviews], None, ctypes.byref(o)) == 1
    assert lib.fa4_last_error().startswith(b"fa4::backward: options.workspace.data must be a "
                                           b"multiple of 256 bytes")


def test_call_options_with_workspace():
    # CallOptions.with_workspace (the torch path's CUDA backward) sets options.workspace on a copy:
    # the library reads it (a misaligned one is refused by name), the original stays without.
    arrays, views = _views()
    grads = [np.zeros_like(a) for a in arrays[:3]]
    bviews = ([_core.describe(np.ones_like(arrays[3]), "dout", "test")] + views
              + [_core.describe(g, n, "test") for g, n in zip(grads, ["dq", "dk", "dv"])])
    base = _core.CallOptions("test")
    assert _capi.library().fa4_forward(*[ctypes.byref(t) for t in views], ctypes.byref(base.struct)) == 0
    raw = np.zeros(128, np.int32)
    off = raw[(-raw.ctypes.data % 256) // 4 + 1:][:16]
    with_ws = base.with_workspace(off, "test")
    assert not base.struct.workspace and with_ws.struct.workspace
    with pytest.raises(fa4.InvalidArgumentError, match="options.workspace.data must be a multiple of 256"):
        _capi.backward(*bviews, None, with_ws.struct)
    _capi.backward(*bviews, None, base.struct)
