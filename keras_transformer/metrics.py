"""Perplexity: exp of the mean token cross-entropy, ignoring padded positions."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(keras.metrics.Mean):
    """exp(mean cross-entropy) over the tokens whose sample weight is non-zero.

    Args:
        from_logits: bool, whether predictions are logits.
        name: metric name.

    Example:
    >>> import numpy as np
    >>> metric = Perplexity()
    >>> metric.update_state(np.array([[1]]), np.log(np.array([[[0.5, 0.5]]])))
    >>> round(float(metric.result()), 3)
    2.0
    """

    def __init__(self, from_logits=True, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.from_logits = from_logits

    def update_state(self, y_true, y_pred, sample_weight=None):
        loss = keras.losses.sparse_categorical_crossentropy(
            y_true, ops.cast(y_pred, "float32"), from_logits=self.from_logits
        )
        # Every token counts once, across batches of any length: `Mean` would reduce (B, T) to per-row means
        # first, weighing a short batch's tokens more than a long one's.
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")  # (B,) per row or (B, T) per token
            while len(sample_weight.shape) < len(loss.shape):
                sample_weight = ops.expand_dims(sample_weight, -1)
            sample_weight = ops.reshape(ops.broadcast_to(sample_weight, ops.shape(loss)), (-1,))
        super().update_state(ops.reshape(loss, (-1,)), sample_weight=sample_weight)  # (B, T) -> (B * T,)

    def result(self):
        return ops.exp(super().result())

    def get_config(self):
        return {**super().get_config(), "from_logits": self.from_logits}
