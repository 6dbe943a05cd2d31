"""Export for deployment: ONNX bundles and TensorFlow SavedModels, from any backend.

Under TensorFlow the task is exported in this process. Under JAX or PyTorch, an ONNX bundle whose
graphs the ONNX kernels build (a causal LM's prefill and decode step, `export/decode_graph.py`) is
written in this process too: it needs no tracing, only the weights. Anything else (SavedModels,
encoder and seq2seq graphs, steps the kernels do not cover) is written by a child process: the task
is saved to a temporary preset and `python -m keras_transformer.export` exports it with
`KERAS_BACKEND=tensorflow`. Either way the files do not depend on the backend a model was trained
with (the same weights give the same bytes).

Formats:
    "onnx": a deployment bundle (a directory): the ONNX graphs, `tokenizer.json`,
        `bundle.json` (graphs, their inputs and outputs, cache layout), for language
        models `generation_config.json`, and `generate.py`, the runner that needs only
        numpy, onnxruntime and tokenizers (see export/README.md).
    "tf_saved_model": a SavedModel with serving signatures for the forward pass and,
        for language models, a `generate` signature with the decoding loop in the graph.
    "huggingface": the folder `transformers`' `save_pretrained` writes (config.json,
        safetensors weights, generation_config.json, tokenizer), for vLLM, SGLang and TGI;
        written in this process from any backend (see `keras_transformer/convert/hf_export.py`).

`quantize="int8"` or `"int4"` (ONNX only): 8- or 4-bit weights, stored so by the ONNX kernels as a causal
LM's graphs are built, else by rewriting the written graphs (see `export/quantize.py`). A model with LoRA
enabled is exported with its LoRA factors merged into the kernels (on a copy: the model keeps its LoRA).

Writes are atomic: the export goes to a temporary directory next to the target, which is
renamed at the end; a failure leaves nothing behind, and an existing target is replaced
only with `overwrite=True`.

The exporters import tensorflow, tf2onnx and onnx only when they run, so this package
imports without them.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import keras

from keras_transformer import presets
from keras_transformer.convert import hf_export
from keras_transformer import progress
from keras_transformer.export import graphs
from keras_transformer.export import handover
from keras_transformer.export.decode_graph import Unsupported
from keras_transformer.export.onnx import write_onnx_bundle
from keras_transformer.export.quantize import check_mode, quantize_bundle
from keras_transformer.export.saved_model import write_saved_model
from keras_transformer.models.backbone import Backbone
from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.lora import lora_layers
from keras_transformer.models.masked_lm import MaskedLM
from keras_transformer.models.quantization import quantization_mode
from keras_transformer.models.seq2seq_lm import Seq2SeqLM
from keras_transformer.models.task import Task

FORMATS = ("onnx", "tf_saved_model", hf_export.FORMAT)
INSTALL_HINT = "pip install 'keras-transformer[export]'"
# What each format needs at export time (onnxruntime is what a bundle needs to run).
# What each format needs; TRACED: what a graph the ONNX kernels do not build needs besides (traced under
# TensorFlow, converted by tf2onnx). A causal LM's bundle needs only onnx and onnxruntime.
_REQUIREMENTS = {"onnx": ("onnx", "onnxruntime"), "tf_saved_model": ("tensorflow",)}
_TRACED = ("tensorflow", "tf2onnx")


def export_model(task, path, format="onnx", overwrite=False, quantize=None, verbose="auto", **options):
    """Export `task` to `path` as an ONNX bundle, a TensorFlow SavedModel or a Hugging Face folder.

    Args:
        task: a `keras_transformer` task: a causal LM (GPT), an encoder task (BERT
            masked LM or classifier) or a seq2seq LM (T5, Transformer).
        path: the directory to write; it must not exist unless `overwrite=True`.
        format: "onnx", "tf_saved_model" or "huggingface".
        overwrite: bool, replace an existing directory (atomically, at the end).
        quantize: None, "int8" or "int4" (format "onnx" only): the bundle's weights in 8 or 4 bits.
        verbose: "auto" (the default: for a model of 100M parameters or more), True or False: a line per phase
            of the export, and a progress bar over the layers where a phase goes layer by layer (ONNX) or over the
            tensors where it writes them one at a time (Hugging Face).
        **options: format "huggingface" only: `dtype` and `max_shard_size` (see
            `keras_transformer.convert.hf_export.export_hugging_face`).

    Returns:
        The `Path` of the written directory.

    Example:
    >>> # Writes files: not run by the doctests (tests/export runs it).
    >>> lm.export("out/gpt_onnx", format="onnx")  # doctest: +SKIP
    >>> # python out/gpt_onnx/generate.py --prompt "def add(" --sampler greedy
    """
    if format == hf_export.FORMAT:
        if quantize is not None:
            raise ValueError(
                f"format='huggingface' writes float weights: pass quantize=None. Received: quantize={quantize!r}"
            )
        return hf_export.export_hugging_face(task, path, overwrite=overwrite, verbose=verbose, **options)
    if options:
        raise ValueError(f"Unexpected arguments for format={format!r}: {sorted(options)}")
    return export_models(task, {path: format}, overwrite=overwrite, quantize=quantize, verbose=verbose)[0]


def export_models(task, targets, overwrite=False, quantize=None, verbose="auto"):
    """Export `task` to several directories at once: `{path: format}`.

    The same as one `export_model` per target, but under JAX or PyTorch a single TensorFlow child
    process writes them all when one is needed. Each directory is written atomically.

    Returns:
        The list of written `Path`s, in the order of `targets`.

    Example:
    >>> # A SavedModel is traced by TensorFlow, tens of seconds: not run by the doctests (tests/export runs it).
    >>> export_models(lm, {"out/onnx": "onnx", "out/saved_model": "tf_saved_model"})  # doctest: +SKIP
    """
    targets = [(Path(os.fspath(path)).expanduser().resolve(), format) for path, format in dict(targets).items()]
    if not targets:
        raise ValueError("`targets` is empty: pass at least one {path: format}.")
    for path, format in targets:
        if format not in FORMATS:
            raise ValueError(f"`format` must be one of {FORMATS}. Received: format={format!r}")
        if format == hf_export.FORMAT:
            raise ValueError("format='huggingface' is written by export_model (one directory per call).")
        if path.exists() and not overwrite:
            raise ValueError(f"{path} already exists: pass overwrite=True to replace it.")
    check_mode(quantize)
    if quantize is not None and any(format != "onnx" for _, format in targets):
        raise ValueError(
            f"`quantize` applies to format='onnx' only. Received: quantize={quantize!r} with "
            f"formats {sorted({format for _, format in targets})}"
        )
    if quantization_mode(task) is not None:
        raise ValueError(
            f"The task's weights are quantized ({quantization_mode(task)}) in Keras: export the float "
            f"model and pass quantize='int8' or 'int4' to quantize the exported graphs."
        )
    graphs.model_kind(task)  # an unsupported task is an error before any work
    verbose = progress.resolve(verbose, task)
    if lora_layers(task):
        task = _merged_copy(task)  # the graphs get plain kernels
    for format in dict.fromkeys(format for _, format in targets):
        check_requirements(format)

    def write_all(pending, written):
        # Each target in its own temporary directory, renamed when it is complete.
        if pending:
            (path, format), rest = pending[0], pending[1:]
            presets.atomic_dir(path, overwrite, lambda tmp: write_all(rest, written + [(tmp, format)]))
        else:
            _write_targets(task, written, quantize, verbose)

    write_all(targets, [])
    return [path for path, _ in targets]


def _merged_copy(task):
    """A copy of `task` whose LoRA factors are folded into its kernels (Keras saves LoRA layers merged)."""
    copy = type(task).from_config(task.get_config())
    with tempfile.TemporaryDirectory(prefix="keras_transformer_merge_") as scratch:
        weights = Path(scratch) / "merged.weights.h5"
        presets.save_weights_without_optimizer(task, weights)
        copy.load_weights(str(weights))
    return copy


def check_requirements(format, traced=False):
    """Raise one ImportError naming the `export` extra when a package `format` needs is missing.

    traced: also what a graph traced under TensorFlow needs (an ONNX graph the kernels do not build).
    """
    needed = _REQUIREMENTS[format] + (_TRACED if traced and format == "onnx" else ())
    missing = [name for name in dict.fromkeys(needed) if not _installed(name)]
    if missing:
        why = " (this model's graphs are traced under TensorFlow)" if traced and format == "onnx" else ""
        raise ImportError(
            f"Exporting to format={format!r}{why} needs {', '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_HINT}"
        )


def _write_targets(task, targets, quantize, verbose):
    """Write [(directory, format)]: the ONNX bundles the kernels build in this process, the rest traced under
    TensorFlow (in this process on TensorFlow, else in one child process)."""
    targets = _write_without_tracing(task, targets, quantize, verbose)
    for format in dict.fromkeys(format for _, format in targets):
        check_requirements(format, traced=True)
    if not targets:
        return
    if keras.config.backend() == "tensorflow":
        for directory, format in targets:
            write(task, directory, format, quantize, verbose)
        return
    formats = " and ".join(dict.fromkeys(format for _, format in targets))
    with progress.Phase(f"{formats}: traced in a TensorFlow child process", verbose):
        _write_in_tensorflow_child(task, targets)
    for directory, format in targets:
        if quantize is not None and format == "onnx":
            quantize_bundle(directory, quantize, verbose)


def _installed(package):
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a blocked import, or a module whose __spec__ is None
        return False


def write(task, directory, format, quantize=None, verbose=False):
    """Write the export of `task` into the existing empty `directory` (TensorFlow backend only)."""
    if keras.config.backend() != "tensorflow":
        raise RuntimeError("keras_transformer.export.write runs under the TensorFlow backend only.")
    if format == "onnx":
        write_onnx_bundle(task, directory, quantize=quantize, verbose=verbose)
    else:
        with progress.Phase("SavedModel: the forward pass and the decoding loops traced and written", verbose):
            write_saved_model(task, directory)


def _write_without_tracing(task, targets, quantize=None, verbose=False):
    """Write in this process each ONNX target whose graphs the ONNX kernels build; returns the targets left (the
    other formats, and bundles the kernels do not cover, their directories emptied again)."""
    left = []
    for directory, format in targets:
        if format != "onnx":
            left.append((directory, format))
            continue
        try:
            write_onnx_bundle(task, directory, traced=False, quantize=quantize, verbose=verbose)
        except Unsupported:
            for entry in Path(directory).iterdir():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            left.append((directory, format))
    return left


def _write_in_tensorflow_child(task, targets):
    """Hand `task` over to a child process under the TensorFlow backend (export/handover.py), which writes each
    (directory, format)."""
    with tempfile.TemporaryDirectory(prefix="keras_transformer_export_") as scratch:
        command = [sys.executable, "-m", "keras_transformer.export", *handover.hand_over(task, scratch)]
        env = {
            **os.environ,
            "KERAS_BACKEND": "tensorflow",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            # The parent (JAX or PyTorch) may hold the GPU; exporting is CPU work.
            "CUDA_VISIBLE_DEVICES": "-1",
        }
        for directory, format in targets:
            command += ["--write-into", str(directory), format]
        result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-25:])
        raise RuntimeError(
            f"Exporting under the TensorFlow backend (in a child process) failed with exit code "
            f"{result.returncode}:\n{tail}"
        )


def load_preset_task(preset, load_weights=True):
    """The task a preset directory (or registered name) holds, with its preprocessor if it has one.

    Presets written by `Task.save_to_preset` name their task class; presets holding only a
    backbone get their backbone's language-model task (see `language_model_task`).
    """
    path, config = presets.load_config(preset)
    class_name = (config.get("task") or {}).get("class_name")
    if class_name is not None:
        task_cls = presets.get_class(class_name, Task)
    else:
        task_cls = language_model_task(presets.get_class(config["backbone"]["class_name"], Backbone))
    has_tokenizer = "preprocessor" in config or (path / "tokenizer.json").is_file()
    preprocessor = "auto" if has_tokenizer and task_cls.preprocessor_cls is not None else None
    return task_cls.from_preset(str(path), load_weights=load_weights, preprocessor=preprocessor)


def language_model_task(backbone_cls):
    """The task class a backbone-only preset is exported as: the language model (causal, masked or
    seq2seq) built on exactly this backbone class; a ValueError when the family defines none."""

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = sorted(
        {
            cls
            for base in (CausalLM, MaskedLM, Seq2SeqLM)
            for cls in subclasses(base)
            if cls.backbone_cls is backbone_cls
        },
        key=lambda cls: cls.__name__,
    )
    if len(found) != 1:
        raise ValueError(
            f"A preset holding only a {backbone_cls.__name__} is exported as the language model built on it; "
            f"found {[cls.__name__ for cls in found] or 'none'}. Save the task itself (`task.save_to_preset`)."
        )
    return found[0]


__all__ = [
    "FORMATS",
    "INSTALL_HINT",
    "check_requirements",
    "export_model",
    "export_models",
    "language_model_task",
    "load_preset_task",
    "write",
]
