"""StreamedTensor: a checkpoint tensor that is exactly one of our weights, read from it a block at a time."""

import keras
import ml_dtypes
import numpy as np

_BLOCK = 2**22  # elements read at a time (16 MB in float32)


def _float32(value):
    """A variable, a backend tensor or a numpy array -> a float32 numpy array."""
    if isinstance(value, np.ndarray):
        return np.asarray(value, dtype="float32")
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(value, "float32")), dtype="float32")


def host_view(value):
    """`value`'s elements as a numpy array that shares its memory, where the backend keeps it in host memory (a
    tensor or variable on the CPU); else None. Blocks sliced from it cost no backend operation: slicing a JAX
    variable block by block ran one operation per block and left its freed 16 MB buffers in the allocator, holding
    most of an embedding's size after its export (tests/export/test_export_memory.py)."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, keras.Variable):
        value = value.value
    backend = keras.config.backend()
    if backend == "jax" and all(device.platform == "cpu" for device in value.devices()):
        return np.asarray(value)  # a read-only view of the CPU buffer
    if backend == "torch" and value.device.type == "cpu":
        import torch  # the backend's own

        if value.dtype == torch.bfloat16:  # numpy's bfloat16 is ml_dtypes': the same bits
            return value.detach().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return value.detach().numpy()
    if backend == "tensorflow":
        tensor = value.value() if hasattr(value, "read_value") else value  # a variable's current value: no copy
        if "CPU" in tensor.device:
            return np.asarray(tensor)
    return None


class StreamedTensor:
    """A checkpoint tensor whose elements are one weight's, in the weight's order or transposed.

    An export that wrote such a tensor from a whole copy of the weight (or of its transpose) would hold
    the weight twice; this reads it in blocks of leading-axis slices instead, so a writer holds one
    block (at most about 16 MB) at a time. A large embedding is the tensor this matters for.

    Args:
        source: a Keras variable, a backend tensor or a numpy array: our weight, in our layout.
        shape: the tensor's shape in the checkpoint, with as many elements as `source`.
        transposed: bool, whether the checkpoint holds the 2D `source` transposed (a torch Linear's
            (out, in) weight against our (in, out) kernel).

    `blocks()` yields the tensor's values as flat float32 arrays in the checkpoint's row-major order;
    `numpy.asarray(tensor)` gives the whole tensor (for a consumer that needs it at once).
    """

    def __init__(self, source, shape, transposed=False):
        self.source = source
        self.shape = tuple(shape)
        self.transposed = transposed
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = 4 * self.size  # as numpy's: the bytes of the whole tensor in float32
        if transposed and len(source.shape) != 2:
            raise ValueError(f"Only a 2D weight streams transposed. Received: shape={tuple(source.shape)}")

    def blocks(self):
        source_shape = tuple(self.source.shape)
        if not source_shape:  # a scalar
            yield _float32(self.source).reshape(-1)
            return
        view = host_view(self.source)
        source = self.source if view is None else view  # blocks sliced from the view, else read from the backend
        if self.transposed:  # our (C, R) is the checkpoint's (R, C): its rows are our columns
            step = max(1, _BLOCK // max(1, source_shape[0]))
            for begin in range(0, source_shape[1], step):
                yield np.ascontiguousarray(_float32(source[:, begin : begin + step]).T).reshape(-1)  # (n, C)
            return
        per_row = self.size // max(1, source_shape[0])
        step = max(1, _BLOCK // max(1, per_row))
        for begin in range(0, source_shape[0], step):
            yield _float32(source[begin : begin + step]).reshape(-1)

    def __array__(self, dtype=None, copy=None):
        del copy  # always a new array
        whole = np.concatenate([np.zeros(0, "float32"), *self.blocks()])
        return whole.reshape(self.shape).astype(dtype or "float32", copy=False)


__all__ = ["StreamedTensor", "host_view"]
