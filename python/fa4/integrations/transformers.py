"""fa4 as an attention implementation of HF transformers (``attn_implementation="fa4"``).

Importing this module (or calling :func:`register`) adds "fa4" to transformers'
``AttentionInterface`` and, for its masks, to ``AttentionMaskInterface`` with the 2-D padding-mask
format of the flash-attention family, so each layer receives:

* query (batch, num_heads, q_len, head_dim), key/value (batch, num_kv_heads, kv_len, head_dim):
  transposed (as views) into fa4's (batch, seq, heads, dim); GQA is native (no repeat_kv);
* attention_mask: None (no padding) or a bool (batch, kv_len) padding mask, True = real token.
  Padding is removed and the call becomes varlen (cu_seqlens): left, right or both-sided padding,
  in prefill and in decode with a KV cache. The queries are the last q_len positions of the kv
  sequence. Causal masks are bottom-right aligned per sequence, which equals transformers'
  position-based causal mask on the real tokens.
  A 4-D mask (a custom or pre-built mask) cannot be represented and is rejected with an error;
* sliding_window=W (Mistral & co.): a query sees itself and the W-1 keys before it, i.e.
  window_size=(W-1, 0) with causal. Windows count positions, so with sliding_window the real
  tokens of each row must be contiguous (padding only at the ends) — padding holes are rejected;
* scaling -> softmax_scale; softcap -> softcap; s_aux (learnable sink, gpt-oss) -> sink;
* dropout must be 0 (fa4 has no dropout): anything else raises ValueError — put the model in
  eval() or set attention_dropout=0;
* is_causal: taken from the call, else the module's ``is_causal``.

KV caches: with a padding mask shorter than the key buffers (a StaticCache: the mask covers the
slots filled so far, from slot 0), the keys/values past it are not used. Without a mask, a call
whose keys outnumber its queries (decoding, or a prompt into a StaticCache) goes through
fa4.flash_attn_with_kvcache with cache_seqlens = the last query's position + 1 (clamped to the
buffer length, for sliding-window caches that keep fewer slots than positions): the empty slots
of a StaticCache are never attended to, and on CUDA the decode kernel runs. position_ids come
from transformers' kwargs; without them all key slots are taken as filled.

Returns (attn_output (batch, q_len, num_heads, head_dim), None); padded query rows are 0.
"""

from __future__ import annotations

import torch

import fa4

NAME = "fa4"


def _int_max(x: torch.Tensor) -> int:
    return int(x.max().item()) if x.numel() else 0


def _unpad(x: torch.Tensor, mask: torch.Tensor):
    """(b, s, h, d) + bool (b, s) -> packed (total, h, d), int32 cu_seqlens, max_seqlen, indices."""
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    packed = x.reshape(-1, *x.shape[2:]).index_select(0, indices)
    return packed, cu, _int_max(lengths), indices


def _check_no_holes(mask: torch.Tensor) -> None:
    # True where a real token follows a padding token that follows a real token: the padding sits
    # inside the sequence, so windows counted on positions and on real tokens would differ.
    as_int = mask.to(torch.int8)
    starts = (as_int[:, 1:] > as_int[:, :-1]).sum(dim=1) + as_int[:, 0]
    if bool((starts > 1).any()):
        raise ValueError(
            "fa4 attention: sliding_window with padding in the middle of a sequence (real tokens "
            "of a row are not contiguous) cannot be represented: fa4's window counts real tokens "
            "while transformers counts positions. Use left or right padding only.")


def _filled_lengths(position_ids, query: torch.Tensor, kv_len: int):
    """Without a padding mask: the filled KV-cache slots per sequence, (position of the last query
    + 1) as int32 on query's device, or None where the call is not a cached one (no past keys, no
    position_ids, or training). Positions count from 0 when nothing is padded; a sliding-window
    cache keeps fewer slots than positions, hence the clamp to kv_len (all slots filled)."""
    batch, _, q_len, _ = query.shape
    if (position_ids is None or kv_len <= q_len or query.requires_grad
            or tuple(position_ids.shape) != (batch, q_len)):
        return None
    last = position_ids[:, -1].to(device=query.device, dtype=torch.int64) + 1
    return last.clamp(max=kv_len).to(torch.int32)


