"""Export to the Hugging Face format: the folder `transformers`' `save_pretrained` writes, which vLLM,
SGLang and TGI serve.

The inverse of the converters next to this file. Their `load_weights` functions are the one name
table: each says, for every variable of ours, which checkpoint tensor it comes from and how it is
transposed, reshaped or sliced. This module runs the same function against a recording stand-in
for the checkpoint (`WeightRecorder`, weight_recorder.py), whose tensors hold their own element numbers instead of
weights, so every element of every variable lands back at the position it was read from; nothing
of a family's layout is written twice.

The folder is written by `transformers` itself: the model's config class and model class are built
(on the `meta` device, so no memory is spent on random weights), given our weights, and saved with
`save_pretrained` (config.json, generation_config.json, model.safetensors or shards with
model.safetensors.index.json); the tokenizer by `PreTrainedTokenizerFast.save_pretrained`
(tokenizer.json, tokenizer_config.json with the chat template; see hf_tokenizer.py). `transformers`
and `torch` are therefore needed to export, not to train or to convert in.

Supported tasks: GPTCausalLM (GPT2LMHeadModel), LlamaCausalLM (LlamaForCausalLM, Qwen2ForCausalLM
or MistralForCausalLM, by which biases and window it has), BertMaskedLM (BertForMaskedLM),
BertClassifier (BertForSequenceClassification), T5Seq2SeqLM (T5ForConditionalGeneration).

Example:
>>> import tempfile
>>> from keras_transformer.models import CausalLM
>>> lm = CausalLM.from_preset("gpt_stdlib")
>>> out = lm.export(f"{tempfile.mkdtemp()}/gpt_hf", format="huggingface")
>>> sorted(path.name for path in out.iterdir())
['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']
>>> # then, in a shell: vllm serve <the out folder>
"""

import json
import logging
import os
from pathlib import Path

import keras

from keras_transformer import presets
from keras_transformer.convert import hf_bert, hf_gpt2, hf_llama, hf_t5, hf_tokenizer
from keras_transformer.convert.options import ACTIVATIONS
from keras_transformer.convert.weight_recorder import WeightRecorder
from keras_transformer.models.lora import lora_layers
from keras_transformer.models.quantization import quantization_mode

FORMAT = "huggingface"
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_SHARD_SIZE = "5GB"  # transformers' own default
INSTALL_HINT = "pip install transformers 'torch==2.13.0'"

_log = logging.getLogger(__name__)
# Our activation -> the Hugging Face name the converters read back as it (the first listed wins).
_HF_ACTIVATIONS = {ours: hf_name for hf_name, ours in reversed(list(ACTIVATIONS.items()))}


def export_hugging_face(task, path, overwrite=False, dtype=None, max_shard_size=DEFAULT_MAX_SHARD_SIZE):
    """Write `task` to `path` as a Hugging Face checkpoint folder.

    Args:
        task: a GPTCausalLM, LlamaCausalLM, BertMaskedLM, BertClassifier or T5Seq2SeqLM. LoRA
            factors are merged into the exported kernels (the model keeps its LoRA); int8 kernels
            are dequantized (said in a log line); int4 ones are refused.
        path: the directory to write; it must not exist unless `overwrite=True`.
        overwrite: bool, replace an existing directory (atomically, at the end).
        dtype: None (the dtype of the model's weights), "float32", "bfloat16" or "float16".
        max_shard_size: int (bytes) or a string such as "5GB" or "200MB": weights past this size
            are split into shards listed by model.safetensors.index.json.

    Returns:
        The `Path` of the written directory.
    """
    path = Path(os.fspath(path)).expanduser().resolve()
    family = _family(task)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists: pass overwrite=True to replace it.")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"`dtype` must be None or one of {DTYPES}. Received: dtype={dtype!r}")
    _check_shard_size(max_shard_size)
    dequantized = _dequantized_kernels(task)
    torch, transformers = _import_requirements()
    dtype = dtype or _weights_dtype(task)
    if dequantized:
        _log.warning(
            "Exporting %s with its int8 kernels dequantized to %s (the Hugging Face checkpoint holds float "
            "weights; a serving engine can quantize them again).",
            type(task).__name__,
            dtype,
        )
    if lora_layers(task):
        _log.info("Exporting %s with its LoRA factors merged into the kernels.", type(task).__name__)

    config_cls, model_cls, settings = family(task)
    settings.update(_token_ids(task))
    config = getattr(transformers, config_cls)(**settings, dtype=dtype)
    with torch.device("meta"):
        hf_model = getattr(transformers, model_cls)(config)
    shapes = {name: tuple(tensor.shape) for name, tensor in hf_model.state_dict().items()}
    arrays, tied = _export_weights(task, config.to_dict(), shapes, dequantized)
    torch_dtype = getattr(torch, dtype)
    state = {name: torch.from_numpy(array).to(torch_dtype) for name, array in arrays.items()}
    # A tied copy is the same tensor, as in a model transformers built: save_pretrained stores it once.
    state.update({name: state[reference] for name, reference in tied.items()})
    hf_model.load_state_dict(state, strict=True, assign=True)
    hf_model.eval()

    def write(tmp):
        hf_model.save_pretrained(tmp, max_shard_size=max_shard_size)
        _add_transformers4_keys(tmp, task, family)
        if task.preprocessor is not None:
            hf_tokenizer.save_tokenizer(task, transformers, tmp)

    presets.atomic_dir(path, overwrite, write)
    return path


