"""fa4 — exact attention with the FlashAttention-4 algorithm (arXiv 2603.05451), from Python.

A thin layer over libfa4's C ABI (include/fa4/c_api.h), loaded with ctypes: nothing is compiled
against torch or NumPy. Inputs may be

* torch tensors on CUDA (Hopper kernels, on ``torch.cuda.current_stream()``) or on CPU (the CPU
  FlashAttention-4 implementation), with autograd through fa4's backward and
  ``torch.compile(fullgraph=True)`` support (custom ops ``fa4::fwd`` / ``fa4::bwd``);
* NumPy arrays on CPU: float16, float32, or ``ml_dtypes.bfloat16`` if ml_dtypes is installed.

Layouts are flash-attn's (see :func:`flash_attn_func`); :func:`flash_attn_with_kvcache` is the
inference-only KV-cache entry point (decoding, paged caches). Errors are :class:`Fa4Error` subclasses
carrying the library's message (which names the tensor and the rule broken).
"""

from __future__ import annotations

import sys

from . import _capi, _core
from ._capi import (CudaError, Fa4Error, InternalError, InvalidArgumentError,
                    LibraryNotFoundError, NoDeviceError, UnsupportedError)
from ._core import backward, forward, forward_support

try:  # torch is optional; when present the custom ops are registered at import
    import torch as _torch_module  # noqa: F401
except ImportError:
    _torch_ops = None
    _Tensor = None
else:
    from . import _torch_ops
    from torch import Tensor as _Tensor

__all__ = [
    "flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache", "forward", "backward",
    "forward_support",
    "version", "has_cuda", "library_path", "check_async_errors", "release_cached_memory",
    "Fa4Error", "InvalidArgumentError", "UnsupportedError", "CudaError", "NoDeviceError", "InternalError", "LibraryNotFoundError",
]

try:  # the installed distribution's version (= libfa4's CMake project version)
    from importlib.metadata import PackageNotFoundError as _NotFound
    from importlib.metadata import version as _dist_version

    __version__ = _dist_version("fa4")
except _NotFound:  # used from the source tree (PYTHONPATH=python, FA4_LIBRARY=...)
    __version__ = "unknown"


def __getattr__(name):
    # fa4.context_parallel (ring attention over torch.distributed) is imported on first use: it
    # needs torch, which the rest of the package does not.
    if name == "context_parallel":
        import importlib

        try:
            return importlib.import_module(".context_parallel", __name__)
        except ImportError as e:  # hasattr(fa4, "context_parallel") is then False
            raise AttributeError(f"fa4.context_parallel needs torch.distributed: {e}") from e
    raise AttributeError(f"module 'fa4' has no attribute {name!r}")


def version() -> str:
    """Version of the loaded libfa4 (the CMake project version)."""
    return _capi.version()


def has_cuda() -> bool:
    """True if the loaded libfa4 was built with the CUDA (Hopper) kernels."""
    return _capi.has_cuda()


def check_async_errors(device=0) -> None:
    """Raises :class:`InvalidArgumentError` if an earlier varlen or KV-cache call on CUDA device
    `device` (an index, or anything torch.device accepts: "cuda:1", torch.device("cuda") = the
    current device) met invalid cu_seqlens_q/k, seqused_k, cache_seqlens, cache_batch_idx or
    page_table contents, then clears the record.

    CUDA tensors' indices are checked by the kernel, not before the call (reading them would cost a
    host sync and break CUDA graph capture): a sequence that breaks a rule is not computed (its
    out/lse rows stay unwritten) and the next call on the device raises instead of running. This
    function does not wait for the GPU: synchronise first to see the calls already issued."""
    _capi.check_async_errors(_cuda_index(device, "fa4.check_async_errors"))


def release_cached_memory(device=0) -> None:
    """Frees the device scratch fa4 keeps for eager calls on CUDA device `device` (an index, or
    anything torch.device accepts), as ``torch.cuda.empty_cache()`` does for PyTorch's cache.

    fa4 keeps the scratch its CUDA calls need (tile counters, split and stream-K partials; the
    dQ accumulator of :func:`backward` on CUDA tensors, up to GBs for a training shape) between
    calls, so that a call neither allocates nor waits: per stream, and a backward workspace or
    stream-K partials over 4 MiB in a memory pool shared by the streams (autograd's backward,
    through flash_attn_func and co., takes its workspace from torch's caching allocator instead).
    This waits for the device, then gives it back to CUDA (except what a call in another thread
    is using at that moment, and captured CUDA graphs' scratch); the next calls allocate again.
    Returns without waiting if fa4 never kept anything for that device. Do not call it while a
    stream of the device is being captured into a CUDA graph (CUDA refuses the wait and the
    capture breaks) or while a kernel that never ends runs there. Raises
    :class:`InvalidArgumentError` for a negative index or a device that is not CUDA,
    :class:`CudaError` if CUDA refuses the wait or a free."""
    _capi.release_cached_memory(_cuda_index(device, "fa4.release_cached_memory"))


