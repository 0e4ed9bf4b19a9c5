"""fa4 as an attention implementation of HF transformers (``attn_implementation="fa4"``).

Importing this module (or calling :func:`register`) adds "fa4" to transformers'
``AttentionInterface`` and, for its masks, to ``AttentionMaskInterface`` with the 2-D padding-mask
format of the flash-attention family, so each layer receives:

* query (batch, num_heads, q_len, head_dim), key/value (batch, num_kv_heads, kv_len, head_dim):
  transposed (as views) into fa4's (batch, seq, heads, dim); GQA is native (no repeat_kv);
* attention_mask: None (no padding) or a bool (batch, kv_len) padding mask, True = real token.
  Padding is removed and the call becomes varlen (cu_seqlens): left, right or both-sided padding,
  in prefill and in decode with a KV cache. In a causal or sliding-window call the queries are
  the last q_len positions of the kv sequence and padded query rows are 0; a non-causal call
  without a window (an encoder, cross-attention, where the mask pads the encoder's keys)
  computes every query row against the real keys, as eager and sdpa attention do. Causal masks
  are bottom-right aligned per sequence, which equals transformers' position-based causal mask
  on the real tokens.
  A 4-D mask (a custom or pre-built mask) cannot be represented and is rejected with an error;
* sliding_window=W (Mistral & co.): a query sees itself and the W-1 keys before it, i.e.
  window_size=(W-1, 0) with causal. Windows count positions, so with sliding_window the real
  tokens of each row must be contiguous (padding only at the ends) — padding holes are rejected;
* scaling -> softmax_scale; softcap -> softcap; s_aux (learnable sink, gpt-oss) -> sink;
* dropout must be 0 (fa4 has no dropout): anything else raises ValueError — put the model in
  eval() or set attention_dropout=0;
* is_causal: taken from the call, else the module's ``is_causal``;
* padding-free packing (several sequences concatenated in a row, no mask): given by
  cu_seq_lens_q/k and max_length_q/k, or by position_ids alone (DataCollatorWithFlattening's
  default): a new sequence starts wherever the position does not grow by 1, the rule of
  transformers' own masks (and, for one row, of its flash-attention path). Each sequence attends
  only to itself (varlen). Reading position_ids costs one host sync per model call without a
  mask and without cached keys (the answer is kept for the position_ids tensor every layer gets);
  under torch.compile and CUDA-graph capture it is not read (packing by position_ids alone is
  then not seen: pass cu_seq_lens_q/k, e.g. DataCollatorWithFlattening(return_flash_attn_kwargs=
  True)). The position_ids rule also applies when a cache is passed but still empty (kv_len ==
  q_len), as in transformers' flash-attention path (its sdpa path does not split then).

KV caches: with a padding mask shorter than the key buffers (a StaticCache with padding: the
mask covers the slots filled so far, from slot 0), the keys/values past it are not used. Without
a mask, a causal call whose keys outnumber its queries (unpadded decoding with any cache, an
unpadded prompt into a StaticCache) takes the filled length of each
sequence from position_ids (last position + 1: with no padding, positions are slot indices;
clamped to [q_len, kv_len] for sliding-window caches): up to 16 queries and no gradient go
through fa4.flash_attn_with_kvcache (on CUDA the decode kernel), anything else through the
varlen forward with seqused_k (differentiable; it copies the packed keys). Without position_ids
all key slots are taken as filled.

Returns (attn_output (batch, q_len, num_heads, head_dim), None).
"""

from __future__ import annotations

import weakref

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


# The KV-cache kernel is for a few query rows per sequence (decoding, speculative decoding);
# longer cached calls (a prompt into a cache, chunked prefill) take the forward kernel.
_KVCACHE_MAX_Q = 16
# (device type, dtype, head dim, head dim v) -> whether flash_attn_with_kvcache takes it, decided
# by the first call (the answer depends only on these).
_kvcache_ok: dict = {}


def _filled_lengths(position_ids, query: torch.Tensor, kv_len: int, causal: bool):
    """Without a padding mask: the filled KV-cache slots per sequence as int32 on query's device,
    or None where the call is not a cached one (no past keys, not causal, no usable position_ids).

    With no padding, positions are slot indices (transformers counts them from 0), so sequence b
    has position_ids[b, -1] + 1 filled slots; a StaticCache's buffers also hold empty slots past
    them. A sliding-window cache keeps fewer slots than positions (in position order, newest
    last), hence the clamp to kv_len; the clamp to q_len keeps at least the queries' own keys.
    position_ids of shape (1, q_len) (transformers' default without a mask) serve every row."""
    batch, _, q_len, _ = query.shape
    if position_ids is None or kv_len <= q_len or not causal or position_ids.dim() != 2:
        return None
    if position_ids.shape[1] != q_len or position_ids.shape[0] not in (1, batch):
        return None
    last = position_ids[:, -1].to(device=query.device, dtype=torch.int64) + 1
    return last.clamp(min=q_len, max=kv_len).expand(batch).to(torch.int32)


# The last _packed_from_positions answer: (a weak reference to position_ids, its version, the
# arguments, the answer). Every layer of a model call gets the same position_ids tensor, so the
# host sync of reading it is paid once per model call, not once per layer.
_packed_memo: tuple = (None, -1, None, None)


