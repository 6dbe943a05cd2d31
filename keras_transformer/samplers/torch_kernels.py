"""Plain-PyTorch kernels for the layers a cached decoding step calls, chosen by layer type.

Axes: R decoded rows, T new tokens, S key length (cache width), S_enc encoder length,
D model width, H query heads, Hkv key/value heads, G = H / Hkv, Dh head size, V vocabulary.

PyTorch's eager decoding loop pays Python for every Keras layer call and op: about 60 layer
calls and 400 ops per step at gpt_tiny's size, several times the arithmetic of a one-token step.
A family describes its step once (`call_with_cache`), calling its layers through a
`call_layer(layer, *args, **kwargs)` argument. On PyTorch the loop passes a `TorchKernels`,
which runs each layer of a known type with one PyTorch call per operation (reading the
layer's own weights) and writes the caches in place; a layer of any other type (or a call
with arguments a kernel does not cover) goes through Keras as usual. The layer types and kernel
names are the one table of layers/kernel_table.py, shared with the ONNX graphs (export/onnx_kernels.py).
So every family built from these layers (decoder blocks with or without cross-attention, pre- or post-norm, layer or
RMS norm, learned or sinusoidal positions, relative position bias, tied or separate heads)
gets the fast step, and a new layer type needs one kernel here, never a model copy.

The decoding tests hold every family's kernel step to its Keras step, logits and caches.
"""

import inspect

import keras
import torch
import torch.nn.functional as F

from keras_transformer.layers import kernel_table



_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def supports(task):
    """Whether the kernels may run `task`: PyTorch, a step that takes `call_layer`, a float compute dtype
    in every layer (float32, bfloat16, float16, or a mixed policy), and float or int8 weights (int4 and
    LoRA over int8 keep Keras's calls)."""
    if keras.config.backend() != "torch" or not isinstance(task, keras.Model):
        return False
    if "call_layer" not in inspect.signature(task.call_with_cache).parameters:
        return False
    return all(
        layer.compute_dtype in _DTYPES and _quantization(layer) in (None, "int8") for layer in task._flatten_layers()
    )


def _quantization(layer):
    """None (float weights), "int8" (Keras's int8 weights without LoRA: the kernels' fast path), or another mode."""
    mode = getattr(layer.dtype_policy, "quantization_mode", None)
    if mode == "int8" and getattr(layer, "lora_enabled", False):
        return "int8 with LoRA"
    return mode


