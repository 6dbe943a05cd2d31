"""LoRA on a backbone: low-rank updates of chosen projections, built on Keras's own `enable_lora`.

Keras's `Dense` and `EinsumDense` carry LoRA themselves: `layer.enable_lora(rank)` adds two
float32 factors A (..., r) and B (r, ...), freezes the kernel, and the layer's `kernel` reads
kernel + (alpha / r) A @ B. This module picks the layers by name, freezes everything else
(embeddings and norms included), writes and reads the factors alone, and folds them into
the kernels.

A mixture of experts' stacked experts (E, D, I) are neither Dense nor EinsumDense: they get no factors and
stay frozen, and `enable_lora` says so in a warning. Its router is a Dense named "router", a target like
any other projection.

A LoRA file is safetensors: tensors `lora.{i}.a` / `lora.{i}.b` for the i-th LoRA layer in
the backbone's layer order, and metadata {"format", "rank", "target_names", "layers"}.
"""

import json
import logging
import os

import keras
import numpy as np

from keras_transformer import presets
from keras_transformer.layers.mixture_of_experts import MixtureOfExperts
from keras_transformer.models.quantization import one_gc_collect

_log = logging.getLogger("keras_transformer")

DEFAULT_TARGET_NAMES = ("query", "value")  # the attention query and value projections
FORMAT = "keras_transformer.lora/1"
_LORA_TYPES = (keras.layers.Dense, keras.layers.EinsumDense)


def projection_layers(model):
    """Every Dense / EinsumDense layer below `model`, in its layer order."""
    return [layer for layer in model._flatten_layers(include_self=False) if isinstance(layer, _LORA_TYPES)]


def lora_layers(model):
    """The projection layers of `model` that have LoRA enabled, in layer order."""
    return [layer for layer in projection_layers(model) if layer.lora_enabled]


