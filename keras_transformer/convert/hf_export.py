"""Export to the Hugging Face format: the folder `transformers`' `save_pretrained` writes, which vLLM,
SGLang and TGI serve.

The inverse of the converters next to this file. Their `load_weights` functions are the one name
table: each says, for every variable of ours, which checkpoint tensor it comes from and how it is
transposed, reshaped or sliced. This module runs the same function against a recording stand-in
for the checkpoint (`WeightRecorder`, weight_recorder.py), whose tensors hold their own element numbers instead of
weights, so every element of every variable lands back at the position it was read from; nothing
of a family's layout is written twice.

The folder is the one `transformers`' `save_pretrained` writes: the model's config class and model class
are built (on the `meta` device, so no memory is spent on random weights) for config.json,
generation_config.json and the tensors' names and shapes; the weights stream tensor by tensor into
model.safetensors or its shards with model.safetensors.index.json (`SafetensorsWriter`; a tensor that is
one variable is read from it a block at a time), except for the layouts transformers converts while
saving, given to the model and saved by `save_pretrained`; the tokenizer by
`PreTrainedTokenizerFast.save_pretrained` (tokenizer.json, tokenizer_config.json with the chat template;
see hf_tokenizer.py). `transformers` and `torch` are therefore needed to export, not to train or to
convert in.

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

import json
import logging
import os
from pathlib import Path

import keras

from keras_transformer import presets
from keras_transformer.convert import hf_generation, hf_tokenizer
from keras_transformer.convert.hf_export_families import FAMILIES, LAYOUT_CONVERTERS, family_of, llama_config
from keras_transformer.convert.hf_export_families import modernbert_config
from keras_transformer.convert.hf_export_families import gemma_config, t5_config
from keras_transformer.convert.safetensors_writer import SafetensorsWriter
from keras_transformer.convert.weight_recorder import WeightRecorder
from keras_transformer.models.lora import lora_layers
from keras_transformer.models.quantization import quantization_mode

FORMAT = "huggingface"
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_SHARD_SIZE = "5GB"  # transformers' own default
INSTALL_HINT = "pip install transformers 'torch==2.13.0'"

_log = logging.getLogger(__name__)


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
    family = family_of(task)
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
    for key, value in hf_generation.write(getattr(task, "generation_config", None)).items():
        setattr(hf_model.generation_config, key, value)  # the model's defaults for generate
    streamed = _stored_as_held(hf_model)

    def write(tmp):
        args = (task, hf_model, shapes, dequantized, dtype, tmp, max_shard_size)
        _stream_weights(*args) if streamed else _save_pretrained(torch, *args)
        _add_transformers4_keys(tmp, task, family)
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
    - the Llama architecture: `rope_theta` and `rope_scaling` beside `rope_parameters` (4 reads only those), and
      Qwen3-MoE's `num_experts` beside `num_local_experts`;
    - T5 v1.1 (its own, unscaled head): tie_word_embeddings=false, as its checkpoints say. transformers 5
      writes true with scale_decoder_outputs=false, which 4 reads as v1.0's tied, scaled head.
    """
    file = Path(directory) / "config.json"
    config = json.loads(file.read_text(encoding="utf-8"))
    config["torch_dtype"] = config["dtype"]
    if family is llama_config and config["model_type"] == "phi3":
        config.update(_phi3_transformers4_keys(config["rope_parameters"]))
    elif family is llama_config:
        scaling = dict(config["rope_parameters"])
        config["rope_theta"] = scaling.pop("rope_theta")
        config["rope_scaling"] = None if scaling["rope_type"] == "default" else scaling
        if config["model_type"] == "qwen3_moe":  # 5 writes num_local_experts; 4 (and the Hub) num_experts
            config["num_experts"] = config["num_local_experts"]
    if family is modernbert_config:
        config.update(_modernbert_hub_keys(config))
    if family is gemma_config:
        config.update(_gemma_transformers4_keys(config["rope_parameters"]))
    if family is t5_config and not task.backbone.tie_embedding_weights:
        config["tie_word_embeddings"] = False
    presets.write_json(file, config)