class TorchKernels:
    """`call_layer` for a step on PyTorch: a plain-PyTorch kernel per known layer type, Keras otherwise.

    Made once per `generate` call: weights arranged for the kernels (fused projections,
    (in, out) matrices) are read from the layers then, so a call after training sees the new
    weights. Callable as `kernels(layer, *args, **kwargs)`.
    """

    def __init__(self, length=None):
        # length: None, the eager loop (the cache index is read as an int at every step, attention reads only
        # the written positions); or the buffer length L of a compiled loop, whose steps keep the index a
        # tensor (no host synchronisation, one graph for every position): cache writes by `index_copy_`,
        # attention over the whole width under a mask, position tables made for L positions up front.
        self.length = length
        self._weights = {}  # id(layer) -> the layer's weights arranged for its kernel
        self._masks = {}  # (start, T, S) -> causal mask (T, S), for the step in progress
        self._index = (None, 0)  # the step's cache index tensor and its int
        self._padding = (None, None)  # a padding mask tensor and its `padding_blocked` form
        self.through_keras = set()  # names of the layer types that ran through Keras (slow, still right)

    def __call__(self, layer, *args, **kwargs):
        kernel = _KERNELS.get(type(layer))
        if kernel is not None:
            dtype = self.weights(layer.dtype_policy, lambda policy: _DTYPES[policy.compute_dtype])
            if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point() and args[0].dtype != dtype:
                # As a Keras layer call casts its float inputs to the layer's compute dtype (e.g. a float32
                # head over a bfloat16 backbone).
                args = (args[0].to(dtype),) + args[1:]
            result = kernel(self, layer, *args, **kwargs)
            if result is not NotImplemented:
                return result
        self.through_keras.add(type(layer).__name__)
        return layer(*args, **kwargs)

    def weights(self, layer, arrange):
        """`arrange(layer)`, made once per call: every step then reads plain tensors, not the layer's
        attributes (each a torch Module lookup, or a Keras property that converts its variable)."""
        key = id(layer)
        if key not in self._weights:
            self._weights[key] = arrange(layer)
        return self._weights[key]

    @property
    def static(self):
        return self.length is not None

    def positions(self, index, length, device):
        """(T,) long positions [index, index + T) of a static step's queries."""
        return torch.as_tensor(index, device=device).long() + torch.arange(length, device=device)

    def start(self, index):
        """The cache index as an int, read from the device once per step (every layer gets the same tensor)."""
        if self.static:
            return index
        if self._index[0] is not index:
            self._index = (index, int(index))
        return self._index[1]

    def padding_blocked(self, padding_mask):
        """(R, S) padding mask -> (R, 1, 1, S) True where masked out, or None where nothing is: made once
        per mask tensor (the encoder's mask is the same at every step)."""
        if padding_mask is None:
            return None
        if self.static:
            return ~padding_mask.bool()[:, None, None, :]
        if self._padding[0] is not padding_mask:
            blocked = ~padding_mask.bool()[:, None, None, :]
            self._padding = (padding_mask, blocked if bool(blocked.any()) else None)
        return self._padding[1]

    def causal_mask(self, start, length, width, device, window=None):
        """(T, S) bool, True where query t (at start + t) may attend key s: s <= start + t
        (and start + t - s < window with a sliding window)."""
        key = (start, length, width, window)
        if key not in self._masks:
            if self._masks and next(iter(self._masks))[0] != start:
                self._masks = {}  # one step's layers share them; the next step has another start
            keys = torch.arange(width, device=device)
            queries = start + torch.arange(length, device=device)
            allowed = keys[None, :] <= queries[:, None]
            if window is not None:
                allowed = allowed & (queries[:, None] - keys[None, :] < window)
            self._masks[key] = allowed
        return self._masks[key]


# --- embeddings and norms ------------------------------------------------------


def _reversible_embedding(kernels, layer, inputs, reverse=False):
    w = kernels.weights(layer, lambda layer: {"table": _weight(layer, layer.embeddings)})
    if not reverse:
        return F.embedding(inputs.long(), w["table"])  # (R, T) -> (R, T, D)
    if "head" not in w:  # made on the first reverse call only (a family with a separate head never pays it)
        w["head"] = _reverse_kernel(layer)
    if w["head"] is None:
        return NotImplemented
    logits = inputs.to(w["head"].dtype) @ w["head"]  # (R, T, D) x (D, V) -> (R, T, V)
    cap = layer.logit_soft_cap
    return logits if cap is None else torch.tanh(logits / cap) * cap


def _reverse_kernel(layer):
    """The (D, V) output projection, contiguous: at a few rows a transposed (V, D) reads at half speed."""
    dtype = _DTYPES.get(layer.reverse_dtype or layer.compute_dtype)
    if dtype is None:
        return None
    head = _weight(layer, layer.embeddings, dtype).t() if layer.tie_weights else _weight(
        layer, layer.reverse_embeddings, dtype)
    return head.contiguous()


def _positional_embedding(kernels, layer, inputs, start_index=0):
    start, length = kernels.start(start_index), inputs.shape[1]
    if kernels.static:
        table = kernels.weights(layer, lambda layer: _weight(
            layer, layer.embeddings if layer.position_type == "learned" else layer._table))  # (P, D)
        rows = table.index_select(0, kernels.positions(start, length, table.device))  # (T, D)
        return rows[None].expand(inputs.shape)  # -> (R, T, D)
    table = kernels.weights(
        layer, lambda layer: _weight(layer, layer.embeddings if layer.position_type == "learned" else layer._table)
    )  # (P, D)
    return table[start : start + length][None].expand(inputs.shape)  # (T, D) -> (R, T, D)


