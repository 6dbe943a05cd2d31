"""MaskedLM: the task base of encoder-only masked language models (predict hidden tokens)."""

import keras

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
