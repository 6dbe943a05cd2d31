"""Raw text given to `Task.fit` / `evaluate` / `predict`: recognising it, and a dataset of raw-text batches
turned into the preprocessed numpy batches the model trains on (the preprocessor runs on the host, per batch).
"""

import keras
import numpy as np


def first_leaf_is_text(x):
    """Whether `x` (strings, an array, nested lists or a dataset) holds raw text: its first leaf is a string."""
    if isinstance(x, (str, bytes)):
        return True
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "USO" and x.size > 0 and isinstance(x.reshape(-1)[0], (str, bytes))
    if isinstance(x, (list, tuple)):
        return len(x) > 0 and first_leaf_is_text(x[0])
    if is_dataset(x):
        return True  # datasets given to a task with a preprocessor are expected to hold text
    return False


def is_dataset(x):
    """A `keras.utils.PyDataset` or a `tf.data.Dataset` (recognised without importing TensorFlow)."""
    if isinstance(x, keras.utils.PyDataset):
        return True
    return type(x).__module__.startswith("tensorflow") and hasattr(x, "as_numpy_iterator")


class PreprocessedDataset(keras.utils.PyDataset):
    """Batches of raw text (tf.data or PyDataset) -> preprocessed numpy batches."""

    def __init__(self, source, preprocess):
        super().__init__()
        if isinstance(source, keras.utils.PyDataset):
            self._batches = source
        else:  # tf.data.Dataset: read once into host memory (notebook-scale text data)
            self._batches = list(source.as_numpy_iterator())
            if self._batches and not isinstance(self._batches[0], tuple) and np.ndim(self._batches[0]) == 0:
                raise ValueError("The tf.data.Dataset yields single strings: batch it first, e.g. `dataset.batch(16)`.")
        self._preprocess = preprocess

    def __len__(self):
        return len(self._batches)

    def __getitem__(self, index):
        batch = self._batches[index]
        if isinstance(batch, tuple):  # (x, y) or (x, y, sample_weight); seq2seq: (sources, targets)
            return _drop_none(self._preprocess(*batch))
        return _drop_none(self._preprocess(batch))


def _drop_none(batch):
    x, y, w = batch
    if w is not None:
        return x, y, w
    return (x, y) if y is not None else (x,)


__all__ = ["PreprocessedDataset", "first_leaf_is_text", "is_dataset"]
