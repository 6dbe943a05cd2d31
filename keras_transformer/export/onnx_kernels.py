"""The ONNX nodes of each layer type in a one-token decode step (see decode_graph.py), keyed by layer type.

Axes: B rows, D model width, H heads, Hkv key/value heads, Dh head size, F feed-forward width, V vocabulary.
Every kernel takes `(kernels, layer, *call arguments)` as the layer's own `call` does and returns
`decode_graph.Value`s; what it does not build raises `Unsupported`.
"""

import keras
import numpy as np

from keras_transformer.export.decode_graph import Unsupported, Value, weight
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.positional_embedding import PositionalEmbedding
from keras_transformer.layers.transformer_decoder_block import TransformerDecoderBlock


def _reversible_embedding(kernels, layer, inputs, reverse=False):
    b = kernels.builder
    if not reverse:
        return Value(b, b.node("Gather", [b.const(f"{layer.name}.embeddings", weight(layer.embeddings)),
                                          inputs.materialize()]))  # (B, 1) -> (B, 1, D)
    kernel = weight(layer.embeddings).T if layer.tie_weights else weight(layer.reverse_embeddings)  # (D, V)
    logits = b.node("MatMul", [inputs.materialize(), b.const(f"{layer.name}.reverse", np.ascontiguousarray(kernel))])
    cap = layer.logit_soft_cap
    if cap:  # cap * tanh(logits / cap)
        cap = b.const(f"{layer.name}.logit_soft_cap", np.float32(cap))
        logits = b.node("Mul", [b.node("Tanh", [b.node("Div", [logits, cap])]), cap])
    return Value(b, logits)  # (B, 1, V)


def _positional_embedding(kernels, layer, inputs, start_index=0):
    """The table's rows at each row's own position (`position_ids`), whatever `start_index` traced."""
    b = kernels.builder
    table = weight(layer.embeddings) if layer.position_type == "learned" else np.asarray(layer._table, np.float32)
    return Value(b, b.node("Gather", [b.const(f"{layer.name}.table", table), "position_ids"]))  # (B, 1, D)


def _layer_norm(kernels, layer, x):
    """A LayerNormalization of x; a pending residual sum becomes one SkipLayerNormalization (x takes the sum)."""
    if layer.rms_scaling or not (layer.scale and layer.center) or layer.axis not in (-1, [-1], 2, [2]):
        raise Unsupported(f"a LayerNormalization other than scale + center over the last axis ({layer.name})")
    b = kernels.builder
    gamma, beta = b.const(f"{layer.name}.gamma", weight(layer.gamma)), b.const(f"{layer.name}.beta", weight(layer.beta))
    if x.branch is None:
        return Value(b, b.node("LayerNormalization", [x.materialize(), gamma, beta], axis=-1,
                               epsilon=float(layer.epsilon)))
    inputs = [x.name, x.branch, gamma, beta] + ([x.bias] if x.bias is not None else [])
    normalized, total = b.node("SkipLayerNormalization", inputs, outputs=4, domain="com.microsoft",
                               names=[None, "", "", None], epsilon=float(layer.epsilon))[::3]
    x.name, x.branch, x.bias = total, None, None  # the residual stream goes on from the sum
    return Value(b, normalized)


def _dense(kernels, layer, x):
    """x @ kernel, its bias left pending (the op that reads it adds it)."""
    if layer.activation not in (None, keras.activations.linear):
        raise Unsupported(f"a Dense with an activation ({layer.name})")
    return _matmul(kernels, layer, x)


def _matmul(kernels, layer, x, shape=None):
    b = kernels.builder
    kernel = weight(layer.kernel)
    y = b.node("MatMul", [x.materialize(), b.const(f"{layer.name}.kernel", kernel if shape is None else kernel.reshape(shape))])
    bias = None if layer.bias is None else b.const(f"{layer.name}.bias", weight(layer.bias).reshape(-1))
    return Value(b, y, bias=bias)


def _dropout(kernels, layer, x, training=None):
    if training:
        raise Unsupported("dropout in training mode")
    return x


def _feed_forward(kernels, layer, x, training=None):
    """`FeedForward.call` at inference: (B, 1, D) -> (B, 1, D), its output bias pending."""
    if not layer._gated:
        hidden = _activation(kernels, layer.activation, _matmul(kernels, layer.intermediate_dense, x))
    else:  # act(x W_gate) * (x W_in); "gated-gelu" is the tanh approximation
        hidden = _matmul(kernels, layer.intermediate_dense, x).materialize()
        base = "gelu_approximate" if layer.activation == "gated-gelu" else layer.activation.removeprefix("gated-")
        gate = _activation(kernels, base, _matmul(kernels, layer.gate_dense, x))
        hidden = kernels.builder.node("Mul", [gate, hidden])
    return _matmul(kernels, layer.output_dense, Value(kernels.builder, hidden))  # (B, 1, F) -> (B, 1, D)


