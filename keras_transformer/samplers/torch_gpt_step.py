"""GPT's cached decoding step in plain PyTorch calls, for `generate` on the PyTorch backend.

Axes: R decoded rows, T new tokens, S cache length, D model width, H query heads,
Hkv key/value heads, Dh head size, V vocabulary.

Eager PyTorch pays Python for every Keras layer call and op (about 60 layer calls and 400
ops per step for gpt_tiny-sized models, ~10 ms); the arithmetic of a one-token step is a
fraction of that. This step reads the same weights from the same layers and does the same
computation as `GPTBackbone.call_with_cache` + the tied LM head, with one PyTorch call per
operation, and writes each layer's new keys/values into its cache buffer in place. The
decoding tests compare its logits with the Keras model's full forward pass at every step.

Used only when `supports(task)`: a `GPTCausalLM` on the PyTorch backend in float32
(mixed-precision policies keep the Keras path, which casts as the policy says).
"""

import keras
import torch
import torch.nn.functional as F


def supports(task):
    from keras_transformer.models.gpt import GPTBackbone

    backbone = getattr(task, "backbone", None)
    if keras.config.backend() != "torch" or type(backbone) is not GPTBackbone:
        return False
    if task.dtype_policy.name != "float32" or backbone.dtype_policy.name != "float32":
        return False
    layers = [backbone.layer_norm] + [
        norm for block in backbone.transformer_layers for norm in (block.self_attention_norm, block.feed_forward_norm)
    ]
    return all(_plain_layer_norm(layer) for layer in layers) and all(
        layer.dtype_policy.name == "float32" for layer in backbone._flatten_layers()
    )


def _plain_layer_norm(layer):
    return (
        type(layer) is keras.layers.LayerNormalization
        and not layer.rms_scaling
        and layer.axis in (-1, [-1], 2, [2])
    )


def call_with_cache(task, token_ids, cache, index):
    """(R, T) ids at positions [index, index + T), per-layer (keys, values) pairs of (R, Hkv, S, Dh) -> (logits (R, T, V), caches).

    The caches are written in place (and returned, for the loop's state).
    """
    backbone = task.backbone
    # Writable buffers: rows repeated per beam can be broadcast views (stride 0) of one row.
    cache = [tuple(c if c.is_contiguous() else c.contiguous() for c in pair) for pair in cache]
    token_ids = token_ids.long()
    start = int(index)
    rows, length = token_ids.shape
    x = F.embedding(token_ids, backbone.token_embedding.embeddings.value)  # (R, T, D)
    positions = backbone.position_embedding
    table = positions.embeddings.value if positions.position_type == "learned" else positions._table  # (P, D)
    x = x + table[start : start + length]
    # Query t sits at start + t and attends keys 0 .. start + t: (T, S) True to attend.
    key_positions = torch.arange(cache[0][0].shape[2], device=x.device)
    query_positions = start + torch.arange(length, device=x.device)
    allowed = key_positions[None, :] <= query_positions[:, None]
    for block, layer_cache in zip(backbone.transformer_layers, cache):
        h = _norm(block.self_attention_norm, x) if block.norm_first else x
        h = _attention(block.self_attention, h, layer_cache, start, allowed)
        x = x + h if block.norm_first else _norm(block.self_attention_norm, x + h)
        h = _norm(block.feed_forward_norm, x) if block.norm_first else x
        h = _feed_forward(block.feed_forward, h)
        x = x + h if block.norm_first else _norm(block.feed_forward_norm, x + h)
    x = _norm(backbone.layer_norm, x)
    logits = F.linear(x, backbone.token_embedding.embeddings.value)  # (R, T, D) x (V, D)^T -> (R, T, V)
    return logits, cache


def _attention(attention, h, layer_cache, start, allowed):
    """h (R, T, D) -> (R, T, D); writes the new keys/values into both buffers of layer_cache at [start, start + T)."""
    heads, kv_heads, head_dim = attention.num_heads, attention._kv_heads, attention._head_dim
    rows, length, _ = h.shape
    q = _project(attention.query_dense, h, heads * head_dim).view(rows, length, heads, head_dim)  # (R, T, D) -> (R, T, H, Dh)
    k = _project(attention.key_dense, h, kv_heads * head_dim).view(rows, length, kv_heads, head_dim)  # (R, T, D) -> (R, T, Hkv, Dh)
    v = _project(attention.value_dense, h, kv_heads * head_dim).view(rows, length, kv_heads, head_dim)  # (R, T, D) -> (R, T, Hkv, Dh)
    keys, values = layer_cache  # (R, Hkv, S, Dh) each
    keys[:, :, start : start + length] = k.transpose(1, 2)  # (R, T, Hkv, Dh) -> (R, Hkv, T, Dh)
    values[:, :, start : start + length] = v.transpose(1, 2)
    if kv_heads != heads:
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)  # (R, H, S, Dh)
        values = values.repeat_interleave(heads // kv_heads, dim=1)
    # Plain products: PyTorch's CPU flash-attention kernel costs more than these at a few queries.
    scores = (q.transpose(1, 2) * attention._scale) @ keys.transpose(2, 3)  # (R, H, T, Dh) x (R, H, Dh, S) -> (R, H, T, S)
    scores = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)  # query t always sees key 0
    out = scores @ values  # (R, H, T, S) x (R, H, S, Dh) -> (R, H, T, Dh)
    out = out.transpose(1, 2).reshape(rows, length, heads * head_dim)  # -> (R, T, H * Dh)
    dense = attention.output_dense
    out = out @ dense.kernel.value.reshape(heads * head_dim, -1)  # (R, T, H * Dh) x (H * Dh, D)
    return out + dense.bias.value if dense.bias is not None else out


def _project(dense, x, width):
    """EinsumDense "btd,dhk->bthk" as one matmul: (R, T, D) -> (R, T, width)."""
    y = x @ dense.kernel.value.reshape(x.shape[-1], width)
    return y + dense.bias.value.reshape(width) if dense.bias is not None else y


def _feed_forward(layer, x):
    """`FeedForward.call` at inference: (R, T, D) -> (R, T, D)."""
    hidden = _dense(layer.intermediate_dense, x)  # (R, T, F)
    if layer._gated:
        hidden = layer._activation_fn(_dense(layer.gate_dense, x)) * hidden
    else:
        hidden = layer._activation_fn(hidden)
    return _dense(layer.output_dense, hidden)


def _dense(layer, x):
    y = x @ layer.kernel.value
    return y + layer.bias.value if layer.bias is not None else y


def _norm(layer, x):
    gamma = layer.gamma.value if layer.scale else None
    beta = layer.beta.value if layer.center else None
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, layer.epsilon)
