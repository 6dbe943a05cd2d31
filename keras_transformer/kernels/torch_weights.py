"""Weights arranged for the PyTorch kernels (`torch_kernels.py`): compute dtypes, and every projection as
one `linear` product, float or Keras int8 / int4 (with or without LoRA), alone or fused with others of the
same input.

Axes: R decoded rows, T new tokens, D model width (a projection's input), O its outputs.
"""

import keras
import torch
import torch.nn.functional as F

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def quantization(layer):
    """None (float weights, LoRA merged by the layer's `kernel`), "int8" or "int4" (Keras's quantized
    weights), "int8 with LoRA" or "int4 with LoRA", or another mode (float8, GPTQ, ...: Keras's calls)."""
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode in ("int8", "int4") and getattr(layer, "lora_enabled", False):
        return f"{mode} with LoRA"
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
    """A Dense / EinsumDense as `linear`'s (kernel (in, out), bias (out,) or None, divisor, quantizer, LoRA),
    its outputs times `scale`. Float weights: the kernel in the compute dtype (a float layer's LoRA merged
    into it), no divisor. Keras int8 weights: the int8 values as float32, the dequantization divisor (out,)
    and the inputs' quantizer (value range, epsilon), or None where only the weights are quantized; the
    products are Keras's int8 call's. Keras int4 weights: see `_int4_projection`. LoRA over quantized
    weights: its own low-rank product (`_lora`), added as Keras's quantized calls add it."""
    bias = None if layer.bias is None else weight(layer, layer.bias).reshape(-1) * scale
    mode = quantization(layer)
    if mode is None:
        return weight(layer, layer.kernel).reshape(width, -1) * scale, bias, None, None, None
    lora = None
    if mode.endswith(" with LoRA"):
        mode, lora = mode.removesuffix(" with LoRA"), _lora(layer, width, scale)
    if mode == "int4":
        return _int4_projection(layer, width, scale, bias) + (lora,)
    kernel = value(layer._kernel).detach().float()  # e.g. (D, H, Dh) int8 values
    kernel_scale = value(layer.kernel_scale).detach().float()
    if hasattr(layer, "_adjust_scale_for_dequant"):  # an EinsumDense keeps its scale in its own layout
        kernel_scale = layer._adjust_scale_for_dequant(kernel_scale)
    divisor = torch.broadcast_to(kernel_scale, kernel.shape).reshape(width, -1)[0] / scale  # (out,): per output
    return kernel.reshape(width, -1).contiguous(), bias, divisor, _inputs_quantizer(layer), lora


def unpack_int4(packed, columns):
    """(rows, ceil(columns / 2)) int8, two signed 4-bit values a byte (the low nibble first, as Keras's
    `pack_int4` along the last axis) -> (rows, columns) int8 in [-8, 7], contiguous.

    Keras's own `unpack_int4` gives the same values, but through many small ops (far slower; see
    benchmarks/RESULTS.md, "int4 weights") and transposed, a layout that the few-row products read slowly.
    """
    low = torch.bitwise_right_shift(torch.bitwise_left_shift(packed, 4), 4)  # int8 shifts: sign-extended
    high = torch.bitwise_right_shift(packed, 4)
    values = torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)  # (rows, packed, 2) -> (rows, 2 packed)
    return values[:, :columns].contiguous()


