"""Per-row tensor helpers of the decoding loop: read and write a column of the token buffer.

Axes: R decoded rows, L token buffer length.
"""

from keras import ops


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
