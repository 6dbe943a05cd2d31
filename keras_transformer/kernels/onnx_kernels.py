"""The ONNX nodes of each layer type in a decode step of T >= 1 tokens per row (see decode_graph.py), keyed by
layer type.

Axes: B rows, T new tokens per row, D model width, H heads, Hkv key/value heads, Dh head size, F feed-forward
width, V vocabulary, S_total = S + T positions attended, S_enc encoder length, P positions, R rotated dims per head.
Every kernel takes `(kernels, layer, *call arguments)` as the layer's own `call` does and returns
`onnx_values.Value`s; what it does not build raises `Unsupported`.
"""

import logging

import keras
import numpy as np

from keras_transformer.kernels.onnx_experts import mixture_of_experts as _mixture_of_experts  # noqa: F401 (bound by the table)
from keras_transformer.kernels.onnx_values import Unsupported, Value, weight
from keras_transformer.kernels.onnx_values import activation as _activation
from keras_transformer.kernels.onnx_values import matmul as _matmul
from keras_transformer.kernels import kernel_table
from keras_transformer.layers.feed_forward import base_activation

_log = logging.getLogger("keras_transformer")


def _reversible_embedding(kernels, layer, inputs, reverse=False):
    """The table's rows for the ids, or (reverse) the logits: x @ the table's transpose (tied) or the reverse kernel.

    A tied table is read by both (Gather, and MatMul through a Transpose that ONNX Runtime folds when the session
    loads): the bundle's weights file holds it once.
    """
    b = kernels.builder
    if not reverse:
        return Value(
            b, b.gather(f"{layer.name}.embeddings", weight(layer.embeddings), inputs.materialize())
        )  # (B, T, D)
    if layer.tie_weights:
        logits = b.matmul(inputs.materialize(), f"{layer.name}.embeddings", weight(layer.embeddings), transposed=True)
    else:
        logits = b.matmul(inputs.materialize(), f"{layer.name}.reverse", weight(layer.reverse_embeddings))  # (D, V)
    cap = layer.logit_soft_cap
    if cap:  # cap * tanh(logits / cap)
        cap = b.const(f"{layer.name}.logit_soft_cap", np.float32(cap))
        logits = b.node("Mul", [b.node("Tanh", [b.node("Div", [logits, cap])]), cap])
    return Value(b, logits)  # (B, T, V)


def _positional_embedding(kernels, layer, inputs, start_index=0):
    """The table's rows at each row's own position (`position_ids`), whatever `start_index` traced."""
    b = kernels.builder
    table = weight(layer.embeddings) if layer.position_type == "learned" else np.asarray(layer._table, np.float32)
    return Value(b, b.gather(f"{layer.name}.table", table, "position_ids"))  # (B, T, D)


def _layer_norm(kernels, layer, x):
    """A LayerNormalization of x; a pending residual sum becomes one SkipLayerNormalization (x takes the sum)."""
    if layer.rms_scaling or not (layer.scale and layer.center) or layer.axis not in (-1, [-1], 2, [2]):
        raise Unsupported(f"a LayerNormalization other than scale + center over the last axis ({layer.name})")
    b = kernels.builder
    gamma, beta = b.const(f"{layer.name}.gamma", weight(layer.gamma)), b.const(f"{layer.name}.beta", weight(layer.beta))
    if x.branch is None:
        return Value(
            b, b.node("LayerNormalization", [x.materialize(), gamma, beta], axis=-1, epsilon=float(layer.epsilon))
        )
    return _skip_norm(kernels, "SkipLayerNormalization", x, [gamma, beta], layer.epsilon)