# --- families ---------------------------------------------------------------
# Each builds (config class name, model class name, config arguments) from a task; the weights follow
# from the family's converter (`_FAMILIES`). Options our model has and the Hugging Face class has not
# are refused here, before anything is written.


def _gpt(task):
    b = task.backbone
    if b.num_key_value_heads not in (None, b.num_heads):
        raise _unsupported(task, f"num_key_value_heads={b.num_key_value_heads}", "GPT-2 has no grouped-query attention")
    return (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(
            vocab_size=b.vocabulary_size,
            n_embd=b.hidden_dim,
            n_layer=b.num_layers,
            n_head=b.num_heads,
            n_inner=b.intermediate_dim,
            n_positions=b.max_sequence_length,
            activation_function=_hf_activation(task, b.activation),
            layer_norm_epsilon=b.norm_epsilon,
            resid_pdrop=b.dropout,
            embd_pdrop=b.dropout,
            attn_pdrop=b.dropout,
            tie_word_embeddings=True,
        ),
    )


def _llama(task):
    """Llama, Qwen2 or Mistral, whichever has exactly this model's biases and attention window."""
    b = task.backbone
    head_dim = b.head_dim or b.hidden_dim // b.num_heads
    if b.rotary_dim not in (None, head_dim):
        raise _unsupported(
            task, f"rotary_dim={b.rotary_dim}", "transformers' Llama, Qwen2 and Mistral rotate whole heads"
        )
    qkv_bias = bool(b.attention_bias)
    output_bias = qkv_bias if b.attention_output_bias is None else bool(b.attention_output_bias)
    mlp_bias, window = bool(b.mlp_bias), b.sliding_window
    theta = float(b.rope_max_wavelength)
    rope = (
        {"rope_type": "default", "rope_theta": theta} if not b.rope_scaling else {**b.rope_scaling, "rope_theta": theta}
    )
    settings = dict(
        vocab_size=b.vocabulary_size,
        hidden_size=b.hidden_dim,
        intermediate_size=b.intermediate_dim,
        num_hidden_layers=b.num_layers,
        num_attention_heads=b.num_heads,
        num_key_value_heads=b.num_key_value_heads or b.num_heads,
        head_dim=head_dim,
        max_position_embeddings=b.max_sequence_length,
        rms_norm_eps=b.norm_epsilon,
        rope_parameters=rope,
        hidden_act="silu",
        attention_dropout=b.dropout,
        tie_word_embeddings=bool(b.tie_word_embeddings),
    )
    if qkv_bias and not output_bias and not mlp_bias:  # Qwen2: query/key/value biases only
        settings.update(use_sliding_window=window is not None, sliding_window=window, max_window_layers=0)
        return "Qwen2Config", "Qwen2ForCausalLM", settings
    if window is None and qkv_bias == output_bias:  # Llama: one switch for all four projections
        return "LlamaConfig", "LlamaForCausalLM", {**settings, "attention_bias": qkv_bias, "mlp_bias": mlp_bias}
    if window is not None and not (qkv_bias or output_bias or mlp_bias):
        return "MistralConfig", "MistralForCausalLM", {**settings, "sliding_window": window}
    raise _unsupported(
        task,
        f"attention_bias={b.attention_bias}, attention_output_bias={b.attention_output_bias}, "
        f"mlp_bias={b.mlp_bias}, sliding_window={window}",
        "no Hugging Face class has this mix (Llama: biases on all four attention projections or none, mlp_bias, "
        "no window; Qwen2: query/key/value biases, optional window; Mistral: no biases, a window)",
    )