def _dequantize_groups(values, zero, scale, groups, block_size):
    """Keras's `dequantize_with_sz_map` (group axis 0) in float32: (values - zero[g]) * scale[g], values
    (in, out) int8, zero and scale (n_groups, out), groups (in,) each row's group. Where the groups are
    Keras's blocks of `block_size` consecutive rows (as `quantize` makes them) and fill the rows, the same
    arithmetic broadcast over a (n_groups, block_size, out) view: no gathered (in, out) zeros and scales."""
    rows, count = values.shape[0], zero.shape[0]
    blocks = rows == count * block_size or count == 1
    if blocks and torch.equal(groups, torch.arange(rows, device=groups.device) // block_size):
        view = values.view(count, rows // count, -1).float()  # (in, out) -> (n_groups, rows a group, out)
        return view.sub_(zero[:, None]).mul_(scale[:, None]).view(rows, -1)  # -> (in, out)
    return (values.float() - zero[groups]) * scale[groups]


def _scaled(kernel, scale):
    """kernel times `scale`, skipped (no pass over the weights) where it is 1."""
    return kernel if scale == 1.0 else kernel * scale


def _lora(layer, width, scale):
    """LoRA over quantized weights as (A (in, m r), B (m r, out)), B times alpha / rank and `scale`.

    Keras's factors: A has the kernel's shape with the last axis r, B (r, the kernel's last axis). An
    EinsumDense kernel (D, H, Dh) has A (D, H, r): each of the m = H heads its own r columns, all sharing
    B, so B goes on the diagonal m times: x @ A -> (H r), then each head's r through B -> (H Dh).
    """
    a = weight(layer, layer.lora_kernel_a)  # kernel.shape[:-1] + (r,)
    b = weight(layer, layer.lora_kernel_b) * (layer.lora_alpha / layer.lora_rank * scale)  # (r, last)
    rank = a.shape[-1]
    a = a.reshape(width, -1)  # -> (in, m r)
    copies = a.shape[1] // rank
    if copies > 1:
        b = torch.block_diag(*[b] * copies)  # -> (m r, m last)
    return a.contiguous(), b.contiguous()


def _inputs_quantizer(layer):
    """The layer's inputs quantizer as (low, high, epsilon), or None (only the weights are quantized)."""
    quantizer = getattr(layer, "inputs_quantizer", None)
    if quantizer is None:
        return None
    return float(quantizer.value_range[0]), float(quantizer.value_range[1]), float(quantizer.epsilon)


def _int4_projection(layer, width, scale, bias):
    """`projection` of Keras int4 weights, unpacked once (two signed nibbles a byte, `unpack_int4`; the
    kernels keep what this returns) into the form Keras's int4 call computes with:

    - sub-channel (`quantize("int4")`'s default, groups of `block_size` inputs with a scale and a zero
      point each): Keras dequantizes the whole kernel, (values - zero) * scale in float32, cast to the
      compute dtype, then runs a float product; so the kernel is that float kernel, no divisor.
    - per channel (block_size -1 / None), Dense: the int8 path's form, integer values and the divisor (out,).
    - per channel, EinsumDense: Keras divides the values by the scale first, then takes a float product;
      the same float kernel here (with an inputs quantizer, the int8 form: the same up to rounding).

    Keras keeps the kernel as (rows, columns) = (the input axes, the output axes) flattened, packed along
    the columns: for every projection here that is the (in, out) layout of `width` rows.
    """
    packed = value(layer._kernel).detach()  # (in, ceil(out / 2)) int8, two values a byte
    columns = getattr(layer, "_int4_unpacked_column_size", None) or layer._orig_output_dim
    values = unpack_int4(packed, columns)  # -> (in, out) int8 in [-8, 7]
    kernel_scale = value(layer.kernel_scale).detach().float()
    block_size = getattr(layer, "_int4_block_size", None)
    dtype = compute_dtype(layer)
    if block_size is not None and block_size > 0:
        groups = value(layer.g_idx).detach().long()  # (in,): each input row's group
        zero = value(layer.kernel_zero).detach().float()  # (n_groups, out)
        kernel = _dequantize_groups(values, zero, kernel_scale, groups, block_size).to(dtype)
        return _scaled(kernel.reshape(width, -1), scale), bias, None, None
    quantizer = _inputs_quantizer(layer)
    if hasattr(layer, "_int4_unpacked_column_size") and quantizer is None:  # EinsumDense, weights only
        kernel = values.to(dtype) / kernel_scale.to(dtype)  # (in, out) / (out,)
        return _scaled(kernel.reshape(width, -1), scale), bias, None, None
    return values.float().reshape(width, -1).contiguous(), bias, kernel_scale.reshape(-1) / scale, quantizer


def fused(parts):
    """Projections of one input side by side: (kernel (in, sum out), bias, divisor, quantizer, LoRA) (see
    `projection`), or ([the parts], None, None, None, None) where they differ in quantization or biases.
    LoRA factors, where any part has them: A side by side (in, sum r), B block-diagonal
    (sum r, sum out), a part without LoRA taking no rows of B."""
    kernels, biases, divisors, quantizers, loras = zip(*parts)
    if len(set(quantizers)) > 1 or len({d is None for d in divisors}) > 1 or len({b is None for b in biases}) > 1:
        # Quantized differently (a model quantized in part) or biased in part: one product each, side by
        # side (`linear` takes the list).
        return list(parts), None, None, None, None
    lora = None
    if any(factors is not None for factors in loras):
        empty = [(k.new_zeros((k.shape[0], 0)), k.new_zeros((0, k.shape[1]))) for k in kernels]
        loras = [factors if factors is not None else none for factors, none in zip(loras, empty)]
        lora = (torch.cat([a for a, _ in loras], dim=1).contiguous(), torch.block_diag(*[b for _, b in loras]))
    return (
        torch.cat(kernels, dim=1).contiguous(),
        None if biases[0] is None else torch.cat(biases),
        None if divisors[0] is None else torch.cat(divisors),
        quantizers[0],
        lora,
    )


def linear(x, kernel, bias, divisor=None, quantizer=None, lora=None):
    """x (..., in) through a `projection`: x @ kernel + bias; int8 weights as Keras's int8 call computes them
    (inputs quantized per row, the integer product, then divided by both scales); LoRA's (x @ A) @ B added
    before the bias, from the inputs as they came. A list of projections as `kernel` (parts `fused` could not
    join): each applied, their outputs side by side."""
    if isinstance(kernel, list):
        return torch.cat([linear(x, *part) for part in kernel], dim=-1)
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
    if lora is not None:
        y = y + (x @ lora[0]) @ lora[1]  # (..., in) x (in, r) x (r, out)
    return y if bias is None else y + bias


ACTIVATIONS = {  # FeedForward's and the experts' activations: Keras's formulas (tests/kernels/test_torch_kernels.py)
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_approximate": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}
