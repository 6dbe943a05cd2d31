"""Attention for the PyTorch kernels (`torch_kernels.py`): causal self-attention writing the cache in place
(eager: the written positions only; static, a compiled step's: the whole width under a mask), rotary
positions, grouped-query products, and cross-attention over the encoder's cached keys/values.

Axes: R decoded rows, T new tokens, S key length (cache width), S_enc encoder length, D model width,
H query heads, Hkv key/value heads, G = H / Hkv, Dh head size.
"""

import torch

from keras_transformer.kernels.torch_weights import fused, linear, mark_static, projection


def attention_weights(attention, key_value):
    """Projections as (in, out) matrices; `key_value`: query, key and value in one (D, (H + 2 Hkv) Dh) matrix."""
    projections = (attention.query_dense, attention.key_dense, attention.value_dense)
    if not key_value:
        projections = projections[:1]
    width = attention.query_dense.kernel.shape[0]
    # The logits' scale goes into the query projection (one product per step fewer; rotary
    # embeddings are linear, so rotating scaled queries is the same), unless a norm of the queries
    # follows it (which would undo it): then `query_scale` scales the normed queries.
    normed = attention.query_key_norm is not None
    scales = [1.0 if normed else attention._scale] + [1.0] * (len(projections) - 1)
    H, Dh = attention.num_heads, attention._head_dim
    return {
        "heads": (H, attention._kv_heads, Dh),
        "projection": fused([projection(p, width, scale) for p, scale in zip(projections, scales)]),
        "output": projection(attention.output_dense, H * Dh),
        "query_scale": attention._scale if normed else None,
        "cap": attention.logit_soft_cap,
    }


def normalize(kernels, attention, weights, q, k=None):
    """`MultiHeadAttention.normalize` of q (R, T, H, Dh) (and k (R, T, Hkv, Dh)), then q's scale: the
    layer's RMS norms per head or over all heads, through the RMS norm kernel (layers with query/key norms only)."""
    shape = q.shape
    if attention.query_key_norm == "head":
        q = kernels(attention.query_norm, q)
        k = None if k is None else kernels(attention.key_norm, k)
    else:  # over all heads: (R, T, heads * Dh)
        q = kernels(attention.query_norm, q.reshape(shape[0], shape[1], -1)).view(shape)
        k = None if k is None else kernels(attention.key_norm, k.reshape(k.shape[0], k.shape[1], -1)).view(k.shape)
    return q * weights["query_scale"], k


def attend(heads, q, keys, values, blocked, bias, cap=None):
    """q (R, T, H, Dh) already scaled, keys/values (R, Hkv, S, Dh), blocked (R|1, 1, T, S) bool (True: masked
    out) or None, bias (R|1, H, T, S) or None, cap: the logits' soft cap or None -> (R, T, H * Dh).

    Each key/value head serves its G query heads as one (G * T)-row product, so grouped-query
    attention reads the cache without repeating it. Plain products: PyTorch's CPU
    flash-attention kernel costs more than these at a few queries.
    """
    H, Hkv, Dh = heads
    G = H // Hkv
    rows, length = q.shape[0], q.shape[1]
    width = keys.shape[2]
    q = q.transpose(1, 2)  # (R, T, H, Dh) -> (R, H, T, Dh)
    if G > 1:
        q = q.reshape(rows, Hkv, G * length, Dh)  # -> (R, Hkv, G * T, Dh)
    logits = q @ keys.transpose(2, 3)  # (R, Hkv, G * T, Dh) x (R, Hkv, Dh, S)
    if G > 1:
        logits = logits.view(rows, H, length, width)  # -> (R, H, T, S)
    logits = logits.float()  # bias, mask and softmax in float32 whatever the compute dtype, as the layer's
    if cap is not None:  # `MultiHeadAttention.cap_logits`
        logits = torch.tanh(logits / cap) * cap
    if bias is not None:
        logits = logits + bias
    if blocked is not None:
        logits = logits.masked_fill(blocked, -1.0e9)  # MultiHeadAttention's mask bias
    probs = logits.softmax(dim=-1).to(values.dtype)
    if G > 1:
        probs = probs.view(rows, Hkv, G * length, width)
    out = probs @ values  # (R, Hkv, G * T, S) x (R, Hkv, S, Dh) -> (R, Hkv, G * T, Dh)
    return out.view(rows, H, length, Dh).transpose(1, 2).reshape(rows, length, H * Dh)  # -> (R, T, H * Dh)


