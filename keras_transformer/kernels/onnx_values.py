"""What the ONNX decode graph (decode_graph.py) and its layer kernels (onnx_kernels.py) both build on:
`Value`, a tensor of the graph being built, `Unsupported`, raised for a step the kernels do not cover,
and `weight`, a variable as float32 numpy. They live in their own module so that decode_graph.py imports
the kernels and the kernels import these names, with no import cycle between the two.
"""

import keras
import numpy as np


class Unsupported(Exception):
    """The step needs something the ONNX kernels do not build; the export uses the traced step instead."""


class Value:
    """A tensor of the graph being built, by name; `+` of two values stays pending until a norm or a reader needs it.

    A pending sum x + branch (+ bias) is what a LayerNormalization turns into one
    SkipLayerNormalization node (which also outputs the sum for the residual stream).
    """

    def __init__(self, builder, name, branch=None, bias=None, index=None):
        self.builder, self.name, self.branch, self.bias, self.index = builder, name, branch, bias, index

    def __add__(self, other):
        if not isinstance(other, Value):
            raise Unsupported(f"adding a {type(other).__name__} to a graph value")
        plain = self.branch is None and self.bias is None and self.index is None
        if plain and other.branch is None and other.index is None:
            return Value(self.builder, self.name, branch=other.name, bias=other.bias)
        return Value(self.builder, self.builder.node("Add", [self.materialize(), other.materialize()]))

    def __mul__(self, factor):
        if not isinstance(factor, (int, float)):
            raise Unsupported(f"multiplying a graph value by a {type(factor).__name__}")
        return Value(self.builder, self.builder.node("Mul", [self.materialize(), self.builder.scalar(factor)]))

    def __getitem__(self, index):
        """x[:, ..., i] over leading axes, made only if something reads it (a step may index a cache for its length)."""
        index = index if isinstance(index, tuple) else (index,)
        if not all(isinstance(i, int) or i == slice(None) for i in index):
            raise Unsupported(f"indexing a graph value with {index!r}")
        return Value(self.builder, self.materialize(), index=index)

    def materialize(self):
        """The name of this value's tensor, adding the pending sum's (or indexing's) nodes if any."""
        name = self.name
        if self.index is not None:  # one Gather per integer index, the last axis first
            for axis, i in reversed(list(enumerate(self.index))):
                if isinstance(i, int):
                    name = self.builder.node("Gather", [name, self.builder.const("index", np.array(i))], axis=axis)
            self.index = None
        if self.bias is not None:
            if self.branch is None:
                name = self.builder.node("Add", [name, self.bias])
            else:
                branch = self.builder.node("Add", [self.branch, self.bias])
                self.branch, self.bias = branch, None
        if self.branch is not None:
            name = self.builder.node("Add", [name, self.branch])
        self.name, self.branch, self.bias = name, None, None
        return name


def weight(variable):
    """A Keras variable as a float32 numpy array (an initializer's value)."""
    return np.asarray(keras.ops.convert_to_numpy(variable), np.float32)


def matmul(kernels, layer, x, shape=None):
    """x @ the layer's kernel (reshaped to `shape`), its bias left pending: a `Value`."""
    b = kernels.builder
    kernel = weight(layer.kernel)
    y = b.matmul(x.materialize(), f"{layer.name}.kernel", kernel if shape is None else kernel.reshape(shape))
    bias = None if layer.bias is None else b.const(f"{layer.name}.bias", weight(layer.bias).reshape(-1))
    return Value(b, y, bias=bias)


def activation(kernels, name, y):
    """act(y + its pending bias) -> a tensor name, the bias inside the kernel where ONNX Runtime has one."""
    b = kernels.builder
    bias = [y.bias] if y.bias is not None else []
    if name == "gelu_approximate":  # 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        return b.node("FastGelu", [y.name] + bias, domain="com.microsoft")
    if name == "gelu":  # 0.5 x (1 + erf(x / sqrt 2))
        return b.node("BiasGelu" if bias else "Gelu", [y.name] + bias, domain="com.microsoft")
    x = y.materialize()
    if name == "relu":
        return b.node("Relu", [x])
    if name == "silu":
        return b.node("Mul", [x, b.node("Sigmoid", [x])])
    raise Unsupported(f"no ONNX kernel for the activation {name!r}")
