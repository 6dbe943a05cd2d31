"""MaskedLM: the task base of encoder-only masked language models (predict hidden tokens)."""

import keras
from keras import ops

from keras_transformer.metrics import Perplexity
from keras_transformer.models.task import Task


class MaskedLM(Task):
    """Masked language model: logits (B, P, V) for the P selected positions of each sequence.

    The preprocessor picks the positions, hides the tokens there and returns
    the original ids as labels, with sample weight 0 for the padding
    selections of short texts (the loss and metrics ignore them). Compiled by
    default with AdamW, sparse cross-entropy, accuracy and perplexity over
    the masked tokens.
    """

    def default_weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy"), Perplexity()]


class OutputBias(keras.layers.Layer):
    """Adds a learned bias (V,) to logits (..., V): the only weight of a masked LM head's output layer (its decoder
    is the tied token embedding)."""

    def build(self, inputs_shape):
        self.bias = self.add_weight(name="bias", shape=(inputs_shape[-1],), initializer="zeros")

    def call(self, inputs):
        return inputs + ops.cast(self.bias, inputs.dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
