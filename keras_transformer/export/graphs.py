"""The graphs an export holds, written as tf.functions over the task's own methods.

Axes: B batch, T new tokens, S past length, S_enc encoder length, L layers,
Hkv key/value heads, Dh head size, V vocabulary.

Three kinds of task, three sets of graphs:
    decoder (causal LM, GPT):  prefill  input_ids (B, T), attention_mask (B, T)
                                 -> logits (B, T, V), present.{i}.key/value (B, T, Hkv, Dh)
                               decode   input_ids (B, 1), attention_mask (B, S + 1),
                                        past_key_values.{i}.key/value (B, S, Hkv, Dh)
                                 -> logits (B, 1, V), present.{i}.key/value (B, S + 1, Hkv, Dh)
    encoder (BERT tasks):      forward  the task's inputs (token_ids, segment_ids, padding_mask, ...)
                                 -> the backbone's outputs (sequence_output, pooled_output) and logits
    encoder-decoder (T5, ...): encoder  input_ids (B, S_enc), attention_mask (B, S_enc)
                                 -> encoder_hidden_states (B, S_enc, D), cross_key_values.{i}.key/value
                               decoder  input_ids (B, 1), encoder_attention_mask (B, S_enc),
                                        past_key_values.{i}.key/value (B, S, Hkv, Dh) (S may be 0),
                                        cross_key_values.{i}.key/value (B, S_enc, Hkv, Dh)
                                 -> logits (B, 1, V), present.{i}.key/value (B, S + 1, Hkv, Dh)

The key/value caches grow by one position per step, as in Hugging Face optimum: the new
token's position is the past length S. Inside, a step pads the past by one slot and calls
the task's `call_with_cache` at index S, so the graph is the model's own cached decoding
(its one-token cache write is a `where`, which exports to Equal/Where nodes). All integer
inputs are int64 (ONNX Runtime's and Hugging Face's convention); masks are 0/1.

Built under the TensorFlow backend only; `tensorflow` is imported when a graph is built.
"""

from typing import NamedTuple

from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.task import Task

KINDS = ("decoder", "encoder", "encoder_decoder")


class Graph(NamedTuple):
    """One exported graph: `function(*inputs) -> {output name: tensor}`.

    `inputs` are `tf.TensorSpec`s named after the graph inputs; `axes` names the
    dynamic axes of every input and output (the ONNX `dim_param`s).
    """

    name: str
    function: object
    inputs: list
    axes: dict


def model_kind(task):
    """"decoder", "encoder" or "encoder_decoder"; a ValueError for what cannot be exported."""
    from keras_transformer.models.seq2seq_lm import Seq2SeqLM

    if not isinstance(task, Task):
        raise ValueError(
            "Export takes a keras_transformer task (e.g. GPTCausalLM, BertClassifier, T5Seq2SeqLM). "
            f"Received: an object of type {type(task).__name__}"
        )
    layers = [task] + list(getattr(getattr(task, "backbone", None), "layers", []))
    other = sorted({layer.dtype_policy.name for layer in layers if layer.compute_dtype != "float32"})
    if other:
        raise ValueError(
            f"Export supports float32 models; this {type(task).__name__} computes in lower precision. "
            "Rebuild it under the float32 policy (e.g. `keras.config.set_dtype_policy('float32')` before "
            f"`from_preset`). Received: dtype policies {other}"
        )
    if isinstance(task, Seq2SeqLM):
        return "encoder_decoder"
    if isinstance(task, CausalLM):
        if not hasattr(task, "call_with_cache") or not hasattr(task.backbone, "cache_shape"):
            raise ValueError(f"{type(task).__name__} has no cached decoding (`call_with_cache`): it cannot be exported.")
        return "decoder"
    outputs = getattr(getattr(task, "backbone", None), "output", None)
    if isinstance(outputs, dict) and "sequence_output" in outputs:
        return "encoder"
    raise ValueError(
        f"{type(task).__name__} (family {getattr(getattr(task, 'backbone', None), 'family', None)!r}) is not an exportable "
        "task: export supports causal LMs, encoder tasks and seq2seq LMs."
    )


def cache_dims(task):
    """(L, Hkv, Dh) of the task's self-attention cache (layout (B, L, 2, S, Hkv, Dh))."""
    _, layers, _, _, heads, head_dim = task.backbone.cache_shape(1, 1)
    return layers, heads, head_dim


