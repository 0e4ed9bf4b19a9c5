"""ctypes binding of libfa4's C ABI (include/fa4/c_api.h).

This module knows nothing about NumPy or torch: it loads the shared library, mirrors the C structs
and turns status codes into Python exceptions. The struct layouts below must match c_api.h
exactly; ``fa4_abi_version()`` is checked at load time.

Which library is loaded (first match wins):
  1. ``$FA4_LIBRARY`` — an explicit path to libfa4.so (e.g. a CMake build dir's ``src/libfa4.so``);
  2. the library installed inside this package by ``pip install ./python`` (``fa4/lib/libfa4.so``).
Nothing else is searched, so a stale system copy can never be picked up silently.

The C host path of the eager torch calls (``fa4._fastpath``, python/fa4/_fastpath.c) is the
module of that name built beside the loaded library (:func:`fastpath`); without it those calls take
the ctypes path below.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import pathlib
import threading
import warnings

# ---- constants mirrored from c_api.h ------------------------------------------------------------
C_API_VERSION = 4  # the FA4_C_API_VERSION this binding was written against
MAX_DIMS = 4

STATUS_OK = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_UNSUPPORTED = 2
STATUS_CUDA_ERROR = 3
STATUS_NO_DEVICE = 4
STATUS_INTERNAL = 5

DTYPE_BF16 = 0
DTYPE_FP16 = 1
DTYPE_FP32 = 2
DTYPE_FP8_E4M3 = 3
DTYPE_INT32 = 4

DEVICE_CPU = 0
DEVICE_CUDA = 1

BACKENDS = {"auto": 0, "cpu": 1, "cpu_reference": 2, "cuda": 3}

_LIBRARY_ENV = "FA4_LIBRARY"
_PACKAGED_LIBRARY = pathlib.Path(__file__).resolve().parent / "lib" / "libfa4.so"
# Bytes for fa4_forward_support's kernel name (names are short identifiers).
_KERNEL_NAME_CAPACITY = 256


# ---- exceptions -----------------------------------------------------------------------------------
class Fa4Error(Exception):
    """Base of every error fa4 raises. ``code`` is the C status (see c_api.h), ``status`` its name.

    The concrete classes also derive from the matching built-in so generic handlers work:
    InvalidArgumentError is a ValueError, UnsupportedError a NotImplementedError (hence a
    RuntimeError), the others RuntimeErrors.
    """

    code = STATUS_INTERNAL
    status = "internal"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgumentError(Fa4Error, ValueError):
    """A tensor or option breaks a documented rule (shape, dtype, stride, option range...)."""

    code, status = STATUS_INVALID_ARGUMENT, "invalid_argument"


class UnsupportedError(Fa4Error, NotImplementedError):
    """Valid arguments, but this build/device has no kernel for them (the message says what is)."""

    code, status = STATUS_UNSUPPORTED, "unsupported"


class CudaError(Fa4Error, RuntimeError):
    """A CUDA runtime call inside fa4 failed."""

    code, status = STATUS_CUDA_ERROR, "cuda_error"


class NoDeviceError(Fa4Error, RuntimeError):
    """A CUDA tensor was passed but there is no usable GPU or the library has no CUDA."""

    code, status = STATUS_NO_DEVICE, "no_device"


class InternalError(Fa4Error, RuntimeError):
    """A bug in fa4 (or the host ran out of memory)."""

    code, status = STATUS_INTERNAL, "internal"


_ERROR_CLASSES = {
    cls.code: cls
    for cls in (InvalidArgumentError, UnsupportedError, CudaError, NoDeviceError, InternalError)
}


class LibraryNotFoundError(Fa4Error, ImportError):
    """libfa4.so could not be found or loaded (the message says where fa4 looked)."""


# ---- struct mirrors -------------------------------------------------------------------------------
class Tensor(ctypes.Structure):
    """fa4_tensor: non-owning view; shape and strides in elements."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("stride", ctypes.c_int64 * MAX_DIMS),
        ("device_type", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
    ]


