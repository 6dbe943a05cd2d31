"""WeightRecorder: a converter's `load_weights` run backwards, to write our weights in a checkpoint's layout."""

import keras
import numpy as np


class WeightRecorder:
    """A stand-in for `CheckpointWeights` that runs a converter's `load_weights` backwards.

    `get(name)` returns the element numbers of the tensor `name` (numbers from one range shared by
    all tensors, laid out in the tensor's Hugging Face shape); the converter transposes, reshapes
    and slices them exactly as it would the weights and hands them to `assign` with the variable
    they belong to. `assign` then writes the variable's values at those numbers, so the buffer
    ends up holding every tensor in the checkpoint's layout.
    """

    def __init__(self, shapes, values=None):
        self.shapes = shapes
        self.values = values or {}  # id(variable) -> the float value to write instead of the variable's own
        self.offsets, total = {}, 0
        for name, shape in shapes.items():
            self.offsets[name] = total
            total += int(np.prod(shape, dtype=np.int64))
        self.buffer = np.zeros(total, dtype="float32")
        self.written = np.zeros(total, dtype="uint8")
        self.index_dtype = "int32" if total < 2**31 else "int64"
        self.tied = {}  # name -> the name of the tensor it is a copy of

    def has(self, name):
        return name in self.shapes

    def get(self, name):
        if name not in self.shapes:
            raise ValueError(f"The Hugging Face model has no tensor {name!r}, which the export needs.")
        start = self.offsets[name]
        size = int(np.prod(self.shapes[name], dtype=np.int64))
        return np.arange(start, start + size, dtype=self.index_dtype).reshape(self.shapes[name])

    def assign(self, variable, value, source):
        index = np.asarray(value)
        if tuple(variable.shape) != index.shape:
            raise ValueError(
                f"Shape mismatch exporting {source}: the Hugging Face layout gives {index.shape}, "
                f"our weight has {tuple(variable.shape)}."
            )
        if id(variable) in self.values:  # a dequantized int8 kernel
            values = self.values[id(variable)]
        else:  # a variable, or a tensor (a LoRA layer's `kernel` reads kernel + (alpha / r) A @ B)
            values = keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32"))
        self.buffer[index.ravel()] = values.ravel()
        self.written[index.ravel()] += 1  # the numbers within one tensor are distinct

    def skip(self, layer, reason):
        del layer, reason  # weights the checkpoint has no place for (e.g. a pooler a masked LM does not use)

    def check_same(self, name, reference_name):
        if name in self.shapes:
            self.tied[name] = reference_name

    def report(self, *args, **kwargs):
        del args, kwargs

    def arrays(self):
        """{name: array in the Hugging Face shape} but for the tied copies; every element written exactly once."""
        out = {}
        for name, shape in self.shapes.items():
            if name in self.tied:
                continue
            start = self.offsets[name]
            size = int(np.prod(shape, dtype=np.int64))
            counts = self.written[start : start + size]
            if size and (counts.min() != 1 or counts.max() != 1):
                how = "more than once" if counts.max() > 1 else "not at all" if counts.max() == 0 else "partly"
                raise ValueError(
                    f"The export wrote the Hugging Face tensor {name!r} {how}: the model and the Hugging Face "
                    "class do not have the same weights."
                )
            out[name] = self.buffer[start : start + size].reshape(shape)
        return out