def build_graphs(task):
    """The graphs of `task`, in the order a runtime uses them."""
    kind = model_kind(task)
    if kind == "decoder":
        return [_prefill_graph(task), _decode_graph(task)]
    if kind == "encoder":
        return [_encoder_task_graph(task)]
    return [_seq2seq_encoder_graph(task), _seq2seq_decoder_graph(task)]


# --- decoders ---------------------------------------------------------------


def _cache_specs(task, prefix, sequence_axis):
    import tensorflow as tf

    layers, heads, head_dim = cache_dims(task)
    specs, axes = [], {}
    for i in range(layers):
        for part in ("key", "value"):
            name = f"{prefix}.{i}.{part}"
            specs.append(tf.TensorSpec((None, None, heads, head_dim), tf.float32, name=name))
            axes[name] = ("batch", sequence_axis, None, None)
    return specs, axes


def _present(cache, num_layers):
    """(B, L, 2, S, Hkv, Dh) -> {present.{i}.key/value: (B, S, Hkv, Dh)}."""
    out = {}
    for i in range(num_layers):
        out[f"present.{i}.key"] = cache[:, i, 0]
        out[f"present.{i}.value"] = cache[:, i, 1]
    return out


def _past_plus_one_slot(past, num_layers):
    """2L tensors (B, S, Hkv, Dh) -> one cache (B, L, 2, S + 1, Hkv, Dh), the new slot zero."""
    import tensorflow as tf

    layers = [tf.stack([past[2 * i], past[2 * i + 1]], axis=1) for i in range(num_layers)]  # L x (B, 2, S, Hkv, Dh)
    cache = tf.stack(layers, axis=1)  # (B, L, 2, S, Hkv, Dh)
    return tf.pad(cache, [[0, 0], [0, 0], [0, 0], [0, 1], [0, 0], [0, 0]])  # (B, L, 2, S + 1, Hkv, Dh)


def _prefill_graph(task):
    import tensorflow as tf

    layers, _, _ = cache_dims(task)

    def prefill(input_ids, attention_mask):
        batch, length = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        cache = tf.zeros(task.backbone.cache_shape(batch, length))  # (B, L, 2, T, Hkv, Dh)
        logits, cache = task.call_with_cache(
            tf.cast(input_ids, "int32"), cache, 0, padding_mask=tf.cast(attention_mask, "bool")
        )
        return {"logits": logits, **_present(cache, layers)}

    _, present_axes = _cache_specs(task, "present", "sequence")
    inputs = [
        tf.TensorSpec((None, None), tf.int64, name="input_ids"),
        tf.TensorSpec((None, None), tf.int64, name="attention_mask"),
    ]
    axes = {
        "input_ids": ("batch", "sequence"),
        "attention_mask": ("batch", "sequence"),
        "logits": ("batch", "sequence", None),
        **present_axes,
    }
    return Graph("prefill", tf.function(prefill, autograph=False), inputs, axes)


def _decode_graph(task):
    import tensorflow as tf

    layers, _, _ = cache_dims(task)

    def decode(input_ids, attention_mask, *past):
        position = tf.shape(past[0])[1]  # S: the new token's position
        cache = _past_plus_one_slot(past, layers)
        logits, cache = task.call_with_cache(
            tf.cast(input_ids, "int32"), cache, position, padding_mask=tf.cast(attention_mask, "bool")
        )
        return {"logits": logits, **_present(cache, layers)}

    past_specs, past_axes = _cache_specs(task, "past_key_values", "past_sequence")
    _, present_axes = _cache_specs(task, "present", "total_sequence")
    inputs = [
        tf.TensorSpec((None, 1), tf.int64, name="input_ids"),
        tf.TensorSpec((None, None), tf.int64, name="attention_mask"),
        *past_specs,
    ]
    axes = {
        "input_ids": ("batch", None),
        "attention_mask": ("batch", "total_sequence"),
        "logits": ("batch", None, None),
        **past_axes,
        **present_axes,
    }
    return Graph("decode", tf.function(decode, autograph=False), inputs, axes)


# --- encoders ---------------------------------------------------------------