class Options(ctypes.Structure):
    """fa4_options (v4: v1 and workspace). Always created through :func:`default_options`."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("has_softmax_scale", ctypes.c_int32),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_size_left", ctypes.c_int32),
        ("window_size_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
        ("rescale_threshold", ctypes.c_float),
        ("has_exp2_emulation_fraction", ctypes.c_int32),
        ("exp2_emulation_fraction", ctypes.c_float),
        ("backend", ctypes.c_int32),
        ("deterministic", ctypes.c_int32),
        ("sink", ctypes.POINTER(Tensor)),
        ("cu_seqlens_q", ctypes.POINTER(Tensor)),
        ("cu_seqlens_k", ctypes.POINTER(Tensor)),
        ("seqused_k", ctypes.POINTER(Tensor)),
        ("workspace", ctypes.POINTER(Tensor)),  # ABI 4
    ]


class KVCacheArgs(ctypes.Structure):
    """fa4_kvcache_args (v3). Always created through :func:`new_kvcache_args`."""

    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("k_new", ctypes.POINTER(Tensor)),
        ("v_new", ctypes.POINTER(Tensor)),
        ("cache_seqlens", ctypes.POINTER(Tensor)),
        ("cache_batch_idx", ctypes.POINTER(Tensor)),
        ("page_table", ctypes.POINTER(Tensor)),
        ("num_splits", ctypes.c_int32),
        ("reserved", ctypes.c_int32),
    ]


_TP = ctypes.POINTER(Tensor)
_OP = ctypes.POINTER(Options)
_KP = ctypes.POINTER(KVCacheArgs)


# ---- loading --------------------------------------------------------------------------------------
_lock = threading.Lock()
_lib = None


def _candidates():
    env = os.environ.get(_LIBRARY_ENV)
    if env:
        return [pathlib.Path(env)], True
    return [_PACKAGED_LIBRARY], False


def _declare(lib):
    lib.fa4_options_init.argtypes = [_OP, ctypes.c_size_t]
    lib.fa4_options_init.restype = ctypes.c_int32
    lib.fa4_forward.argtypes = [_TP, _TP, _TP, _TP, _TP, _OP]
    lib.fa4_forward.restype = ctypes.c_int32
    lib.fa4_backward.argtypes = [_TP] * 10 + [_OP]
    lib.fa4_backward.restype = ctypes.c_int32
    lib.fa4_forward_support.argtypes = [_TP, _TP, _TP, _TP, _TP, _OP, ctypes.c_char_p,
                                        ctypes.c_size_t]
    lib.fa4_forward_support.restype = ctypes.c_int32
    lib.fa4_last_error.argtypes = []
    lib.fa4_last_error.restype = ctypes.c_char_p
    lib.fa4_status_name.argtypes = [ctypes.c_int32]
    lib.fa4_status_name.restype = ctypes.c_char_p
    lib.fa4_version.argtypes = []
    lib.fa4_version.restype = ctypes.c_char_p
    lib.fa4_abi_version.argtypes = []
    lib.fa4_abi_version.restype = ctypes.c_int32
    lib.fa4_has_cuda.argtypes = []
    lib.fa4_has_cuda.restype = ctypes.c_int32
    if hasattr(lib, "fa4_check_async_errors"):  # absent from older builds (benchmarks load those)
        lib.fa4_check_async_errors.argtypes = [ctypes.c_int32]
        lib.fa4_check_async_errors.restype = ctypes.c_int32
    if hasattr(lib, "fa4_release_cached_memory"):  # ABI 4
        lib.fa4_release_cached_memory.argtypes = [ctypes.c_int32]
        lib.fa4_release_cached_memory.restype = ctypes.c_int32
    if hasattr(lib, "fa4_backward_workspace_size"):  # ABI 4
        lib.fa4_backward_workspace_size.argtypes = [_TP] * 10 + [_OP, ctypes.POINTER(ctypes.c_uint64)]
        lib.fa4_backward_workspace_size.restype = ctypes.c_int32
    if hasattr(lib, "fa4_forward_with_kvcache"):  # ABI 3
        lib.fa4_kvcache_args_init.argtypes = [_KP, ctypes.c_size_t]
        lib.fa4_kvcache_args_init.restype = ctypes.c_int32
        lib.fa4_forward_with_kvcache.argtypes = [_TP, _TP, _TP, _TP, _TP, _OP, _KP]
        lib.fa4_forward_with_kvcache.restype = ctypes.c_int32
        lib.fa4_forward_with_kvcache_support.argtypes = [_TP, _TP, _TP, _TP, _TP, _OP, _KP,
                                                         ctypes.c_char_p, ctypes.c_size_t]
        lib.fa4_forward_with_kvcache_support.restype = ctypes.c_int32


def library():
    """The loaded libfa4 (ctypes.CDLL), loading it on first use. Raises LibraryNotFoundError."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, from_env = _candidates()
        errors = []
        for path in paths:
            if not path.is_file():
                errors.append(f"{path}: no such file")
                continue
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:  # e.g. a missing dependency such as libcudart
                errors.append(f"{path}: {e}")
                continue
            _declare(lib)
            abi = lib.fa4_abi_version()
            if abi < C_API_VERSION:
                errors.append(f"{path}: C ABI v{abi} is older than the v{C_API_VERSION} this "
                              "package needs; rebuild libfa4")
                continue
            _lib = lib
            return lib
        where = (f"${_LIBRARY_ENV}" if from_env else
                 f"the package (pip install ./python), or set ${_LIBRARY_ENV} to a built libfa4.so")
        raise LibraryNotFoundError(
            f"fa4: cannot load libfa4 from {where}: " + "; ".join(errors))


