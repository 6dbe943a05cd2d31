"""A GGUF file's Q4_0 tensors kept 4-bit: `CausalLM.from_preset("model.gguf", quantize="int4")`.

Q4_0 stores each row of a weight (one output's inputs) in blocks of 32 values: a float16 scale d and 32 4-bit
numbers n, w = d (n - 8). Keras 3's sub-channel int4 (`Int4QuantizationConfig(block_size=32)`) stores, per output
and block of 32 inputs, a scale s and a zero point z, with w = s (q - z) and q in [-8, 7]: s = d, z = 0 and
q = n - 8 hold a Q4_0 block exactly (tests/convert/test_gguf_int4.py). So the blocks go into the int4 Dense and
EinsumDense layers as they are, with no float copy of the weight on the way.

How: the family's Hugging Face converter runs as it does for a float load, but `get` hands it the element numbers
of a tensor in the Hugging Face layout (gguf_names.TensorRead.arrange moves numbers as it moves values) rather than
its values. The converter transposes, slices and reshapes them into the kernel's shape exactly as it would the
weights, and `assign` reads from them which of the file's 4-bit numbers and scales each int4 kernel element takes.

Which tensors stay 4-bit: those of the layers `task.quantize("int4")` quantizes, the attention and feed-forward
projections. Each of them must be Q4_0 (any other type is a ValueError naming the tensor and its type, checked
before any weight is assigned: Q4_1, Q5_x and the K-quants store a float minimum or more bits, which Keras's int4
does not hold exactly, and requantizing F16 / Q8_0 weights is `task.quantize`'s job, not a loader's). The tensors
that stay float in a quantized model (the token embedding and an untied output head, which llama.cpp's Q4_0 files
store as Q6_K; norms, biases, a mixture of experts' router and stacked experts) are dequantized, of any type.

Axes: O outputs, I inputs, G blocks of 32 inputs, R and C a kernel's rows (its inputs) and columns (its outputs).
"""

import bisect

import keras
import numpy as np
from keras import quantizers

from keras_transformer.convert.checkpoint import CheckpointWeights
from keras_transformer.convert.gguf_names import TensorRead
from keras_transformer.layers.mixture_of_experts import MixtureOfExperts

MODES = ("int4",)
BLOCK = 32
_Q4_0_BYTES = 18  # a block: the float16 scale d, then 16 bytes of two 4-bit numbers each
# GGUF matrices that feed layers `task.quantize` leaves float.
_FLOAT_MATRICES = ("token_embd.weight", "position_embd.weight", "output.weight", "ffn_gate_inp.weight")


def q4_0_blocks(checkpoint, name):
    """The Q4_0 tensor `name` as (q (O, I) int8 in [-8, 7], d (O, G) float32), w = d q: as gguf's dequantization
    reads a block, the 16 low 4-bit halves are its first 16 values and the high halves the next 16."""
    shape = checkpoint.shape(name)  # (O, I)
    raw = np.asarray(checkpoint.tensors[name].data, dtype="uint8").reshape(-1, _Q4_0_BYTES)  # (O * G, 18)
    scale = raw[:, :2].copy().view("<f2").astype("float32")  # (O * G, 1)
    packed = raw[:, 2:]  # (O * G, 16)
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype("int8") - np.int8(8)  # (O * G, 32)
    return q.reshape(shape), scale.reshape(shape[0], shape[1] // BLOCK)


def check_q4_0(checkpoint):
    """Refuse a file whose projection weights (every matrix but `_FLOAT_MATRICES` and stacked experts) are not all
    Q4_0, naming the first such tensor and its type, before any layer is quantized."""
    for name in checkpoint.tensors:
        if len(checkpoint.shape(name)) != 2 or name.split(".", 2)[-1] in _FLOAT_MATRICES or name in _FLOAT_MATRICES:
            continue
        kind = checkpoint.tensor_type(name)
        if kind != "Q4_0":
            raise ValueError(
                f"from_preset(quantize='int4') keeps a GGUF file's Q4_0 projection weights 4-bit, and {checkpoint.path}"
                f"'s tensor {name!r} is {kind}: Keras's int4 holds Q4_0 blocks exactly, not {kind}'s. Load it with "
                "quantize=None (dequantized), then task.quantize('int4') to requantize; or write the file with "
                "llama.cpp's `llama-quantize --pure ... Q4_0`."
            )


def quantizable_layers(model):
    """{id(kernel variable): layer} of the float Dense / EinsumDense layers `task.quantize` would quantize (a
    mixture of experts' router stays float, as models/quantization.py leaves it)."""
    routers = {id(layer.router) for layer in model._flatten_layers() if isinstance(layer, MixtureOfExperts)}
    return {
        id(layer._kernel): layer
        for layer in model._flatten_layers()
        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))
        and layer.quantization_mode is None
        and id(layer) not in routers
    }