def fa4_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                          sliding_window=None, softcap=None, is_causal=None, s_aux=None,
                          **kwargs):
    """transformers attention function; see the module docstring for the calling convention."""
    if dropout != 0.0:
        raise ValueError(
            f"fa4 attention: dropout = {dropout} is not supported (fa4 has no attention dropout); "
            "call model.eval() or set config.attention_dropout = 0")
    if kwargs.get("output_attentions", False):
        raise ValueError("fa4 attention: output_attentions=True needs the attention weights, "
                         "which fa4 never materialises; use attn_implementation='eager'")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(
            f"fa4 attention: got a {attention_mask.dim()}-D attention_mask {tuple(attention_mask.shape)}; "
            "fa4 represents only padding masks (2-D (batch, kv_len)), which transformers builds "
            "for attn_implementation='fa4' — a custom or pre-built 4-D mask cannot be represented")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (-1, -1)
    if sliding_window is not None and sliding_window > 0:
        window = (sliding_window - 1, 0 if causal else sliding_window - 1)
    opts = dict(softmax_scale=scaling, causal=bool(causal), window_size=window,
                softcap=float(softcap) if softcap else 0.0,
                sink=s_aux.float() if s_aux is not None else None)

    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    q = query.transpose(1, 2)  # views; the last dim stays contiguous
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)

    cu_q = kwargs.get("cu_seq_lens_q")
    cu_k = kwargs.get("cu_seq_lens_k")
    if attention_mask is None and cu_q is not None and cu_k is not None:
        # Padding-free packed batch (DataCollatorWithFlattening): sequences given by cu_seqlens.
        out = fa4.flash_attn_varlen_func(
            q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
            cu_q.to(torch.int32), cu_k.to(torch.int32), int(kwargs["max_length_q"]),
            int(kwargs["max_length_k"]), **opts)
        return out.view(batch, q_len, *out.shape[1:]), None

    if attention_mask is None:
        seqlens = _filled_lengths(kwargs.get("position_ids"), query, kv_len)
        if seqlens is not None:
            # Decoding (or a prompt) against a KV cache: fa4's KV-cache path, attending to the
            # filled slots only (a StaticCache's buffers also hold the empty ones past them).
            try:
                return fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **opts), None
            except fa4.UnsupportedError:
                # No KV-cache kernel for this input on this device (e.g. a CUDA head dim without a
                # decode bucket): the same attention through the forward on the filled slots.
                filled = seqlens.tolist()
                if len(set(filled)) != 1:
                    raise
                k, v = k[:, :filled[0]], v[:, :filled[0]]
        return fa4.flash_attn_func(q, k, v, **opts), None

    mask = attention_mask[:, -kv_len:].to(device=query.device, dtype=torch.bool)
    if mask.shape[1] < kv_len:
        # A StaticCache: the mask covers the slots filled so far, [0, mask length); the rest of
        # the buffers is empty.
        k, v, kv_len = k[:, :mask.shape[1]], v[:, :mask.shape[1]], mask.shape[1]
    if window[0] >= 0:
        _check_no_holes(mask)
    q_mask = mask[:, -q_len:]  # the queries are the last q_len positions of the kv sequence
    q_packed, cu_seqlens_q, max_q, q_idx = _unpad(q, q_mask)
    k_packed, cu_seqlens_k, max_k, k_idx = _unpad(k, mask)
    v_packed = v.reshape(-1, *v.shape[2:]).index_select(0, k_idx)
    out_packed = fa4.flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens_q,
                                            cu_seqlens_k, max_q, max_k, **opts)
    out = out_packed.new_zeros(batch * q_len, *out_packed.shape[1:])
    out.index_copy_(0, q_idx, out_packed)
    return out.view(batch, q_len, *out_packed.shape[1:]), None


def register(name: str = NAME) -> str:
    """Registers fa4 under `name` in transformers' attention and mask interfaces; returns name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, fa4_attention_forward)
    # Without a mask function transformers would build NO mask for an unknown implementation
    # (padding silently ignored); the flash-attention one gives the 2-D padding mask used above.
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


register()