def _layer_norm(kernels, layer, x):
    w = kernels.weights(layer, _arrange_layer_norm)
    if w is None or w[0] != (x.shape[-1],):
        return NotImplemented
    return F.layer_norm(x.float(), *w).to(x.dtype)  # in float32 whatever the compute dtype, as Keras's norm


def _arrange_layer_norm(layer):
    """(normalized shape, gamma, beta, epsilon) of a norm over the last axis, else None."""
    if layer.rms_scaling or layer.axis not in (-1, [-1], 2, [2]):
        return None
    gamma = _weight(layer, layer.gamma, torch.float32) if layer.scale else None
    beta = _weight(layer, layer.beta, torch.float32) if layer.center else None
    width = (gamma if gamma is not None else beta)
    return (None if width is None else (width.shape[0],)), gamma, beta, layer.epsilon


def _rms_norm(kernels, layer, x):
    scale, epsilon, axis = kernels.weights(
        layer, lambda layer: (_weight(layer, layer.scale, torch.float32), layer.epsilon, layer.axis))
    if axis not in (-1, [-1], len(x.shape) - 1, [len(x.shape) - 1]):
        return NotImplemented
    return F.rms_norm(x.float(), (x.shape[-1],), scale, epsilon).to(x.dtype)  # in float32, as Keras's norm


def _dense(kernels, layer, x):
    w = kernels.weights(layer, _arrange_dense)
    return NotImplemented if w is None else _linear(x, *w)


def _arrange_dense(layer):
    if layer.activation not in (None, keras.activations.linear) or len(layer.kernel.shape) != 2:
        return None
    return _projection(layer, layer.kernel.shape[0])


def _projection(layer, width, scale=1.0):
    """A Dense / EinsumDense as `_linear`'s (kernel (in, out), bias (out,) or None, divisor, quantizer), its
    outputs times `scale`. Float weights: the kernel in the compute dtype, no divisor. Keras int8 weights:
    the int8 values as float32, the dequantization divisor (out,) and the inputs' quantizer (value range,
    epsilon), or None where only the weights are quantized; the products are Keras's int8 call's."""
    bias = None if layer.bias is None else _weight(layer, layer.bias).reshape(-1) * scale
    if _quantization(layer) is None:
        return _weight(layer, layer.kernel).reshape(width, -1) * scale, bias, None, None
    kernel = _value(layer._kernel).detach().float()  # e.g. (D, H, Dh) int8 values
    kernel_scale = _value(layer.kernel_scale).detach().float()
    if hasattr(layer, "_adjust_scale_for_dequant"):  # an EinsumDense keeps its scale in its own layout
        kernel_scale = layer._adjust_scale_for_dequant(kernel_scale)
    divisor = torch.broadcast_to(kernel_scale, kernel.shape).reshape(width, -1)[0] / scale  # (out,): per output
    quantizer = getattr(layer, "inputs_quantizer", None)
    if quantizer is not None:
        quantizer = (float(quantizer.value_range[0]), float(quantizer.value_range[1]), float(quantizer.epsilon))
    return kernel.reshape(width, -1).contiguous(), bias, divisor, quantizer


def _fused(parts):
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


def _dropout(kernels, layer, x, training=None):
    return NotImplemented if training else x