def _bert(task):
    b = task.backbone
    settings = dict(
        vocab_size=b.vocabulary_size,
        hidden_size=b.hidden_dim,
        num_hidden_layers=b.num_layers,
        num_attention_heads=b.num_heads,
        intermediate_size=b.intermediate_dim,
        max_position_embeddings=b.max_sequence_length,
        type_vocab_size=b.num_segments,
        hidden_act=_hf_activation(task, b.activation),
        layer_norm_eps=b.norm_epsilon,
        hidden_dropout_prob=b.dropout,
        attention_probs_dropout_prob=b.dropout,
    )
    if type(task).__name__ == "BertClassifier":
        settings.update(num_labels=task.num_classes, classifier_dropout=task.dropout)
        return "BertConfig", "BertForSequenceClassification", settings
    return "BertConfig", "BertForMaskedLM", settings


def _t5(task):
    b = task.backbone
    activation = b.activation
    if activation.startswith("gated-"):
        proj = "gated-" + _hf_activation(task, activation.removeprefix("gated-"))
    else:
        proj = _hf_activation(task, activation)
    return (
        "T5Config",
        "T5ForConditionalGeneration",
        dict(
            vocab_size=b.vocabulary_size,
            d_model=b.hidden_dim,
            d_kv=b.key_dim or b.hidden_dim // b.num_heads,
            d_ff=b.intermediate_dim,
            num_layers=b.num_layers,
            num_decoder_layers=b.num_decoder_layers or b.num_layers,
            num_heads=b.num_heads,
            relative_attention_num_buckets=b.relative_attention_num_buckets,
            relative_attention_max_distance=b.relative_attention_max_distance,
            dropout_rate=b.dropout,
            layer_norm_epsilon=b.norm_epsilon,
            feed_forward_proj=proj,
            n_positions=b.max_sequence_length,
            # transformers reads tie_word_embeddings=False as T5 v1.1's unscaled head of its own.
            tie_word_embeddings=bool(b.tie_embedding_weights),
            is_encoder_decoder=True,
        ),
    )


# Task class -> (config builder, converter module).
_FAMILIES = {
    "GPTCausalLM": (_gpt, hf_gpt2),
    "LlamaCausalLM": (_llama, hf_llama),
    "BertMaskedLM": (_bert, hf_bert),
    "BertClassifier": (_bert, hf_bert),
    "T5Seq2SeqLM": (_t5, hf_t5),
}


_SUPPORTED = (
    f"format='huggingface' exports the tasks {sorted(_FAMILIES)} (GPT as GPT2LMHeadModel; Llama, Qwen2 and Mistral "
    "layouts; BERT masked LM and classifier; T5)"
)


def _family(task):
    name = type(task).__name__
    if name not in _FAMILIES:
        raise ValueError(
            f"No Hugging Face class for a {name}: {_SUPPORTED}. Received: task of type {name}. Nothing was written."
        )
    return _FAMILIES[name][0]


def _unsupported(task, option, why):
    return ValueError(
        f"Cannot export this {type(task).__name__} to the Hugging Face format: {option} ({why}); {_SUPPORTED}. "
        "Nothing was written."
    )


def _hf_activation(task, ours):
    if ours not in _HF_ACTIVATIONS:
        raise _unsupported(task, f"activation={ours!r}", f"Hugging Face names only {sorted(_HF_ACTIVATIONS)}")
    return _HF_ACTIVATIONS[ours]


