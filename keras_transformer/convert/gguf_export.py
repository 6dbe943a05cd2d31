"""Export to GGUF, the one-file format of llama.cpp, Ollama and LM Studio: `task.export("out.gguf", format="gguf",
gguf_type="f16")`, or `keras-transformer export PRESET out.gguf --format gguf --gguf-type q8_0`.

The weights take the path of the Hugging Face export: the family's converter (hf_llama.py, hf_gpt2.py, hf_phi3.py,
hf_gemma.py, hf_moe.py) is run backwards against a `WeightRecorder`, which gives our weights under the Hugging Face
names and layouts, and gguf_names.py renames them as llama.cpp's `convert_hf_to_gguf.py` does (its query/key
permutation for the `llama` architecture included). A LoRA model's kernels are read merged (the recorder reads
`layer.kernel`). The file is written by the `gguf` package's GGUFWriter with the architecture's metadata, the
tokenizer (gguf_tokenizer.py) and the chat template, atomically (a temporary file renamed at the end). The weights
stream: the recorder hands each tensor, as soon as it is whole, to gguf_writer.py's GGUFStreamWriter, which writes
it at its offset in the file, so the export holds about one layer's tensors beyond the model, never a copy of it.

`gguf_type`, as llama.cpp's converter names them: "f32", "f16", "bf16", "q8_0" or "q4_0". As llama.cpp writes
them, one-dimensional tensors (norms, biases) stay F32, and a matrix whose rows are not a whole number of blocks
(32 values) is written F16, with a log line (gguf_writer.tensor_type). Keras's int8 / int4 weights are refused
(export the float model, quantize=None): a GGUF quantization is chosen by `gguf_type`.

Architectures: `gpt2` (GPTCausalLM); for a LlamaCausalLM `llama` (no biases, or biases on all four attention
projections; with Mixtral-style experts), `qwen2` (query/key/value biases), `qwen3` (query/key norms), `qwen3moe`
(query/key norms and experts on every layer) or, with partial rotary or a sliding window, `phi3` (fused qkv and
gate/up tensors, the window on every layer, a window of 0 for none, as llama.cpp writes Phi-4); for a GemmaCausalLM
with query/key norms `gemma3` (norms stored as 1 + w, every 6th layer global, the local layers' rotary base as
rope.freq_base_swa). Options llama.cpp reads nowhere from these architectures' metadata (a window on some layers
only, partial rotary without phi3's other traits, layers without rotary positions, dense layers among routed ones,
a shared expert, rope scalings but linear, another Gemma 3 layer pattern or query scale) are refused with the
option's name before anything is written. Tokenizers: byte-level BPE as llama.cpp's `gpt2` model, BPE with byte
fallback (SentencePiece's: Llama 2, Phi-3, Gemma) as its `llama` model with scores and token types
(gguf_tokenizer.py).
"""

import logging
import os
from pathlib import Path

import gguf
import numpy as np

from keras_transformer import presets
from keras_transformer.convert import gguf_names, gguf_tokenizer, hf_gemma, hf_gpt2, hf_llama, hf_moe, hf_phi3
from keras_transformer.convert.hf_shapes import checkpoint_shapes
from keras_transformer.convert.gguf_writer import GGUFStreamWriter, tensor_type
from keras_transformer.convert.weight_recorder import WeightRecorder
from keras_transformer.models.lora import lora_layers
from keras_transformer.models.quantization import quantization_mode
from keras_transformer.progress import Phase
from keras_transformer.progress import resolve as resolve_verbose

FORMAT = "gguf"
GGUF_TYPES = {
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}

_log = logging.getLogger(__name__)
_GEMMA3_PATTERN = 6  # llama.cpp's Gemma 3: every 6th layer global, the others windowed