def _rms_norm(kernels, layer, x):
    """An RMSNormalization of x, x / sqrt(mean(x^2) + epsilon) * scale (plus the layer's `scale_offset`, Gemma's
    1 + w, where it has one); a pending residual sum becomes one SkipSimplifiedLayerNormalization (x takes the sum)."""
    if layer.axis not in (-1, [-1], 2, [2]):
        raise Unsupported(f"an RMSNormalization over another axis than the last ({layer.name})")
    b = kernels.builder
    scale = b.const(f"{layer.name}.scale", weight(layer.scale) + np.float32(getattr(layer, "scale_offset", 0.0)))
    if x.branch is None:
        # Standard ops (SimplifiedLayerNormalization is ONNX Runtime's, outside opset 17), in the
        # pattern ONNX Runtime fuses into it.
        x = x.materialize()
        mean = b.node("ReduceMean", [b.node("Pow", [x, b.scalar(2.0)])], axes=[-1], keepdims=1)  # (B, T, 1)
        root = b.node("Sqrt", [b.node("Add", [mean, b.scalar(layer.epsilon)])])
        return Value(b, b.node("Mul", [b.node("Div", [x, root]), scale]))
    return _skip_norm(kernels, "SkipSimplifiedLayerNormalization", x, [scale], layer.epsilon)


def _skip_norm(kernels, op, x, parameters, epsilon):
    """norm(x + branch (+ bias)) of a pending sum as one fused node, which also gives the sum: x takes it."""
    inputs = [x.name, x.branch, *parameters] + ([x.bias] if x.bias is not None else [])
    normalized, total = kernels.builder.node(
        op, inputs, outputs=4, domain="com.microsoft", names=[None, "", "", None], epsilon=float(epsilon)
    )[::3]
    x.name, x.branch, x.bias = total, None, None  # the residual stream goes on from the sum
    return Value(kernels.builder, normalized)


def _dense(kernels, layer, x):
    """x @ kernel, its bias left pending (the op that reads it adds it)."""
    if layer.activation not in (None, keras.activations.linear):
        raise Unsupported(f"a Dense with an activation ({layer.name})")
    return _matmul(kernels, layer, x)


def _dropout(kernels, layer, x, training=None):
    if training:
        raise Unsupported("dropout in training mode")
    return x


def _feed_forward(kernels, layer, x, training=None):
    """`FeedForward.call` at inference: (B, T, D) -> (B, T, D), its output bias pending."""
    if not layer._gated:
        hidden = _activation(kernels, layer.activation, _matmul(kernels, layer.intermediate_dense, x))
    else:  # act(x W_gate) * (x W_in), act as FeedForward reads its name ("gated-gelu": the tanh approximation)
        hidden = _matmul(kernels, layer.intermediate_dense, x).materialize()
        gate = _activation(kernels, base_activation(layer.activation), _matmul(kernels, layer.gate_dense, x))
        hidden = kernels.builder.node("Mul", [gate, hidden])
    return _matmul(kernels, layer.output_dense, Value(kernels.builder, hidden))  # (B, T, F) -> (B, T, D)


def _relative_position_bias(kernels, layer, query, key, query_start=0):
    """T5's causal bias of each row's queries (at its `position_ids` (B, T)) against keys [0, S_total):
    (B, H, T, S_total).

    Whatever `query_start` and `key` traced: the queries are at the row's positions and the keys are
    the positions attended. Distances past `max_distance` share the last bucket, so a table of
    max_distance + 1 distances, looked up at min(distance, max_distance), covers every position; a key
    after its query (clipped to distance 0) is masked by the attention's causal mask.
    """
    if layer.bidirectional or kernels.prefill:
        raise Unsupported(f"a relative position bias other than a decode step's causal one ({layer.name})")
    b = kernels.builder
    distances = np.arange(layer.max_distance + 1, dtype=np.int32)
    buckets = keras.ops.convert_to_numpy(layer._bucket(keras.ops.convert_to_tensor(-distances)))  # key - query = -d
    table = b.const(f"{layer.name}.table", weight(layer.embeddings)[buckets])  # (max_distance + 1, H)
    keys = b.node("Range", [b.const("zero", np.array(0)), kernels.total_length_int64, b.const("one", np.array(1))])
    queries = b.node("Unsqueeze", ["position_ids", b.const("axis_2", np.array([2]))])  # (B, T, 1)
    distance = b.node("Sub", [queries, keys])  # (B, T, 1) - (S_total,) -> (B, T, S_total): query - key
    distance = b.node("Clip", [distance, b.const("zero", np.array(0)), b.const("max", np.array(layer.max_distance))])
    bias = b.node("Gather", [table, distance])  # (B, T, S_total, H)
    return Value(b, b.node("Transpose", [bias], perm=[0, 3, 1, 2]))  # -> (B, H, T, S_total)


