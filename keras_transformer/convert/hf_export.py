"""Export to the Hugging Face format: the folder `transformers`' `save_pretrained` writes, which vLLM,
SGLang and TGI serve.

The inverse of the converters next to this file. Their `load_weights` functions are the one name
table: each says, for every variable of ours, which checkpoint tensor it comes from and how it is
transposed, reshaped or sliced. This module runs the same function against a recording stand-in
for the checkpoint (`WeightRecorder`, weight_recorder.py), whose tensors hold their own element numbers instead of
weights, so every element of every variable lands back at the position it was read from; nothing
of a family's layout is written twice.

The folder holds what `transformers`' `save_pretrained` writes, and is written without `torch` or `transformers`'
model classes: config.json and generation_config.json from the config arguments our task gives
(hf_config_files.py); the weights tensor by tensor, in the tensors' names and shapes of hf_shapes.py, into
model.safetensors or its shards with model.safetensors.index.json (`SafetensorsWriter`; a tensor that is one
variable is read from it a block at a time); the tokenizer by `transformers`' `PreTrainedTokenizerFast`
(tokenizer.json, tokenizer_config.json with the chat template; see hf_tokenizer.py), which imports no `torch`.
A mixture of experts' experts are written one tensor each, as the Hub's checkpoints and `save_pretrained` store
them (transformers 5 holds them stacked in memory).

Supported tasks: GPTCausalLM (GPT2LMHeadModel), LlamaCausalLM (LlamaForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM, SmolLM3ForCausalLM or MistralForCausalLM, by which biases, windows, query/key norms and
rotary layers it has; Phi3ForCausalLM; a mixture of experts as Qwen3MoeForCausalLM, MixtralForCausalLM,
OlmoeForCausalLM or Qwen2MoeForCausalLM), BertMaskedLM (BertForMaskedLM, or RobertaForMaskedLM for RoBERTa and XLM-R),
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

import logging
import os
from pathlib import Path

import keras

from keras_transformer import presets
from keras_transformer.convert import hf_config_files, hf_generation, hf_tokenizer
from keras_transformer.convert.hf_export_families import FAMILIES, LAYOUT_CONVERTERS, family_of
from keras_transformer.convert.hf_shapes import checkpoint_shapes, parameter_count
from keras_transformer.convert.safetensors_writer import SafetensorsWriter
from keras_transformer.convert.weight_recorder import WeightRecorder
from keras_transformer.models.lora import lora_layers
from keras_transformer.models.quantization import quantization_mode
from keras_transformer.progress import Phase
from keras_transformer.progress import resolve as resolve_verbose

FORMAT = "huggingface"
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_SHARD_SIZE = "5GB"  # transformers' own default
INSTALL_HINT = "pip install transformers"

_log = logging.getLogger(__name__)


def export_hugging_face(task, path, overwrite=False, dtype=None, max_shard_size=DEFAULT_MAX_SHARD_SIZE, verbose="auto"):
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
        verbose: "auto" (for a model of 100M parameters or more), True or False: a line when the weights start and
            end, and a progress bar over the tensors.

    Returns:
        The `Path` of the written directory.
    """
    path = Path(os.fspath(path)).expanduser().resolve()
    family = family_of(task)
    verbose = resolve_verbose(verbose, task)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists: pass overwrite=True to replace it.")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"`dtype` must be None or one of {DTYPES}. Received: dtype={dtype!r}")
    _check_shard_size(max_shard_size)
    dequantized = _dequantized_kernels(task)
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
    config = hf_config_files.model_config(config_cls, model_cls, settings, dtype)
    config.update(hf_config_files.transformers4_keys(config, getattr(task.backbone, "tie_embedding_weights", True)))
    transformers = _import_transformers() if task.preprocessor is not None else None

    def write(tmp):
        phase = Phase("Hugging Face: the weights, tensor by tensor", verbose, unit="tensor")
        _stream_weights(task, config, dequantized, dtype, tmp, max_shard_size, phase)
        if task.preprocessor is not None:
            hf_tokenizer.save_tokenizer(task, transformers, tmp)

    presets.atomic_dir(path, overwrite, write)
    return path


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
    offset = getattr(task.backbone, "position_offset", 0)
    if offset and ids["pad_token_id"] != offset - 1:  # RoBERTa counts positions from its padding id
        raise ValueError(
            f"A BertBackbone with position_offset={offset} exports as RoBERTa, whose positions start past its "
            f"padding id: the tokenizer's pad_token_id must be {offset - 1}. Received: {ids['pad_token_id']}"
        )
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


def _import_transformers():
    """`transformers`, whose `PreTrainedTokenizerFast` writes the tokenizer files (it imports no torch)."""
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "Exporting a model with its tokenizer to format='huggingface' needs transformers (for the tokenizer "
            f"files), which is not installed: {INSTALL_HINT}"
        ) from None
    return transformers


# --- weights ----------------------------------------------------------------


def _stream_weights(task, config, values, dtype, directory, max_shard_size, phase):
    """Write the safetensors files tensor by tensor as the converter, run backwards, fills each one (`save_pretrained`
    would need every tensor at once), a step of `phase` each, and the config files."""
    shapes = checkpoint_shapes(task, config["model_type"])
    writer = SafetensorsWriter(directory, dtype, max_shard_size)
    phase.layers = len(shapes)

    def add(name, array):
        writer.add(name, array)
        phase.step()

    with phase:
        recorder = WeightRecorder(shapes, values, sink=add)
        _run_converter(task, config, recorder)
        recorder.finish()
        writer.close(total_parameters=parameter_count(shapes))
    presets.write_json(Path(directory) / "config.json", config)
    if hasattr(task, "generate"):
        generation = hf_config_files.generation_config(config, getattr(task, "generation_config", None))
        presets.write_json(Path(directory) / hf_generation.FILE_NAME, generation)


def _run_converter(task, hf_config, recorder):
    """The family's converter run backwards into `recorder` (see `WeightRecorder`)."""
    converter = LAYOUT_CONVERTERS.get(hf_config.get("model_type"), FAMILIES[type(task).__name__][1])
    converter.load_weights(task, recorder, hf_config)


__all__ = ["DEFAULT_MAX_SHARD_SIZE", "DTYPES", "FORMAT", "export_hugging_face"]