def _cuda_index(device, fn: str) -> int:
    """A CUDA device index from an int, or from anything torch.device accepts ("cuda:1",
    torch.device("cuda") = the current device)."""
    if type(device) is int:  # (int32: the C ABI's type; a larger one would wrap to another device)
        return _core._int32(device, "device", fn)
    torch = sys.modules.get("torch")
    if isinstance(device, bool):
        torch = None  # (not an index, although an int)
    if torch is None:
        raise InvalidArgumentError(f"{fn}: device = {device!r} must be a CUDA device index (an int)")
    try:
        d = torch.device(device)  # "cuda:1", torch.device("cuda"), ...
    except (TypeError, RuntimeError, ValueError):
        raise InvalidArgumentError(f"{fn}: device = {device!r} is not a device") from None
    if d.type != "cuda":
        raise InvalidArgumentError(f"{fn}: device = {device!r} is not a CUDA device")
    return d.index if d.index is not None else torch.cuda.current_device()


def library_path() -> str:
    """Path of the loaded libfa4.so."""
    return _capi.library_path()


def _dispatch(q, k, v, *, fn, varlen, return_lse, **kw):
    if _core.is_torch_tensor(q) or _core.is_torch_tensor(k) or _core.is_torch_tensor(v):
        if _torch_ops is None:  # unreachable in practice: a torch tensor implies torch imports
            raise ImportError(f"{fn}: torch tensors given but torch could not be imported")
        out, lse = _torch_ops.attention(q, k, v, fn=fn, **kw)
    else:
        out, lse = _core.numpy_forward(q, k, v, varlen=varlen, fn=fn, **kw)
    return (out, lse) if return_lse else out


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    sink=None, deterministic=False, return_lse=False, *, rescale_threshold=None,
                    exp2_emulation_fraction=None, backend="auto"):
    """Exact attention, batched layout (flash-attn's).

    Args:
        q: (batch, seqlen_q, num_heads, headdim); bf16, fp16 or fp32 (torch) / fp16, fp32 or
            ml_dtypes.bfloat16 (NumPy). Any strides except that the last dim must be contiguous
            (torch inputs whose last dim is not are copied).
        k: (batch, seqlen_k, num_heads_kv, headdim); num_heads % num_heads_kv == 0 (GQA/MQA:
            query head h uses kv head h // (num_heads // num_heads_kv)).
        v: (batch, seqlen_k, num_heads_kv, headdim_v).
        softmax_scale: multiplies q.k; default 1/sqrt(headdim) (q's real head dim); finite, > 0.
        causal: bottom-right aligned causal mask (same as window_size=(-1, 0)).
        window_size: (left, right) local window, -1 (or None) = unbounded; bottom-right aligned:
            query i sees key j iff i + sk - sq - left <= j <= i + sk - sq + right.
        softcap: 0 = off; else scores s -> softcap * tanh(s / softcap); >= 0.
        sink: fp32 (num_heads,) learnable sink logits, in the units of the scores (after
            softmax_scale and softcap, natural log): exp(sink[h]) joins row h's softmax
            denominator only.
        deterministic: bitwise-reproducible backward (autograd on torch tensors); the forward is so
            on one device without it (except a CUDA stream-K forward whose cooperative launch the
            device refuses, e.g. under MPS: include/fa4/attention.h), so a forward-only call
            (NumPy) needs nothing more.
        return_lse: also return lse.
        rescale_threshold: FA4 lazy-rescaling threshold tau in log2 units (paper Sec. 3), in
            [0, 8]; default the library's (8). Changes rounding only.
        exp2_emulation_fraction: share of exp2 done by the software polynomial (paper Sec. 3), a
            multiple of 1/16 in [0, 1]; default the kernel's tuned share. Changes rounding only.
        backend: "auto" (CUDA tensors -> Hopper kernels, CPU -> CPU FA4), "cpu",
            "cpu_reference" (float64 naive oracle) or "cuda".

    Returns:
        out (batch, seqlen_q, num_heads, headdim_v), dtype of q; with return_lse also
        lse (batch, num_heads, seqlen_q) fp32, natural log (for rows that see no key: -inf, or
        sink[h] when a sink is given).
        torch: out is differentiable w.r.t. q, k, v and sink; lse is not.

    Raises:
        InvalidArgumentError (ValueError) for a broken rule (the message names the tensor or
        option and the rule), UnsupportedError (NotImplementedError) where no kernel exists (a
        head dim above 256 anywhere; on CUDA: fp32, a head dim that is no multiple of 8, a bucket
        this build did not compile, exp2_emulation_fraction > 0 on a bucket whose key tile is no
        multiple of 128), NoDeviceError / CudaError (RuntimeError). Nothing is written on error.
        The options are float32 in the library: a value that rounds to 0 or inf there is an
        InvalidArgumentError.

    Algorithm: FlashAttention-4 (arXiv 2603.05451): tiled online softmax with software exp2 and
    lazy rescaling; see include/fa4/attention.h for the full semantics.
    """
    if return_lse is not True and return_lse is not False:  # a flag, never truthiness
        return_lse = _core._bool(return_lse, "return_lse", "fa4.flash_attn_func")
    if _torch_ops is not None and (isinstance(q, _Tensor) or isinstance(k, _Tensor)
                                   or isinstance(v, _Tensor)):
        # _dispatch's torch branch with positional arguments (host time per call matters here)
        out, lse = _torch_ops.attention(q, k, v, "fa4.flash_attn_func", None, None, None, 0, 0,
                                        softmax_scale, causal, window_size, softcap, sink,
                                        deterministic, rescale_threshold,
                                        exp2_emulation_fraction, backend)
        return (out, lse) if return_lse else out
    return _dispatch(q, k, v, fn="fa4.flash_attn_func", varlen=False, return_lse=return_lse,
                     softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                     softcap=softcap, sink=sink, deterministic=deterministic,
                     rescale_threshold=rescale_threshold,
                     exp2_emulation_fraction=exp2_emulation_fraction, backend=backend)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           sink=None, deterministic=False, return_lse=False, seqused_k=None, *,
                           rescale_threshold=None, exp2_emulation_fraction=None, backend="auto"):
    """Exact attention over packed variable-length sequences (flash-attn's varlen layout).

    Args:
        q: (total_q, num_heads, headdim); sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1.
        k, v: (total_k, num_heads_kv, headdim / headdim_v); rows by cu_seqlens_k, of which only
            the first seqused_k[b] are used when seqused_k is given.
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,), non-decreasing, starting at 0, on q's
            device.
        max_seqlen_q, max_seqlen_k: upper bounds of the per-sequence lengths (ints), > 0 when
            batch > 0 (a batch of empty sequences passes 1).
        seqused_k: optional int32 (batch,).
        Other arguments: as :func:`flash_attn_func`; masks are per sequence, bottom-right.

    Returns:
        out (total_q, num_heads, headdim_v); with return_lse also lse (num_heads, total_q) fp32.
        Rows outside every sequence: out 0, lse -inf.

    Raises:
        As :func:`flash_attn_func`. CPU-resident cu_seqlens / seqused_k are checked before the call
        (a sequence past the packed rows is an InvalidArgumentError); CUDA-resident ones by the
        kernel, without a host sync: a sequence that breaks a rule is skipped (its rows unwritten)
        and the next fa4 call on the device raises InvalidArgumentError naming the rule (or
        :func:`check_async_errors`).
    """
    if return_lse is not True and return_lse is not False:  # a flag, never truthiness
        return_lse = _core._bool(return_lse, "return_lse", "fa4.flash_attn_varlen_func")
    if _torch_ops is not None and (isinstance(q, _Tensor) or isinstance(k, _Tensor)
                                   or isinstance(v, _Tensor)):
        out, lse = _torch_ops.attention(q, k, v, "fa4.flash_attn_varlen_func", cu_seqlens_q,
                                        cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                        softmax_scale, causal, window_size, softcap, sink,
                                        deterministic, rescale_threshold,
                                        exp2_emulation_fraction, backend)
        return (out, lse) if return_lse else out
    return _dispatch(q, k, v, fn="fa4.flash_attn_varlen_func", varlen=True,
                     return_lse=return_lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                     seqused_k=seqused_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                     softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                     softcap=softcap, sink=sink, deterministic=deterministic,
                     rescale_threshold=rescale_threshold,
                     exp2_emulation_fraction=exp2_emulation_fraction, backend=backend)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, *, cache_seqlens=None,
                            cache_batch_idx=None, page_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0, sink=None,
                            num_splits=0, return_lse=False, rescale_threshold=None,
                            exp2_emulation_fraction=None, backend="auto"):
    """Attention against a KV cache, with an optional in-place append first (flash-attn's
    ``flash_attn_with_kvcache``; inference only: no autograd, outputs never require grad).
    Everything after ``v`` is keyword-only: flash-attn 2 and 3 put other arguments there
    (rotary_cos, qv), so a positional call written for them fails instead of binding wrongly.

    Args:
        q: (batch, seqlen_q, num_heads, headdim); bf16, fp16 or fp32 (torch) / fp16, fp32 or
            ml_dtypes.bfloat16 (NumPy).
        k_cache, v_cache: dense (batch_cache, seqlen_cache, num_heads_kv, headdim / headdim_v),
            or paged (num_pages, page_size, num_heads_kv, headdim / headdim_v) when page_table is
            given (any page_size >= 1). Same dtype as q; last dim contiguous. Written in place
            when k/v are given, as a torch in-place op writes: their autograd version counters
            advance, caches that require grad are refused unless grad mode is off, eager calls
            write inference tensors only inside ``torch.inference_mode()``; NumPy arrays must be
            writeable.
        k, v: optional (batch, seqlen_new, num_heads_kv, headdim / headdim_v), both or neither:
            row t of sequence b is copied into the cache at key position cache_seqlens[b] + t
            before attending. Requires cache_seqlens. (The library's errors call them k_new and
            v_new, their name in the C++ and C APIs.)
        cache_seqlens: keys already in the cache per sequence: an int32 tensor (batch,) on q's
            device, or an int (the same value for every sequence; an int32 tensor is then
            allocated on q's device, so CUDA-graph users should pass a tensor). None: every
            sequence holds the whole capacity (seqlen_cache, or max_pages * page_size). The
            tensor is not modified: advance it yourself after an append.
        cache_batch_idx: optional int32 (batch,): dense cache row of q's sequence b (default b,
            with batch_cache == batch). Distinct values when appending. Not with page_table.
        page_table: optional int32 (batch, max_pages) (flash-attn's block_table): key j of
            sequence b lives in slot j % page_size of page page_table[b, j // page_size].
        softmax_scale, causal, window_size, softcap, sink, rescale_threshold,
        exp2_emulation_fraction, backend: as :func:`flash_attn_func`. Masks are bottom-right
            aligned per sequence against seqlen_k(b) = cache_seqlens[b] + seqlen_new, so with
            causal=True the last query sees every cached key.
        num_splits: split-KV count of the CUDA decode kernel; 0 = automatic, at most 256 on CUDA.
            (An explicit count keeps the call on the decode kernel; automatic lets a chunk of more
            than 128 query rows per KV head (except a short one, up to 256 rows over at most 1,024
            keys, whose 16-row tiles number between half the SMs (a quarter at headdim 128) and
            all of them) over a dense cache, or a paged one whose page size is a multiple of the
            forward's key tile (128 keys up to headdim 128 and at 192 x 128, 96 at 192, 80 at 256)
            or, on the 64, 128 and 256 buckets (headdim up to 64, 97-128, 193-256; chunks of at
            least 96, 64 and any query tokens), a power of two from 8 rows, attend on the forward
            kernel.)
            Any count >= 0 gives the CPU's result (it needs no split).
        return_lse: also return lse.

    Returns:
        out (batch, seqlen_q, num_heads, headdim_v), dtype of q; with return_lse also
        lse (batch, num_heads, seqlen_q) fp32, natural log.

    Raises:
        InvalidArgumentError (ValueError) for a broken rule (nothing is written then, the caches
        included), UnsupportedError, NoDeviceError / CudaError. CPU index tensors are checked
        before the call; CUDA ones by the kernel (see :func:`check_async_errors`).

    torch: CUDA tensors run on ``torch.cuda.current_stream()`` without a host sync and allocate
    only out and lse, so the call can be captured in a CUDA graph (with a tensor cache_seqlens).
    """
    fn = "fa4.flash_attn_with_kvcache"
    if return_lse is not True and return_lse is not False:  # a flag, never truthiness
        return_lse = _core._bool(return_lse, "return_lse", fn)
    if _torch_ops is not None and any(isinstance(x, _Tensor) for x in (q, k_cache, v_cache, k, v)):
        out, lse = _torch_ops.kvcache_attention(
            q, k_cache, v_cache, fn, k, v, cache_seqlens, cache_batch_idx, page_table,
            softmax_scale, causal, window_size, softcap, sink, num_splits, rescale_threshold,
            exp2_emulation_fraction, backend)
    else:
        out, lse = _core.numpy_forward_with_kvcache(
            q, k_cache, v_cache, fn=fn, k_new=k, v_new=v, cache_seqlens=cache_seqlens,
            cache_batch_idx=cache_batch_idx, page_table=page_table, num_splits=num_splits,
            softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
            sink=sink, rescale_threshold=rescale_threshold,
            exp2_emulation_fraction=exp2_emulation_fraction, backend=backend)
    return (out, lse) if return_lse else out
