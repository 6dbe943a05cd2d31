"""WeightRecorder: a converter's `load_weights` run backwards, to write our weights in a checkpoint's layout."""

import bisect
import weakref

import keras
import numpy as np

from keras_transformer.convert.streamed_tensor import StreamedTensor, host_view

_SLICE = 2**22  # elements flattened at a time in `assign`


class WeightRecorder:
    """A stand-in for `CheckpointWeights` that runs a converter's `load_weights` backwards.

    `get(name)` returns the element numbers of the tensor `name` (numbers from one range shared by
    all tensors, laid out in the tensor's Hugging Face shape); the converter transposes, reshapes
    and slices them exactly as it would the weights and hands them to `assign` with the variable
    they belong to. `assign` then writes the variable's values at those numbers into that tensor's
    buffer.

    A tensor's buffer exists only while it is being filled: once every element of it is written
    (exactly once), it goes to `sink(name, array)` and is dropped, so an export streams tensor by
    tensor and holds about one layer's tensors at a time, never a copy of the whole model. A tensor
    that is one variable exactly, or its 2D transpose, has no buffer: the sink gets a `StreamedTensor`
    (streamed_tensor.py) that reads the variable a block at a time. Without a `sink`, the finished
    tensors are kept for `arrays()`.
    """

    def __init__(self, shapes, values=None, sink=None):
        self.shapes = shapes
        self.values = values or {}  # id(variable) -> the float value to write instead of the variable's own
        self.names, self.starts, total = list(shapes), [], 0
        for shape in shapes.values():
            self.starts.append(total)
            total += int(np.prod(shape, dtype=np.int64))
        self.total = total
        self.index_dtype = "int32" if total < 2**31 else "int64"
        self.tied = {}  # name -> the name of the tensor it is a copy of
        self.finished = {}  # name -> the array, when there is no sink
        self.sink = sink or self.finished.__setitem__
        self.sent = set()  # the names handed to the sink
        self.pending = {}  # name -> [buffer (N,), write counts (N,), elements written]
        self.handed_out = {}  # id(numbers) -> (name, weak reference to the numbers `get` returned)

    def has(self, name):
        return name in self.shapes

    def get(self, name):
        if name not in self.shapes:
            raise ValueError(f"The Hugging Face model has no tensor {name!r}, which the export needs.")
        start = self.starts[self.names.index(name)]
        numbers = np.arange(start, start + self._size(name), dtype=self.index_dtype)
        self.handed_out[id(numbers)] = (name, weakref.ref(numbers))  # to know it again in `assign` (see `_whole`)
        return numbers.reshape(self.shapes[name])

    def put(self, variable, name, transform=None):
        """As `CheckpointWeights.put`; an untransformed tensor is the variable itself, so it goes to the sink as a
        `StreamedTensor` with no element numbers at all (an embedding's would be as large as the embedding)."""
        if transform is not None:
            return self.assign(variable, transform(self.get(name)), name)
        if name not in self.shapes:
            raise ValueError(f"The Hugging Face model has no tensor {name!r}, which the export needs.")
        if tuple(variable.shape) != tuple(self.shapes[name]):
            raise ValueError(
                f"Shape mismatch exporting {name}: the Hugging Face layout gives {self.shapes[name]}, "
                f"our weight has {tuple(variable.shape)}."
            )
        if name in self.sent or name in self.pending:
            raise ValueError(f"The export wrote the Hugging Face tensor {name!r} more than once.")
        self.sent.add(name)
        self.sink(name, StreamedTensor(self.values.get(id(variable), variable), self.shapes[name]))

    def assign(self, variable, value, source):
        index = np.asarray(value)
        if tuple(variable.shape) != index.shape:
            raise ValueError(
                f"Shape mismatch exporting {source}: the Hugging Face layout gives {index.shape}, "
                f"our weight has {tuple(variable.shape)}."
            )
        # A dequantized int8 kernel's value; else a variable, or a tensor (a LoRA layer's `kernel` reads
        # kernel + (alpha / r) A @ B).
        weight = self.values.get(id(variable), variable)
        # The tensor exactly as `get` gave it (e.g. an embedding), or its transpose (a Linear's plain `.T`): no
        # buffer, no scatter, and the weight read a block at a time as it is written.
        for numbers, transposed in ((index, False), (index.T, True)) if index.ndim == 2 else ((index, False),):
            whole = self._whole(numbers)
            if whole is not None:
                self.sent.add(whole)
                self.sink(whole, StreamedTensor(weight, self.shapes[whole], transposed))
                return
        view = host_view(weight)  # the weight's own memory where the backend has it on the host: no copy in float32
        values = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(weight, "float32")) if view is None else view)
        values = values.astype("float32", copy=False)
        # In slices along the first axis, so that the flattened numbers (a copy when the converter transposed
        # them) and their offsets never cost more than a slice: a large embedding's are 3x its size otherwise.
        rows = max(1, _SLICE // max(1, int(np.prod(index.shape[1:], dtype=np.int64)))) if index.ndim else 1
        for begin in range(0, max(1, index.shape[0] if index.ndim else 1), rows):
            part = (index, values) if not index.ndim else (index[begin : begin + rows], values[begin : begin + rows])
            self._scatter(part[0].ravel(), part[1].ravel())

    def skip(self, layer, reason):
        del layer, reason  # weights the checkpoint has no place for (e.g. a pooler a masked LM does not use)

    def check_same(self, name, reference_name):
        if name in self.shapes:
            self.tied[name] = reference_name

    def report(self, *args, **kwargs):
        del args, kwargs

    def finish(self):
        """Check that every tensor but the tied copies went to the sink, each element written exactly once (and
        send the empty ones)."""
        for name in self.names:
            if name in self.tied and name in self.sent:
                raise ValueError(f"The export wrote the Hugging Face tensor {name!r}, which is a tied copy of another.")
            if name in self.tied or name in self.sent:
                continue
            if not self._size(name):  # nothing to write, but the checkpoint lists it
                self.sent.add(name)
                self.sink(name, np.zeros(self.shapes[name], "float32"))
                continue
            how = "partly" if name in self.pending else "not at all"
            raise ValueError(
                f"The export wrote the Hugging Face tensor {name!r} {how}: the model and the Hugging Face "
                "class do not have the same weights."
            )

    def arrays(self):
        """{name: array in the Hugging Face shape} but for the tied copies (without a sink)."""
        self.finish()
        return {name: np.asarray(self.finished[name]) for name in self.names if name not in self.tied}

    def _size(self, name):
        return int(np.prod(self.shapes[name], dtype=np.int64))

    def _whole(self, index):
        """The name of the tensor whose numbers `index` is, in order, as `get` returned them; else None."""
        root = index
        while isinstance(root.base, np.ndarray):
            root = root.base
        name, numbers = self.handed_out.get(id(root), (None, None))
        if numbers is None or numbers() is not root:
            return None
        whole = index.flags.c_contiguous and index.size == root.size and index.ctypes.data == root.ctypes.data
        return name if whole and name not in self.pending and name not in self.sent else None

    def _tensor_of(self, element):
        return bisect.bisect_right(self.starts, int(element)) - 1

    def _scatter(self, index, values):
        """Write flat `values` at the flat element numbers `index`, tensor by tensor."""
        if not index.size:
            return
        first, last = self._tensor_of(index.min()), self._tensor_of(index.max())
        if first == last:  # the usual case: a variable is (part of) one checkpoint tensor
            self._write(first, index - self.starts[first], values)
            return
        tensors = np.searchsorted(self.starts, index, side="right") - 1  # e.g. one fused variable, several tensors
        for tensor in np.unique(tensors):
            chosen = tensors == tensor
            self._write(int(tensor), index[chosen] - self.starts[tensor], values[chosen])

    def _write(self, tensor, local, values):
        """Write `values` at the element numbers `local` of tensor number `tensor`; send it on when it is full."""
        name = self.names[tensor]
        size = self._size(name)
        if name in self.sent:
            raise ValueError(f"The export wrote the Hugging Face tensor {name!r} more than once.")
        if name not in self.pending:
            self.pending[name] = [np.zeros(size, "float32"), np.zeros(size, "uint8"), 0]
        entry = self.pending[name]
        buffer, counts = entry[0], entry[1]
        buffer[local] = values
        counts[local] += 1  # the numbers within one assignment are distinct
        entry[2] += local.size
        if entry[2] < size:
            return
        if counts.min() != 1 or counts.max() != 1:
            raise ValueError(
                f"The export wrote the Hugging Face tensor {name!r} more than once: the model and the Hugging Face "
                "class do not have the same weights."
            )
        del self.pending[name]
        self.sent.add(name)
        self.sink(name, buffer.reshape(self.shapes[name]))