def enable_lora(model, rank, target_names=None):
    """Enable rank-`rank` LoRA on the projections of `model` named in `target_names`; freeze the rest."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValueError(f"`rank` must be a positive int. Received: rank={rank!r}")
    if isinstance(target_names, str):
        target_names = [target_names]
    names = list(DEFAULT_TARGET_NAMES if target_names is None else target_names)
    candidates = projection_layers(model)
    available = sorted({layer.name for layer in candidates})
    unknown = [name for name in names if name not in available]
    if not names or unknown:
        raise ValueError(
            f"`target_names` must name projection layers of this {type(model).__name__}. "
            f"Received: target_names={target_names!r}; no layer is named {unknown}. Available: {available}"
        )
    if lora_layers(model):
        raise ValueError(
            f"LoRA is already enabled on this {type(model).__name__} (rank {lora_rank(model)}). "
            "Call merge_lora() first to start over."
        )
    if any(layer.quantization_mode not in (None, "int8", "int4") for layer in candidates):
        raise ValueError("LoRA works on float, int8 or int4 weights only.")
    model.trainable = True
    for layer in model._flatten_layers(include_self=False):
        layer.trainable = False  # embeddings, norms and the projections that get no LoRA
    for layer in candidates:
        if layer.name in names:
            layer.trainable = True
            layer.enable_lora(rank)  # adds A and B, freezes the kernel
            if layer.bias is not None:
                layer.bias.trainable = False  # only the LoRA factors train
    model._lora_target_names = tuple(dict.fromkeys(names))
    mixtures = [layer for layer in model._flatten_layers() if isinstance(layer, MixtureOfExperts)]
    if mixtures:
        _log.warning(
            "keras_transformer: enable_lora(%d) gives the stacked experts of %d mixture-of-experts layer(s) "
            "(%s, ...) no LoRA factors: they stay frozen (only Dense and EinsumDense layers get LoRA)",
            rank,
            len(mixtures),
            mixtures[0].path,
        )


def lora_rank(model):
    """The LoRA rank of `model`, or None when LoRA is not enabled."""
    layers = lora_layers(model)
    return layers[0].lora_rank if layers else None


def lora_target_names(model):
    """The layer names LoRA was enabled on (in the order given), or () when not enabled."""
    return tuple(dict.fromkeys(layer.name for layer in lora_layers(model))) if lora_layers(model) else ()


def save_lora_weights(model, path):
    """Write the LoRA factors of `model` (and nothing else) to the safetensors file `path`."""
    from safetensors.numpy import save_file

    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"LoRA is not enabled on this {type(model).__name__}: call enable_lora(rank) first.")
    tensors = {}
    for i, layer in enumerate(layers):
        tensors[f"lora.{i}.a"] = np.ascontiguousarray(keras.ops.convert_to_numpy(layer.lora_kernel_a))
        tensors[f"lora.{i}.b"] = np.ascontiguousarray(keras.ops.convert_to_numpy(layer.lora_kernel_b))
    metadata = {
        "format": FORMAT,
        "rank": str(lora_rank(model)),
        "target_names": json.dumps(list(_given_target_names(model))),
        "layers": json.dumps([_relative_path(model, layer) for layer in layers]),
    }
    presets.atomic_file(os.fspath(path), lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def load_lora_weights(model, path):
    """Put the LoRA factors saved by `save_lora_weights` back on `model` (same rank and targets)."""
    from safetensors import safe_open

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"No LoRA weights file at {path}.")
    try:
        with safe_open(path, framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as error:  # safetensors raises its own error types for damaged files
        raise ValueError(f"Corrupt or not a safetensors file {path}: {error}") from None
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path} is not a keras_transformer LoRA file (format {metadata.get('format')!r}).")
    rank, names = int(metadata["rank"]), tuple(json.loads(metadata["target_names"]))
    saved_layers = json.loads(metadata["layers"])
    layers = lora_layers(model)
    if not layers:
        raise ValueError(
            f"LoRA is not enabled on this {type(model).__name__}: call enable_lora(rank={rank}, "
            f"target_names={list(names)}) before load_lora_weights."
        )
    here = [_relative_path(model, layer) for layer in layers]
    if rank != lora_rank(model) or saved_layers != here:
        raise ValueError(
            f"The LoRA weights in {path} (rank={rank}, target_names={list(names)}, {len(saved_layers)} layers) "
            f"do not fit this model (rank={lora_rank(model)}, target_names={list(_given_target_names(model))}, "
            f"{len(here)} layers). Nothing was loaded."
        )
    pairs = [(layer.lora_kernel_a, tensors[f"lora.{i}.a"]) for i, layer in enumerate(layers)]
    pairs += [(layer.lora_kernel_b, tensors[f"lora.{i}.b"]) for i, layer in enumerate(layers)]
    mismatched = [(v.path, tuple(v.shape), value.shape) for v, value in pairs if tuple(v.shape) != value.shape]
    if mismatched:
        raise ValueError(f"The LoRA weights in {path} have other shapes than this model's: {mismatched[:3]}.")
    for variable, value in pairs:
        variable.assign(value)


def merge_lora(model):
    """Fold every layer's A @ B into its kernel and remove the factors; every weight trains again."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError(f"LoRA is not enabled on this {type(model).__name__}: nothing to merge.")
    for layer in layers:
        if layer.quantization_mode is not None:
            raise ValueError(f"merge_lora works on float weights; layer {layer.path!r} is {layer.quantization_mode}.")
    with one_gc_collect():  # Keras collects garbage for every deleted variable (1 s each in a large process)
        for layer in layers:
            _merge(layer)
    for sublayer in model._flatten_layers():
        sublayer.trainable = True  # every layer and weight trains again
    model._lora_target_names = ()


def _merge(layer):
    merged = keras.ops.convert_to_numpy(layer.kernel)  # kernel + (alpha / r) A @ B
    layer._tracker.unlock()
    del layer.lora_kernel_a  # Layer.__delattr__ untracks the variable
    del layer.lora_kernel_b
    layer._tracker.lock()
    layer.lora_enabled = False
    layer.lora_rank = None
    layer._kernel.assign(merged.astype(layer._kernel.dtype))
    for variable in (layer._kernel, layer.bias):
        if variable is not None:
            variable.trainable = True  # enable_lora froze them one by one; the layer setter does not reach them


def _given_target_names(model):
    return getattr(model, "_lora_target_names", None) or lora_target_names(model)


def _relative_path(model, layer):
    """The layer's path below `model` (without the model's own, possibly numbered, name)."""
    return layer.path.split("/", 1)[-1] if layer.path.startswith(model.name + "/") else layer.path
