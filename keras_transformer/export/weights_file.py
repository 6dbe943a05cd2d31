"""One file for a bundle's weights, written once, that every graph of the bundle reads (ONNX external data).

An initializer of `min_bytes` or more is not put in its graph: its bytes are appended to the file
(at an aligned offset, see `ALIGNMENT`) and the graph's TensorProto only
points at them (location, offset, length). A tensor whose bytes are already in the file (the same
embedding table read by the prefill and the decode graph, a kernel reshaped) points at the copy
already written, so each weight is stored once whatever number of graphs read it. Small tensors
(norm scales of a tiny model, shape constants) stay in their graph.

Each tensor is written when it is added, from the array handed in, and forgotten: the file is
streamed, and no graph ever holds a model's worth of weights in memory.
"""

import hashlib
from pathlib import Path

import numpy as np

FILE_NAME = "weights.data"  # a bundle's weights file
# Offsets: a tensor of a MiB or more starts on a page (ONNX Runtime maps it in place), a smaller one on 64 bytes
# (as onnx's own `align_offset` does for the large ones; pages for small tensors would bloat a small model's file).
ALIGNMENT, PAGE, PAGE_FROM_BYTES = 64, 4096, 2**20
MIN_BYTES = 1024  # smaller tensors stay in their graph (onnx's own default threshold for external data)


class WeightsFile:
    """`tensor(name, array)` -> an ONNX TensorProto whose bytes live in `path` (written there once).

    Use as a context manager, or `close()` it before a graph that points into it is loaded.

    Example:
    >>> import numpy as np, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "weights.data"
    >>> with WeightsFile(path) as weights:
    ...     a = weights.tensor("a", np.ones((64, 64), np.float32))
    ...     b = weights.tensor("b", np.ones((4096,), np.float32))  # the same bytes: stored once
    >>> path.stat().st_size, [entry.value for entry in b.external_data]
    (16384, ['weights.data', '0', '16384'])
    """

    def __init__(self, path, min_bytes=MIN_BYTES):
        self.path = Path(path)
        self.min_bytes = int(min_bytes)
        self._file = open(self.path, "wb")
        self._written = {}  # (dtype, sha256 of the bytes) -> (offset, length)

    def tensor(self, name, array):
        """`array` (numpy) as the initializer `name`: inline when small, else pointing into the file."""
        from onnx import TensorProto, helper, numpy_helper

        array = np.asarray(array)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")  # (not np.ascontiguousarray: it makes a scalar one-dimensional)
        if array.nbytes < self.min_bytes:
            return numpy_helper.from_array(array, name)
        data = memoryview(array.reshape(-1)).cast("B")
        key = (array.dtype.str, hashlib.sha256(data).hexdigest())
        if key not in self._written:
            alignment = PAGE if array.nbytes >= PAGE_FROM_BYTES else ALIGNMENT
            offset = -self._file.tell() % alignment + self._file.tell()
            self._file.seek(offset)
            self._file.write(data)
            self._written[key] = (offset, array.nbytes)
        offset, length = self._written[key]
        tensor = TensorProto(name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.data_location = TensorProto.EXTERNAL
        for field, value in (("location", self.path.name), ("offset", offset), ("length", length)):
            tensor.external_data.add(key=field, value=str(value))
        return tensor

    @property
    def size(self):
        """Bytes written so far (the file's size once closed)."""
        return self._file.tell() if not self._file.closed else self.path.stat().st_size

    def close(self):
        if not self._file.closed:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


__all__ = ["ALIGNMENT", "FILE_NAME", "MIN_BYTES", "PAGE", "WeightsFile"]