def _self_attention(kernels, attention, h, cache, bias=None):
    """Causal self-attention of T tokens per row after its past, its keys/values written into the cache buffers in
    place; in a prefill, of T tokens per row from position 0 with no past, its keys/values the presents
    (B, T, Hkv, Dh).

    Rotary positions and a sliding window are GroupQueryAttention's own: it rotates the packed
    queries and keys at each row's position with cos/sin tables (P, R/2) (rotate-half layout; its
    CPU kernel takes R/2 a multiple of 8), and `local_window_size` W lets a query at p attend the
    keys k with p - W < k <= p, as `MultiHeadAttention(sliding_window=W)`. `bias` (B|1, H, T, S_total)
    is added to the logits (T5's relative positions).
    """
    b = kernels.builder
    past = [value.name for value in cache]
    if not all(name.startswith("past_key_values.") for name in past):
        raise Unsupported("a self-attention cache that is not a graph input")
    present = [name.replace("past_key_values.", "present.", 1) for name in past]
    H, Hkv, Dh = attention.num_heads, attention._kv_heads, attention._head_dim
    lengths = [kernels.past_lengths, kernels.total_length]
    inputs = _query_key_value(kernels, attention, h) + (["", ""] if kernels.prefill else past) + lengths
    options = {}
    if attention.rotary_embedding is not None:
        inputs += _rotary_tables(kernels, attention.rotary_embedding, Dh)
        options.update(do_rotary=1, rotary_interleaved=0)
    if attention.sliding_window is not None:
        options["local_window_size"] = int(attention.sliding_window)
    if attention.logit_soft_cap is not None:  # cap * tanh(logits / cap), after the scale
        options["softcap"] = float(attention.logit_soft_cap)
    if bias is not None:
        inputs += [""] * (10 - len(inputs)) + [bias.materialize()]  # attention_bias is GQA's 11th input
    out, keys, values = b.node(
        "GroupQueryAttention",
        inputs,
        outputs=3,
        domain="com.microsoft",
        num_heads=H,
        kv_num_heads=Hkv,
        scale=float(attention._scale),
        names=[None, None, None] if kernels.prefill else [None, present[0], present[1]],
        **options,
    )  # (B, T, H Dh), 2 x (B, Hkv, S_total, Dh)
    if kernels.prefill:  # (B, Hkv, T, Dh) -> (B, T, Hkv, Dh), the prefill's layout
        keys, values = (b.node("Transpose", [t], perm=[0, 2, 1, 3], names=[n]) for t, n in zip((keys, values), present))
    return _matmul(kernels, attention.output_dense, Value(b, out), shape=(H * Dh, -1)), (
        Value(b, keys),
        Value(b, values),
    )