def export_gguf(task, path, format=FORMAT, overwrite=False, quantize=None, verbose="auto", gguf_type="f16"):
    """Write `task` to the GGUF file `path`.

    Args:
        task: a GPTCausalLM, LlamaCausalLM or GemmaCausalLM (see the module docstring for the architectures).
        path: the file to write, ending in `.gguf`; it must not exist unless `overwrite=True`.
        format: "gguf".
        overwrite: bool, replace an existing file (atomically, at the end).
        quantize: must be None (Keras's int8 / int4 are ONNX options; `gguf_type` picks the GGUF's).
        verbose: "auto" (for a model of 100M parameters or more), True or False: a line when the weights start and
            end, and a progress bar over the tensors.
        gguf_type: "f32", "f16" (the default), "bf16", "q8_0" or "q4_0".

    Returns:
        The `Path` of the written file.
    """
    del format
    verbose = resolve_verbose(verbose, task)
    path = Path(os.fspath(path)).expanduser().resolve()
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"A GGUF export is one file whose name ends in .gguf. Received: path={str(path)!r}")
    if path.exists() and not overwrite:
        raise ValueError(f"{path} already exists: pass overwrite=True to replace it.")
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"`gguf_type` must be one of {sorted(GGUF_TYPES)}. Received: gguf_type={gguf_type!r}")
    if quantize is not None:
        raise ValueError(
            f"format='gguf' quantizes with `gguf_type` (e.g. gguf_type='q8_0'): pass quantize=None. "
            f"Received: quantize={quantize!r}"
        )
    mode = quantization_mode(task)
    if mode is not None:
        raise ValueError(
            f"The task's weights are quantized ({mode}) in Keras; a GGUF export reads float weights. Export the float "
            "model (before `quantize`, quantize=None) and pick the GGUF's quantization with gguf_type. "
            "Nothing was written."
        )
    architecture, config, converter = _architecture(task)
    if lora_layers(task):
        _log.info("Exporting %s with its LoRA factors merged into the kernels.", type(task).__name__)
    shapes = checkpoint_shapes(task, architecture, stacked_experts=True)
    asked, file_type = GGUF_TYPES[gguf_type]
    # The file's tensors in the order the whole-model writer had them: the Hugging Face tensors' order, renamed.
    placeholders = {name: np.broadcast_to(np.float32(0), shape) for name, shape in shapes.items()}
    table = {
        name: (array.shape, tensor_type(name, array.shape, asked))
        for name, array in gguf_names.gguf_tensors(placeholders, architecture, config).items()
    }

    def write(tmp):
        writer = gguf.GGUFWriter(str(tmp), architecture)
        _write_metadata(writer, task, architecture, config, file_type)
        stream = GGUFStreamWriter(writer, table)

        phase = Phase(f"GGUF ({gguf_type}): the weights, tensor by tensor", verbose, len(shapes), "tensor")

        def sink(hf_name, array):  # each Hugging Face tensor as the recorder finishes it
            arrays = {hf_name: np.asarray(array)}  # a `StreamedTensor` read whole: GGUF's tensors are permuted
            for name, values in gguf_names.gguf_tensors(arrays, architecture, config).items():
                stream.add(name, values)
            phase.step()

        with phase:
            recorder = WeightRecorder(shapes, sink=sink)
            converter.load_weights(task, recorder, {"model_type": architecture})
            recorder.finish()
            if recorder.tied:
                raise ValueError(f"GGUF export: tied copies {sorted(recorder.tied)} in the Hugging Face layout.")
            stream.close()

    presets.atomic_file(path, write)
    return path


