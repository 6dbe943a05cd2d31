"""CausalLM: the task base of decoder-only language models (next-token prediction)."""

import keras

from keras_transformer.metrics import Perplexity
from keras_transformer.models.task import Task


class CausalLM(Task):
    """Next-token language model: logits (B, T, V) from token ids; loss ignores padding.

    Compiled by default with AdamW, masked sparse cross-entropy, token accuracy
    and perplexity. Generation (`generate`) is provided by the samplers.
    """

    default_learning_rate = 1e-3

    def default_weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy"), Perplexity()]
