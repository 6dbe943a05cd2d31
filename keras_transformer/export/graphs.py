"""The graphs an export holds, written as tf.functions over the task's own methods.

Axes: B batch, T new tokens, S past length, S_enc encoder length, L layers,
Hkv key/value heads, Dh head size, V vocabulary.

Three kinds of task, three sets of graphs:
    decoder (causal LM, GPT):  prefill  input_ids (B, T), attention_mask (B, T)
                                 -> logits (B, T, V), present.{i}.key/value (B, T, Hkv, Dh)
                                        built by the ONNX kernels when they cover the task's step
                                        (decode_graph.py; the mask right padding), else traced
                               decode   when the ONNX kernels cover the task's step (decode_graph.py):
                                        input_ids (B, 1), position_ids (B, 1),
                                        past_key_values.{i}.key/value (B, Hkv, S_buf, Dh)
                                 -> logits (B, 1, V), present.{i}.key/value: the past buffers with
                                    position S written in place (bound to the same memory)
                                        otherwise: input_ids (B, 1), attention_mask (B, S + 1),
                                        past_key_values.{i}.key/value (B, S, Hkv, Dh)
                                 -> logits (B, 1, V), present.{i}.key/value (B, S + 1, Hkv, Dh)
    encoder (BERT tasks, TextEmbedders): the task's inputs (token_ids, segment_ids, padding_mask, ...)
                                 -> the backbone's outputs (sequence_output, pooled_output) and logits
                                 (a TextEmbedder's: embeddings)
    encoder-decoder (T5, ...): encoder  input_ids (B, S_enc), attention_mask (B, S_enc)
                                 -> encoder_hidden_states (B, S_enc, D), cross_key_values.{i}.key/value
                                    (B, Hkv, S_enc, Dh) for an in-place decoder, else (B, S_enc, Hkv, Dh)
                               decoder  when the ONNX kernels cover the task's step (decode_graph.py):
                                        input_ids (B, 1), position_ids (B, 1), encoder_attention_mask
                                        (B, S_enc), past_key_values.{i}.key/value (B, Hkv, S_buf, Dh),
                                        cross_key_values.{i}.key/value (B, Hkv, S_enc, Dh)
                                 -> logits (B, 1, V), present.{i}.key/value written in place (as decode)
                                        otherwise: input_ids (B, 1), encoder_attention_mask (B, S_enc),
                                        past_key_values.{i}.key/value (B, S, Hkv, Dh) (S may be 0),
                                        cross_key_values.{i}.key/value (B, S_enc, Hkv, Dh)
                                 -> logits (B, 1, V), present.{i}.key/value (B, S + 1, Hkv, Dh)

The traced key/value caches grow by one position per step, as in Hugging Face optimum: the new
tokens' positions start at the past length S. A traced step (every prefill, the decode steps
the ONNX kernels do not cover) pads the past by the new slots and calls the task's
own `call_with_cache` at index S: its one-token cache write is a `where` (ONNX Equal/Where),
and its multi-token write an XlaDynamicUpdateSlice that onnx.py converts to Pad + Where.
All integer inputs are int64 (ONNX Runtime's and Hugging Face's convention); masks are 0/1.

Built under the TensorFlow backend only; `tensorflow` is imported when a graph is built.
"""

from typing import NamedTuple

from keras_transformer.export.decode_graph import Unsupported, decode_model, prefill_model
from keras_transformer.progress import Phase
from keras_transformer.layers.kv_cache import KVCache
from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.seq2seq_lm import Seq2SeqLM
from keras_transformer.models.task import Task
from keras_transformer.models.text_embedder import TextEmbedder

KINDS = ("decoder", "encoder", "encoder_decoder")


class Graph(NamedTuple):
    """One exported graph: `function(*inputs) -> {output name: tensor}`.

    `inputs` are `tf.TensorSpec`s named after the graph inputs; `axes` names the
    dynamic axes of every input and output (the ONNX `dim_param`s). A graph written
    directly in ONNX (a decode step with in-place caches, see decode_graph.py) has no function and carries
    its `model` instead.
    """

    name: str
    function: object
    inputs: list
    axes: dict
    model: object = None
    # The Keras variables a traced function reads: the converter traces them as further inputs (no weight in the
    # TensorFlow graph, so tf2onnx converts the structure only) and gives them back as initializers.
    variables: tuple = ()


def model_kind(task):
    """The kind of `task`: "decoder", "encoder" or "encoder_decoder"; a ValueError for what cannot be exported."""
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
            raise ValueError(
                f"{type(task).__name__} has no cached decoding (`call_with_cache`): it cannot be exported."
            )
        return "decoder"
    outputs = getattr(getattr(task, "backbone", None), "output", None)
    if isinstance(task, TextEmbedder) or (isinstance(outputs, dict) and "sequence_output" in outputs):
        return "encoder"  # a TextEmbedder on a decoder's backbone too (its hidden states are its sequence_output)
    family = getattr(getattr(task, "backbone", None), "family", None)
    raise ValueError(
        f"{type(task).__name__} (family {family!r}) is not an exportable task: export supports causal LMs, "
        "encoder tasks (a backbone with a sequence_output) and seq2seq LMs."
    )