_fastpath_module = None  # fa4._fastpath as loaded by fastpath(); False: looked for, not there


def fastpath():
    """The ``fa4._fastpath`` extension module built beside the loaded libfa4 (same directory: the
    package's ``lib/``, or a CMake build's ``src/``), or None where there is none (CMake did not
    find Python's headers, ``-DFA4_PYTHON_FASTPATH=OFF``, another Python version). Its entry points
    are called with the addresses of the loaded library's functions, so it always calls the
    library this module loaded."""
    global _fastpath_module
    if _fastpath_module is None:
        found = False
        lib_dir = pathlib.Path(library()._name).resolve().parent
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = lib_dir / ("_fastpath" + suffix)
            if path.is_file():
                try:
                    spec = importlib.util.spec_from_file_location("fa4._fastpath", path)
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    found = module
                except (ImportError, OSError) as e:  # e.g. built for another Python
                    warnings.warn(f"fa4: {path} could not be loaded ({e}); eager calls take the "
                                  "ctypes path", RuntimeWarning, stacklevel=2)
                break
        _fastpath_module = found
    return _fastpath_module or None


def entry_address(name: str) -> int:
    """Address of libfa4's C function `name` (for fa4._fastpath.call)."""
    return ctypes.cast(getattr(library(), name), ctypes.c_void_p).value


def check(status: int) -> None:
    """Raises the Fa4Error subclass of `status` with the library's thread-local message."""
    if status == STATUS_OK:
        return
    lib = library()
    message = lib.fa4_last_error().decode("utf-8", errors="replace")
    cls = _ERROR_CLASSES.get(status, InternalError)
    if not message:
        message = f"fa4: call failed with status {status} ({lib.fa4_status_name(status).decode()})"
    raise cls(message)


def default_options() -> Options:
    """A fa4_options holding the library's defaults (via fa4_options_init)."""
    o = Options()
    check(library().fa4_options_init(ctypes.byref(o), ctypes.sizeof(Options)))
    return o


_default_options_bytes = None  # fa4_options_init's output, taken once: the defaults are constants


def new_options() -> Options:
    """Same as :func:`default_options`, copied from the first call's bytes (a C call and a byref
    fewer per attention call)."""
    global _default_options_bytes
    b = _default_options_bytes
    if b is None:
        b = _default_options_bytes = bytes(default_options())
    return Options.from_buffer_copy(b)