def self_attention(kernels, attention, h, cache, start, padding_mask, bias):
    """Causal self-attention of h (R, T, D) at positions [start, start + T), writing the new keys/values
    into the cache pair (R, Hkv, S, Dh) in place -> (output (R, T, D), cache)."""
    weights = kernels.weights(attention, lambda layer: attention_weights(layer, key_value=True))
    H, Hkv, Dh = weights["heads"]
    rows, length, _ = h.shape
    qkv = linear(h, *weights["projection"])  # (R, T, D) -> (R, T, (H + 2 Hkv) Dh)
    q, k, v = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
    q, k = q.view(rows, length, H, Dh), k.view(rows, length, Hkv, Dh)
    if weights["query_scale"] is not None:  # query/key norms (checked here: no call on the usual step)
        q, k = normalize(kernels, attention, weights, q, k)
    if attention.rotary_embedding is not None:
        q, k = (
            _rotate(kernels, attention.rotary_embedding, q, start),
            _rotate(kernels, attention.rotary_embedding, k, start),
        )
    keys, values = (c if c.is_contiguous() else c.contiguous() for c in cache)  # rows may be broadcast views
    if kernels.static:
        return _static_self_attention(kernels, attention, weights, q, k, v, keys, values, start, padding_mask, bias)
    end = start + length
    keys[:, :, start:end] = k.transpose(1, 2)  # (R, T, Hkv, Dh) -> (R, Hkv, T, Dh)
    values[:, :, start:end] = v.view(rows, length, Hkv, Dh).transpose(1, 2)
    # Only the positions [low, end) that some query may see are read: the cache past `end` is not
    # written yet, and a one-token step sees every position of that range, so it needs no mask.
    window = attention.sliding_window
    low = 0 if window is None else max(0, start + 1 - window)
    blocked = None
    if length > 1:
        blocked = ~kernels.causal_mask(start, length, keys.shape[2], h.device, window)[None, None, :, low:end]
    if padding_mask is not None:
        padded = ~padding_mask[:, low:end].bool()[:, None, None, :]  # (R, S) -> (R, 1, 1, S)
        blocked = padded if blocked is None else blocked | padded
    if bias is not None:
        bias = bias[..., low:end]  # (R|1, H, T, S)
    out = attend(weights["heads"], q, keys[:, :, low:end], values[:, :, low:end], blocked, bias, weights["cap"])
    return linear(out, *weights["output"]), (keys, values)  # (R, T, H * Dh) -> (R, T, D)


def _static_self_attention(kernels, attention, weights, q, k, v, keys, values, start, padding_mask, bias):
    """`_self_attention` of a compiled step: `start` a tensor; every position of the cache (R, Hkv, S, Dh)
    is read, the ones not written yet masked out."""
    _, Hkv, width, Dh = keys.shape
    rows, length = q.shape[0], q.shape[1]
    positions = kernels.positions(start, length, q.device)  # (T,)
    keys.index_copy_(2, positions, k.transpose(1, 2).to(keys.dtype))  # (R, T, Hkv, Dh) -> (R, Hkv, T, Dh)
    values.index_copy_(2, positions, v.view(rows, length, Hkv, Dh).transpose(1, 2).to(values.dtype))
    key_positions = torch.arange(width, device=q.device)
    allowed = key_positions[None, :] <= positions[:, None]  # (T, S)
    if attention.sliding_window is not None:
        allowed = allowed & (positions[:, None] - key_positions[None, :] < attention.sliding_window)
    blocked = ~allowed[None, None]  # (1, 1, T, S)
    if padding_mask is not None:
        blocked = blocked | ~padding_mask.bool()[:, None, None, :]  # (R, S) -> (R, 1, T, S)
    out = attend(weights["heads"], q, keys, values, blocked, bias, weights["cap"])
    return linear(out, *weights["output"]), (keys, values)  # (R, T, H * Dh) -> (R, T, D)


