"""The C host path of the eager torch calls (fa4._fastpath, python/fa4/_fastpath.c) against the
ctypes path it replaces: the same fa4_tensor bytes for every tensor, bitwise the same results and
the same errors, and the ctypes path's errors where it cannot describe a tensor. The accuracy of
the calls themselves is test_torch.py's (which runs on whichever path is present).

Skipped where the module was not built (no Python headers when CMake ran), unless
FA4_REQUIRE_FASTPATH=1 (.ci/run sets it), which makes its absence a failure."""

from __future__ import annotations

import contextlib
import ctypes
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: fast-path tests skipped")

import fa4  # noqa: E402
from fa4 import _capi, _core, _torch_ops  # noqa: E402

FASTPATH = _capi.fastpath()
REQUIRED = os.environ.get("FA4_REQUIRE_FASTPATH") == "1"
MISSING = f"fa4._fastpath was not built beside {_capi.library_path()}"
needs_fastpath = pytest.mark.skipif(FASTPATH is None and not REQUIRED,
                                    reason=MISSING + ": fast-path tests skipped")


@pytest.fixture(autouse=True)
def _fastpath_required():
    if FASTPATH is None and REQUIRED:
        pytest.fail(MISSING + " (FA4_REQUIRE_FASTPATH=1)")


@contextlib.contextmanager
def ctypes_path():
    """Every call inside takes the ctypes path."""
    saved = _torch_ops._fast
    _torch_ops._fast = None
    try:
        yield
    finally:
        _torch_ops._fast = saved


@contextlib.contextmanager
def c_path_only():
    """Every call inside must take the C path: the ctypes path's library calls raise."""
    def refuse(*args):
        raise AssertionError("the ctypes path ran where the C path should have")

    saved = {n: getattr(_capi, n) for n in ("forward", "backward", "forward_with_kvcache")}
    for n in saved:
        setattr(_capi, n, refuse)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(_capi, n, f)


def _fast_in_use() -> bool:
    if _torch_ops._fast is _torch_ops._UNSET:
        _torch_ops._fast_setup()
    return _torch_ops._fast is not None


def _tensors():
    base = torch.randn(2, 6, 4, 8)
    yield "contiguous bf16", base.to(torch.bfloat16)
    yield "fp16", base.to(torch.float16)
    yield "transposed fp32", base.transpose(1, 2)
    yield "sliced (strided) fp32", base[:, ::2, 1:3]
    yield "int32 1-d", torch.arange(5, dtype=torch.int32)
    yield "0-d fp32", torch.tensor(1.5)
    yield "empty (0, 3)", torch.empty(0, 3)
    yield "expanded (stride 0)", torch.randn(1, 1, 1, 8).expand(2, 3, 4, 8)
    yield "nn.Parameter", torch.nn.Parameter(torch.randn(3, 4))


@needs_fastpath
@pytest.mark.parametrize("name,x", list(_tensors()), ids=[n for n, _ in _tensors()])
def test_describe_bytes_equal_ctypes(name, x):
    _fast_in_use()
    assert FASTPATH.describe(x) == bytes(_core.describe_torch(x, "x", "test", {})), name


@needs_fastpath
@pytest.mark.parametrize("x", [torch.zeros(2, dtype=torch.float64), torch.zeros(1, 1, 1, 1, 1),
                               torch.zeros(2, 2, device="meta"), [1.0, 2.0], None, 3],
                         ids=["float64", "5-d", "meta", "list", "None", "int"])
def test_describe_leaves_what_fa4_does_not_take_to_ctypes(x):
    _fast_in_use()
    assert FASTPATH.describe(x) is None


def _qkv(gen, dtype=torch.bfloat16, b=2, sq=37, sk=53, h=4, hkv=2, d=32, requires_grad=False):
    mk = lambda *s: torch.randn(*s, generator=gen).to(dtype).requires_grad_(requires_grad)  # noqa: E731
    return mk(b, sq, h, d), mk(b, sk, hkv, d), mk(b, sk, hkv, d)


@needs_fastpath
def test_forward_backward_and_kvcache_bitwise_equal_ctypes():
    assert _fast_in_use()
    gen = torch.Generator().manual_seed(7)
    q, k, v = _qkv(gen, requires_grad=True)
    sink = torch.randn(4, generator=gen).requires_grad_(True)
    results = []
    for ctx in (c_path_only, ctypes_path):
        with ctx():
            out, lse = fa4.flash_attn_func(q, k, v, causal=True, softcap=2.0, sink=sink,
                                           return_lse=True)
            grads = torch.autograd.grad(out.float().square().sum(), (q, k, v, sink))
            kc = torch.randn(2, 64, 2, 32, generator=torch.Generator().manual_seed(3)).bfloat16()
            vc = kc.flip(1).contiguous()
            qd = q.detach()[:, :2].contiguous()
            lens = torch.tensor([40, 9], dtype=torch.int32)
            kv_out = fa4.flash_attn_with_kvcache(qd, kc, vc, k=k.detach()[:, :3], v=v.detach()[:, :3],
                                                 cache_seqlens=lens, causal=True)
            results.append((out, lse, *grads, kv_out, kc, vc))
    for i, (a, b) in enumerate(zip(*results)):
        assert torch.equal(a, b), f"result {i} differs between the fast path and the ctypes path"


