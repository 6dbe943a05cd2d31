"""Checks of input values on the host, before they reach a compiled graph.

A gather does not check its indices on every backend: JAX clamps an out-of-range token id to the
last embedding row and TensorFlow on an accelerator returns zeros, so a bad id gives a silently
wrong answer. These checks run in numpy, outside any graph, in time linear in the input size,
and raise a ValueError naming the argument, the bad value, where it is and the limit.

Used by `Backbone.__call__` and `Task.__call__` (numpy inputs only: backend tensors there may be
traced, or be the batches of a training step) and by `Task.fit` / `evaluate` / `predict` (numpy
inputs and eager backend tensors, once per call; text batches after preprocessing).

Axes: B batch, T length.
"""

import keras
import numpy as np


def check_inputs(model, x, y=None, sample_weight=None, convert_tensors=False, context=""):
    """Check the inputs (and labels, sample weights) of a Backbone or a Task; raise a ValueError.

    Args:
        model: a `Backbone`, or a task with a `backbone`. The checks follow the input names:
            `*token_ids` in [0, vocabulary_size) and at most max_sequence_length long,
            `segment_ids` in [0, num_segments), `*padding_mask` 0/1 of its ids' shape,
            `mask_positions` in [0, T).
        x: the inputs, a dict of arrays. Anything else that is not host data (symbolic or traced
            tensors, datasets, generators) is not inspected.
        y: None or labels (B, ...): finite integers in [0, num_classes) for a classifier, else
            [0, vocabulary_size).
        sample_weight: None or weights (B, ...): finite.
        convert_tensors: bool, also inspect eager backend tensors (copied to the host once).
        context: a prefix for the messages, e.g. "In `validation_data`: ".
    """
    names = _input_names(model)
    if names is None:
        return
    arrays = _input_arrays(x, names, convert_tensors, context)
    if arrays is None:
        return
    backbone = getattr(model, "backbone", model)
    batch_size = _check_input_shapes(arrays, context)
    for name, array in arrays.items():
        _check_input_values(name, array, arrays, backbone, context)
    if y is not None:
        labels = _host_array(y, convert_tensors)
        if labels is not None:
            num_classes = getattr(model, "num_classes", None)
            if num_classes:
                limit, limit_name = num_classes, "num_classes"
            else:
                limit, limit_name = backbone.vocabulary_size, "vocabulary_size"
            _check_finite("y", labels, context)
            _check_batch("y", labels, batch_size, context)
            _check_ints("y", labels, limit, limit_name, "label", context, integral_floats=True)
    if sample_weight is not None:
        weights = _host_array(sample_weight, convert_tensors)
        if weights is not None:
            _check_finite("sample_weight", weights, context)
            _check_batch("sample_weight", weights, batch_size, context)


def check_finite(**values):
    """Raise a ValueError naming the first argument (e.g. `y`, `sample_weight`) with a NaN or an infinity.

    Values that are not host data (None, strings, datasets, tensors) are not inspected.
    """
    for name, value in values.items():
        array = _host_array(value, convert_tensors=False)
        if array is not None:
            _check_finite(name, array, "")


def weigh(weights, sample_weight):
    """Token weights (B, T) times the user's `sample_weight` ((B,) per example or (B, T) per token).

    A preprocessor's helper: a weight count that differs from the batch, or a NaN, is a ValueError.
    """
    if sample_weight is None:
        return weights
    sample_weight = np.asarray(sample_weight, dtype="float32")
    _check_finite("sample_weight", sample_weight, "")
    _check_batch("sample_weight", sample_weight, weights.shape[0], "")
    if sample_weight.ndim == 1:
        return weights * sample_weight[:, None]  # (B,) -> (B, 1)
    if sample_weight.shape != weights.shape:
        raise ValueError(
            f"`sample_weight` must be (B,) or (B, T)={weights.shape}. Received: shape={sample_weight.shape}"
        )
    return weights * sample_weight


def check_not_empty_strings(texts, name):
    """Raise a ValueError naming `name` and the index of the first empty string in `texts` (a list of str)."""
    for index, text in enumerate(texts):
        if not text:
            raise ValueError(
                f"`{name}` holds an empty string at index {index}: every text needs at least one character. "
                f"Received: {name}[{index}]={text!r}"
            )


# --- helpers --------------------------------------------------------------------


def _input_names(model):
    try:
        inputs = model.input  # a functional model's inputs, as given to its constructor
    except (AttributeError, ValueError):
        return None
    return list(inputs) if isinstance(inputs, dict) else None


def _input_arrays(x, names, convert_tensors, context):
    """`x` -> {name: np.ndarray} in the model's input order, or None when `x` is not host data.

    A ValueError for an empty batch, a bare array in place of the dict, or a missing input.
    """
    if isinstance(x, (list, tuple)) and all(isinstance(part, (list, tuple)) and not part for part in (x or [()])):
        raise ValueError(f"{context}`x` is an empty batch: pass at least one example. Received: x={x!r}")
    arrays = _host_arrays(x, convert_tensors)
    if arrays is None:
        if isinstance(x, np.ndarray):
            raise ValueError(
                f"{context}`x` must be a dict of arrays with the keys {names}. Received: an array of shape {x.shape}"
            )
        return None
    missing = [name for name in names if name not in arrays]
    if missing:
        raise ValueError(
            f"{context}`x` has no {missing[0]!r}: the model's inputs are {names}. Received: keys {sorted(arrays)}"
        )
    return {name: arrays[name] for name in names}