def _token_ids(task):
    """The special-token ids config.json names (they also fill generation_config.json)."""
    if task.preprocessor is None:  # no tokenizer: no ids (not the config class's defaults), but T5's own 0 and 1
        return (
            {}
            if type(task).__name__ == "T5Seq2SeqLM"
            else dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id"))
        )
    tokenizer = task.preprocessor.tokenizer
    ids = {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if type(task).__name__ == "T5Seq2SeqLM":
        ids["decoder_start_token_id"] = task.preprocessor.decoder_start_token_id
    return ids


def _weights_dtype(task):
    """The dtype the model keeps its weights in (the token embedding's: every family has one; the
    functional backbone's own policy stays float32 whatever its layers use)."""
    dtype = keras.backend.standardize_dtype(task.backbone.token_embedding.embeddings.dtype)
    return dtype if dtype in DTYPES else "float32"


def _dequantized_kernels(task):
    """{id(int8 kernel variable): its float32 value} for a model quantized to int8 (Keras's abs-max int8 keeps
    one scale per output: kernel = q / scale); {} for a float model. int4 (packed, possibly grouped) is refused."""
    mode = quantization_mode(task)
    if mode is None:
        return {}
    if mode != "int8":
        raise ValueError(
            f"The task's weights are quantized ({mode}) in Keras, which this export does not dequantize. Export the "
            "float model (before `quantize`, i.e. quantize=None), or an int8 one, and let the serving engine quantize "
            "(e.g. `vllm serve OUT --quantization fp8`). Nothing was written."
        )
    values = {}
    for layer in task._flatten_layers():
        if not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)) or layer.quantization_mode is None:
            continue
        if layer.lora_enabled:
            raise ValueError(
                f"Layer {layer.path!r} has LoRA on int8 weights: merge the factors into a float model first "
                "(or export with quantize=None from the float model). Nothing was written."
            )
        scale = layer.kernel_scale
        if isinstance(layer, keras.layers.EinsumDense):
            scale = layer._adjust_scale_for_dequant(scale)  # Keras's own layout of the scale against the kernel
        kernel = keras.ops.divide(keras.ops.cast(layer._kernel, "float32"), keras.ops.cast(scale, "float32"))
        values[id(layer._kernel)] = keras.ops.convert_to_numpy(kernel)
    return values


def _check_shard_size(max_shard_size):
    valid = isinstance(max_shard_size, str) or (
        isinstance(max_shard_size, int) and not isinstance(max_shard_size, bool) and max_shard_size > 0
    )
    if not valid:
        raise ValueError(
            "`max_shard_size` must be a positive int (bytes) or a string such as '5GB'. "
            f"Received: max_shard_size={max_shard_size!r}"
        )


def _import_requirements():
    try:
        import torch
        import transformers
    except ImportError as error:
        raise ImportError(
            f"Exporting to format='huggingface' needs `transformers` and `torch` ({error.name} is not installed): "
            f"{INSTALL_HINT}"
        ) from None
    return torch, transformers


def _add_transformers4_keys(directory, task, family):
    """config.json also in the spelling transformers 4 reads (vLLM, SGLang and TGI may pin it), each entry
    equal to what transformers 5 wrote and read back by 5 as the same model:
    - `torch_dtype` beside `dtype` (releases before 4.56 read only `torch_dtype`);
    - Llama, Qwen2, Mistral: `rope_theta` and `rope_scaling` beside `rope_parameters` (4 reads only those);
    - T5 v1.1 (its own, unscaled head): tie_word_embeddings=false, as its checkpoints say. transformers 5
      writes true with scale_decoder_outputs=false, which 4 reads as v1.0's tied, scaled head.
    """
    file = Path(directory) / "config.json"
    config = json.loads(file.read_text(encoding="utf-8"))
    config["torch_dtype"] = config["dtype"]
    if family is _llama:
        scaling = dict(config["rope_parameters"])
        config["rope_theta"] = scaling.pop("rope_theta")
        config["rope_scaling"] = None if scaling["rope_type"] == "default" else scaling
    if family is _t5 and not task.backbone.tie_embedding_weights:
        config["tie_word_embeddings"] = False
    presets.write_json(file, config)


# --- weights ----------------------------------------------------------------


def _export_weights(task, hf_config, shapes, values=None):
    """Our weights as ({Hugging Face name: float32 array}, {tied copy: its reference}), through the family's
    converter run backwards; `values`: {id(variable): float value} to write instead (dequantized kernels)."""
    recorder = WeightRecorder(shapes, values)
    converter = _FAMILIES[type(task).__name__][1]
    converter.load_weights(task, recorder, hf_config)
    return recorder.arrays(), recorder.tied


__all__ = ["DEFAULT_MAX_SHARD_SIZE", "DTYPES", "FORMAT", "export_hugging_face"]