def _activation(kernels, name, y):
    """act(y + its pending bias) -> a tensor name, the bias inside the kernel where ONNX Runtime has one."""
    b = kernels.builder
    bias = [y.bias] if y.bias is not None else []
    if name == "gelu_approximate":  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        return b.node("FastGelu", [y.name] + bias, domain="com.microsoft")
    if name == "gelu":  # 0.5 x (1 + erf(x / sqrt 2))
        return b.node("BiasGelu" if bias else "Gelu", [y.name] + bias, domain="com.microsoft")
    x = y.materialize()
    if name == "relu":
        return b.node("Relu", [x])
    if name == "silu":
        return b.node("Mul", [x, b.node("Sigmoid", [x])])
    raise Unsupported(f"no ONNX kernel for the activation {name!r}")


def _self_attention(kernels, attention, h, cache):
    """Causal self-attention of one token per row, its keys/values written into the cache buffers in place."""
    if attention.rotary_embedding is not None or attention.sliding_window is not None:
        raise Unsupported(f"rotary positions or a sliding window ({attention.name})")
    b = kernels.builder
    past = [value.name for value in cache]
    if not all(name.startswith("past_key_values.") for name in past):
        raise Unsupported("a self-attention cache that is not a graph input")
    present = [name.replace("past_key_values.", "present.", 1) for name in past]
    dense = (attention.query_dense, attention.key_dense, attention.value_dense)
    width = attention.query_dense.kernel.shape[0]
    # (D, H, Dh), (D, Hkv, Dh), (D, Hkv, Dh) -> (D, (H + 2 Hkv) Dh): one MatMul gives the packed QKV GQA reads.
    kernel = np.concatenate([weight(d.kernel).reshape(width, -1) for d in dense], axis=1)
    qkv = b.node("MatMul", [h.materialize(), b.const(f"{attention.name}.qkv.kernel", kernel)])  # (B, 1, (H + 2 Hkv) Dh)
    if attention.query_dense.bias is not None:
        bias = np.concatenate([weight(d.bias).reshape(-1) for d in dense])
        qkv = b.node("Add", [qkv, b.const(f"{attention.name}.qkv.bias", bias)])
    out = b.node("GroupQueryAttention", [qkv, "", "", past[0], past[1], kernels.past_lengths, kernels.total_length],
                 outputs=3, domain="com.microsoft", num_heads=attention.num_heads, kv_num_heads=attention._kv_heads,
                 scale=float(attention._scale), names=[None, present[0], present[1]])[0]  # (B, 1, H Dh)
    H, Dh = attention.num_heads, attention._head_dim
    return _matmul(kernels, attention.output_dense, Value(b, out), shape=(H * Dh, -1)), (Value(b, present[0]),
                                                                                          Value(b, present[1]))


def _decoder_block(
    kernels, block, inputs, encoder_outputs=None, padding_mask=None, encoder_padding_mask=None,
    self_attention_bias=None, cross_attention_bias=None, self_attention_cache=None, cache_index=None,
    cross_attention_cache=None, use_causal_mask=True, return_attention_scores=False, training=None,
):
    """A pre-norm decoder block without cross-attention, bias or padding mask (the residual sums stay pending)."""
    if block.use_cross_attention or not block.norm_first:
        raise Unsupported("decoder blocks with cross-attention or post-norm")
    if any(a is not None for a in (padding_mask, self_attention_bias, encoder_outputs)) or return_attention_scores:
        raise Unsupported("a decoder block call with a padding mask, an attention bias or scores")
    if training or not use_causal_mask or not isinstance(self_attention_cache, (list, tuple)):
        raise Unsupported("a decoder block call without a (keys, values) cache")
    x = inputs
    h, cache = _self_attention(kernels, block.self_attention, kernels(block.self_attention_norm, x),
                               self_attention_cache)
    x = x + h
    x = x + kernels(block.feed_forward, kernels(block.feed_forward_norm, x))
    return x, cache


KERNELS = {
    keras.layers.ReversibleEmbedding: _reversible_embedding,
    PositionalEmbedding: _positional_embedding,
    keras.layers.LayerNormalization: _layer_norm,
    keras.layers.Dense: _dense,
    keras.layers.Dropout: _dropout,
    FeedForward: _feed_forward,
    TransformerDecoderBlock: _decoder_block,
}