def _query_key_value(kernels, attention, h):
    """GroupQueryAttention's first three inputs for h (B, T, D): the packed QKV (B, T, (H + 2 Hkv) Dh) and two
    empty names, or with query/key norms the normed queries (B, T, H Dh), keys (B, T, Hkv Dh) and values."""
    b = kernels.builder
    dense = (attention.query_dense, attention.key_dense, attention.value_dense)
    width = attention.query_dense.kernel.shape[0]
    matrices = [weight(d.kernel).reshape(width, -1) for d in dense]
    biases = None
    if attention.query_dense.bias is not None:
        biases = [weight(d.bias).reshape(-1) for d in dense]
    x = h.materialize()
    if attention.query_key_norm is None:
        # (D, H, Dh), (D, Hkv, Dh), (D, Hkv, Dh) -> (D, (H + 2 Hkv) Dh): one MatMul gives the packed QKV GQA reads.
        qkv = b.matmul(x, f"{attention.name}.qkv", np.concatenate(matrices, axis=1))  # (B, T, (H + 2 Hkv) Dh)
        if biases is not None:
            qkv = b.node("Add", [qkv, b.const(f"{attention.name}.qkv_bias", np.concatenate(biases))])
        return [qkv, "", ""]
    names = [f"{d.name}.kernel" for d in dense]
    q, k, v = (b.matmul(x, n, kernel) for n, kernel in zip(names, matrices))  # (B, T, H Dh), 2 x (B, T, Hkv Dh)
    if biases is not None:
        q, k, v = (b.node("Add", [y, b.const(f"{d.name}.bias", bias)]) for y, d, bias in zip((q, k, v), dense, biases))
    Dh = attention._head_dim
    return [
        _normed(kernels, attention, attention.query_norm, q, attention.num_heads, Dh),
        _normed(kernels, attention, attention.key_norm, k, attention._kv_heads, Dh),
        v,
    ]


def _normed(kernels, attention, norm, y, heads, head_dim):
    """`MultiHeadAttention.normalize` of queries or keys y (B, T, heads Dh) through the RMS norm kernel."""
    b = kernels.builder
    if attention.query_key_norm == "full":
        return _rms_norm(kernels, norm, Value(b, y)).materialize()
    split = b.node("Reshape", [y, b.const("heads", np.array([0, 0, heads, head_dim]))])  # -> (B, T, heads, Dh)
    normed = _rms_norm(kernels, norm, Value(b, split)).materialize()
    return b.node("Reshape", [normed, b.const("width", np.array([0, 0, heads * head_dim]))])  # -> (B, T, heads Dh)


def _rotary_tables(kernels, rotary, head_dim):
    """[cos, sin] (P, R/2) of `RotaryEmbedding`'s angles position * theta_i, float32 as the layer computes them,
    times its attention factor. longrope: the long factors' tables where the longest row's last position + 1
    (the total length) passes `rotary.long_after`, picked in the graph."""
    frequencies = rotary.inverse_frequencies(head_dim)  # (R/2,)
    if kernels.max_positions is None:
        raise Unsupported("rotary positions in a backbone without a `max_sequence_length` (the tables' length)")
    if frequencies.size % 8:
        raise Unsupported(
            f"rotary positions over {2 * frequencies.size} dims per head (GroupQueryAttention's CPU "
            "kernel rotates a multiple of 16)"
        )
    b = kernels.builder

    def angle_tables(prefix, frequencies):
        angles = np.arange(int(kernels.max_positions), dtype=np.float32)[:, None] * frequencies[None, :]  # (P, R/2)
        cos, sin = np.cos(angles), np.sin(angles)
        if rotary.attention_factor != 1.0:
            cos, sin = cos * np.float32(rotary.attention_factor), sin * np.float32(rotary.attention_factor)
        return [b.const(f"{prefix}rotary.cos", cos), b.const(f"{prefix}rotary.sin", sin)]

    def tables():
        short = angle_tables("", frequencies)
        if rotary.long_after is None:
            return short
        long = angle_tables("long_", rotary.inverse_frequencies(head_dim, long=True))
        after = b.const("long_after", np.array(rotary.long_after, np.int64))
        is_long = b.node("Greater", [kernels.total_length_int64, after])  # () bool
        return [b.node("Where", [is_long, a, c]) for a, c in zip(long, short)]

    key = ("rotary", frequencies.tobytes(), rotary.long_after, rotary.attention_factor)
    if rotary.long_after is not None:
        key += (rotary.inverse_frequencies(head_dim, long=True).tobytes(),)
    return kernels.memo(key, tables)