def _relative_position_bias(kernels, layer, query, key, query_start=0):
    """(1, H, T, S): the layer's bucket of each distance s - (query_start + t), looked up in a table of buckets."""
    start, length, width = kernels.start(query_start), query.shape[1], key.shape[1]
    if kernels.static:  # every distance between two of the L positions, bucketed once per call
        L = kernels.length
        buckets = kernels.weights(layer, lambda layer: layer._bucket(
            torch.arange(-L, L + 1, dtype=torch.int32, device=query.device)).long())  # (2L + 1,)
        keys = torch.arange(width, device=query.device)
        queries = kernels.positions(start, length, query.device)
        bias = F.embedding(buckets[keys[None, :] - queries[:, None] + L], _weight(layer, layer.embeddings))  # (T, S, H)
        return bias.permute(2, 0, 1)[None]  # -> (1, H, T, S)
    low, high = -(start + length - 1), width - 1 - start  # the distances s - (start + t), t < T, s < S
    table = kernels.weights(layer, lambda layer: {"low": 0, "high": -1, "buckets": None})
    if low < table["low"] or high > table["high"]:  # (re)made for every distance this call may meet
        low, high = min(low, table["low"], -2 * width), max(high, table["high"], width)
        distances = torch.arange(low, high + 1, dtype=torch.int32, device=query.device)
        table.update(low=low, high=high, buckets=layer._bucket(distances).long())
    keys = torch.arange(width, device=query.device)
    queries = start + torch.arange(length, device=query.device)
    buckets = table["buckets"][keys[None, :] - queries[:, None] - table["low"]]  # (T, S)
    bias = F.embedding(buckets, _weight(layer, layer.embeddings))  # (T, S) -> (T, S, H)
    return bias.permute(2, 0, 1)[None]  # -> (1, H, T, S)


# --- attention, feed-forward, decoder block -------------------------------------


def _value(weight):
    """A variable's tensor (a layer's weight may also be a plain tensor, e.g. derived from others)."""
    return weight.value if isinstance(weight, keras.Variable) else weight


def _compute_dtype(layer):
    return _DTYPES[layer.compute_dtype]


def _weight(layer, weight, dtype=None):
    """A layer's weight as a plain tensor in its compute dtype (`dtype` overrides): a mixed-precision
    layer's float32 variable is cast once per call, as Keras casts it at every layer call."""
    return _value(weight).detach().to(dtype or _compute_dtype(layer))


def _linear(x, kernel, bias, divisor=None, quantizer=None):
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


def _attention_weights(attention, fused):
    """Projections as (in, out) matrices; `fused`: query, key and value in one (D, (H + 2 Hkv) Dh) matrix."""
    projections = (attention.query_dense, attention.key_dense, attention.value_dense)
    if not fused:
        projections = projections[:1]
    width = attention.query_dense.kernel.shape[0]
    # The logits' scale goes into the query projection (one product per step fewer; rotary
    # embeddings are linear, so rotating scaled queries is the same).
    scales = [attention._scale] + [1.0] * (len(projections) - 1)
    H, Dh = attention.num_heads, attention._head_dim
    return {
        "heads": (H, attention._kv_heads, Dh),
        "projection": _fused([_projection(p, width, scale) for p, scale in zip(projections, scales)]),
        "output": _projection(attention.output_dense, H * Dh),
    }