def cache_dims(task):
    """(L, Hkv, Dh) of the task's self-attention cache (layout (B, L, 2, Hkv, S, Dh))."""
    _, layers, _, heads, _, head_dim = task.backbone.cache_shape(1, 1)
    return layers, heads, head_dim


def build_graphs(task, weights=None, traced=True, quantize=None, verbose=False):
    """The graphs of `task`, in the order a runtime uses them. `weights` (a `weights_file.WeightsFile`): where the
    graphs built in ONNX directly put their large initializers (traced graphs get theirs when converted).
    `traced=False`: only graphs the ONNX kernels build, with no TensorFlow; `Unsupported` if the task needs another.
    `quantize` ("int8" or "int4", with `traced=False` only): their weights stored quantized as they are built.
    `verbose`: a line per graph the kernels build, and a progress bar over its blocks (`progress.Phase`).
    """
    kind = model_kind(task)
    if quantize is not None and traced:
        raise ValueError("Graphs are quantized as they are built only when none is traced: pass traced=False.")

    def built_or_traced(make, name, trace):
        graph = _kernel_graph(make, task, name, weights, quantize, verbose)
        if graph is None:
            if not traced:
                raise Unsupported(f"the {name} graph of a {type(task).__name__} needs tracing")
            graph = trace(task)
        return graph

    if kind == "decoder":
        graphs = [
            built_or_traced(prefill_model, "prefill", _prefill_graph),
            built_or_traced(decode_model, "decode", _decode_graph),
        ]
    elif not traced:
        raise Unsupported(f"the encoder graph of an {kind} task is traced")
    elif kind == "encoder":
        graphs = [_encoder_task_graph(task)]
    else:
        decoder = _kernel_graph(decode_model, task, "decoder", weights, verbose=verbose)
        encoder = _seq2seq_encoder_graph(task, heads_first=decoder is not None)
        graphs = [encoder, decoder or _seq2seq_decoder_graph(task)]
    return [graph if graph.model is not None else graph._replace(variables=tuple(task.variables)) for graph in graphs]


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
    """Keras cache (B, L, 2, Hkv, S, Dh) -> 2L tensors (B, S, Hkv, Dh): keys and values of each layer."""
    import tensorflow as tf

    return [tf.transpose(cache[:, i, part], (0, 2, 1, 3)) for i in range(num_layers) for part in (0, 1)]


def _named(prefix, tensors):
    """2L tensors -> {prefix.{i}.key: ..., prefix.{i}.value: ...}."""
    return {f"{prefix}.{i // 2}.{('key', 'value')[i % 2]}": tensor for i, tensor in enumerate(tensors)}


def _layer_caches(tensors, extra=0):
    """2L tensors (B, S, Hkv, Dh) -> L `KVCache`s (B, Hkv, S + extra, Dh), `extra` empty slots for the new
    tokens; their one-token writes are a `where` (plain Equal/Where nodes for tf2onnx)."""
    import tensorflow as tf

    def heads_first(t):  # (B, S, Hkv, Dh) -> (B, Hkv, S + extra, Dh)
        padded = tf.pad(tf.transpose(t, (0, 2, 1, 3)), [[0, 0], [0, 0], [0, extra], [0, 0]])
        padded.set_shape((None, t.shape[2], None, t.shape[3]))  # a pad by a tensor loses every static size
        return padded

    return [
        KVCache(heads_first(tensors[i]), heads_first(tensors[i + 1]), write="where") for i in range(0, len(tensors), 2)
    ]


def _layer_presents(caches, task):
    """L `KVCache`s (B, Hkv, S, Dh) -> 2L tensors (B, S, Hkv, Dh): keys and values of each layer.

    Their static head sizes are set again: a cache write at a traced index loses them in TensorFlow.
    """
    import tensorflow as tf

    _, heads, head_dim = cache_dims(task)
    presents = [tf.transpose(t, (0, 2, 1, 3)) for cache in caches for t in (cache.keys, cache.values)]
    for present in presents:
        present.set_shape((None, None, heads, head_dim))
    return presents


def _kernel_graph(make, task, name, weights=None, quantize=None, verbose=False):
    """The graph `make` (decode_graph.py's `decode_model` or `prefill_model`) builds by running the task's own step
    with ONNX kernels (a decode step's caches written in place); None when the step needs something those kernels
    do not build."""
    blocks = len(getattr(task.backbone, "transformer_layers", ()))
    try:
        with Phase(f"{name} graph (ONNX kernels{', ' + quantize if quantize else ''})", verbose, blocks) as phase:
            return Graph(name, None, [], {}, model=make(task, weights, quantize, phase))
    except Unsupported:
        return None


