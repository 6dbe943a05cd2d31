"""The layer types a cached decoding step is made of, each with its kernel's name: one table for every
runtime that runs a step without Keras.

A runtime (`kernels/torch_kernels.py` for PyTorch, `kernels/onnx_kernels.py` for ONNX graphs) defines a
function `_<name>(kernels, layer, *call arguments)` per name and binds them with `bind(globals())`. A new
layer type that decoding steps use is one entry here plus one function per runtime: `bind` refuses a
runtime that lacks it, and tests/kernels/test_kernel_table.py, generated from the table, holds every
runtime's kernel to the Keras layer's numbers.
"""

import keras

from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.mixture_of_experts import MixtureOfExperts
from keras_transformer.layers.positional_embedding import PositionalEmbedding
from keras_transformer.layers.relative_position_bias import RelativePositionBias
from keras_transformer.layers.rms_normalization import RMSNormalization
from keras_transformer.layers.transformer_decoder_block import TransformerDecoderBlock

KERNEL_NAMES = {
    keras.layers.ReversibleEmbedding: "reversible_embedding",
    PositionalEmbedding: "positional_embedding",
    keras.layers.LayerNormalization: "layer_norm",
    keras.layers.RMSNormalization: "rms_norm",
    RMSNormalization: "rms_norm",  # with `scale_offset` (Gemma's 1 + w)
    keras.layers.Dense: "dense",
    keras.layers.Dropout: "dropout",
    RelativePositionBias: "relative_position_bias",
    FeedForward: "feed_forward",
    MixtureOfExperts: "mixture_of_experts",
    TransformerDecoderBlock: "decoder_block",
}


def bind(namespace):
    """{layer type: kernel} from a runtime module's namespace (its `_<name>` functions).

    Raises:
        ValueError: the namespace lacks a kernel of the table.
    """
    missing = sorted(name for name in KERNEL_NAMES.values() if not callable(namespace.get(f"_{name}")))
    if missing:
        raise ValueError(
            f"A decoding runtime must define a kernel for every layer type of the table; "
            f"missing: {', '.join('_' + name for name in missing)}"
        )
    return {layer_type: namespace[f"_{name}"] for layer_type, name in KERNEL_NAMES.items()}
