"""ONNX bundles: the writer of the bundle directory around the converted graphs (`onnx_converter.py`).

A bundle directory holds:
    prefill.onnx, decode.onnx        (causal LMs)
    encoder.onnx                     (encoder tasks)
    encoder.onnx, decoder.onnx       (seq2seq LMs)
    weights.data                     the weights, once: every graph's large initializers point into it (ONNX
                                     external data; the prefill and decode graphs share it). Not in a quantized
                                     bundle, whose graphs hold their 8- or 4-bit weights
    bundle.json                      kind, family, graphs with their inputs and outputs, cache layout
    generation_config.json           (LMs) special token ids, max length, how prompts are built
    tokenizer.json, tokenizer_config.json   (tasks with a preprocessor; the chat template, if any)
    generate.py and the modules it imports   the runner: numpy + onnxruntime + tokenizers only (+ jinja2 for
                                     chat): copies of export/runtime/ (`RUNTIME_FILES`) and of the package's
                                     chat_template.py (`SHARED_FILES`)
    batching.py, serve.py (+ theirs) continuous batching and the HTTP server (`python serve.py`)
    requirements.txt                 what those files need (no Keras, TensorFlow or PyTorch)
Nothing in it records when or from which backend it was exported, so exports of the same
weights are the same files.

Runs under the TensorFlow backend (see `keras_transformer.export`), or under any backend when every graph of the
task is built by the ONNX kernels (`write_onnx_bundle(..., traced=False)`).
"""

import shutil
from pathlib import Path

from keras_transformer.export import graphs as graph_lib
from keras_transformer.presets import write_json
from keras_transformer.export.decode_graph import Unsupported
from keras_transformer.export.onnx_converter import OPSET, convert
from keras_transformer.progress import Phase
from keras_transformer.export.quantize import quantize_bundle
from keras_transformer.export.weights_file import FILE_NAME as WEIGHTS_FILE, WeightsFile
from keras_transformer.decoding import LENGTH_BUCKET
from keras_transformer.decoding.decode_loop import refresh_after
from keras_transformer.tokenizers import chat_template

BUNDLE_FILE = "bundle.json"
GENERATION_CONFIG_FILE = "generation_config.json"
RUNTIME_FILE = "generate.py"
# export/runtime/'s files, copied into every bundle (see generate.py's docstring for what each does).
RUNTIME_FILES = (
    RUNTIME_FILE,
    "generator.py",
    "decode_loop.py",
    "sampling.py",
    "encoder.py",
    "bundle_files.py",
    "batching.py",
    "sequence.py",
    "cache_rows.py",
    "prefix_cache.py",
    "prompt_lookup.py",
    "constraint.py",
    "serve.py",
    "serve_constraints.py",
    "serve_endpoints.py",
    "serve_fields.py",
    "serve_logprobs.py",
    "serve_streaming.py",
    "serve_tools.py",
    "serve_validation.py",
    "requirements.txt",
)
# Package files a bundle carries as they are: the runtime imports them by these names. One implementation
# of chat templates and chat-message checks serves the Keras tokenizer and the bundle.
SHARED_FILES = {"chat_template.py": Path(chat_template.__file__)}
FORMAT_VERSION = 1

__all__ = [
    "BUNDLE_FILE",
    "FORMAT_VERSION",
    "GENERATION_CONFIG_FILE",
    "OPSET",
    "RUNTIME_FILE",
    "RUNTIME_FILES",
    "SHARED_FILES",
    "WEIGHTS_FILE",
    "convert",
    "generation_config",
    "runtime_dir",
    "write_onnx_bundle",
]


def runtime_dir():
    """The Keras-free runtime copied into every bundle: package data when installed, the repository's
    `export/runtime/` otherwise."""
    installed = Path(__file__).parent / "runtime"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "export" / "runtime"


def write_onnx_bundle(task, directory, traced=True, quantize=None, verbose=False):
    """Convert `task`'s graphs and write the bundle into the existing empty `directory`.

    A task whose graphs the ONNX kernels build (a causal LM's prefill and decode step) is written with no tracing,
    in any backend's process, its weights streamed once into `weights.data`; `quantize` ("int8" or "int4") stores
    them quantized there as they are built. Otherwise (`traced=True` only; else `decode_graph.Unsupported`, the
    directory left to the caller) its other graphs are traced under TensorFlow and converted by tf2onnx, and
    `quantize` rewrites the written graphs (`quantize.quantize_bundle`: each then holds its own weights).
    `verbose`: a line per phase, with a progress bar where it goes layer by layer (`progress.Phase`).
    """
    directory = Path(directory)
    kind = graph_lib.model_kind(task)
    try:
        graph_entries = _write_graphs(task, directory, traced=False, quantize=quantize, verbose=verbose)
        after = None
    except Unsupported:
        if not traced:
            raise
        # The weights file written again, from empty.
        graph_entries = _write_graphs(task, directory, traced=True, verbose=verbose)
        after = quantize
    bundle = {
        "format": "keras_transformer.onnx_bundle",
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "family": getattr(task.backbone, "family", None),
        "task": type(task).__name__,
        "opset": OPSET,
        "graphs": graph_entries,
        "vocabulary_size": int(task.backbone.vocabulary_size),
    }
    if kind != "encoder":
        layers, heads, head_dim = graph_lib.cache_dims(task)
        bundle["cache"] = {
            "num_layers": int(layers),
            "num_key_value_heads": int(heads),
            "head_dim": int(head_dim),
            "layout": "one float32 array per layer for keys and one for values: (batch, sequence, "
            "num_key_value_heads, head_dim) out of prefill and in a traced decode(r) graph; (batch, "
            "num_key_value_heads, sequence, head_dim) in a decode(r) graph with position_ids, "
            "which writes them in place, and in the cross_key_values it reads",
        }
        # A cache written within N goes stale once the sequence passes N (longrope): the runtime computes it
        # again, through the prefill graph, at the step that feeds position N (decoding/decode_loop.py).
        bundle["cache"]["refresh_after"] = refresh_after(task.backbone)
    write_json(directory / BUNDLE_FILE, bundle)
    if task.preprocessor is not None:
        task.preprocessor.tokenizer.save(directory)
    if kind == "encoder":
        write_json(directory / "preprocessor_config.json", _encoder_preprocessing(task))
    else:
        write_json(directory / GENERATION_CONFIG_FILE, generation_config(task))
    for name in RUNTIME_FILES:
        shutil.copyfile(runtime_dir() / name, directory / name)
    for name, source in SHARED_FILES.items():
        shutil.copyfile(source, directory / name)
    if after is not None:
        quantize_bundle(directory, after, verbose)


