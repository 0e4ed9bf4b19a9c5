"""HF transformers integration on CPU: the example check end to end, plus the refusals."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: transformers tests skipped")
pytest.importorskip("transformers", reason="transformers is not installed: integration skipped")

import fa4.integrations.transformers as fa4_hf  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "transformers_check.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("transformers_check", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_check_passes_on_cpu(capsys):
    # Llama-3 GQA + Mistral sliding window, left/right padding, prefill + decode, greedy
    # generation with a StaticCache (tokens and logits), and a training step (loss + every
    # gradient), vs sdpa/fp64.
    assert _load_example().main(["--device", "cpu", "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"summary: (\d+) passed, 0 failed", out)
    assert "FAIL" not in out and m and int(m.group(1)) >= 40, out[-2000:]
    assert "static left-pad tokens" in out and "dynamic unpadded tokens" in out


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(b=2, h=4, hkv=2, s=6, d=16):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(b, h, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
            torch.randn(b, hkv, s, d, generator=g))


def test_rejections_are_clear():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="dropout"):
        fa4_hf.fa4_attention_forward(_Module(), q, k, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="4-D attention_mask"):
        fa4_hf.fa4_attention_forward(_Module(), q, k, v, torch.ones(2, 1, 6, 6, dtype=torch.bool))
    hole = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    with pytest.raises(ValueError, match="sliding_window"):
        fa4_hf.fa4_attention_forward(_Module(), q, k, v, hole, sliding_window=3)


def test_padding_mask_matches_per_row_attention():
    # Left + right padding in one batch: each row equals fa4 on that row's real tokens alone.
    import fa4

    q, k, v = _qkv()
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    out, _ = fa4_hf.fa4_attention_forward(_Module(), q, k, v, mask, scaling=0.3, sliding_window=3)
    assert out.shape == (2, 6, 4, 16)
    for b in range(2):
        idx = mask[b].nonzero().flatten()
        sel = lambda x: x[b:b + 1, :, idx].transpose(1, 2)  # noqa: E731
        want = fa4.flash_attn_func(sel(q), sel(k), sel(v), softmax_scale=0.3, causal=True,
                                   window_size=(2, 0))
        torch.testing.assert_close(out[b, idx], want[0], rtol=0, atol=0)
        assert torch.all(out[b, ~mask[b]] == 0)


@pytest.mark.parametrize("q_len", [1, 3, 5])
def test_cross_attention_keeps_every_query_row(q_len):
    # Encoder-decoder cross-attention: a non-causal call whose 2-D mask pads the encoder's keys
    # (row 0 right-padded). No decoder query is padding, also where the decoder's length equals
    # the encoder's (5): each attends to its row's real keys.
    import fa4

    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, q_len, 16, generator=g)
    k, v = (torch.randn(2, 2, 5, 16, generator=g) for _ in range(2))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    out, _ = fa4_hf.fa4_attention_forward(_Bidirectional(), q, k, v, mask)
    assert out.shape == (2, q_len, 4, 16)
    for b in range(2):
        idx = mask[b].nonzero().flatten()
        want = fa4.flash_attn_func(q[b:b + 1].transpose(1, 2), k[b:b + 1, :, idx].transpose(1, 2),
                                   v[b:b + 1, :, idx].transpose(1, 2))
        torch.testing.assert_close(out[b], want[0], rtol=1e-5, atol=1e-5)


def _filled(x, n):  # the first n slots of (b, h, s, d) buffers, as fa4's (b, s, h, d)
    return x[:, :, :n].transpose(1, 2)


@pytest.mark.parametrize("q_len", [2, 20], ids=["kvcache_route", "varlen_route"])
def test_cache_buffers_attend_to_filled_slots_only(q_len):
    # StaticCache-style buffers: 40 slots, the first 30 filled (positions 0..29), the rest
    # garbage that attending to would change. No mask, and position_ids of shape (1, q_len) as
    # transformers passes them without one: every row sees only its filled slots.
    import fa4

    q, k, v = _qkv(s=40)
    k[:, :, 30:] = 50.0
    v[:, :, 30:] = -7.0
    pos = torch.arange(30 - q_len, 30)[None]
    qs = q[:, :, 30 - q_len:30]
    out, _ = fa4_hf.fa4_attention_forward(_Module(), qs, k, v, None, position_ids=pos)
    want = fa4.flash_attn_func(qs.transpose(1, 2), _filled(k, 30), _filled(v, 30), causal=True)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    # A non-causal module does not take the cached route: every slot is a key.
    class Full(torch.nn.Module):
        is_causal = False
    out_f, _ = fa4_hf.fa4_attention_forward(Full(), qs, k, v, None, position_ids=pos)
    want_f = fa4.flash_attn_func(qs.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    torch.testing.assert_close(out_f, want_f, rtol=1e-5, atol=1e-5)


def test_cache_buffers_keep_gradients():
    # Keys that require grad (prefix tuning: frozen queries, a trainable cache) take the
    # differentiable route; the empty slots get zero gradient.
    import fa4

    q, k, v = _qkv(s=12)
    k = k.clone().requires_grad_()
    pos = torch.arange(6, 8)[None]
    qs = q[:, :, 6:8]
    out, _ = fa4_hf.fa4_attention_forward(_Module(), qs, k, v, None, position_ids=pos)
    assert out.requires_grad
    (dk,) = torch.autograd.grad(out.sum(), (k,))
    k2 = k.detach().clone().requires_grad_()
    want = fa4.flash_attn_func(qs.transpose(1, 2), _filled(k2, 8), _filled(v, 8), causal=True)
    (dk2,) = torch.autograd.grad(want.sum(), (k2,))
    torch.testing.assert_close(dk, dk2, rtol=1e-5, atol=1e-5)
    assert torch.all(dk[:, :, 8:] == 0)


def test_short_mask_covers_filled_slots():
    # With a padding mask shorter than the buffers (what generate() passes with a StaticCache),
    # the mask covers the filled slots and the rest is ignored.
    import fa4

    q, k, v = _qkv(s=10)
    k[:, :, 6:] = 50.0
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    out, _ = fa4_hf.fa4_attention_forward(_Module(), q[:, :, 4:6], k, v, mask)
    for b in range(2):
        idx = mask[b].nonzero().flatten()
        sel = lambda x: x[b:b + 1, :, idx].transpose(1, 2)  # noqa: E731
        want = fa4.flash_attn_func(q[b:b + 1, :, 4:6].transpose(1, 2), sel(k), sel(v), causal=True)
        torch.testing.assert_close(out[b], want[0], rtol=1e-5, atol=1e-5)


class _Bidirectional(torch.nn.Module):
    is_causal = False


def test_packed_position_ids_keep_sequences_apart():
    # Padding-free packing told by position_ids alone (DataCollatorWithFlattening's default, no
    # mask): every sequence attends to itself only, as transformers' own masks make it. Row 0
    # packs 5 + 7 tokens, row 1 3 + 9; causal and bidirectional modules.
    import fa4

    q, k, v = _qkv(s=12)
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8]])
    for module in (_Module(), _Bidirectional()):
        out, _ = fa4_hf.fa4_attention_forward(module, q, k, v, None, position_ids=pos)
        for b, cuts in ((0, (0, 5, 12)), (1, (0, 3, 12))):
            for start, end in zip(cuts[:-1], cuts[1:]):
                sel = lambda x: x[b:b + 1, :, start:end].transpose(1, 2)  # noqa: E731
                want = fa4.flash_attn_func(sel(q), sel(k), sel(v), causal=module.is_causal)
                torch.testing.assert_close(out[b, start:end], want[0], rtol=1e-5, atol=1e-5)


def test_packed_position_ids_read_once_per_tensor(monkeypatch):
    # The layers of a model call get one position_ids tensor: it is read (a host sync on a GPU)
    # once, and again only when it is another tensor or was written in place.
    reads = []
    real = fa4_hf._read_packed_positions
    monkeypatch.setattr(fa4_hf, "_read_packed_positions", lambda *a: reads.append(1) or real(*a))
    q, k, v = _qkv(s=12)
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    first, _ = fa4_hf.fa4_attention_forward(_Module(), q, k, v, None, position_ids=pos)
    again, _ = fa4_hf.fa4_attention_forward(_Module(), q, k, v, None, position_ids=pos)
    assert len(reads) == 1
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    pos[0, 5:] = torch.arange(5, 12)  # in place: one sequence now
    whole, _ = fa4_hf.fa4_attention_forward(_Module(), q, k, v, None, position_ids=pos)
    assert len(reads) == 2
    torch.testing.assert_close(whole, fa4_hf.fa4_attention_forward(_Module(), q, k, v, None)[0],
                               rtol=0, atol=0)
    assert not torch.equal(whole, first)
    fa4_hf.fa4_attention_forward(_Module(), q, k, v, None, position_ids=pos.clone())
    assert len(reads) == 3


def test_packed_position_ids_in_a_model_match_sdpa():
    # The same through a model: fa4's logits equal sdpa's (which masks packed sequences apart).
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                             dtype=torch.float32).eval()
    ids = torch.randint(1, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        # use_cache=False: with a cache, transformers builds no packed mask for sdpa.
        want = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        model.set_attn_implementation(fa4_hf.NAME)
        got = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