def _rotate(kernels, rotary, x, start):
    """`RotaryEmbedding` of x (R, T, H, Dh) at positions [start, start + T), cos/sin read from a table
    made once per call and grown (doubling) when a step reaches past it. longrope's long table serves a
    step whose last position + 1 passes `rotary.long_after`, as the layer's frequencies do."""
    length, head_dim = x.shape[1], x.shape[3]
    table = kernels.table(rotary, lambda layer: {"cos": None, "sin": None})
    if kernels.static:
        if table["cos"] is None:  # made on the first (eager) step for every position of the buffer
            _rotary_table(table, rotary, kernels.length, head_dim, x.device)
        positions = kernels.positions(start, length, x.device)
        cos = table["cos"].index_select(0, positions)[None, :, None, :]  # (1, T, 1, R)
        sin = table["sin"].index_select(0, positions)[None, :, None, :]
        if rotary.long_after is not None:  # picked on the device: no host synchronisation in a compiled step
            long = positions[-1] + 1 > rotary.long_after
            cos = torch.where(long, table["long_cos"].index_select(0, positions)[None, :, None, :], cos)
            sin = torch.where(long, table["long_sin"].index_select(0, positions)[None, :, None, :], sin)
        return _apply_rotation(x, cos, sin)
    if table["cos"] is None or start + length > table["cos"].shape[0]:
        _rotary_table(table, rotary, max(2 * (start + length), 256), head_dim, x.device)
    prefix = "long_" if rotary.long_after is not None and start + length > rotary.long_after else ""
    cos = table[prefix + "cos"][start : start + length][None, :, None, :]  # (1, T, 1, R)
    sin = table[prefix + "sin"][start : start + length][None, :, None, :]
    return _apply_rotation(x, cos, sin)


def _rotary_table(table, rotary, size, head_dim, device):
    """cos / sin (P, R) float32 of the first `size` positions, times the attention factor, into `table` (and
    longrope's long_cos / long_sin)."""
    positions = torch.arange(size, device=device, dtype=torch.float32)
    sets = {"": False} if rotary.long_after is None else {"": False, "long_": True}
    for prefix, long in sets.items():
        frequencies = torch.as_tensor(rotary.inverse_frequencies(head_dim, long=long), device=device)
        angles = positions[:, None] * frequencies[None, :]  # (P, 1) x (1, R/2) -> (P, R/2)
        angles = torch.cat([angles, angles], dim=-1)  # -> (P, R)
        cos, sin = angles.cos(), angles.sin()
        if rotary.attention_factor != 1.0:
            cos, sin = cos * rotary.attention_factor, sin * rotary.attention_factor
        table.update(mark_static({prefix + "cos": cos, prefix + "sin": sin}))


def _apply_rotation(x, cos, sin):
    """x (R, T, H, Dh) rotated by cos / sin (1, T, 1, R), R <= Dh rotary dimensions (the rest pass)."""
    head_dim, rotary_dim = x.shape[3], cos.shape[-1]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    turned = torch.cat([-rotated[..., half:], rotated[..., :half]], dim=-1)  # rotate_half: (x1, x2) -> (-x2, x1)
    rotated = (rotated * cos + turned * sin).to(x.dtype)  # float32 tables: a 16-bit x rotates in float32
    return rotated if rotary_dim == head_dim else torch.cat([rotated, passed], dim=-1)


def cross_attention(kernels, attention, h, cache, encoder_padding_mask, bias):
    """Attention of h (R, T, D) over the encoder's cached keys/values (R, Hkv, S_enc, Dh) -> (R, T, D)."""
    weights = kernels.weights(attention, lambda layer: attention_weights(layer, key_value=False))
    H, _, Dh = weights["heads"]
    rows, length, _ = h.shape
    q = linear(h, *weights["projection"]).view(rows, length, H, Dh)  # (R, T, D) -> (R, T, H, Dh)
    if weights["query_scale"] is not None:
        q, _ = normalize(kernels, attention, weights, q)
    blocked = kernels.padding_blocked(encoder_padding_mask)
    out = attend(weights["heads"], q, cache[0], cache[1], blocked, bias, weights["cap"])
    return linear(out, *weights["output"])