def _architecture(task):
    """(GGUF architecture, the metadata's numbers, the Hugging Face converter whose layout the weights take)."""
    b = task.backbone
    name = type(task).__name__
    config = {"num_attention_heads": b.num_heads, "num_key_value_heads": b.num_key_value_heads or b.num_heads}
    if name == "GPTCausalLM":
        if b.num_key_value_heads not in (None, b.num_heads) or b.activation != "gelu_approximate":
            raise ValueError(
                f"GGUF's gpt2 architecture has full multi-head attention and the tanh GELU: this GPTCausalLM has "
                f"num_key_value_heads={b.num_key_value_heads}, activation={b.activation!r}."
            )
        return "gpt2", config, hf_gpt2
    if name == "GemmaCausalLM":
        _check_gemma3(b)
        return "gemma3", config, hf_gemma
    if name != "LlamaCausalLM":
        raise ValueError(
            f"Exporting to GGUF writes GPTCausalLM, LlamaCausalLM and GemmaCausalLM tasks. Received: a {name}."
        )
    head_dim = b.head_dim or b.hidden_dim // b.num_heads
    partial = b.rotary_dim not in (None, head_dim)
    if partial or b.sliding_window:
        _check_phi3(b)
        return "phi3", config, hf_phi3
    _refuse(
        b,
        "llama, qwen2, qwen3 and phi3",
        sliding_window=b.sliding_window,
        layer_types=b.layer_types,
        rope_layers=b.rope_layers,
        rotary_dim=b.rotary_dim if partial else None,
        mlp_bias=b.mlp_bias or None,
    )
    moe = dict(b.mixture_of_experts or {})
    output_bias = b.attention_bias if b.attention_output_bias is None else b.attention_output_bias
    if moe:
        _check_experts(b, moe, output_bias)
        architecture = "qwen3moe" if b.query_key_norm == "head" else "llama"
    elif b.query_key_norm == "head" and not b.attention_bias and not output_bias:
        architecture = "qwen3"
    elif b.query_key_norm is None and b.attention_bias and not output_bias:
        architecture = "qwen2"
    elif b.query_key_norm is None and bool(b.attention_bias) == bool(output_bias):
        architecture = "llama"
    else:
        raise ValueError(
            f"Exporting to GGUF: query_key_norm={b.query_key_norm!r}, attention_bias={b.attention_bias}, "
            f"attention_output_bias={b.attention_output_bias} fit none of llama, qwen2, qwen3."
        )
    return architecture, config, hf_moe if moe else hf_llama


def _refuse(b, architectures, **options):
    """A ValueError naming the first option that is not None: llama.cpp's `architectures` read no such option."""
    scaling = b.rope_scaling or {}
    if scaling and scaling.get("rope_type") != "linear":
        options["rope_scaling"] = scaling
    for option, value in options.items():
        if value is not None:
            raise ValueError(
                f"Exporting to GGUF: {type(b).__name__}'s {option}={value!r} is not written by this export "
                f"(llama.cpp's {architectures} architectures read no such option from the file)."
            )


def _check_experts(b, moe, output_bias):
    """llama.cpp's qwen3moe and llama experts: every layer routed, top-k weights renormalised, no shared expert."""
    _refuse(
        b,
        "qwen3moe and llama (Mixtral)",
        moe_layers=b.moe_layers if b.moe_layers is not None and not all(b.moe_layers) else None,
        **{"mixture_of_experts['normalize_top_k']": False if not moe.get("normalize_top_k", True) else None},
        **{"mixture_of_experts['shared_intermediate_dim']": moe.get("shared_intermediate_dim")},
    )
    if b.attention_bias or output_bias or b.query_key_norm not in (None, "head"):
        raise ValueError(
            f"Exporting to GGUF: a mixture of experts with attention_bias={b.attention_bias}, query_key_norm="
            f"{b.query_key_norm!r} is neither llama.cpp's qwen3moe (per-head norms) nor its llama (Mixtral)."
        )