def _encoder_task_graph(task):
    """The task's inputs -> the backbone's outputs and the task's logits."""
    import tensorflow as tf

    input_names = list(task.input)
    backbone_names = list(task.backbone.input)

    def forward(*args):
        inputs = {}
        for name, value in zip(input_names, args):
            dtype = task.input[name].dtype
            inputs[name] = tf.cast(value, "bool" if "bool" in str(dtype) else dtype)
        outputs = dict(task.backbone({name: inputs[name] for name in backbone_names}))
        outputs["logits"] = task(inputs)
        return outputs

    specs = [tf.TensorSpec((None,) * len(task.input[name].shape), tf.int64, name=name) for name in input_names]
    axes = {}
    for name in input_names:
        # mask_positions (B, P) has its own length; the others are (B, T).
        axes[name] = ("batch", "masked" if name == "mask_positions" else "sequence")
    axes["sequence_output"] = ("batch", "sequence", None)
    axes["pooled_output"] = ("batch", None)
    axes["logits"] = ("batch", "masked", None) if "mask_positions" in input_names else ("batch", None)
    return Graph("encoder", tf.function(forward, autograph=False), specs, axes)


# --- encoder-decoders -------------------------------------------------------


def _cross(cache, num_layers):
    """(B, L, 2, S_enc, Hkv, Dh) -> {cross_key_values.{i}.key/value: (B, S_enc, Hkv, Dh)}."""
    out = {}
    for i in range(num_layers):
        out[f"cross_key_values.{i}.key"] = cache[:, i, 0]
        out[f"cross_key_values.{i}.value"] = cache[:, i, 1]
    return out


def _seq2seq_encoder_graph(task):
    import tensorflow as tf

    layers, _, _ = cache_dims(task)

    def encoder(input_ids, attention_mask):
        hidden = task.encode(tf.cast(input_ids, "int32"), tf.cast(attention_mask, "bool"))
        cross = task.compute_cross_cache(hidden)  # (B, L, 2, S_enc, Hkv, Dh)
        return {"encoder_hidden_states": hidden, **_cross(cross, layers)}

    _, cross_axes = _cache_specs(task, "cross_key_values", "encoder_sequence")
    inputs = [
        tf.TensorSpec((None, None), tf.int64, name="input_ids"),
        tf.TensorSpec((None, None), tf.int64, name="attention_mask"),
    ]
    axes = {
        "input_ids": ("batch", "encoder_sequence"),
        "attention_mask": ("batch", "encoder_sequence"),
        "encoder_hidden_states": ("batch", "encoder_sequence", None),
        **cross_axes,
    }
    return Graph("encoder", tf.function(encoder, autograph=False), inputs, axes)


def _seq2seq_decoder_graph(task):
    import tensorflow as tf

    layers, _, _ = cache_dims(task)

    def decoder(input_ids, encoder_attention_mask, *caches):
        past, cross = caches[: 2 * layers], caches[2 * layers:]
        position = tf.shape(past[0])[1]  # S: the new token's position
        self_cache = _past_plus_one_slot(past, layers)
        cross_cache = tf.stack(
            [tf.stack([cross[2 * i], cross[2 * i + 1]], axis=1) for i in range(layers)], axis=1
        )  # L x (B, 2, S_enc, Hkv, Dh) -> (B, L, 2, S_enc, Hkv, Dh)
        logits, self_cache = task.call_with_cache(
            tf.cast(input_ids, "int32"), self_cache, position, cross_cache,
            tf.cast(encoder_attention_mask, "bool"),
        )
        return {"logits": logits, **_present(self_cache, layers)}

    past_specs, past_axes = _cache_specs(task, "past_key_values", "past_sequence")
    cross_specs, cross_axes = _cache_specs(task, "cross_key_values", "encoder_sequence")
    _, present_axes = _cache_specs(task, "present", "total_sequence")
    inputs = [
        tf.TensorSpec((None, 1), tf.int64, name="input_ids"),
        tf.TensorSpec((None, None), tf.int64, name="encoder_attention_mask"),
        *past_specs,
        *cross_specs,
    ]
    axes = {
        "input_ids": ("batch", None),
        "encoder_attention_mask": ("batch", "encoder_sequence"),
        "logits": ("batch", None, None),
        **past_axes,
        **cross_axes,
        **present_axes,
    }
    return Graph("decoder", tf.function(decoder, autograph=False), inputs, axes)