@needs_fastpath
def test_errors_equal_ctypes():
    """An error libfa4 finds (4 query heads over 3 KV heads) reads the same on both paths."""
    assert _fast_in_use()
    gen = torch.Generator().manual_seed(11)
    q = torch.randn(2, 37, 4, 32, generator=gen).bfloat16()
    k, v = (torch.randn(2, 53, 3, 32, generator=gen).bfloat16() for _ in range(2))
    messages = []
    for ctx in (c_path_only, ctypes_path):
        with ctx(), pytest.raises(fa4.InvalidArgumentError) as e:
            fa4.flash_attn_func(q, k, v)
        messages.append(str(e.value))
    assert messages[0] == messages[1] and "num_heads" in messages[0], messages


@needs_fastpath
def test_a_tensor_it_cannot_describe_gets_the_ctypes_error():
    assert _fast_in_use()
    q = torch.randn(1, 8, 2, 16, dtype=torch.float64)
    k = torch.randn(1, 8, 2, 16, dtype=torch.float64)
    with pytest.raises(fa4.InvalidArgumentError, match=r"q\.dtype = torch\.float64"):
        fa4.flash_attn_func(q, k, k)


@needs_fastpath
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: CUDA fast-path test skipped")
def test_cuda_tensors_carry_the_current_stream():
    _fast_in_use()
    x = torch.randn(4, 8, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        assert FASTPATH.describe(x) == bytes(_core.describe_torch(x, "x", "test", {}))
        t = _capi.Tensor.from_buffer_copy(FASTPATH.describe(x))
        assert t.stream == s.cuda_stream and t.device_type == _capi.DEVICE_CUDA


@needs_fastpath
def test_a_swapped_in_library_gets_its_own_entry_points(monkeypatch):
    """bench/ab_variants.py swaps _capi._lib between libfa4 builds: the fast path must call the
    library in _capi._lib at the time of the call, not the one it first took addresses from."""
    import ctypes

    assert _fast_in_use()
    other = ctypes.CDLL(_capi.library_path())  # the same file: a second handle, other object
    _capi._declare(other)
    monkeypatch.setattr(_capi, "_lib", other)
    q = torch.randn(1, 8, 2, 16)
    with c_path_only():
        fa4.flash_attn_func(q, q, q)
    assert _torch_ops._fast[2] is other


@needs_fastpath
def test_call_runs_the_entry_point_or_declines():
    """call() returns libfa4's status after running it, None (nothing run) for what it cannot
    describe, and refuses argument lists no entry point takes."""
    assert _fast_in_use()
    entry = _capi.entry_address("fa4_forward")
    q = torch.randn(1, 4, 2, 16)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 2, 4), float("nan"))
    opts = _torch_ops._options("fa4::fwd", None, None, None, None, 0, 0, None, False, -1, -1, 0.0,
                               None, None, "auto", False, {})
    assert FASTPATH.call(entry, (q, q, q, out, lse), (opts.address,)) == 0
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    bad = torch.zeros(1, 4, 2, 16, dtype=torch.float64)
    assert FASTPATH.call(entry, (q, q, bad, out, lse), (opts.address,)) is None
    assert FASTPATH.call(entry, (q, q, q, out, lse[0]), (opts.address,)) == _capi.STATUS_INVALID_ARGUMENT
    with pytest.raises(ValueError, match="no entry point"):
        FASTPATH.call(entry, (q, q, q, out), (opts.address,))
    # fa4_forward's address with fa4_backward's argument list: refused before anything is called
    # (through the backward's prototype the forward would read ten tensors as its six arguments).
    with pytest.raises(ValueError, match="these arguments are fa4_backward's, and entry is not"):
        FASTPATH.call(entry, (q, q, q, out, lse, q, q, q, q, None), (opts.address,))
    with pytest.raises(ValueError, match="these arguments are fa4_forward's"):
        FASTPATH.call(_capi.entry_address("fa4_backward"), (q, q, q, out, lse), (opts.address,))