def _attend(heads, q, keys, values, blocked, bias):
    """q (R, T, H, Dh) already scaled, keys/values (R, Hkv, S, Dh), blocked (R|1, 1, T, S) bool (True: masked
    out) or None, bias (R|1, H, T, S) or None -> (R, T, H * Dh).

    Each key/value head serves its G query heads as one (G * T)-row product, so grouped-query
    attention reads the cache without repeating it. Plain products: PyTorch's CPU
    flash-attention kernel costs more than these at a few queries.
    """
    H, Hkv, Dh = heads
    G = H // Hkv
    rows, length = q.shape[0], q.shape[1]
    width = keys.shape[2]
    q = q.transpose(1, 2)  # (R, T, H, Dh) -> (R, H, T, Dh)
    if G > 1:
        q = q.reshape(rows, Hkv, G * length, Dh)  # -> (R, Hkv, G * T, Dh)
    logits = q @ keys.transpose(2, 3)  # (R, Hkv, G * T, Dh) x (R, Hkv, Dh, S)
    if G > 1:
        logits = logits.view(rows, H, length, width)  # -> (R, H, T, S)
    logits = logits.float()  # bias, mask and softmax in float32 whatever the compute dtype, as the layer's
    if bias is not None:
        logits = logits + bias
    if blocked is not None:
        logits = logits.masked_fill(blocked, -1.0e9)  # MultiHeadAttention's mask bias
    probs = logits.softmax(dim=-1).to(values.dtype)
    if G > 1:
        probs = probs.view(rows, Hkv, G * length, width)
    out = probs @ values  # (R, Hkv, G * T, S) x (R, Hkv, S, Dh) -> (R, Hkv, G * T, Dh)
    return out.view(rows, H, length, Dh).transpose(1, 2).reshape(rows, length, H * Dh)  # -> (R, T, H * Dh)


def _self_attention(kernels, attention, h, cache, start, padding_mask, bias):
    """Causal self-attention of h (R, T, D) at positions [start, start + T), writing the new keys/values
    into the cache pair (R, Hkv, S, Dh) in place -> (output (R, T, D), cache)."""
    weights = kernels.weights(attention, lambda layer: _attention_weights(layer, fused=True))
    H, Hkv, Dh = weights["heads"]
    rows, length, _ = h.shape
    qkv = _linear(h, *weights["projection"])  # (R, T, D) -> (R, T, (H + 2 Hkv) Dh)
    q, k, v = qkv.split([H * Dh, Hkv * Dh, Hkv * Dh], dim=-1)
    q, k = q.view(rows, length, H, Dh), k.view(rows, length, Hkv, Dh)
    if attention.rotary_embedding is not None:
        q, k = _rotate(kernels, attention.rotary_embedding, q, start), _rotate(kernels, attention.rotary_embedding, k, start)
    keys, values = (c if c.is_contiguous() else c.contiguous() for c in cache)  # rows may be broadcast views
    if kernels.static:
        return _static_self_attention(kernels, attention, weights, q, k, v, keys, values, start, padding_mask, bias)
    end = start + length
    keys[:, :, start:end] = k.transpose(1, 2)  # (R, T, Hkv, Dh) -> (R, Hkv, T, Dh)
    values[:, :, start:end] = v.view(rows, length, Hkv, Dh).transpose(1, 2)
    # Only the positions [low, end) that some query may see are read: the cache past `end` is not
    # written yet, and a one-token step sees every position of that range, so it needs no mask.
    window = attention.sliding_window
    low = 0 if window is None else max(0, start + 1 - window)
    blocked = None
    if length > 1:
        blocked = ~kernels.causal_mask(start, length, keys.shape[2], h.device, window)[None, None, :, low:end]
    if padding_mask is not None:
        padded = ~padding_mask[:, low:end].bool()[:, None, None, :]  # (R, S) -> (R, 1, 1, S)
        blocked = padded if blocked is None else blocked | padded
    if bias is not None:
        bias = bias[..., low:end]  # (R|1, H, T, S)
    out = _attend(weights["heads"], q, keys[:, :, low:end], values[:, :, low:end], blocked, bias)
    return _linear(out, *weights["output"]), (keys, values)  # (R, T, H * Dh) -> (R, T, D)


