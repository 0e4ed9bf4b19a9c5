"""fa4.flash_attn_with_kvcache: CPU torch (and NumPy) against a float64 torch reference built
independently (each sequence's keys gathered by the test from the cache as it must be after the
append), the append itself (bitwise, rows past it untouched), int cache_seqlens, return_lse,
errors; CUDA against the same float64 reference (skipped, loudly, without a GPU)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: KV-cache torch tests skipped")

import fa4  # noqa: E402
from torch_reference import assert_rule as _assert_rule  # noqa: E402
from torch_reference import randn as _randn  # noqa: E402
from torch_reference import ref_attention as _ref  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU: CUDA KV-cache tests skipped")
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@pytest.fixture
def gen(request):
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _bits_equal(a, b):
    return torch.equal(a.view(_BITS[a.dtype]), b.view(_BITS[b.dtype]))


class Cache:
    """A dense or paged cache whose unreadable elements hold NaN, plus the test's own addressing."""

    def __init__(self, gen, *, b, h, hkv, d, dtype, lens, new, page_size=None, max_pages=None,
                 capacity=None, batch_idx=None, device="cpu"):
        self.b, self.hkv, self.d, self.new, self.lens = b, hkv, d, new, list(lens)
        self.paged = page_size is not None
        if self.paged:
            self.ps, self.capacity = page_size, page_size * max_pages
            num_pages = b * max_pages + 2
            perm = torch.randperm(num_pages, generator=gen).tolist()  # shuffled page order
            table = torch.full((b, max_pages), -1, dtype=torch.int32)
            for s in range(b):
                used = -(-(self.lens[s] + new) // page_size)
                for p in range(used):
                    table[s, p] = perm.pop()
            self.table = table
            shape = (num_pages, page_size, hkv, d)
        else:
            self.capacity = capacity
            self.rows = batch_idx if batch_idx is not None else list(range(b))
            shape = (max(self.rows) + 1 if batch_idx is not None else b, capacity, hkv, d)
            self.table = None
        self.k = torch.full(shape, float("nan"), dtype=dtype)
        self.v = torch.full(shape, float("nan"), dtype=dtype)
        for s in range(b):
            for j in range(self.lens[s]):
                self.k[self.where(s, j)] = _randn(gen, (hkv, d), dtype)
                self.v[self.where(s, j)] = _randn(gen, (hkv, d), dtype)
        self.k, self.v = self.k.to(device), self.v.to(device)

    def where(self, s, j):
        if self.paged:
            return (int(self.table[s, j // self.ps]), j % self.ps)
        return (self.rows[s], j)

    def expected(self, k_new, v_new):
        ek, ev = self.k.cpu().clone(), self.v.cpu().clone()
        for s in range(self.b):
            for t in range(self.new):
                ek[self.where(s, self.lens[s] + t)] = k_new[s, t].cpu()
                ev[self.where(s, self.lens[s] + t)] = v_new[s, t].cpu()
        return ek, ev

    def gather(self, ek, ev, s):
        sk = self.lens[s] + self.new
        idx = [self.where(s, j) for j in range(sk)]
        k = torch.stack([ek[i] for i in idx]) if idx else ek.new_zeros((0, self.hkv, self.d))
        v = torch.stack([ev[i] for i in idx]) if idx else ev.new_zeros((0, self.hkv, self.d))
        return k[None], v[None]


def _check_against_reference(cache, ek, ev, q, out, lse, dtype, **mask):
    for s in range(q.shape[0]):
        ks, vs = cache.gather(ek, ev, s)
        o64, l64 = _ref(q[s:s + 1].cpu(), ks, vs, **mask)
        op, lp = _ref(q[s:s + 1].cpu(), ks, vs, upcast=False, **mask)
        _assert_rule(f"out[{s}]", out[s:s + 1].cpu(), o64, op, dtype)
        _assert_rule(f"lse[{s}]", lse[s:s + 1].cpu(), l64, lp.float(), torch.float32,
                     atol_scale=4.0)


LAYOUTS = [dict(capacity=40), dict(page_size=1, max_pages=24), dict(page_size=3, max_pages=9),
           dict(page_size=16, max_pages=3)]
LAYOUT_IDS = ["dense", "paged1", "paged3", "paged16"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("new,sq,causal", [(0, 1, False), (1, 1, True), (3, 4, True),
                                           (2, 5, False)], ids=["decode", "append1", "append3",
                                                                "append2_noncausal"])
def test_cpu_kvcache_matches_fp64(gen, dtype, layout, new, sq, causal):
    b, h, hkv, d = 4, 8, 2, 32
    cap = layout.get("capacity") or layout["page_size"] * layout["max_pages"]
    ps = layout.get("page_size", 16)
    lens = [min(x, cap - new) for x in (0, 1, ps + 1, cap - new)]
    cache = Cache(gen, b=b, h=h, hkv=hkv, d=d, dtype=dtype, lens=lens, new=new, **layout)
    q = _randn(gen, (b, sq, h, d), dtype)
    k_new = _randn(gen, (b, new, hkv, d), dtype) if new else None
    v_new = _randn(gen, (b, new, hkv, d), dtype) if new else None
    seqlens = torch.tensor(lens, dtype=torch.int32)
    ek, ev = cache.expected(k_new, v_new) if new else (cache.k.clone(), cache.v.clone())
    extra = dict(exp2_emulation_fraction=0.0) if dtype == torch.float32 else {}
    out, lse = fa4.flash_attn_with_kvcache(q, cache.k, cache.v, k_new, v_new,
                                           cache_seqlens=seqlens, page_table=cache.table,
                                           causal=causal, return_lse=True, **extra)
    assert out.shape == (b, sq, h, d) and out.dtype == dtype
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32
    assert _bits_equal(cache.k, ek) and _bits_equal(cache.v, ev)  # the append, nothing else
    assert torch.equal(seqlens, torch.tensor(lens, dtype=torch.int32))  # not advanced
    _check_against_reference(cache, ek, ev, q, out, lse, dtype, causal=causal)


def test_cpu_kvcache_window_softcap_sink_gqa(gen):
    dtype = torch.bfloat16
    b, h, hkv, d, new = 3, 8, 1, 64, 2
    lens = [30, 0, 13]
    cache = Cache(gen, b=b, h=h, hkv=hkv, d=d, dtype=dtype, lens=lens, new=new, page_size=16,
                  max_pages=2)
    q = _randn(gen, (b, 3, h, d), dtype)
    k_new, v_new = _randn(gen, (b, new, hkv, d), dtype), _randn(gen, (b, new, hkv, d), dtype)
    sink = _randn(gen, (h,), torch.float32)
    ek, ev = cache.expected(k_new, v_new)
    mask = dict(causal=True, window_size=(9, -1), softcap=4.0, sink=sink)
    out, lse = fa4.flash_attn_with_kvcache(q, cache.k, cache.v, k=k_new, v=v_new,
                                           cache_seqlens=torch.tensor(lens, dtype=torch.int32),
                                           page_table=cache.table, return_lse=True, **mask)
    _check_against_reference(cache, ek, ev, q, out, lse, dtype, **mask)


def test_cpu_int_cache_seqlens_and_batch_idx(gen):
    dtype = torch.float16
    b, h, hkv, d = 3, 4, 4, 16
    rows = [4, 0, 2]
    cache = Cache(gen, b=b, h=h, hkv=hkv, d=d, dtype=dtype, lens=[7] * b, new=1, capacity=12,
                  batch_idx=rows)
    q = _randn(gen, (b, 1, h, d), dtype)
    k_new, v_new = _randn(gen, (b, 1, hkv, d), dtype), _randn(gen, (b, 1, hkv, d), dtype)
    ek, ev = cache.expected(k_new, v_new)
    idx = torch.tensor(rows, dtype=torch.int32)
    out, lse = fa4.flash_attn_with_kvcache(q, cache.k, cache.v, k_new, v_new, cache_seqlens=7,
                                           cache_batch_idx=idx, causal=True, return_lse=True)
    assert _bits_equal(cache.k, ek) and _bits_equal(cache.v, ev)
    _check_against_reference(cache, ek, ev, q, out, lse, dtype, causal=True)
    # Without return_lse: out alone; attending to the 8 keys now cached gives the same result.
    again = fa4.flash_attn_with_kvcache(q, cache.k, cache.v, cache_seqlens=8, cache_batch_idx=idx,
                                        causal=True)
    assert isinstance(again, torch.Tensor) and torch.equal(again, out)


def test_cpu_append_is_an_in_place_write_to_autograd(gen):
    # As after any in-place torch op: a backward that saved the caches' old values refuses to
    # run (eager and op routes), and an eager call writes an inference tensor only inside
    # inference_mode.
    b, h, d = 2, 2, 16
    q = _randn(gen, (b, 1, h, d), torch.float32)
    k_new, v_new = _randn(gen, (b, 1, h, d), torch.float32), _randn(gen, (b, 1, h, d), torch.float32)
    lens = torch.tensor([3, 5], dtype=torch.int32)
    for route in ("eager", "op"):
        kc, vc = _randn(gen, (b, 8, h, d), torch.float32), _randn(gen, (b, 8, h, d), torch.float32)
        w = torch.ones(b, 8, h, d, requires_grad=True)
        loss = (w * kc).sum()  # saves kc
        version = kc._version
        if route == "eager":
            fa4.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens)
        else:
            torch.ops.fa4.fwd_kvcache(q, kc, vc, k_new, v_new, lens, None, None, None, None,
                                      False, -1, -1, 0.0, 0, None, None, "auto")
        assert kc._version > version and torch.equal(kc[0, 3], k_new[0, 0])
        with pytest.raises(RuntimeError, match="inplace operation"):
            loss.backward()
    with torch.inference_mode():
        kc, vc = torch.zeros(b, 8, h, d), torch.zeros(b, 8, h, d)
    with pytest.raises((ValueError, RuntimeError), match="inference"):
        fa4.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens)
    assert not kc.any()
    with torch.inference_mode():
        fa4.flash_attn_with_kvcache(q, kc, vc, k_new, v_new, cache_seqlens=lens)
    assert torch.equal(kc[1, 5], k_new[1, 0])
    # A cache autograd tracks is not appended to (no gradient for the write), on either route;
    # under no_grad it is.
    kc = torch.zeros(b, 8, h, d, requires_grad=True)
    with pytest.raises(ValueError, match="require grad"):
        fa4.flash_attn_with_kvcache(q, kc, kc.detach().clone(), k_new, v_new, cache_seqlens=lens)
    with pytest.raises(ValueError, match="require grad"):
        torch.compile(lambda c: fa4.flash_attn_with_kvcache(q, c, c.detach().clone(), k_new, v_new,
                                                            cache_seqlens=lens),
                      backend="eager")(kc)
    assert not kc.detach().any()
    with torch.no_grad():
        fa4.flash_attn_with_kvcache(q, kc, torch.zeros(b, 8, h, d), k_new, v_new, cache_seqlens=lens)
    assert torch.equal(kc.detach()[1, 5], k_new[1, 0])
    # Attending without appending reads the caches only: no version change.
    kc = torch.zeros(b, 8, h, d)
    version = kc._version
    fa4.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=lens)
    assert kc._version == version


def test_cpu_full_cache_without_seqlens(gen):
    dtype = torch.float32
    cache = Cache(gen, b=2, h=4, hkv=2, d=16, dtype=dtype, lens=[10, 10], new=0, capacity=10)
    q = _randn(gen, (2, 3, 4, 16), dtype)
    out, lse = fa4.flash_attn_with_kvcache(q, cache.k, cache.v, causal=True, return_lse=True,
                                           exp2_emulation_fraction=0.0)
    _check_against_reference(cache, cache.k, cache.v, q, out, lse, dtype, causal=True)


def test_cpu_custom_op_and_compile_match_eager(gen):
    dtype = torch.bfloat16
    lens = [5, 9]
    args = dict(b=2, h=4, hkv=2, d=32, dtype=dtype, lens=lens, new=1, page_size=4, max_pages=3)
    c1, c2 = Cache(gen, **args), None
    c2 = Cache(torch.Generator().manual_seed(0), **args)
    c2.k.copy_(c1.k), c2.v.copy_(c1.v)
    c2.table = c1.table
    q = _randn(gen, (2, 1, 4, 32), dtype)
    kn, vn = _randn(gen, (2, 1, 2, 32), dtype), _randn(gen, (2, 1, 2, 32), dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32)

    def call(k_cache, v_cache, table):
        return fa4.flash_attn_with_kvcache(q, k_cache, v_cache, kn, vn, cache_seqlens=seqlens,
                                           page_table=table, causal=True)

    eager = call(c1.k, c1.v, c1.table)
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=True, backend="aot_eager")(c2.k, c2.v, c2.table)
    assert torch.equal(eager, compiled)
    assert _bits_equal(c1.k, c2.k) and _bits_equal(c1.v, c2.v)  # the op's mutation survives


def test_cpu_errors_name_the_tensor_and_write_nothing(gen):
    dtype = torch.bfloat16
    cache = Cache(gen, b=2, h=4, hkv=2, d=16, dtype=dtype, lens=[3, 5], new=1, page_size=4,
                  max_pages=2)
    q = _randn(gen, (2, 1, 4, 16), dtype)
    kn, vn = _randn(gen, (2, 1, 2, 16), dtype), _randn(gen, (2, 1, 2, 16), dtype)
    k0, v0 = cache.k.clone(), cache.v.clone()
    bad_table = cache.table.clone()
    bad_table[1, 0] = 99
    cases = [
        (dict(cache_seqlens=torch.tensor([3, 8], dtype=torch.int32), page_table=cache.table),
         "cache_seqlens[1] = 8 must be in [0, 7]"),
        (dict(cache_seqlens=torch.tensor([3, 5], dtype=torch.int32), page_table=bad_table),
         "page_table[1][0] = 99 must be in [0, "),
        (dict(cache_seqlens=torch.tensor([3, 5, 1], dtype=torch.int32), page_table=cache.table),
         "cache_seqlens.shape[0] (batch) = 3 must equal q.shape[0] = 2"),
        (dict(cache_seqlens=torch.tensor([3, 5], dtype=torch.int64), page_table=cache.table),
         "cache_seqlens.dtype"),
        (dict(page_table=cache.table), "k_new/v_new need options.cache_seqlens"),
        (dict(cache_seqlens=3, page_table=cache.table, num_splits=-2),
         "options.num_splits = -2 must be >= 0"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(fa4.InvalidArgumentError) as e:
            fa4.flash_attn_with_kvcache(q, cache.k, cache.v, kn, vn, **kwargs)
        assert needle in str(e.value), str(e.value)
        assert _bits_equal(cache.k, k0) and _bits_equal(cache.v, v0)
    with pytest.raises(fa4.InvalidArgumentError, match="v_cache is a ndarray"):
        fa4.flash_attn_with_kvcache(q, cache.k, cache.v.float().numpy(), cache_seqlens=3,
                                    page_table=cache.table)


def test_numpy_kvcache_dense_append(gen):
    b, h, hkv, d, cap = 2, 4, 2, 16, 12
    rng = np.random.default_rng(3)
    kc = rng.standard_normal((b, cap, hkv, d)).astype(np.float32)
    vc = rng.standard_normal((b, cap, hkv, d)).astype(np.float32)
    q = rng.standard_normal((b, 2, h, d)).astype(np.float32)
    kn = rng.standard_normal((b, 2, hkv, d)).astype(np.float32)
    vn = rng.standard_normal((b, 2, hkv, d)).astype(np.float32)
    k0, v0 = kc.copy(), vc.copy()
    out, lse = fa4.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=np.array(
        [4, 10], dtype=np.int32), causal=True, return_lse=True, exp2_emulation_fraction=0.0)
    ek, ev = k0.copy(), v0.copy()
    ek[0, 4:6], ev[0, 4:6], ek[1, 10:12], ev[1, 10:12] = kn[0], vn[0], kn[1], vn[1]
    assert np.array_equal(kc, ek) and np.array_equal(vc, ev)
    for s, sk in ((0, 6), (1, 12)):
        o64, l64 = _ref(torch.from_numpy(q[s:s + 1]), torch.from_numpy(ek[s:s + 1, :sk]),
                        torch.from_numpy(ev[s:s + 1, :sk]), causal=True)
        op, lp = _ref(torch.from_numpy(q[s:s + 1]), torch.from_numpy(ek[s:s + 1, :sk]),
                      torch.from_numpy(ev[s:s + 1, :sk]), causal=True, upcast=False)
        _assert_rule("out", torch.from_numpy(out[s:s + 1]), o64, op, torch.float32)
        _assert_rule("lse", torch.from_numpy(lse[s:s + 1]), l64, lp, torch.float32, 4.0)
    out2 = fa4.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=6, exp2_emulation_fraction=0.0)
    assert out2.shape == (b, 2, h, d)


# ---- CUDA (skipped without a GPU) ----------------------------------------------------------------
CUDA_LAYOUTS = [dict(capacity=700), dict(page_size=16, max_pages=44), dict(page_size=1, max_pages=700)]
CUDA_LAYOUT_IDS = ["dense", "paged16", "paged1"]


@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 0], ids=["splits1", "splits_auto"])
@pytest.mark.parametrize("layout", CUDA_LAYOUTS, ids=CUDA_LAYOUT_IDS)
@pytest.mark.parametrize("new,sq,causal", [(0, 1, False), (1, 1, True), (4, 4, True)],
                         ids=["decode", "append1", "append4_causal"])