def _cross_attention(kernels, attention, h, cache, encoder_padding_mask, bias=None):
    """Attention of T tokens per row over the encoder's keys/values (B, H, S_enc, Dh), graph inputs: ONNX Runtime's
    MultiHeadAttention reads them as they lie (no per-step copy)."""
    b = kernels.builder
    H, Dh = attention.num_heads, attention._head_dim
    if attention._kv_heads != H or attention.logit_soft_cap is not None:
        raise Unsupported(f"grouped keys/values or soft-capped logits in cross-attention ({attention.name})")
    keys, values = (value.materialize() for value in cache)
    width = attention.query_dense.kernel.shape[0]
    q = _matmul(kernels, attention.query_dense, h, shape=(width, -1)).materialize()  # (B, T, D) -> (B, T, H Dh)
    inputs = [q, keys, values, ""]
    if encoder_padding_mask is not None:
        from onnx import TensorProto

        name = encoder_padding_mask.materialize()
        inputs.append(kernels.memo(("int32", name), lambda: b.node("Cast", [name], to=TensorProto.INT32)))  # (B, S_enc)
    if bias is not None:
        inputs += [""] * (5 - len(inputs)) + [bias.materialize()]
    # A masked key gets MultiHeadAttention(Keras)'s -1e9 bias.
    out = b.node(
        "MultiHeadAttention",
        inputs,
        domain="com.microsoft",
        num_heads=H,
        scale=float(attention._scale),
        mask_filter_value=-1.0e9,
    )  # (B, T, H Dh)
    return _matmul(kernels, attention.output_dense, Value(b, out), shape=(H * Dh, -1))


def _decoder_block(
    kernels,
    block,
    inputs,
    encoder_outputs=None,
    padding_mask=None,
    encoder_padding_mask=None,
    self_attention_bias=None,
    cross_attention_bias=None,
    self_attention_cache=None,
    cache_index=None,
    cross_attention_cache=None,
    use_causal_mask=True,
    return_attention_scores=False,
    training=None,
):
    """`TransformerDecoderBlock.call` at inference, pre- or post-norm, with cross-attention over cached keys/values
    (the residual sums stay pending until a norm takes them)."""
    if padding_mask is not None or encoder_outputs is not None or return_attention_scores:
        raise Unsupported("a decoder block call with a padding mask, encoder outputs or scores")
    if training or not use_causal_mask or not isinstance(self_attention_cache, (list, tuple)):
        raise Unsupported("a decoder block call without a (keys, values) cache")
    if block.use_cross_attention and not isinstance(cross_attention_cache, (list, tuple)):
        raise Unsupported("cross-attention without the encoder's (keys, values)")

    def pre(x, norm):
        return kernels(norm, x) if block.norm_first else x

    def post(x, h, norm, post_norm=None):
        h = h if post_norm is None else kernels(post_norm, h)
        return x + h if block.norm_first else kernels(norm, x + h)

    post_norms = (block.self_attention_post_norm, block.feed_forward_post_norm) if block.post_norm else (None, None)
    x = inputs
    h, cache = _self_attention(
        kernels, block.self_attention, pre(x, block.self_attention_norm), self_attention_cache, self_attention_bias
    )
    x = post(x, h, block.self_attention_norm, post_norms[0])
    if block.use_cross_attention:
        h = _cross_attention(
            kernels,
            block.cross_attention,
            pre(x, block.cross_attention_norm),
            cross_attention_cache,
            encoder_padding_mask,
            cross_attention_bias,
        )
        x = post(x, h, block.cross_attention_norm)
    x = post(x, kernels(block.feed_forward, pre(x, block.feed_forward_norm)), block.feed_forward_norm, post_norms[1])
    return (x, cache, cross_attention_cache) if block.use_cross_attention else (x, cache)


KERNELS = kernel_table.bind(globals())  # {layer type: kernel}, the types of kernels/kernel_table.py


def is_block(layer):
    """Whether `layer` is a transformer block (what an export's progress counts)."""
    return KERNELS.get(type(layer)) is _decoder_block