def _phi3_transformers4_keys(rope):
    """Phi-3's rotary settings as transformers 4 reads them: top-level `rope_theta` and `partial_rotary_factor`, and a
    `rope_scaling` of exactly `type`, `short_factor` and `long_factor` (4's Phi3Config refuses other fields; an
    attention factor transformers would not derive is kept beside them). transformers 5 reads `rope_scaling` before
    `rope_parameters`, and the same model from it."""
    keys = {"rope_theta": rope["rope_theta"], "partial_rotary_factor": rope["partial_rotary_factor"]}
    keys["rope_scaling"] = None
    if rope["rope_type"] == "longrope":
        names = ("short_factor", "long_factor", "attention_factor")
        keys["rope_scaling"] = {"type": "longrope", **{name: rope[name] for name in names if name in rope}}
    return keys


def _gemma_transformers4_keys(rope):
    """Gemma's rotary bases as transformers 4 reads them: `rope_theta` and `rope_scaling` (Gemma 3's global layers,
    or Gemma 2's one embedding) and `rope_local_base_freq` (Gemma 3's sliding layers)."""
    full = dict(rope.get("full_attention", rope))
    keys = {"rope_theta": full.pop("rope_theta"), "rope_scaling": None if full["rope_type"] == "default" else full}
    if "sliding_attention" in rope:
        keys["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    return keys


def _modernbert_hub_keys(config):
    """ModernBERT's config in the Hub's spelling, which transformers 4 reads: the two rotary bases, and
    `global_attn_every_n_layers` where the layer types follow that pattern (transformers 5 reads `layer_types`)."""
    keys = {
        "global_rope_theta": config["rope_parameters"]["full_attention"]["rope_theta"],
        "local_rope_theta": config["rope_parameters"]["sliding_attention"]["rope_theta"],
    }
    layer_types = config["layer_types"]
    for every in range(1, len(layer_types) + 1):
        if layer_types == ["sliding_attention" if i % every else "full_attention" for i in range(len(layer_types))]:
            keys["global_attn_every_n_layers"] = every
            break
    return keys


# --- weights ----------------------------------------------------------------


def _stored_as_held(hf_model):
    """Whether `save_pretrained` stores the model's tensors as the model holds them. transformers 5 holds some
    layouts otherwise (e.g. a mixture of experts' stacked experts, saved one tensor per expert) and reverts them over
    the whole state dict when saving; those go through `save_pretrained`, the others stream."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: no conversions
        return True
    held = hf_model.state_dict()  # meta tensors: the conversions run on shapes alone
    stored = revert_weight_conversion(hf_model, dict(held))
    return {name: tuple(tensor.shape) for name, tensor in stored.items()} == {
        name: tuple(tensor.shape) for name, tensor in held.items()
    }


def _stream_weights(task, hf_model, shapes, values, dtype, directory, max_shard_size):
    """Write the safetensors files tensor by tensor as the converter, run backwards, fills each one, and
    the config files as `save_pretrained` writes them (it would need every tensor at once)."""
    writer = SafetensorsWriter(directory, dtype, max_shard_size)
    recorder = WeightRecorder(shapes, values, sink=writer.add)
    _run_converter(task, hf_model.config.to_dict(), recorder)
    recorder.finish()
    writer.close(total_parameters=hf_model.num_parameters())
    hf_model.config.dtype = dtype
    hf_model.config.architectures = [type(hf_model).__name__]
    hf_model.config.save_pretrained(directory)
    if hf_model.can_generate():
        hf_model.generation_config.save_pretrained(directory)


def _save_pretrained(torch, task, hf_model, shapes, values, dtype, directory, max_shard_size):
    """The whole state dict, given to the model and saved by `save_pretrained` (which converts layouts)."""
    recorder = WeightRecorder(shapes, values)
    _run_converter(task, hf_model.config.to_dict(), recorder)
    arrays = recorder.arrays()
    torch_dtype = getattr(torch, dtype)
    state = {name: torch.from_numpy(array).to(torch_dtype) for name, array in arrays.items()}
    # A tied copy is the same tensor, as in a model transformers built: save_pretrained stores it once.
    state.update({name: state[reference] for name, reference in recorder.tied.items()})
    hf_model.load_state_dict(state, strict=True, assign=True)
    hf_model.eval()
    hf_model.save_pretrained(directory, max_shard_size=max_shard_size)


def _run_converter(task, hf_config, recorder):
    """The family's converter run backwards into `recorder` (see `WeightRecorder`)."""
    converter = LAYOUT_CONVERTERS.get(hf_config.get("model_type"), FAMILIES[type(task).__name__][1])
    converter.load_weights(task, recorder, hf_config)


__all__ = ["DEFAULT_MAX_SHARD_SIZE", "DTYPES", "FORMAT", "export_hugging_face"]
