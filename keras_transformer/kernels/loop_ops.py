"""The decoding loop's tensor operations whose fast form differs by backend, keyed by operation as the layer
kernels are keyed by layer type: the loop and the samplers call these and never a backend's own tensor methods.

Axes: R decoded rows, V vocabulary, Hkv key/value heads, S cache positions, Dh head size.
"""

import keras
from keras import ops


def first_argmax(x):
    """x (R, V) -> (R,) int32 index of each row's first maximum (a NaN counts as the maximum, as in argmax).

    Where XLA compiles the loop, the index of the first entry equal to the row's max: two vectorised
    reductions, where XLA on CPU runs `argmax` as a scalar (value, index) reduction (benchmarks/RESULTS.md,
    "first_argmax"). PyTorch keeps its one argmax kernel, several times faster than the two reductions there.
    """
    if keras.config.backend() == "torch":
        return ops.cast(ops.argmax(x, axis=-1), "int32")
    size = ops.shape(x)[-1]
    is_max = ops.logical_or(x == ops.max(x, axis=-1, keepdims=True), ops.isnan(x))
    return ops.min(ops.where(is_max, ops.arange(size, dtype="int32")[None, :], size), axis=-1)


def reorder_filled_rows(cache, index, filled):
    """Per layer (keys, values), each (R, Hkv, S, Dh), with the first `filled` positions of every row taken in
    the order `index` (R,), written in place; the positions after them are written before they are read.

    For steps that run op by op on PyTorch (`DecodeOptions.eager_rows`): no new (R, Hkv, S, Dh) buffer per
    layer and step, and on average half the positions of the chunk's width. Returns the cache (the same
    buffers, made contiguous where they were broadcast views).
    """
    if keras.config.backend() != "torch":
        raise ValueError(
            "An in-place row reorder runs on PyTorch tensors only (`DecodeOptions.eager_rows`). "
            f"Received: backend={keras.config.backend()!r}"
        )
    n, rows = int(filled), ops.convert_to_tensor(index).long()
    reordered = []
    for pair in cache:
        pair = tuple(t if t.is_contiguous() else t.contiguous() for t in pair)
        for t in pair:  # (R, Hkv, S, Dh)
            t[:, :, :n] = t[:, :, :n].index_select(0, rows)
        reordered.append(pair)
    return reordered