def _check_phi3(b):
    """A LlamaBackbone with partial rotary or a window must be llama.cpp's phi3: no biases, norms or experts, the
    window on every layer, heads of D / H (phi3 writes no key_length), no rope scaling (its longrope is not ours)."""
    _refuse(
        b,
        "phi3",
        layer_types=b.layer_types,
        rope_layers=b.rope_layers,
        attention_bias=b.attention_bias or None,
        attention_output_bias=b.attention_output_bias or None,
        mlp_bias=b.mlp_bias or None,
        query_key_norm=b.query_key_norm,
        mixture_of_experts=b.mixture_of_experts,
        head_dim=b.head_dim if b.head_dim not in (None, b.hidden_dim // b.num_heads) else None,
        rope_scaling=b.rope_scaling,
    )


def _check_gemma3(b):
    """llama.cpp's gemma3: per-head query/key norms, no biases or attention soft-capping, every 6th layer global and
    the others windowed (when there is a window), queries scaled by 1 / sqrt(head size) (its 27B's 62 layers: by
    1 / sqrt(D / H))."""
    head_dim = b.head_dim or b.hidden_dim // b.num_heads
    scalar = b.hidden_dim // b.num_heads if b.num_layers == 62 else head_dim
    pattern = [
        "sliding_attention" if (i + 1) % _GEMMA3_PATTERN and b.sliding_window else "full_attention"
        for i in range(b.num_layers)
    ]
    _refuse(
        b,
        "gemma3",
        query_key_norm=b.query_key_norm if b.query_key_norm != "head" else None,
        attention_bias=b.attention_bias or None,
        attention_logit_soft_cap=b.attention_logit_soft_cap,
        layer_types=b.layer_types if list(b.layer_types or pattern) != pattern else None,
        query_pre_attn_scalar=b.query_pre_attn_scalar if b.query_pre_attn_scalar not in (None, scalar) else None,
    )


def _write_metadata(writer, task, architecture, config, file_type):
    b = task.backbone
    writer.add_name(task.name)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(b.max_sequence_length)
    writer.add_embedding_length(b.hidden_dim)
    writer.add_block_count(b.num_layers)
    writer.add_feed_forward_length(b.intermediate_dim)
    writer.add_head_count(b.num_heads)
    if architecture == "gpt2":
        writer.add_layer_norm_eps(b.norm_epsilon)
    elif architecture in ("phi3", "gemma3"):
        _write_phi3_gemma3(writer, b, architecture, config)
    else:
        head_dim = b.head_dim or b.hidden_dim // b.num_heads
        writer.add_head_count_kv(config["num_key_value_heads"])
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_rope_dimension_count(head_dim)
        writer.add_rope_freq_base(float(b.rope_max_wavelength))
        writer.add_layer_norm_rms_eps(b.norm_epsilon)
        writer.add_vocab_size(b.vocabulary_size)
        if b.mixture_of_experts:
            writer.add_expert_count(b.mixture_of_experts["num_experts"])
            writer.add_expert_used_count(b.mixture_of_experts["top_k"])
            if architecture == "qwen3moe":
                writer.add_expert_feed_forward_length(b.mixture_of_experts["intermediate_dim"])
        if b.rope_scaling:
            writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            writer.add_rope_scaling_factor(float(b.rope_scaling["factor"]))
    preprocessor = task.preprocessor
    if preprocessor is not None:
        add_bos = getattr(preprocessor, "add_start_token", True) and preprocessor.tokenizer.bos_token_id is not None
        gguf_tokenizer.write_tokenizer(writer, preprocessor.tokenizer, add_bos)


def _write_phi3_gemma3(writer, b, architecture, config):
    """The keys llama.cpp's converter writes for phi3 (partial rotary as rope.dimension_count, a window of 0 for
    none) and gemma3 (head size, the local layers' rotary base, the window, final soft-capping)."""
    head_dim = b.head_dim or b.hidden_dim // b.num_heads
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(b.norm_epsilon)
    if architecture == "phi3":
        writer.add_rope_dimension_count(b.rotary_dim or head_dim)
        writer.add_rope_freq_base(float(b.rope_max_wavelength))
        writer.add_sliding_window(b.sliding_window or 0)
        return
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(b.rope_max_wavelength))
    writer.add_rope_freq_base_swa(float(b.local_rope_max_wavelength or b.rope_max_wavelength))
    if b.sliding_window:
        writer.add_sliding_window(b.sliding_window)
    if b.final_logit_soft_cap:
        writer.add_final_logit_softcapping(float(b.final_logit_soft_cap))
    if b.rope_scaling:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(b.rope_scaling["factor"]))


__all__ = ["FORMAT", "GGUF_TYPES", "export_gguf"]
