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
names are the one table of kernels/kernel_table.py, shared with the ONNX graphs (kernels/onnx_kernels.py).
So every family built from these layers (decoder blocks with or without cross-attention, pre- or post-norm, layer or
RMS norm, learned or sinusoidal positions, relative position bias, tied or separate heads)
gets the fast step, and a new layer type needs one kernel here, never a model copy.

Attention lives in `torch_attention.py`, the arranged weights and the one product every projection
runs (float, int8 or int4, LoRA or not, fused or alone) in `torch_weights.py`. The decoding tests hold every family's
kernel step to its Keras step, logits and caches.
"""

import inspect

import keras
import torch
import torch.nn.functional as F

from keras_transformer.kernels import kernel_table
from keras_transformer.kernels.torch_attention import cross_attention, self_attention
from keras_transformer.kernels.torch_experts import mixture_of_experts as _mixture_of_experts  # noqa: F401 (bound by the table)
from keras_transformer.kernels.torch_weights import (
    ACTIVATIONS as _ACTIVATIONS,
    DTYPES,
    fused,
    linear,
    mark_static,
    projection,
    quantization,
    weight,
)
from keras_transformer.layers.feed_forward import base_activation


_QUANTIZATIONS = (None, "int8", "int4", "int8 with LoRA", "int4 with LoRA")  # `quantization()`s the kernels run


def supports(task):
    """Whether the kernels may run `task`: PyTorch, a step that takes `call_layer`, a float compute dtype
    in every layer (float32, bfloat16, float16, or a mixed policy), and float, int8 or int4 weights, with
    or without LoRA (other quantization modes keep Keras's calls)."""
    if keras.config.backend() != "torch" or not isinstance(task, keras.Model):
        return False
    if "call_layer" not in inspect.signature(task.call_with_cache).parameters:
        return False
    return all(
        layer.compute_dtype in DTYPES and quantization(layer) in _QUANTIZATIONS for layer in task._flatten_layers()
    )


class TorchKernels:
    """`call_layer` for a step on PyTorch: a plain-PyTorch kernel per known layer type, Keras otherwise.

    Kept per task and length across `generate` calls (`compile.plan`): the weights arranged for the
    kernels (fused projections, (in, out) matrices, 16-bit copies) are made at a first call, and
    `refresh` copies new values into the same tensors after training. Their addresses never change,
    so a compiled step is neither recompiled nor re-captured as a CUDA graph, and they are marked as
    static inputs, which CUDA graphs read in place instead of copying at every replay.
    Callable as `kernels(layer, *args, **kwargs)`.
    """

    def __init__(self, length=None):
        # length: None, the eager loop (the cache index is read as an int at every step, attention reads only
        # the written positions); or the buffer length L of a compiled loop, whose steps keep the index a
        # tensor (no host synchronisation, one graph for every position): cache writes by `index_copy_`,
        # attention over the whole width under a mask, position tables made for L positions up front.
        self.length = length
        self._weights = {}  # id(layer) -> the layer's weights arranged for its kernel
        self._arrangers = {}  # (id(layer), part) -> (layer, the function that arranged them), for `refresh`
        self._tables = {}  # id(layer) -> a table the kernel fills as steps need it (positions), no weights
        self._dispatch = {}  # id(layer) -> (its kernel or None, its compute dtype)
        self._masks = {}  # (start, T, S) -> causal mask (T, S), for the step in progress
        self._index = (None, 0)  # the step's cache index tensor and its int
        self._padding = (None, None)  # a padding mask tensor and its `padding_blocked` form
        self.through_keras = set()  # names of the layer types that ran through Keras (slow, still right)

    def __call__(self, layer, *args, **kwargs):
        entry = self._dispatch.get(id(layer))
        if entry is None:  # looked up once per layer and call: a step then pays one dict lookup per layer
            kernel = _KERNELS.get(type(layer))
            entry = self._dispatch[id(layer)] = (kernel, DTYPES.get(layer.compute_dtype) if kernel else None)
        kernel, dtype = entry
        if kernel is not None:
            if args and getattr(args[0], "dtype", dtype) != dtype and args[0].is_floating_point():
                # As a Keras layer call casts its float inputs to the layer's compute dtype (e.g. a float32
                # head over a bfloat16 backbone).
                args = (args[0].to(dtype),) + args[1:]
            result = kernel(self, layer, *args, **kwargs)
            if result is not NotImplemented:
                return result
        self.through_keras.add(type(layer).__name__)
        return layer(*args, **kwargs)

    def weights(self, layer, arrange, part=None):
        """`arrange(layer)` (a structure of tensors read from the layer's variables), made once: every step
        then reads plain tensors, not the layer's attributes (each a torch Module lookup, or a Keras
        property that converts its variable). `part` names a second arrangement of the same layer."""
        key = (id(layer), part)
        if key not in self._weights:
            self._weights[key] = mark_static(arrange(layer))
            self._arrangers[key] = (layer, arrange)
        return self._weights[key]

    def table(self, layer, make):
        """`make(layer)`: a dict the layer's kernel fills and grows as steps need (position tables). It
        depends on the layer's configuration only, so `refresh` leaves it as it is."""
        if id(layer) not in self._tables:
            self._tables[id(layer)] = make(layer)
        return self._tables[id(layer)]

    def refresh(self):
        """Arrange every layer's weights again from its variables, into the tensors made before."""
        flatten = torch.utils._pytree.tree_flatten
        with torch.no_grad():
            for key, (layer, arrange) in self._arrangers.items():
                (old, old_spec), (new, new_spec) = flatten(self._weights[key]), flatten(arrange(layer))
                if old_spec != new_spec:
                    raise ValueError(
                        f"The weights of layer {layer.name!r} were arranged as {old_spec}, "
                        f"and now as {new_spec}: an arrangement must keep its structure."
                    )
                for before, after in zip(old, new):
                    if isinstance(before, torch.Tensor) and before.data_ptr() != after.data_ptr():
                        before.copy_(after)

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
    if not reverse:
        table = kernels.weights(layer, lambda layer: weight(layer, layer.embeddings))
        return F.embedding(inputs.long(), table)  # (R, T) -> (R, T, D)
    head = kernels.weights(layer, _reverse_kernel, part="head")  # a family with a separate head never makes it
    if head is None:
        return NotImplemented
    logits = inputs.to(head.dtype) @ head  # (R, T, D) x (D, V) -> (R, T, V)
    cap = layer.logit_soft_cap
    return logits if cap is None else torch.tanh(logits / cap) * cap


def _reverse_kernel(layer):
    """The (D, V) output projection, contiguous: at a few rows a transposed (V, D) reads at half speed."""
    dtype = DTYPES.get(layer.reverse_dtype or layer.compute_dtype)
    if dtype is None:
        return None
    head = (
        weight(layer, layer.embeddings, dtype).t()
        if layer.tie_weights
        else weight(layer, layer.reverse_embeddings, dtype)
    )
    return head.contiguous()


def _positional_embedding(kernels, layer, inputs, start_index=0):
    start, length = kernels.start(start_index), inputs.shape[1]
    if kernels.static:
        table = kernels.weights(
            layer, lambda layer: weight(layer, layer.embeddings if layer.position_type == "learned" else layer._table)
        )  # (P, D)
        rows = table.index_select(0, kernels.positions(start, length, table.device))  # (T, D)
        return rows[None].expand(inputs.shape)  # -> (R, T, D)
    table = kernels.weights(
        layer, lambda layer: weight(layer, layer.embeddings if layer.position_type == "learned" else layer._table)
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
    gamma = weight(layer, layer.gamma, torch.float32) if layer.scale else None
    beta = weight(layer, layer.beta, torch.float32) if layer.center else None
    width = gamma if gamma is not None else beta
    return (None if width is None else (width.shape[0],)), gamma, beta, layer.epsilon


def _rms_norm(kernels, layer, x):
    scale, epsilon, axis = kernels.weights(layer, _arrange_rms_norm)
    if axis not in (-1, [-1], len(x.shape) - 1, [len(x.shape) - 1]):
        return NotImplemented
    return F.rms_norm(x.float(), (x.shape[-1],), scale, epsilon).to(x.dtype)  # in float32, as Keras's norm


def _arrange_rms_norm(layer):
    """(the float32 scale, plus `scale_offset` where the layer has one, epsilon, axis)."""
    scale = weight(layer, layer.scale, torch.float32) + getattr(layer, "scale_offset", 0.0)
    return scale, layer.epsilon, layer.axis


def _dense(kernels, layer, x):
    w = kernels.weights(layer, _arrange_dense)
    return NotImplemented if w is None else linear(x, *w)


def _arrange_dense(layer):
    if layer.activation not in (None, keras.activations.linear) or len(layer.kernel.shape) != 2:
        return None
    return projection(layer, layer.kernel.shape[0])


def _dropout(kernels, layer, x, training=None):
    return NotImplemented if training else x


def _relative_position_bias(kernels, layer, query, key, query_start=0):
    """(1, H, T, S): the layer's bucket of each distance s - (query_start + t), looked up in a table of buckets."""
    start, length, width = kernels.start(query_start), query.shape[1], key.shape[1]
    if kernels.static:  # every distance between two of the L positions, bucketed once per call
        L = kernels.length
        buckets = kernels.weights(
            layer, lambda layer: layer._bucket(torch.arange(-L, L + 1, dtype=torch.int32, device=query.device)).long()
        )  # (2L + 1,)
        keys = torch.arange(width, device=query.device)
        queries = kernels.positions(start, length, query.device)
        bias = F.embedding(buckets[keys[None, :] - queries[:, None] + L], weight(layer, layer.embeddings))  # (T, S, H)
        return bias.permute(2, 0, 1)[None]  # -> (1, H, T, S)
    low, high = -(start + length - 1), width - 1 - start  # the distances s - (start + t), t < T, s < S
    table = kernels.table(layer, lambda layer: {"low": 0, "high": -1, "buckets": None})
    if low < table["low"] or high > table["high"]:  # (re)made for every distance this call may meet
        low, high = min(low, table["low"], -2 * width), max(high, table["high"], width)
        distances = torch.arange(low, high + 1, dtype=torch.int32, device=query.device)
        table.update(low=low, high=high, buckets=layer._bucket(distances).long())
    keys = torch.arange(width, device=query.device)
    queries = start + torch.arange(length, device=query.device)
    buckets = table["buckets"][keys[None, :] - queries[:, None] - table["low"]]  # (T, S)
    bias = F.embedding(buckets, weight(layer, layer.embeddings))  # (T, S) -> (T, S, H)
    return bias.permute(2, 0, 1)[None]  # -> (1, H, T, S)


# --- feed-forward, mixture of experts, decoder block ----------------------------


def _feed_forward(kernels, layer, x, training=None):
    if training:
        return NotImplemented
    intermediate, gated, output, activation = kernels.weights(layer, _arrange_feed_forward)
    hidden = linear(x, *intermediate)  # (R, T, D) -> (R, T, F), or (R, T, 2F) gate and up side by side
    if gated:
        gate, hidden = hidden.chunk(2, dim=-1)  # -> 2 x (R, T, F)
        hidden = activation(gate) * hidden
    else:
        hidden = activation(hidden)
    return linear(hidden, *output)  # (R, T, F) -> (R, T, D)


def _arrange_feed_forward(layer):
    """(the input projection, gated, the output projection, the activation): a gated layer's gate and up
    projections are one (D, 2F) product."""
    width = layer.intermediate_dense.kernel.shape[0]
    # The layer's activation as one PyTorch call, as FeedForward reads its name ("gated-gelu": the tanh approximation).
    base = base_activation(layer.activation)
    intermediate = projection(layer.intermediate_dense, width)
    if layer._gated:
        intermediate = fused([projection(layer.gate_dense, width), intermediate])
    output = projection(layer.output_dense, layer.output_dense.kernel.shape[0])
    return intermediate, layer._gated, output, _ACTIVATIONS[base]


def _decoder_block(
    kernels,
    block,
    inputs,
    encoder_outputs=None,
    padding_mask=None,
    encoder_padding_mask=None,
    self_attention_bias=None,
    cross_attention_bias=None,
    self_attention_cache=None,
    cache_index=None,
    cross_attention_cache=None,
    use_causal_mask=True,
    return_attention_scores=False,
    training=None,
):
    """`TransformerDecoderBlock.call` with a (keys, values) cache pair, at inference: same residual rule and returns."""
    norm_first, attention, attention_norm, cross, cross_norm, feed_forward, feed_forward_norm, post_norms = (
        kernels.weights(block, _arrange_block)
    )
    if (
        training
        or return_attention_scores
        or not use_causal_mask
        or cache_index is None
        or not isinstance(self_attention_cache, (list, tuple))
        or (cross is not None and not isinstance(cross_attention_cache, (list, tuple)))
    ):
        return NotImplemented
    start = kernels.start(cache_index)

    def pre(x, norm):
        return kernels(norm, x) if norm_first else x

    def post(x, h, norm, post_norm=None):
        h = h if post_norm is None else kernels(post_norm, h)
        return x + h if norm_first else kernels(norm, x + h)

    x = inputs
    h, self_attention_cache = self_attention(
        kernels, attention, pre(x, attention_norm), self_attention_cache, start, padding_mask, self_attention_bias
    )
    x = post(x, h, attention_norm, post_norms[0])
    if cross is not None:
        h = cross_attention(
            kernels, cross, pre(x, cross_norm), cross_attention_cache, encoder_padding_mask, cross_attention_bias
        )
        x = post(x, h, cross_norm)
    x = post(x, kernels(feed_forward, pre(x, feed_forward_norm)), feed_forward_norm, post_norms[1])
    return (x, self_attention_cache, cross_attention_cache) if cross is not None else (x, self_attention_cache)


def _arrange_block(block):
    """The block's sub-layers, looked up once (each is a torch Module attribute lookup); last, its post norms
    (self-attention's, the feed-forward's), or Nones."""
    cross = block.use_cross_attention
    post_norms = (block.self_attention_post_norm, block.feed_forward_post_norm) if block.post_norm else (None, None)
    return (
        block.norm_first,
        block.self_attention,
        block.self_attention_norm,
        block.cross_attention if cross else None,
        block.cross_attention_norm if cross else None,
        block.feed_forward,
        block.feed_forward_norm,
        post_norms,
    )


_KERNELS = kernel_table.bind(globals())  # {layer type: kernel}, the types of kernels/kernel_table.py

__all__ = ["TorchKernels", "supports"]
