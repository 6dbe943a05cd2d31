"""Weights arranged for the PyTorch kernels (`torch_kernels.py`): compute dtypes, and every projection as
one `linear` product, float or Keras int8, alone or fused with others of the same input.

Axes: R decoded rows, T new tokens, D model width (a projection's input), O its outputs.
"""

import keras
import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def quantization(layer):
    """None (float weights), "int8" (Keras's int8 weights without LoRA: the kernels' fast path), or another mode."""
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode == "int8" and getattr(layer, "lora_enabled", False):
        return "int8 with LoRA"
    return mode


def value(weight):
    """A variable's tensor (a layer's weight may also be a plain tensor, e.g. derived from others)."""
    return weight.value if isinstance(weight, keras.Variable) else weight


def compute_dtype(layer):
    return DTYPES[layer.compute_dtype]


def weight(layer, weight, dtype=None):
    """A layer's weight as a plain tensor in its compute dtype (`dtype` overrides): a mixed-precision
    layer's float32 variable is cast once per call, as Keras casts it at every layer call."""
    return value(weight).detach().to(dtype or compute_dtype(layer))


def mark_static(arranged):
    """`arranged` with its tensors marked as static inputs of a compiled step: a CUDA graph reads them where
    they are instead of copying them into its own buffers at every replay, as it does with other inputs
    that are not parameters."""
    for tensor in torch.utils._pytree.tree_leaves(arranged):
        if isinstance(tensor, torch.Tensor):
            torch._dynamo.mark_static_address(tensor)
    return arranged


def projection(layer, width, scale=1.0):
    """A Dense / EinsumDense as `_linear`'s (kernel (in, out), bias (out,) or None, divisor, quantizer), its
    outputs times `scale`. Float weights: the kernel in the compute dtype, no divisor. Keras int8 weights:
    the int8 values as float32, the dequantization divisor (out,) and the inputs' quantizer (value range,
    epsilon), or None where only the weights are quantized; the products are Keras's int8 call's."""
    bias = None if layer.bias is None else weight(layer, layer.bias).reshape(-1) * scale
    if quantization(layer) is None:
        return weight(layer, layer.kernel).reshape(width, -1) * scale, bias, None, None
    kernel = value(layer._kernel).detach().float()  # e.g. (D, H, Dh) int8 values
    kernel_scale = value(layer.kernel_scale).detach().float()
    if hasattr(layer, "_adjust_scale_for_dequant"):  # an EinsumDense keeps its scale in its own layout
        kernel_scale = layer._adjust_scale_for_dequant(kernel_scale)
    divisor = torch.broadcast_to(kernel_scale, kernel.shape).reshape(width, -1)[0] / scale  # (out,): per output
    quantizer = getattr(layer, "inputs_quantizer", None)
    if quantizer is not None:
        quantizer = (float(quantizer.value_range[0]), float(quantizer.value_range[1]), float(quantizer.epsilon))
    return kernel.reshape(width, -1).contiguous(), bias, divisor, quantizer


def fused(parts):
    """Projections of one input side by side: (kernel (in, sum out), bias, divisor, quantizer) (see `_projection`)."""
    kernels, biases, divisors, quantizers = zip(*parts)
    if len(set(quantizers)) > 1 or len({d is None for d in divisors}) > 1 or len({b is None for b in biases}) > 1:
        raise ValueError("Projections fused into one product must share their quantization and biases.")
    return (
        torch.cat(kernels, dim=1).contiguous(),
        None if biases[0] is None else torch.cat(biases),
        None if divisors[0] is None else torch.cat(divisors),
        quantizers[0],
    )


def linear(x, kernel, bias, divisor=None, quantizer=None):
    """x (..., in) through a `_projection`: x @ kernel + bias; int8 weights as Keras's int8 call computes them
    (inputs quantized per row, the integer product, then divided by both scales)."""
    if divisor is None:
        y = x @ kernel  # (..., in) x (in, out)
    else:
        x32 = x.float()
        if quantizer is None:  # weight-only int8
            y = (x32 @ kernel) / divisor
        else:
            low, high, epsilon = quantizer
            scale = high / (x32.abs().amax(dim=-1, keepdim=True) + epsilon)  # (..., 1)
            y = (torch.clamp(torch.round(x32 * scale), low, high) @ kernel) / (scale * divisor)
        y = y.to(x.dtype)
    return y if bias is None else y + bias