class Int4Weights(CheckpointWeights):
    """The weights a family converter reads (`get`) and assigns (`assign`) when loading a GGUF file with its Q4_0
    projections kept 4-bit (see the module docstring).

    Args:
        checkpoint: the GGUFFile.
        sources: {Hugging Face name: read()} (gguf_names.hf_tensors).
        model: the float task or backbone being loaded; its projection layers are quantized as they are assigned.
    """

    def __init__(self, checkpoint, sources, model):
        super().__init__(checkpoint.path)
        check_q4_0(checkpoint)
        self.checkpoint = checkpoint
        self._arrays = sources
        self.layers = quantizable_layers(model)
        self.names, self.starts, total = list(checkpoint.tensors), [], 0
        for name in self.names:
            self.starts.append(total)
            total += int(np.prod(checkpoint.shape(name), dtype=np.int64))
        self.index_dtype = "int32" if total < 2**31 else "int64"
        self.quantized = []

    def get(self, name):
        """A TensorRead's element numbers in the Hugging Face layout (values for everything else)."""
        if name not in self._arrays:
            raise ValueError(f"The GGUF checkpoint {self.path} has no tensor for {name!r}, which the model needs.")
        self.used.add(name)
        read = self._arrays[name]
        if not isinstance(read, TensorRead) or read.shift:
            return read()
        start = self.starts[self.names.index(read.name)]
        numbers = np.arange(start, start + self._size(read.name), dtype=self.index_dtype)
        return read.arrange(numbers.reshape(self.checkpoint.shape(read.name)))

    def assign(self, variable, value, source):
        if tuple(variable.shape) != tuple(value.shape):
            raise ValueError(
                f"Shape mismatch converting {source}: the checkpoint gives {tuple(value.shape)}, "
                f"our variable {variable.path} has {tuple(variable.shape)}."
            )
        index = np.asarray(value)
        if index.dtype != self.index_dtype:  # values: a tensor `get` did not number
            return super().assign(variable, value, source)
        name = self._tensor_of(index, source)
        local = index - self.starts[self.names.index(name)]
        layer = self.layers.get(id(variable))
        if layer is None:  # a float variable (an embedding, a norm, a bias): the tensor dequantized
            return super().assign(variable, self.checkpoint.tensor(name).ravel()[local], source)
        self._quantize(layer, name, local, source)

    def check_same(self, name, reference_name):
        if self.has(name) and not np.array_equal(self._arrays[name](), self._arrays[reference_name]()):
            raise ValueError(
                f"The checkpoint's {name!r} differs from {reference_name!r}, but this model ties them: "
                "untied output embeddings are not supported for this family."
            )

    def _size(self, name):
        return int(np.prod(self.checkpoint.shape(name), dtype=np.int64))

    def _tensor_of(self, index, source):
        first = bisect.bisect_right(self.starts, int(index.min())) - 1
        if first != bisect.bisect_right(self.starts, int(index.max())) - 1:
            raise ValueError(f"Converting {source}: one variable reads several GGUF tensors, which int4 cannot keep.")
        return self.names[first]

    def _quantize(self, layer, name, local, source):
        """Quantize `layer` to sub-channel int4 (32-wide blocks) and write the Q4_0 tensor `name`'s numbers and
        scales into it; `local`: the tensor's element numbers in the kernel's shape."""
        q, scale = q4_0_blocks(self.checkpoint, name)  # (O, I), (O, G)
        inputs = q.shape[1]
        layer.quantize("int4", config=quantizers.Int4QuantizationConfig(block_size=BLOCK))
        rows = getattr(layer, "_int4_rows", local.shape[0])  # an EinsumDense's reduced axes lead its kernel
        flat = local.reshape(rows, -1)  # (R, C)
        blocks = (flat // inputs) * (inputs // BLOCK) + (flat % inputs) // BLOCK  # (R, C): each element's Q4_0 block
        grouped = blocks.reshape(rows // BLOCK, BLOCK, -1) if rows % BLOCK == 0 else None  # (R / 32, 32, C)
        if grouped is None or (grouped != grouped[:, :1]).any():
            raise ValueError(
                f"Converting {source}: the Q4_0 blocks of {name!r} do not fall on the 32-input groups of "
                f"{layer.path}'s int4 kernel ({rows} inputs), so it cannot keep them 4-bit."
            )
        packed, _, _ = quantizers.pack_int4(q.ravel()[flat], axis=-1)  # (R, C) -> (R, ceil(C / 2))
        layer._kernel.assign(packed)
        layer.kernel_scale.assign(scale.ravel()[grouped[:, 0]])  # (R / 32, C)
        layer.kernel_zero.assign(np.zeros(layer.kernel_zero.shape, "int8"))
        self.assigned.update(id(v) for v in (layer._kernel, layer.kernel_scale, layer.kernel_zero, layer.g_idx))
        self.quantized.append(layer.path)


__all__ = ["BLOCK", "MODES", "Int4Weights", "check_q4_0", "q4_0_blocks", "quantizable_layers"]