def _check_input_shapes(arrays, context):
    """Every input finite and (B, T) with B, T > 0, one B for all -> B."""
    for name, array in arrays.items():
        _check_finite(name, array, context)
        if array.ndim != 2:
            raise ValueError(f"{context}`{name}` must be 2-D (batch, length). Received: shape={array.shape}")
        if array.shape[0] == 0:
            raise ValueError(
                f"{context}`{name}` is an empty batch: pass at least one example. Received: shape={array.shape}"
            )
        if array.shape[1] == 0:
            raise ValueError(f"{context}`{name}` has no positions. Received: shape={array.shape}")
    batch_sizes = {name: array.shape[0] for name, array in arrays.items()}
    if len(set(batch_sizes.values())) > 1:
        raise ValueError(f"{context}All inputs must have the same batch size. Received: {batch_sizes}")
    return next(iter(batch_sizes.values()))


def _check_input_values(name, array, arrays, backbone, context):
    """One input's values, by its name: ids in range, masks 0/1 of their ids' shape, positions in [0, T)."""
    if name.endswith("token_ids"):
        _check_ints(name, array, backbone.vocabulary_size, "vocabulary_size", "id", context)
        limit = getattr(backbone, "max_sequence_length", None)
        if limit is not None and array.shape[1] > limit:
            raise ValueError(
                f"{context}`{name}` has {array.shape[1]} positions, more than max_sequence_length={limit}. "
                f"Received: shape={array.shape}"
            )
    elif name.endswith("padding_mask") or name == "segment_ids":
        ids_name = "token_ids" if name == "segment_ids" else name.replace("padding_mask", "token_ids")
        if ids_name in arrays and array.shape != arrays[ids_name].shape:
            raise ValueError(
                f"{context}`{name}` must have the shape of `{ids_name}`. Received: {name}.shape={array.shape}, "
                f"{ids_name}.shape={arrays[ids_name].shape}"
            )
        if name == "segment_ids" and backbone.num_segments == 0 and np.any(array != 0):  # DistilBERT: no segments
            where = tuple(int(i) for i in np.argwhere(array != 0)[0])
            raise ValueError(
                f"{context}`segment_ids` must be zeros: the backbone has num_segments=0 (no segment embedding). "
                f"Received: {array[where]} at {list(where)}"
            )
        elif name == "segment_ids" and backbone.num_segments:
            _check_ints(name, array, backbone.num_segments, "num_segments", "id", context)
        elif array.dtype != bool:
            _check_values_in(name, array, (0, 1), context)
    elif name == "mask_positions" and "token_ids" in arrays:
        length = arrays["token_ids"].shape[1]
        _check_ints(name, array, length, "the length of token_ids", "position", context)


def _host_arrays(x, convert_tensors):
    """A dict of arrays -> {name: np.ndarray}, or None when any value is not host data."""
    if not isinstance(x, dict):
        return None
    arrays = {}
    for name, value in x.items():
        array = _host_array(value, convert_tensors)
        if array is None:
            return None
        arrays[name] = array
    return arrays


def _host_array(value, convert_tensors):
    """numpy arrays, lists and numbers as they are; eager backend tensors if asked; else None."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple, int, float, bool, np.generic)):
        try:
            array = np.asarray(value)
        except ValueError:  # ragged lists: leave them to Keras
            return None
        return array if array.dtype.kind in "biuf" else None
    if (
        convert_tensors
        and hasattr(value, "shape")
        and hasattr(value, "dtype")
        and not keras.backend.is_keras_tensor(value)
    ):
        try:
            return keras.ops.convert_to_numpy(value)
        except Exception:  # symbolic or traced: not inspectable here
            return None
    return None


def _check_finite(name, array, context):
    if array.dtype.kind in "fc" and array.size:
        bad = ~np.isfinite(array)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(
                f"{context}`{name}` has {array[where]} at {list(where)}: every value must be a finite number. "
                f"Received: {name} of shape {array.shape}"
            )


def _check_batch(name, array, batch_size, context):
    if array.ndim == 0 or array.shape[0] != batch_size:
        rows = "a scalar" if array.ndim == 0 else f"{array.shape[0]} rows"
        raise ValueError(
            f"{context}`{name}` has {rows} for {batch_size} examples in `x`: pass one per example. "
            f"Received: {name} of shape {array.shape}"
        )


def _check_ints(name, array, limit, limit_name, noun, context, integral_floats=False):
    """Integer values in [0, limit); a float dtype is an error unless `integral_floats` and whole."""
    if array.dtype.kind == "f" and integral_floats:
        fraction = array != np.round(array)
        if fraction.any():
            where = tuple(int(i) for i in np.argwhere(fraction)[0])
            raise ValueError(f"{context}`{name}` must hold integer {noun}s. Received: {array[where]} at {list(where)}")
    elif array.dtype.kind not in "iu":
        raise ValueError(f"{context}`{name}` must hold integer {noun}s. Received: dtype={array.dtype}")
    bad = (array < 0) | (array >= limit)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        value = array[where]
        value = int(value) if array.dtype.kind in "iu" or value == int(value) else value
        raise ValueError(
            f"{context}`{name}` has {noun} {value} at {list(where)}, outside [0, {limit}) ({limit_name}={limit})"
        )


def _check_values_in(name, array, allowed, context):
    bad = ~np.isin(array, allowed)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{context}`{name}` must hold only {' or '.join(map(str, allowed))} (or booleans). "
            f"Received: {array[where]} at {list(where)}"
        )