def new_kvcache_args() -> KVCacheArgs:
    """A fa4_kvcache_args holding the library's defaults (via fa4_kvcache_args_init)."""
    a = KVCacheArgs()
    check(library().fa4_kvcache_args_init(ctypes.byref(a), ctypes.sizeof(KVCacheArgs)))
    return a


def version() -> str:
    """libfa4's version string (the CMake project version)."""
    return library().fa4_version().decode()


def has_cuda() -> bool:
    """True if the loaded libfa4 was built with the CUDA (Hopper) kernels."""
    return bool(library().fa4_has_cuda())


def abi_version() -> int:
    return int(library().fa4_abi_version())


def library_path() -> str:
    return library()._name


# The structs are passed as they are: for a POINTER(Tensor) / POINTER(Options) argtype ctypes
# passes an instance by reference itself, faster than a ctypes.byref object per argument.
def forward(q, k, v, out, lse, options) -> None:
    status = (_lib if _lib is not None else library()).fa4_forward(q, k, v, out, lse, options)
    if status:
        check(status)


def backward(dout, q, k, v, out, lse, dq, dk, dv, dsink, options) -> None:
    status = (_lib if _lib is not None else library()).fa4_backward(
        dout, q, k, v, out, lse, dq, dk, dv, dsink, options)
    if status:
        check(status)


def forward_support(q, k, v, out, lse, options):
    """(True, kernel_name) if fa4_forward would run, else (False, reason). Raises nothing for
    unsupported or invalid arguments (the reason says why)."""
    buf = ctypes.create_string_buffer(_KERNEL_NAME_CAPACITY)
    lib = library()
    status = lib.fa4_forward_support(ctypes.byref(q), ctypes.byref(k), ctypes.byref(v),
                                     ctypes.byref(out), ctypes.byref(lse), ctypes.byref(options),
                                     buf, _KERNEL_NAME_CAPACITY)
    if status == STATUS_OK:
        return True, buf.value.decode()
    return False, lib.fa4_last_error().decode("utf-8", errors="replace")


def forward_with_kvcache(q, k_cache, v_cache, out, lse, options, args) -> None:
    status = (_lib if _lib is not None else library()).fa4_forward_with_kvcache(
        q, k_cache, v_cache, out, lse, options, args)
    if status:
        check(status)


def forward_with_kvcache_support(q, k_cache, v_cache, out, lse, options, args):
    """(True, kernel_name) if fa4_forward_with_kvcache would run, else (False, reason)."""
    buf = ctypes.create_string_buffer(_KERNEL_NAME_CAPACITY)
    lib = library()
    status = lib.fa4_forward_with_kvcache_support(q, k_cache, v_cache, out, lse, options, args,
                                                  buf, _KERNEL_NAME_CAPACITY)
    if status == STATUS_OK:
        return True, buf.value.decode()
    return False, lib.fa4_last_error().decode("utf-8", errors="replace")


def check_async_errors(device_index: int) -> None:
    """fa4_check_async_errors: raises InvalidArgumentError if an earlier kernel on CUDA device
    `device_index` met invalid device-resident varlen or KV-cache indices."""
    check(library().fa4_check_async_errors(device_index))


def release_cached_memory(device_index: int) -> None:
    """fa4_release_cached_memory: waits for CUDA device `device_index` and frees the scratch fa4
    keeps for eager calls there."""
    check(library().fa4_release_cached_memory(device_index))


def backward_workspace_size(dout, q, k, v, out, lse, dq, dk, dv, dsink, options) -> int:
    """fa4_backward_workspace_size: the bytes of options.workspace fa4_backward needs (0: none)."""
    n = ctypes.c_uint64(0)
    check(library().fa4_backward_workspace_size(
        dout, q, k, v, out, lse, dq, dk, dv, dsink, options, ctypes.byref(n)))
    return n.value
