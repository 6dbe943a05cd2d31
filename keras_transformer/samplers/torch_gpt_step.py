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


class StepWeights:
    """A GPT's weights arranged for the step, read from its layers once per `generate` call.

    Every matrix is (in, out) and contiguous: at a few rows PyTorch's CPU matmul reads an
    (out, in) matrix at about half the speed once it is out of cache, which made the tied LM
    head (V, D) the slowest product of the step. The query, key and value projections are one
    (D, (H + 2 Hkv) Dh) matrix. Copies: the head's transpose and the fused projections.
    """

    def __init__(self, task):
        backbone = task.backbone
        self.embeddings = backbone.token_embedding.embeddings.value  # (V, D)
        positions = backbone.position_embedding
        self.positions = positions.embeddings.value if positions.position_type == "learned" else positions._table  # (P, D)
        self.head = self.embeddings.detach().t().contiguous()  # (V, D) -> (D, V)
        self.final_norm = _norm_weights(backbone.layer_norm)
        self.blocks = [_block_weights(block) for block in backbone.transformer_layers]


def _norm_weights(layer):
    return (layer.gamma.value if layer.scale else None, layer.beta.value if layer.center else None, layer.epsilon)


def _dense_weights(layer):
    return layer.kernel.value, (layer.bias.value if layer.bias is not None else None)  # (in, out), (out,)


def _block_weights(block):
    attention, feed_forward = block.self_attention, block.feed_forward
    heads, kv_heads, head_dim = attention.num_heads, attention._kv_heads, attention._head_dim
    projections = (attention.query_dense, attention.key_dense, attention.value_dense)
    hidden_dim = attention.query_dense.kernel.shape[0]
    # (D, H, Dh), (D, Hkv, Dh), (D, Hkv, Dh) -> (D, (H + 2 Hkv) Dh)
    qkv = torch.cat([p.kernel.value.reshape(hidden_dim, -1) for p in projections], dim=1).detach().contiguous()
    qkv_bias = None
    if attention.query_dense.bias is not None:
        qkv_bias = torch.cat([p.bias.value.reshape(-1) for p in projections]).detach()  # ((H + 2 Hkv) Dh,)
    output = attention.output_dense
    return {
        "norm_first": block.norm_first,
        "attention_norm": _norm_weights(block.self_attention_norm),
        "feed_forward_norm": _norm_weights(block.feed_forward_norm),
        "heads": (heads, kv_heads, head_dim),
        "scale": attention._scale,
        "qkv": (qkv, qkv_bias),
        "output": (output.kernel.value.reshape(heads * head_dim, -1),  # (H, Dh, D) -> (H * Dh, D)
                   output.bias.value if output.bias is not None else None),
        "intermediate": _dense_weights(feed_forward.intermediate_dense),
        "gate": _dense_weights(feed_forward.gate_dense) if feed_forward._gated else None,
        "activation": feed_forward._activation_fn,
        "feed_forward_output": _dense_weights(feed_forward.output_dense),
    }


def call_with_cache(task, token_ids, cache, index, weights=None):
    """(R, T) ids at positions [index, index + T), per-layer (keys, values) pairs of (R, Hkv, S, Dh) -> (logits (R, T, V), caches).

    `weights`: the task's `StepWeights` (`generate` makes them once per call); read from the
    task when None. The caches are written in place (and returned, for the loop's state).
    """
    weights = weights if weights is not None else StepWeights(task)
    # Writable buffers: rows repeated per beam can be broadcast views (stride 0) of one row.
    cache = [tuple(c if c.is_contiguous() else c.contiguous() for c in pair) for pair in cache]
    token_ids = token_ids.long()
    start = int(index)
    rows, length = token_ids.shape
    x = F.embedding(token_ids, weights.embeddings)  # (R, T, D)
    x = x + weights.positions[start : start + length]
    # Query t sits at start + t and attends keys 0 .. start + t: (T, S) True to attend.
    key_positions = torch.arange(cache[0][0].shape[2], device=x.device)
    query_positions = start + torch.arange(length, device=x.device)
    allowed = key_positions[None, :] <= query_positions[:, None]
    for block, layer_cache in zip(weights.blocks, cache):
        norm_first = block["norm_first"]
        h = _norm(block["attention_norm"], x) if norm_first else x
        h = _attention(block, h, layer_cache, start, allowed)
        x = x + h if norm_first else _norm(block["attention_norm"], x + h)
        h = _norm(block["feed_forward_norm"], x) if norm_first else x
        h = _feed_forward(block, h)
        x = x + h if norm_first else _norm(block["feed_forward_norm"], x + h)
    x = _norm(weights.final_norm, x)
    logits = x @ weights.head  # (R, T, D) x (D, V) -> (R, T, V)
    return logits, cache


def _attention(block, h, layer_cache, start, allowed):
    """h (R, T, D) -> (R, T, D); writes the new keys/values into both buffers of layer_cache at [start, start + T)."""
    heads, kv_heads, head_dim = block["heads"]
    rows, length, _ = h.shape
    qkv = _dense(block["qkv"], h)  # (R, T, D) -> (R, T, (H + 2 Hkv) Dh)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.view(rows, length, heads, head_dim)  # (R, T, H * Dh) -> (R, T, H, Dh)
    k = k.view(rows, length, kv_heads, head_dim)  # (R, T, Hkv * Dh) -> (R, T, Hkv, Dh)
    v = v.view(rows, length, kv_heads, head_dim)
    keys, values = layer_cache  # (R, Hkv, S, Dh) each
    keys[:, :, start : start + length] = k.transpose(1, 2)  # (R, T, Hkv, Dh) -> (R, Hkv, T, Dh)
    values[:, :, start : start + length] = v.transpose(1, 2)
    if kv_heads != heads:
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)  # (R, H, S, Dh)
        values = values.repeat_interleave(heads // kv_heads, dim=1)
    # Plain products: PyTorch's CPU flash-attention kernel costs more than these at a few queries.
    scores = (q.transpose(1, 2) * block["scale"]) @ keys.transpose(2, 3)  # (R, H, T, Dh) x (R, H, Dh, S) -> (R, H, T, S)
    scores = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)  # query t always sees key 0
    out = scores @ values  # (R, H, T, S) x (R, H, S, Dh) -> (R, H, T, Dh)
    out = out.transpose(1, 2).reshape(rows, length, heads * head_dim)  # -> (R, T, H * Dh)
    return _dense(block["output"], out)  # (R, T, H * Dh) x (H * Dh, D) -> (R, T, D)


def _feed_forward(block, x):
    """`FeedForward.call` at inference: (R, T, D) -> (R, T, D)."""
    hidden = _dense(block["intermediate"], x)  # (R, T, F)
    if block["gate"] is not None:
        hidden = block["activation"](_dense(block["gate"], x)) * hidden
    else:
        hidden = block["activation"](hidden)
    return _dense(block["feed_forward_output"], hidden)


def _dense(weights, x):
    kernel, bias = weights  # (in, out), (out,) or None
    y = x @ kernel
    return y + bias if bias is not None else y


def _norm(weights, x):
    gamma, beta, epsilon = weights
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, epsilon)