def _write_graphs(task, directory, traced, quantize=None, verbose=False):
    """Each graph of `task` as `{name}.onnx` in `directory`, their large weights in one weights file -> the bundle's
    `graphs` entries (file, inputs, outputs)."""
    graph_entries = {}
    with WeightsFile(directory / WEIGHTS_FILE) as weights:
        for graph in graph_lib.build_graphs(task, weights, traced=traced, quantize=quantize, verbose=verbose):
            with Phase(
                f"{graph.name} graph (traced by TensorFlow, converted by tf2onnx)", verbose and graph.model is None
            ):
                model = convert(graph, weights)
            filename = f"{graph.name}.onnx"
            graph_entries[graph.name] = {
                "file": filename,
                "inputs": [_describe(value) for value in model.graph.input],
                "outputs": [_describe(value) for value in model.graph.output],
            }
            _save(model, directory / filename)
            del model
    _check_saved(directory, [entry["file"] for entry in graph_entries.values()])
    return graph_entries


def generation_config(task):
    """Special ids, lengths and prompt building of an LM, for the runtime."""
    preprocessor = task.preprocessor
    tokenizer = preprocessor.tokenizer if preprocessor is not None else None
    config = {
        "family": getattr(task.backbone, "family", None),
        "kind": graph_lib.model_kind(task),
        "max_length": int(task.backbone.max_sequence_length),
        "bos_token_id": tokenizer.bos_token_id if tokenizer else None,
        "eos_token_id": tokenizer.eos_token_id if tokenizer else None,
        "pad_token_id": tokenizer.pad_token_id if tokenizer else None,
    }
    defaults = getattr(task, "generation_config", None)
    if defaults is not None and defaults.stop_token_ids is not None:
        config["stop_token_ids"] = list(defaults.stop_token_ids)  # what "auto" stops at, as `lm.generate`
    # The runner draws random-sampling noise as `RandomSampler` does, over a buffer of this bucket.
    config["noise_length_bucket"] = _keras_length_bucket()
    if config["kind"] == "decoder":
        config["add_start_token"] = bool(getattr(preprocessor, "add_start_token", True)) if preprocessor else False
    else:
        config["decoder_start_token_id"] = _decoder_start_token_id(task)
        config["add_end_token"] = bool(getattr(preprocessor, "add_end_token", True)) if preprocessor else False
        config["encoder_sequence_length"] = getattr(preprocessor, "encoder_sequence_length", None)
    return config


def _decoder_start_token_id(task):
    """The id `lm.generate` starts a seq2seq decoder from (the preprocessor's, else the task's, else 0)."""
    preprocessor = task.preprocessor
    start = getattr(preprocessor, "decoder_start_token_id", None) if preprocessor is not None else None
    if start is None:
        start = getattr(task, "decoder_start_token_id", None)
    return 0 if start is None else int(start)


def _keras_length_bucket():
    return int(LENGTH_BUCKET)


def _encoder_preprocessing(task):
    preprocessor = task.preprocessor
    tokenizer = preprocessor.tokenizer if preprocessor is not None else None
    return {
        "family": getattr(task.backbone, "family", None),
        "sequence_length": getattr(preprocessor, "sequence_length", None),
        "max_length": int(task.backbone.max_sequence_length),
        "cls_token_id": tokenizer.cls_token_id if tokenizer else None,
        "sep_token_id": tokenizer.sep_token_id if tokenizer else None,
        "pad_token_id": tokenizer.pad_token_id if tokenizer else None,
        "mask_token_id": tokenizer.mask_token_id if tokenizer else None,  # "[MASK]", RoBERTa's "<mask>", ...
    }


def _describe(value):
    from onnx import TensorProto

    tensor = value.type.tensor_type
    shape = [dim.dim_param or dim.dim_value for dim in tensor.shape.dim]
    return {"name": value.name, "dtype": TensorProto.DataType.Name(tensor.elem_type).lower(), "shape": shape}


def _save(model, path):
    import onnx

    onnx.save(model, str(path))  # small: its weights are in the weights file


def _check_saved(directory, files):
    """The ONNX checker on each saved graph (by path: its external tensors are looked up in the weights file,
    which is removed when no graph reads it)."""
    import onnx

    for name in files:
        onnx.checker.check_model(str(directory / name))
    weights = directory / WEIGHTS_FILE
    if weights.stat().st_size == 0:
        weights.unlink()