def test_cuda_kvcache_matches_fp64(gen, layout, num_splits, new, sq, causal):
    if not fa4.has_cuda():  # (needs_cuda: a GPU is present, so the build is what is wrong)
        pytest.fail("a CUDA GPU is present but libfa4 was built without CUDA")
    dtype = torch.bfloat16
    b, h, hkv, d = 4, 8, 2, 128
    cap = layout.get("capacity") or layout["page_size"] * layout["max_pages"]
    lens = [min(x, cap - new) for x in (0, 1, 17, 650)]
    cache = Cache(gen, b=b, h=h, hkv=hkv, d=d, dtype=dtype, lens=lens, new=new, device="cuda",
                  **layout)
    q = _randn(gen, (b, sq, h, d), dtype, "cuda")
    k_new = _randn(gen, (b, new, hkv, d), dtype, "cuda") if new else None
    v_new = _randn(gen, (b, new, hkv, d), dtype, "cuda") if new else None
    ek, ev = cache.expected(k_new, v_new) if new else (cache.k.cpu(), cache.v.cpu())
    table = cache.table.cuda() if cache.table is not None else None
    out, lse = fa4.flash_attn_with_kvcache(
        q, cache.k, cache.v, k_new, v_new, cache_seqlens=torch.tensor(lens, dtype=torch.int32,
                                                                      device="cuda"),
        page_table=table, causal=causal, num_splits=num_splits, return_lse=True)
    torch.cuda.synchronize()
    fa4.check_async_errors(q.device)
    assert _bits_equal(cache.k.cpu(), ek) and _bits_equal(cache.v.cpu(), ev)
    _check_against_reference(cache, ek, ev, q.cpu(), out.cpu(), lse.cpu(), dtype, causal=causal)


@needs_cuda
def test_cuda_kvcache_graph_capture(gen):
    # Device-resident indices are not read by the host: the decode step captures in a CUDA graph
    # and every replay equals an eager call bitwise.
    if not fa4.has_cuda():  # (needs_cuda: a GPU is present, so the build is what is wrong)
        pytest.fail("a CUDA GPU is present but libfa4 was built without CUDA")
    dtype = torch.bfloat16
    cache = Cache(gen, b=2, h=8, hkv=2, d=128, dtype=dtype, lens=[100, 300], new=1, page_size=16,
                  max_pages=32, device="cuda")
    q = _randn(gen, (2, 1, 8, 128), dtype, "cuda")
    kn, vn = _randn(gen, (2, 1, 2, 128), dtype, "cuda"), _randn(gen, (2, 1, 2, 128), dtype, "cuda")
    seqlens = torch.tensor([100, 300], dtype=torch.int32, device="cuda")
    table = cache.table.cuda()

    def call():
        return fa4.flash_attn_with_kvcache(q, cache.k, cache.v, kn, vn, cache_seqlens=seqlens,
                                           page_table=table, causal=True)

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for _ in range(2):
        q.copy_(_randn(gen, tuple(q.shape), dtype, "cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, call())
