"""Per-row tensor helpers of the decoding loop: read and write a column of the token buffer, pick maxima.

Axes: R decoded rows, L token buffer length, V vocabulary.
"""

from keras import ops

from keras_transformer.samplers import compile as compile_lib


def column(tokens, i, gather=False):
    """tokens (R, L), scalar i -> tokens[:, i] (R,).

    gather: True on PyTorch (`DecodeOptions.gather_columns`): eagerly one gather costs far less than Keras's
    slice at a tensor index, and compiled it keeps the index a tensor; XLA's loops take a dynamic slice.
    """
    if gather:
        return ops.take(tokens, i, axis=1)
    return ops.slice(tokens, (0, i), (ops.shape(tokens)[0], 1))[:, 0]


def write_column(tokens, i, values):
    """tokens (R, L) with column i replaced by values (R,)."""
    positions = ops.arange(ops.shape(tokens)[1], dtype="int32")[None, :]  # (1, L)
    return ops.where(positions == i, ops.cast(values, tokens.dtype)[:, None], tokens)


def first_argmax(x):
    """x (R, V) -> (R,) int32 index of each row's first maximum (a NaN counts as the maximum, as in argmax).

    Where XLA compiles the loop, the index of the first entry equal to the row's max: two vectorised
    reductions, where XLA on CPU runs `argmax` as a scalar (value, index) reduction (benchmarks/RESULTS.md,
    "first_argmax"). PyTorch keeps its one argmax kernel (`compile.native_argmax`).
    """
    if compile_lib.native_argmax():
        return ops.cast(ops.argmax(x, axis=-1), "int32")
    size = ops.shape(x)[-1]
    is_max = ops.logical_or(x == ops.max(x, axis=-1, keepdims=True), ops.isnan(x))
    return ops.min(ops.where(is_max, ops.arange(size, dtype="int32")[None, :], size), axis=-1)
