"""Quantized weights: Keras's own int8 / int4 quantization of a model's projections.

Only `Dense` and `EinsumDense` layers are quantized (attention projections, feed-forward and
dense heads): they hold most of the weights and Keras dequantizes them inside `call`. Embedding
tables stay float, since decoding reads the tied head's table directly (`Task.decode_head`).

A mixture of experts (`MixtureOfExperts`) keeps its stacked experts (E, D, I) float: they are neither Dense
nor EinsumDense, and `quantize` says so in a warning naming them. Its router (a Dense of D x E) stays float
too, as the usual recipes for quantized MoE checkpoints keep the gate: it is a negligible share of the weights,
and int8 noise in its logits would change which experts a token picks, not only by how much.
"""

import gc
import logging
from contextlib import contextmanager

import keras

from keras_transformer.layers.mixture_of_experts import MixtureOfExperts

MODES = ("int8", "int4")
_TYPES = (keras.layers.Dense, keras.layers.EinsumDense)
_log = logging.getLogger("keras_transformer")


def quantize(model, mode, parent_quantize, config=None):
    """Quantize the float Dense / EinsumDense layers of `model` with `parent_quantize` (keras.Model.quantize);
    `config`: None or a Keras `QuantizationConfig` (e.g. int4 with a block size)."""
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")
    if not model.built:
        raise ValueError(f"Build the {type(model).__name__} (call it once) before quantizing it.")
    mixtures = [layer for layer in model._flatten_layers() if isinstance(layer, MixtureOfExperts)]
    routers = {id(layer.router) for layer in mixtures}
    if mixtures:
        _log.warning(
            "keras_transformer: quantize(%r) leaves the stacked experts and the router of %d mixture-of-experts "
            "layer(s) float (%s, ...): only Dense and EinsumDense layers are quantized",
            mode,
            len(mixtures),
            mixtures[0].path,
        )
    with one_gc_collect():
        parent_quantize(
            mode,
            config=config,
            filters=lambda layer: (
                isinstance(layer, _TYPES) and layer.quantization_mode is None and id(layer) not in routers
            ),
        )


@contextmanager
def one_gc_collect():
    """Keras runs `gc.collect()` for every variable a layer drops (`Layer.__delattr__`: quantizing, merging
    LoRA), and each one is slow in a process holding TensorFlow and JAX (benchmarks/RESULTS.md, "Quantize: one
    gc.collect"): collect once, at the end, instead."""
    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect
        collect()


def quantization_mode(model):
    """The mode the layers of `model` are quantized in ("int8", "int4"), or None for float weights."""
    modes = {layer.quantization_mode for layer in model._flatten_layers() if isinstance(layer, _TYPES)}
    modes.discard(None)
    if len(modes) > 1:
        raise ValueError(f"The layers of this {type(model).__name__} are quantized in several modes: {sorted(modes)}")
    return modes.pop() if modes else None