def _static_self_attention(kernels, attention, weights, q, k, v, keys, values, start, padding_mask, bias):
    """`_self_attention` of a compiled step: `start` a tensor; every position of the cache (R, Hkv, S, Dh)
    is read, the ones not written yet masked out."""
    _, Hkv, width, Dh = keys.shape
    rows, length = q.shape[0], q.shape[1]
    positions = kernels.positions(start, length, q.device)  # (T,)
    keys.index_copy_(2, positions, k.transpose(1, 2).to(keys.dtype))  # (R, T, Hkv, Dh) -> (R, Hkv, T, Dh)
    values.index_copy_(2, positions, v.view(rows, length, Hkv, Dh).transpose(1, 2).to(values.dtype))
    key_positions = torch.arange(width, device=q.device)
    allowed = key_positions[None, :] <= positions[:, None]  # (T, S)
    if attention.sliding_window is not None:
        allowed = allowed & (positions[:, None] - key_positions[None, :] < attention.sliding_window)
    blocked = ~allowed[None, None]  # (1, 1, T, S)
    if padding_mask is not None:
        blocked = blocked | ~padding_mask.bool()[:, None, None, :]  # (R, S) -> (R, 1, T, S)
    out = _attend(weights["heads"], q, keys, values, blocked, bias)
    return _linear(out, *weights["output"]), (keys, values)  # (R, T, H * Dh) -> (R, T, D)


def _rotate(kernels, rotary, x, start):
    """`RotaryEmbedding` of x (R, T, H, Dh) at positions [start, start + T), cos/sin read from a table
    made once per call and grown (doubling) when a step reaches past it."""
    length, head_dim = x.shape[1], x.shape[3]
    table = kernels.weights(rotary, lambda layer: {"cos": None, "sin": None})
    if kernels.static:
        if table["cos"] is None:  # made on the first (eager) step for every position of the buffer
            _rotary_table(table, rotary, kernels.length, head_dim, x.device)
        positions = kernels.positions(start, length, x.device)
        cos = table["cos"].index_select(0, positions)[None, :, None, :]  # (1, T, 1, R)
        sin = table["sin"].index_select(0, positions)[None, :, None, :]
        return _apply_rotation(x, cos, sin)
    if table["cos"] is None or start + length > table["cos"].shape[0]:
        _rotary_table(table, rotary, max(2 * (start + length), 256), head_dim, x.device)
    cos = table["cos"][start : start + length][None, :, None, :]  # (1, T, 1, R)
    sin = table["sin"][start : start + length][None, :, None, :]
    return _apply_rotation(x, cos, sin)


def _rotary_table(table, rotary, size, head_dim, device):
    """cos / sin (P, R) float32 of the first `size` positions, into `table`."""
    positions = torch.arange(size, device=device, dtype=torch.float32)
    frequencies = torch.as_tensor(rotary.inverse_frequencies(head_dim), device=device)
    angles = positions[:, None] * frequencies[None, :]  # (P, 1) x (1, R/2) -> (P, R/2)
    angles = torch.cat([angles, angles], dim=-1)  # -> (P, R)
    table.update(cos=angles.cos(), sin=angles.sin())


def _apply_rotation(x, cos, sin):
    """x (R, T, H, Dh) rotated by cos / sin (1, T, 1, R), R <= Dh rotary dimensions (the rest pass)."""
    head_dim, rotary_dim = x.shape[3], cos.shape[-1]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    turned = torch.cat([-rotated[..., half:], rotated[..., :half]], dim=-1)  # rotate_half: (x1, x2) -> (-x2, x1)
    rotated = (rotated * cos + turned * sin).to(x.dtype)  # float32 tables: a 16-bit x rotates in float32
    return rotated if rotary_dim == head_dim else torch.cat([rotated, passed], dim=-1)


def _cross_attention(kernels, attention, h, cache, encoder_padding_mask, bias):
    """Attention of h (R, T, D) over the encoder's cached keys/values (R, Hkv, S_enc, Dh) -> (R, T, D)."""
    weights = kernels.weights(attention, lambda layer: _attention_weights(layer, fused=False))
    H, _, Dh = weights["heads"]
    rows, length, _ = h.shape
    q = _linear(h, *weights["projection"]).view(rows, length, H, Dh)  # (R, T, D) -> (R, T, H, Dh)
    out = _attend(weights["heads"], q, cache[0], cache[1], kernels.padding_blocked(encoder_padding_mask), bias)
    return _linear(out, *weights["output"])