@needs_fastpath
@pytest.mark.parametrize("layout", ["paged", "cache_batch_idx"])
def test_kvcache_index_tensors_bitwise_equal_ctypes(layout):
    """The KV-cache call's index tensors (page_table, cache_batch_idx, cache_seqlens) and appended
    rows go through the C path's copy of fa4_kvcache_args: bitwise ctypes' results."""
    assert _fast_in_use()
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 4, 32, generator=gen).bfloat16()
    k_new, v_new = (torch.randn(2, 2, 2, 32, generator=gen).bfloat16() for _ in range(2))
    lens = torch.tensor([21, 6], dtype=torch.int32)
    results = []
    for ctx in (c_path_only, ctypes_path):
        g = torch.Generator().manual_seed(9)
        if layout == "paged":  # 8 pages of 8 rows, in shuffled order
            kc, vc = (torch.randn(8, 8, 2, 32, generator=g).bfloat16() for _ in range(2))
            extra = dict(page_table=torch.tensor([[5, 2, 7, 0], [3, 6, 1, 4]], dtype=torch.int32))
        else:
            kc, vc = (torch.randn(3, 32, 2, 32, generator=g).bfloat16() for _ in range(2))
            extra = dict(cache_batch_idx=torch.tensor([2, 0], dtype=torch.int32))
        with ctx():
            out, lse = fa4.flash_attn_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=lens,
                                                   causal=True, num_splits=2, return_lse=True,
                                                   **extra)
        results.append((out, lse, kc, vc))
    for i, (a, b) in enumerate(zip(*results)):
        assert torch.equal(a, b), f"result {i} differs between the fast path and the ctypes path"


@needs_fastpath
def test_kvcache_index_tensor_it_cannot_describe_gets_the_ctypes_error():
    assert _fast_in_use()
    q = torch.randn(1, 1, 2, 16)
    kc = torch.randn(1, 8, 2, 16)
    with pytest.raises(fa4.InvalidArgumentError, match=r"cache_seqlens\.dtype = torch\.int64"):
        fa4.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=torch.tensor([3]))


@needs_fastpath
def test_call_with_kvcache_args_leaves_the_base_struct_and_declines_what_it_cannot_take():
    assert _fast_in_use()
    entry = _capi.entry_address("fa4_forward_with_kvcache")
    q = torch.randn(1, 1, 2, 16)
    kc = torch.randn(1, 8, 2, 16)
    out, lse = torch.empty_like(q), torch.empty(1, 2, 1)
    opts = _torch_ops._options("fa4::fwd_kvcache", None, None, None, None, 0, 0, None, False, -1,
                               -1, 0.0, None, None, "auto", False, {})
    base = _core.KVCacheCall("test", num_splits=1)
    before = bytes(base.struct)
    lens = torch.tensor([5], dtype=torch.int32)
    kv = (None, None, lens, None, None)
    assert FASTPATH.call(entry, (q, kc, kc, out, lse), (opts.address, base.address), kv) == 0
    assert bytes(base.struct) == before  # the C side filled a copy
    assert torch.isfinite(out).all()
    bad = (None, None, torch.tensor([5]), None, None)  # int64: no fa4 dtype
    assert FASTPATH.call(entry, (q, kc, kc, out, lse), (opts.address, base.address), bad) is None
    with pytest.raises(ValueError, match="no entry point"):
        FASTPATH.call(entry, (q, kc, kc, out, lse), (opts.address, base.address), kv[:4])
    with pytest.raises(ValueError, match="no entry point"):
        FASTPATH.call(entry, (q, kc, kc, out, lse), (opts.address,), kv)


@needs_fastpath
def test_backward_workspace_size_entry():
    """fa4_backward_workspace_size through the C path (10 tensors, the options and the address of
    the uint64 it writes), as the CUDA backward asks it: the ctypes call's value (0 on the CPU)
    and its errors."""
    assert _fast_in_use()
    gen = torch.Generator().manual_seed(5)
    q, k, v = _qkv(gen)
    out, lse = fa4.flash_attn_func(q, k, v, causal=True, return_lse=True)
    dout = torch.randn(out.shape, generator=gen).bfloat16()
    grads = tuple(torch.empty_like(x) for x in (q, k, v))
    opts = _core.CallOptions("test", causal=True)
    n = ctypes.c_uint64(99)
    tensors = (dout, q, k, v, out, lse, *grads, None)
    assert _torch_ops._fast_call("fa4_backward_workspace_size", tensors, (opts.address, ctypes.addressof(n)))
    assert n.value == 0
    bad = (dout, q, k[:, :, :1].expand(-1, -1, 3, -1), v, out, lse, *grads, None)
    with pytest.raises(fa4.InvalidArgumentError, match="^fa4::backward_workspace_size: .*num_heads"):
        _torch_ops._fast_call("fa4_backward_workspace_size", bad, (opts.address, ctypes.addressof(n)))
