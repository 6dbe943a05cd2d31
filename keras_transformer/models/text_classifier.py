"""TextClassifier: the task base of sequence classifiers (one label per text or text pair)."""

import keras
import numpy as np

from keras_transformer.models.task import Task


class TextClassifier(Task):
    """Text (or text pair) -> logits (B, num_classes) float32.

    Compiled by default with AdamW, sparse categorical cross-entropy from
    logits and accuracy. Subclasses store `num_classes` and return it (and any
    head argument) from `get_config`.
    """

    def default_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

    def default_weighted_metrics(self):
        return None

    def fit(self, x=None, y=None, batch_size=None, sample_weight=None, validation_data=None, **kwargs):
        # Validation data always has labels: a tuple starting with raw text is (x, y[, sample_weight]),
        # never a text pair (a pair is the x inside it: ((texts_a, texts_b), labels)).
        if isinstance(validation_data, tuple) and validation_data and self._is_raw(validation_data[0]):
            validation_data = self._preprocess(*validation_data, batch_size=batch_size)
            validation_data = tuple(part for part in validation_data if part is not None)
        return super().fit(
            x, y, batch_size=batch_size, sample_weight=sample_weight, validation_data=validation_data, **kwargs
        )

    def _preprocessor_kwargs(self):
        # Labels pass through the preprocessor, which checks them against our head's width.
        return {"num_classes": self.num_classes}

    def _preprocess(self, x, y=None, sample_weight=None, batch_size=None, predict=False):
        if isinstance(y, (list, tuple, np.ndarray)) and not self._is_raw(x):  # already tokenized: check here
            y = check_labels(y, len(y), self.num_classes)
        return super()._preprocess(x, y, sample_weight, batch_size, predict)


def check_labels(labels, num_examples, num_classes=None):
    """Labels -> (B,) int32; a wrong count, a non-integer or an out-of-range label is a ValueError."""
    array = np.asarray(labels)
    if array.ndim == 2 and array.shape[1] == 1:
        array = array[:, 0]  # (B, 1) -> (B,)
    if array.ndim != 1:
        raise ValueError(f"Labels must be one integer per example. Received: labels of shape {array.shape}")
    if array.shape[0] != num_examples:
        raise ValueError(f"Got {array.shape[0]} labels for {num_examples} texts: pass exactly one label per text.")
    if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
        array = array.astype("int64")
    if array.dtype.kind not in "iub":
        raise ValueError(f"Labels must be integers (class indices). Received: labels of dtype {array.dtype}")
    upper = np.inf if num_classes is None else num_classes
    bad = array[(array < 0) | (array >= upper)]
    if bad.size:
        bound = "be non-negative" if num_classes is None else f"be in [0, num_classes) with num_classes={num_classes}"
        raise ValueError(f"Labels must {bound}. Received: label {bad[0]}")
    return array.astype("int32")