def _decoder_step(task):
    """step(ids (B, T) int32, mask (B, S + T) bool, past: 2L x (B, S, Hkv, Dh)) -> (logits (B, T, V), 2L presents)."""
    return lambda ids, mask, past: _cached_step(task, ids, mask, past)


def _cached_step(task, ids, mask, past):
    """Any causal LM: its own `call_with_cache` on the past plus T empty slots, at index S."""
    import tensorflow as tf

    position = tf.shape(past[0])[1]  # S: the first new token's position
    cache = _layer_caches(past, extra=tf.shape(ids)[1])  # L x (B, Hkv, S + T, Dh)
    logits, cache = task.call_with_cache(ids, cache, position, padding_mask=mask)
    return logits, _layer_presents(cache, task)


def _prefill_graph(task):
    import tensorflow as tf

    layers, heads, head_dim = cache_dims(task)
    step = _decoder_step(task)

    def prefill(input_ids, attention_mask):
        empty = tf.zeros(tf.stack([tf.shape(input_ids)[0], 0, heads, head_dim]))  # (B, 0, Hkv, Dh)
        logits, presents = step(tf.cast(input_ids, "int32"), tf.cast(attention_mask, "bool"), [empty] * (2 * layers))
        return {"logits": logits, **_named("present", presents)}

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

    step = _decoder_step(task)

    def decode(input_ids, attention_mask, *past):
        logits, presents = step(tf.cast(input_ids, "int32"), tf.cast(attention_mask, "bool"), list(past))
        return {"logits": logits, **_named("present", presents)}

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
    """The task's inputs -> the backbone's outputs and the task's own output, named by its `output_name` ("logits",
    or a TextEmbedder's "embeddings")."""
    import tensorflow as tf

    input_names = list(task.input)
    backbone_names = list(task.backbone.input)
    output_name = getattr(task, "output_name", "logits")

    def forward(*args):
        inputs = {}
        for name, value in zip(input_names, args):
            dtype = task.input[name].dtype
            inputs[name] = tf.cast(value, "bool" if "bool" in str(dtype) else dtype)
        # The backbone runs twice in the trace; TensorFlow's graph optimizer keeps one copy.
        outputs = task.backbone({name: inputs[name] for name in backbone_names})
        outputs = dict(outputs) if isinstance(outputs, dict) else {"sequence_output": outputs}  # (B, T, D)
        outputs[output_name] = task(inputs)
        return outputs

    specs = [tf.TensorSpec((None,) * len(task.input[name].shape), tf.int64, name=name) for name in input_names]
    axes = {}
    for name in input_names:
        # mask_positions (B, P) has its own length; the others are (B, T).
        axes[name] = ("batch", "masked" if name == "mask_positions" else "sequence")
    axes["sequence_output"] = ("batch", "sequence", None)
    axes["pooled_output"] = ("batch", None)
    axes[output_name] = ("batch", "masked", None) if "mask_positions" in input_names else ("batch", None)
    return Graph("encoder", tf.function(forward, autograph=False), specs, axes)


# --- encoder-decoders -------------------------------------------------------


def _seq2seq_encoder_graph(task, heads_first=False):
    """heads_first: cross keys/values (B, Hkv, S_enc, Dh), as an in-place decoder reads them; else
    (B, S_enc, Hkv, Dh)."""
    import tensorflow as tf

    layers, _, _ = cache_dims(task)

    def encoder(input_ids, attention_mask):
        hidden = task.encode(tf.cast(input_ids, "int32"), tf.cast(attention_mask, "bool"))
        cross = task.compute_cross_cache(hidden)  # (B, L, 2, Hkv, S_enc, Dh)
        if heads_first:
            cross = [cross[:, i, part] for i in range(layers) for part in (0, 1)]
        else:
            cross = _present(cross, layers)
        return {"encoder_hidden_states": hidden, **_named("cross_key_values", cross)}

    _, cross_axes = _cache_specs(task, "cross_key_values", "encoder_sequence")
    if heads_first:
        cross_axes = {name: ("batch", None, "encoder_sequence", None) for name in cross_axes}
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
        past, cross = caches[: 2 * layers], caches[2 * layers :]
        position = tf.shape(past[0])[1]  # S: the new token's position
        self_cache = _layer_caches(past, extra=1)  # L x (B, Hkv, S + 1, Dh)
        logits, self_cache = task.call_with_cache(
            tf.cast(input_ids, "int32"),
            self_cache,
            position,
            _layer_caches(cross),
            tf.cast(encoder_attention_mask, "bool"),
        )
        return {"logits": logits, **_named("present", _layer_presents(self_cache, task))}

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