def _packed_from_positions(position_ids, batch: int, q_len: int, kv_len: int, device):
    global _packed_memo
    if position_ids is None or torch.compiler.is_compiling() or (
            position_ids.is_cuda and torch.cuda.is_current_stream_capturing()):
        return None  # reading it would be a host sync: not traceable, not capturable
    ref, version, args, answer = _packed_memo
    key = (batch, q_len, kv_len, device)
    if ref is not None and ref() is position_ids and version == position_ids._version and args == key:
        return answer
    answer = _read_packed_positions(position_ids, batch, q_len, kv_len, device)
    _packed_memo = (weakref.ref(position_ids), position_ids._version, key, answer)
    return answer


def _read_packed_positions(position_ids, batch: int, q_len: int, kv_len: int, device):
    """Without a padding mask: (int32 cu_seqlens over the flattened rows, longest sequence) of the
    sequences that position_ids pack into each row, or None where every row is one sequence or
    the call has cached keys (kv_len != q_len). A sequence starts at each row's first token and
    wherever the position does not grow by exactly 1 (transformers' masking_utils.
    find_packed_sequence_indices). position_ids of shape (1, q_len) serve every row."""
    if (position_ids is None or kv_len != q_len or q_len < 2 or position_ids.dim() != 2
            or position_ids.shape[1] != q_len or position_ids.shape[0] not in (1, batch)):
        return None
    pos = position_ids.to(device)
    starts = torch.ones(pos.shape, dtype=torch.bool, device=device)
    starts[:, 1:] = (pos[:, 1:] - pos[:, :-1]) != 1
    if not bool(starts[:, 1:].any()):
        return None
    first = starts.expand(batch, q_len).flatten().nonzero().flatten()
    cu = torch.cat([first, first.new_tensor([batch * q_len])]).to(torch.int32)
    return cu, _int_max(cu[1:] - cu[:-1])


def _cached_attention(q, k, v, seqlens, needs_grad: bool, opts: dict):
    """Causal attention of the last q_len positions of each sequence against its seqlens[b] filled
    key slots (q (b, q_len, h, d); k/v (b, kv_len, hkv, d) views of the cache buffers)."""
    batch, q_len = q.shape[0], q.shape[1]
    key = (q.device.type, q.dtype, q.shape[-1], v.shape[-1])
    if not needs_grad and q_len <= _KVCACHE_MAX_Q and _kvcache_ok.get(key, True):
        try:
            out = fa4.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **opts)
            _kvcache_ok[key] = True
            return out
        except fa4.UnsupportedError:  # e.g. a CUDA head dim without a decode bucket
            _kvcache_ok[key] = False
    # The forward (differentiable, any q_len): the sequences packed, the keys of sequence b cut to
    # seqlens[b] by seqused_k (no host sync). Packing copies the cache buffers' views.
    kv_len = k.shape[1]
    ar = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    return _rows_varlen(q, k, v, ar * q_len, ar * kv_len, q_len, kv_len, opts, seqused_k=seqlens)


def _rows_varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, opts: dict, **extra):
    """flash_attn_varlen_func over the rows of q/k/v (batch, len, heads, d) taken as one packed
    tensor (the sequences given by cu_q / cu_k over it); out in q's (batch, q_len) layout."""
    out = fa4.flash_attn_varlen_func(
        q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
        cu_q, cu_k, max_q, max_k, **extra, **opts)
    return out.view(*q.shape[:2], *out.shape[1:])


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
        return _rows_varlen(q, k, v, cu_q.to(torch.int32), cu_k.to(torch.int32),
                            int(kwargs["max_length_q"]), int(kwargs["max_length_k"]), opts), None

    if attention_mask is None:
        packed = _packed_from_positions(kwargs.get("position_ids"), batch, q_len, kv_len, q.device)
        if packed is not None:
            cu, longest = packed
            return _rows_varlen(q, k, v, cu, cu, longest, longest, opts), None
        seqlens = _filled_lengths(kwargs.get("position_ids"), query, kv_len, bool(causal))
        if seqlens is not None:
            # A cached call (decoding, or a prompt into a cache): only the filled slots are keys.
            needs_grad = torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (query, key, value, s_aux))
            return _cached_attention(q, k, v, seqlens, needs_grad, opts), None
        return fa4.flash_attn_func(q, k, v, **opts), None

    mask = attention_mask[:, -kv_len:].to(device=query.device, dtype=torch.bool)
    if mask.shape[1] < kv_len:
        # A StaticCache: the mask covers the slots filled so far, [0, mask length); the rest of
        # the buffers is empty.
        k, v, kv_len = k[:, :mask.shape[1]], v[:, :mask.shape[1]], mask.shape[1]
    if window[0] >= 0:
        _check_no_holes(mask)
    if causal or window[0] >= 0:
        # Positions matter (the causal diagonal, the window): the queries are the last q_len
        # positions of the kv sequence, unpadded like the keys so both align per sequence.
        q_mask = mask[:, -q_len:]
    else:
        # Without positions every query row is computed, as eager and sdpa attention do: in
        # cross-attention the mask pads the encoder's keys, not the decoder's queries (whatever
        # the two lengths), and an encoder's padded rows are then finite, never read.
        q_mask = torch.ones(batch, q_len, dtype=torch.bool, device=mask.device)
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