def _feed_forward(kernels, layer, x, training=None):
    if training:
        return NotImplemented
    intermediate, gated, output, activation = kernels.weights(layer, _arrange_feed_forward)
    hidden = _linear(x, *intermediate)  # (R, T, D) -> (R, T, F), or (R, T, 2F) gate and up side by side
    if gated:
        gate, hidden = hidden.chunk(2, dim=-1)  # -> 2 x (R, T, F)
        hidden = activation(gate) * hidden
    else:
        hidden = activation(hidden)
    return _linear(hidden, *output)  # (R, T, F) -> (R, T, D)


def _arrange_feed_forward(layer):
    """(the input projection, gated, the output projection, the activation): a gated layer's gate and up
    projections are one (D, 2F) product."""
    width = layer.intermediate_dense.kernel.shape[0]
    # The layer's activation as one PyTorch call ("gated-gelu" is the tanh approximation, as in FeedForward).
    base = "gelu_approximate" if layer.activation == "gated-gelu" else layer.activation.removeprefix("gated-")
    intermediate = _projection(layer.intermediate_dense, width)
    if layer._gated:
        intermediate = _fused([_projection(layer.gate_dense, width), intermediate])
    output = _projection(layer.output_dense, layer.output_dense.kernel.shape[0])
    return intermediate, layer._gated, output, _ACTIVATIONS[base]


_ACTIVATIONS = {  # FeedForward's activations: the same formulas (tests/samplers/test_torch_kernels.py)
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_approximate": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def _decoder_block(
    kernels, block, inputs, encoder_outputs=None, padding_mask=None, encoder_padding_mask=None,
    self_attention_bias=None, cross_attention_bias=None, self_attention_cache=None, cache_index=None,
    cross_attention_cache=None, use_causal_mask=True, return_attention_scores=False, training=None,
):
    """`TransformerDecoderBlock.call` with a (keys, values) cache pair, at inference: same residual rule and returns."""
    norm_first, attention, attention_norm, cross, cross_norm, feed_forward, feed_forward_norm = kernels.weights(
        block, _arrange_block
    )
    if (
        training or return_attention_scores or not use_causal_mask or cache_index is None
        or not isinstance(self_attention_cache, (list, tuple))
        or (cross is not None and not isinstance(cross_attention_cache, (list, tuple)))
    ):
        return NotImplemented
    start = kernels.start(cache_index)

    def pre(x, norm):
        return kernels(norm, x) if norm_first else x

    def post(x, h, norm):
        return x + h if norm_first else kernels(norm, x + h)

    x = inputs
    h, self_attention_cache = _self_attention(
        kernels, attention, pre(x, attention_norm), self_attention_cache, start, padding_mask, self_attention_bias,
    )
    x = post(x, h, attention_norm)
    if cross is not None:
        h = _cross_attention(kernels, cross, pre(x, cross_norm), cross_attention_cache, encoder_padding_mask,
                             cross_attention_bias)
        x = post(x, h, cross_norm)
    x = post(x, kernels(feed_forward, pre(x, feed_forward_norm)), feed_forward_norm)
    return (x, self_attention_cache, cross_attention_cache) if cross is not None else (x, self_attention_cache)


def _arrange_block(block):
    """The block's sub-layers, looked up once (each is a torch Module attribute lookup)."""
    cross = block.use_cross_attention
    return (block.norm_first, block.self_attention, block.self_attention_norm,
            block.cross_attention if cross else None, block.cross_attention_norm if cross else None,
            block.feed_forward, block.feed_forward_norm)


_KERNELS = kernel_table.bind(globals())  # {layer type: kernel}, the types of layers/kernel_table.py

__all__ = ["TorchKernels", "supports"]
