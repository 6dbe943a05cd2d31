"""Multi-head scaled dot-product attention with masks, bias and a key/value cache.

Axes: B batch, T query length, S key length, H query heads, Hkv key/value heads,
Dh head size, D model width.
"""

import contextlib
import math

import keras
from keras import ops

from keras_transformer.layers.masks import causal_mask, merge_masks, mask_to_bias


def _check_rate(name, value):
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={value}")


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention as in "Attention Is All You Need", section 3.2.

    softmax(scale * Q K^T + bias + mask) V for every head, then the output
    projection W_O. Self- and cross-attention, padding and bottom-right causal
    masks, an additive bias (T5's relative bias), grouped-query attention and a
    static-size key/value cache for incremental decoding. When attention
    probabilities are not requested (and no attention dropout is active) it
    calls `keras.ops.dot_product_attention`, so GPUs get fused kernels.

    Args:
        num_heads: int, number of query heads H.
        key_dim: int, size Dh of each head. Defaults to D // num_heads.
        num_key_value_heads: int, number of key/value heads Hkv (grouped-query
            attention). Must divide `num_heads`. Defaults to `num_heads`.
        use_bias: bool, whether the projections have biases.
        dropout: float in [0, 1), dropout on the attention probabilities.
        scale: float, multiplier of the logits. Defaults to 1 / sqrt(Dh);
            T5 uses 1.0.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.

    Call arguments:
        query: (B, T, D).
        value: (B, S, Dv), defaults to `query` (self-attention).
        key: (B, S, Dk), defaults to `value`.
        attention_mask: (B, S) key padding mask or (B, T, S); True attends.
        attention_bias: additive float, broadcastable to (B, H, T, S).
        use_causal_mask: bool. Query i attends key j iff j <= i + (S - T),
            or j <= cache_index + i with a cache.
        cache: (B, 2, Hkv, S_max, Dh) projected keys ([:, 0]) and values
            ([:, 1]), or a (keys, values) pair of (B, Hkv, S_max, Dh) tensors;
            heads before positions (as in Hugging Face's `past_key_values`), so
            that the attention products read it without a transpose. The pair
            is what the decoding loop carries: two separate buffers are written
            in place and read without a copy. With `cache_index`, the new
            keys/values are written at [cache_index, cache_index + T) and
            attention runs over the whole cache; without it, the cache is used
            as fixed keys/values (cross-attention) and `key`/`value` are
            ignored. Beam search passes a third form, a dict with "keys_t"
            (B, Hkv, Dh, S_max * K) (keys transposed; position s of slot j at
            s * K + j), "values" (B, Hkv, S_max * K, Dh) and "ancestry"
            (B, K, S_max) int: the query rows are R = B * K beams;
            beam k writes its new keys/values in its own slot k and reads
            position s from slot ancestry[b, k, s], so choosing beams reorders
            only the small ancestry table, never the cache (see `_attend_beams`).
            A fourth form, a dict with "keys" and "values" (B, Hkv, S_max, Dh),
            says that only the first query token is real: the others only pad
            the projections (see `_attend_padded`).
        cache_index: int or scalar int tensor, where to write in the cache.
        return_attention_scores: bool, also return the probabilities.
        training: bool, whether dropout is active.

    Returns:
        output (B, T, D); `(output, scores)` with scores (B, H, T, S) when
        `return_attention_scores`; the updated cache is appended when a cache
        is given, in the form it came.

    Example:
    >>> layer = MultiHeadAttention(num_heads=2)
    >>> x = keras.random.normal((1, 4, 8))
    >>> layer(x, use_causal_mask=True).shape
    (1, 4, 8)
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        num_key_value_heads=None,
        use_bias=True,
        dropout=0.0,
        scale=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"`num_heads` must be a positive int. Received: num_heads={num_heads}")
        if key_dim is not None and (not isinstance(key_dim, int) or key_dim < 1):
            raise ValueError(f"`key_dim` must be a positive int. Received: key_dim={key_dim}")
        if num_key_value_heads is not None and (
            not isinstance(num_key_value_heads, int)
            or num_key_value_heads < 1
            or num_heads % num_key_value_heads
        ):
            raise ValueError(
                "`num_key_value_heads` must be a positive divisor of `num_heads`. "
                f"Received: num_key_value_heads={num_key_value_heads}, num_heads={num_heads}"
            )
        _check_rate("dropout", dropout)
        if scale is not None and scale <= 0:
            raise ValueError(f"`scale` must be positive. Received: scale={scale}")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.num_key_value_heads = num_key_value_heads
        self.use_bias = use_bias
        self.dropout = dropout
        self.scale = scale
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = False

    def build(self, query_shape, value_shape=None, key_shape=None):
        hidden_dim = query_shape[-1]
        if self.key_dim is None and hidden_dim % self.num_heads:
            raise ValueError(
                "The model width must be divisible by `num_heads` when `key_dim` is not set. "
                f"Received: hidden_dim={hidden_dim}, num_heads={self.num_heads}"
            )
        self._head_dim = self.key_dim or hidden_dim // self.num_heads
        self._kv_heads = self.num_key_value_heads or self.num_heads
        self._scale = self.scale if self.scale is not None else 1.0 / math.sqrt(self._head_dim)
        value_shape = value_shape or query_shape
        key_shape = key_shape or value_shape
        H, Hkv, Dh = self.num_heads, self._kv_heads, self._head_dim

        def projection(name, equation, output_shape, bias_axes):
            return keras.layers.EinsumDense(
                equation,
                output_shape=output_shape,
                bias_axes=bias_axes if self.use_bias else None,
                kernel_initializer=self.kernel_initializer,
                bias_initializer=self.bias_initializer,
                dtype=self.dtype_policy,
                name=name,
            )

        # (B, T, D) x (D, H, Dh) -> (B, T, H, Dh)
        self.query_dense = projection("query", "btd,dhk->bthk", (None, H, Dh), "hk")
        self.query_dense.build(query_shape)
        self.key_dense = projection("key", "bsd,dhk->bshk", (None, Hkv, Dh), "hk")
        self.key_dense.build(key_shape)
        self.value_dense = projection("value", "bsd,dhk->bshk", (None, Hkv, Dh), "hk")
        self.value_dense.build(value_shape)
        # (B, T, H, Dh) x (H, Dh, D) -> (B, T, D)
        self.output_dense = projection("attention_output", "bthk,hkd->btd", (None, hidden_dim), "d")
        self.output_dense.build((query_shape[0], query_shape[1], H, Dh))
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def compute_cache(self, value, key=None):
        """Projected keys and values of `value` (B, S, D) -> (B, 2, Hkv, S, Dh), for cross-attention."""
        key = value if key is None else key
        kv = ops.stack([self.key_dense(key), self.value_dense(value)], axis=1)  # (B, 2, S, Hkv, Dh)
        return ops.transpose(kv, (0, 1, 3, 2, 4))

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        attention_bias=None,
        use_causal_mask=False,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
    ):
        value = query if value is None else value
        key = value if key is None else key
        q = self.query_dense(query)  # (B, T, H, Dh)
        if isinstance(cache, dict):
            beams = "ancestry" in cache  # else a padded-query cache {"keys", "values"}
            if attention_mask is not None or return_attention_scores or cache_index is None:
                raise ValueError(
                    f"{'A beam' if beams else 'A padded-query'} cache takes `cache_index` and no `attention_mask` "
                    f"or `return_attention_scores`. Received: cache_index={cache_index}, "
                    f"attention_mask={attention_mask is not None}, return_attention_scores={return_attention_scores}"
                )
            attend = self._attend_beams if beams else self._attend_padded
            output, cache = attend(q, self.key_dense(key), self.value_dense(value), cache, cache_index,
                                   attention_bias, training)
            return self.output_dense(output), cache

        if cache is not None and cache_index is None:
            k, v = _keys_values(cache)  # fixed (cross-attention) keys/values (B, Hkv, S, Dh)
        else:
            k = self.key_dense(key)  # (B, S, Hkv, Dh)
            v = self.value_dense(value)
            if cache is not None:
                # (B, T, Hkv, Dh) -> (B, Hkv, T, Dh), written at [cache_index, cache_index + T)
                cache = _write(cache, ops.transpose(k, (0, 2, 1, 3)), ops.transpose(v, (0, 2, 1, 3)), cache_index)
                k, v = _keys_values(cache)  # (B, Hkv, S_max, Dh)
        sequence_axis = 1 if cache is None else 2  # of k and v

        query_length, key_length = q.shape[1], k.shape[sequence_axis]
        if query_length is None or key_length is None:
            query_length, key_length = ops.shape(q)[1], ops.shape(k)[sequence_axis]
        padding_mask, full_mask = _split_mask(attention_mask, query, query_length, key_length)
        causal = None
        if use_causal_mask:
            query_start = cache_index if cache is not None and cache_index is not None else None
            causal = causal_mask(query_length, key_length, query_start)
        mask = merge_masks(padding_mask, full_mask, causal)

        if cache is None:
            output, scores = self._attend(q, k, v, mask, attention_bias, return_attention_scores, training)
        else:
            output, scores = self._attend_cached(q, k, v, mask, attention_bias, return_attention_scores, training)
        output = self.output_dense(output)  # (B, T, H, Dh) -> (B, T, D)

        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def _attend(self, q, k, v, mask, attention_bias, return_scores, training):
        """q (B, T, H, Dh), k/v (B, S, Hkv, Dh) -> (B, T, H, Dh) and probabilities (B, H, T, S) or None."""
        bias = None
        if mask is not None:
            bias = mask_to_bias(mask, "float32")  # (B|1, 1, T, S)
        if attention_bias is not None:
            attention_bias = ops.cast(attention_bias, "float32")
            bias = attention_bias if bias is None else bias + attention_bias
        if self._kv_heads != self.num_heads:
            repeats = self.num_heads // self._kv_heads
            k = ops.repeat(k, repeats, axis=2)  # (B, S, Hkv, Dh) -> (B, S, H, Dh)
            v = ops.repeat(v, repeats, axis=2)
        use_dropout = training and self.dropout > 0
        # float16 takes the explicit path: its float32 logits and softmax keep the -1e9 mask bias
        # finite (cast to float16 it is -inf: NaN for a fully masked row), and XLA on CPU has no
        # float16 matmul with float32 accumulation, which the fused kernel asks for.
        if not return_scores and not use_dropout and self.compute_dtype != "float16":
            if bias is not None:
                bias = ops.cast(bias, q.dtype)
            output = ops.dot_product_attention(q, k, v, bias=bias, scale=self._scale)
            return output, None
        # Logits and softmax in float32 whatever the compute dtype.
        logits = ops.einsum("bthk,bshk->bhts", ops.cast(q, "float32"), ops.cast(k, "float32"))
        logits = logits * self._scale  # (B, H, T, S)
        if bias is not None:
            logits = logits + bias
        scores = ops.softmax(logits, axis=-1)
        probs = ops.cast(self.dropout_layer(scores, training=training), v.dtype)
        output = ops.einsum("bhts,bshk->bthk", probs, v)  # (B, H, T, S) x (B, S, H, Dh) -> (B, T, H, Dh)
        return output, ops.cast(scores, self.compute_dtype)

    def _attend_cached(self, q, k, v, mask, attention_bias, return_scores, training):
        """q (B, T, H, Dh), k/v (B, Hkv, S, Dh) from a cache -> (B, T, H, Dh) and probabilities (B, H, T, S) or None.

        The products run on (B * Hkv, S, Dh) views of the cache, each key/value head with its G =
        H / Hkv query heads (grouped-query attention without repeating the cache), keys as the left
        operand contracting their minor axis. XLA on CPU then reads the cache as it lies and updates
        it in place across decoding steps; other arrangements made it transpose or copy every
        layer's keys and values at every step. Logits and softmax in float32 whatever the compute dtype.
        """
        H, Hkv, Dh = self.num_heads, self._kv_heads, self._head_dim
        G = H // Hkv
        batch, query_length = ops.shape(q)[0], ops.shape(q)[1]
        key_length = ops.shape(k)[2]
        q = ops.cast(q, "float32") * self._scale
        q = ops.transpose(q, (0, 2, 1, 3))  # (B, T, H, Dh) -> (B, H, T, Dh)
        q = ops.reshape(q, (batch * Hkv, G * query_length, Dh))  # -> (B * Hkv, G * T, Dh)
        keys = ops.reshape(ops.cast(k, "float32"), (batch * Hkv, key_length, Dh))  # (B, Hkv, S, Dh) -> (B * Hkv, S, Dh)
        logits = ops.einsum("nsk,nqk->nsq", keys, q)  # (B * Hkv, S, G * T)
        logits = ops.transpose(logits, (0, 2, 1))  # -> (B * Hkv, G * T, S)
        logits = ops.reshape(logits, (batch, H, query_length, key_length))  # -> (B, H, T, S)
        if mask is not None:
            logits = logits + mask_to_bias(mask, "float32")  # (B|1, 1, T, S)
        if attention_bias is not None:
            logits = logits + ops.cast(attention_bias, "float32")
        scores = ops.softmax(logits, axis=-1)
        probs = scores
        if training and self.dropout > 0:
            probs = self.dropout_layer(scores, training=training)
        probs = ops.reshape(ops.cast(probs, v.dtype), (batch * Hkv, G * query_length, key_length))  # (B * Hkv, G * T, S)
        values = ops.reshape(v, (batch * Hkv, key_length, Dh))  # (B, Hkv, S, Dh) -> (B * Hkv, S, Dh)
        output = ops.einsum("nqs,nsk->nqk", probs, values)  # (B * Hkv, G * T, Dh)
        output = ops.reshape(output, (batch, H, query_length, Dh))  # -> (B, H, T, Dh)
        output = ops.transpose(output, (0, 2, 1, 3))  # -> (B, T, H, Dh)
        return output, (ops.cast(scores, self.compute_dtype) if return_scores else None)

    def _attend_padded(self, q, k, v, cache, cache_index, attention_bias, training):
        """Causal self-attention of the first of T query tokens -> ((B, T, H, Dh), updated cache).

        q (B, T, H, Dh), new k/v (B, T, Hkv, Dh); cache {"keys", "values"} (B, Hkv, S, Dh). Only
        the first token is real, at position cache_index: only its keys/values are written and
        only it attends. The other rows only make the projections matrix products (TensorFlow's
        XLA turns the products of a single token into vector x matrix dots at half speed); they
        get the real row's attention output, so they stay finite, and nothing they compute is
        written or read.
        """
        T = q.shape[1]
        k = ops.transpose(k[:, :1], (0, 2, 1, 3))  # (B, 1, Hkv, Dh) -> (B, Hkv, 1, Dh)
        v = ops.transpose(v[:, :1], (0, 2, 1, 3))
        keys, values = _write((cache["keys"], cache["values"]), k, v, cache_index)  # (B, Hkv, S, Dh) each
        mask = merge_masks(None, None, causal_mask(1, keys.shape[2], cache_index))  # (1, 1, 1, S)
        if attention_bias is not None:  # (B|1, H, T, S)
            attention_bias = attention_bias[:, :, :1]
        output, _ = self._attend_cached(q[:, :1], keys, values, mask, attention_bias, False, training)
        output = ops.repeat(output, T, axis=1)  # (B, 1, H, Dh) -> (B, T, H, Dh)
        return output, {"keys": keys, "values": values}

    def _attend_beams(self, q, k, v, cache, cache_index, attention_bias, training):
        """Causal self-attention of R = B * K beam rows over a beam cache -> ((R, T, H, Dh), updated cache).

        q (R, T, H, Dh), new k/v (R, T, Hkv, Dh) at positions [cache_index, cache_index + T).
        Beam search keeps each beam's keys in its own slot and, when it picks beams, reorders only
        the ancestry table: query beam k reads position s < cache_index from slot ancestry[b, k, s]
        and the new positions from its own slot. Every query
        beam is scored against the keys of all K slots of its input, and positions of the other
        slots are masked out: K times the attention products of a plain cache (small next to the
        projections at one query per row), and no copy of the cache at any step, where reordering
        it copied every layer's keys and values (B = 8, K = 4, 128-256 positions: 3.8-4.3 ms of
        cache copies per step against 1.1-2.7 ms of extra products, measured with JAX on CPU).
        """
        H, Hkv, Dh = self.num_heads, self._kv_heads, self._head_dim
        G = H // Hkv
        keys_t, values, ancestry = cache["keys_t"], cache["values"], cache["ancestry"]
        # keys_t (B, Hkv, Dh, S * K), values (B, Hkv, S * K, Dh), ancestry (B, K, S): position s of
        # slot j lies at s * K + j, so the K beams' new positions are one contiguous block.
        _, K, S = ancestry.shape
        batch = ops.shape(keys_t)[0]
        T = q.shape[1]

        # One write of the T * K new positions per buffer, on the (B * Hkv, ., .) layout the products
        # read: XLA then writes in place (a write on a 4-D view made it copy the buffers every step).
        k = ops.reshape(k, (batch, K, T, Hkv, Dh))  # (R, T, Hkv, Dh) -> (B, K, T, Hkv, Dh)
        v = ops.reshape(v, (batch, K, T, Hkv, Dh))
        new_keys_t = ops.reshape(ops.transpose(k, (0, 3, 4, 2, 1)), (batch * Hkv, Dh, T * K))  # (B, Hkv, Dh, T, K)
        new_values = ops.reshape(ops.transpose(v, (0, 3, 2, 1, 4)), (batch * Hkv, T * K, Dh))  # (B, Hkv, T, K, Dh)
        flat_keys_t = ops.reshape(keys_t, (batch * Hkv, Dh, S * K))  # (B, Hkv, Dh, S * K) -> (B * Hkv, Dh, S * K)
        flat_values = ops.reshape(values, (batch * Hkv, S * K, Dh))  # (B, Hkv, S * K, Dh) -> (B * Hkv, S * K, Dh)
        flat_keys_t = _write_one(flat_keys_t, new_keys_t, cache_index * K, axis=2)
        flat_values = _write_one(flat_values, new_values, cache_index * K, axis=1)

        q = ops.reshape(ops.cast(q, "float32") * self._scale, (batch, K, T, Hkv, G, Dh))
        q = ops.transpose(q, (0, 3, 4, 1, 2, 5))  # -> (B, Hkv, G, K, T, Dh)
        q = ops.reshape(q, (batch * Hkv, G * K * T, Dh))
        # Keys stored transposed make this a plain (rows x Dh) x (Dh x S * K) product: XLA on CPU ran
        # it 3x faster than against (S * K, Dh) keys (B * Hkv = 4, 4 query rows, 512 keys: 4.5 vs 15 us).
        logits = ops.matmul(q, ops.cast(flat_keys_t, "float32"))  # (B * Hkv, G * K * T, Dh) x (., Dh, S * K)
        logits = ops.reshape(logits, (batch, Hkv, G, K, T, S, K))  # query beam, then position, slot

        # Query beam k, token t reads slot j at position s < cache_index iff ancestry[b, k, s] == j,
        # and its own slot at the new positions up to its own (causal).
        slots = ops.arange(K, dtype="int32")
        earlier = (ops.arange(S, dtype="int32") < cache_index)[:, None]  # (S, 1)
        on_path = ops.cast(ancestry, "int32")[:, :, :, None] == slots  # (B, K, S, K): query beam, position, slot
        past = ops.logical_and(on_path, earlier)[:, :, None]  # (B, K, 1, S, K)
        own = (slots[:, None] == slots[None, :])[:, None, :]  # (K, 1, K): query beam == slot
        new = ops.logical_and(own, ops.logical_not(earlier))[None, :, None]  # (1, K, 1, S, K)
        causal = causal_mask(T, S, cache_index)[None, None, :, :, None]  # (1, 1, T, S, 1)
        allowed = ops.logical_and(ops.logical_or(past, new), causal)  # (B, K, T, S, K)
        logits = logits + mask_to_bias(allowed, "float32")[:, None, None]  # (B, 1, 1, K, T, S, K)
        if attention_bias is not None:  # (B|1, H, T, S): relative positions, the same for every slot
            bias = ops.reshape(ops.cast(attention_bias, "float32"), (-1, Hkv, G, 1, T, S, 1))
            logits = logits + bias
        scores = ops.softmax(ops.reshape(logits, (-1, S * K)), axis=-1)  # one row per (b, kv head, g, beam, t)
        if training and self.dropout > 0:
            scores = self.dropout_layer(scores, training=training)
        probs = ops.reshape(ops.cast(scores, values.dtype), (batch * Hkv, G * K * T, S * K))  # rows back per kv head
        output = ops.einsum("nqs,nsk->nqk", probs, flat_values)  # (B * Hkv, G * K * T, Dh)
        output = ops.reshape(output, (batch, Hkv, G, K, T, Dh))
        output = ops.transpose(output, (0, 3, 4, 1, 2, 5))  # -> (B, K, T, Hkv, G, Dh)
        output = ops.reshape(output, (batch * K, T, H, Dh))  # -> (R, T, H, Dh)
        keys_t = ops.reshape(flat_keys_t, (batch, Hkv, Dh, S * K))  # back to the cache's (B, Hkv, ., .) form
        values = ops.reshape(flat_values, (batch, Hkv, S * K, Dh))
        return output, {"keys_t": keys_t, "values": values, "ancestry": ancestry}

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "scale": self.scale,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


# Export sets this (see `where_cache_writes`); Keras generation leaves it False.
_WHERE_WRITES = [False]


@contextlib.contextmanager
def where_cache_writes():
    """Within: one-token cache writes are a `where` over the positions, for export.

    A `where` converts to plain ONNX Equal/Where nodes; a dynamic update slice is
    XlaDynamicUpdateSlice on TensorFlow, which tf2onnx cannot convert by itself. Outside,
    writes are dynamic update slices: XLA does them in place inside the compiled decoding
    loop, where a `where` reads and rewrites the whole cache at every step.
    """
    previous = _WHERE_WRITES[0]
    _WHERE_WRITES[0] = True
    try:
        yield
    finally:
        _WHERE_WRITES[0] = previous


def _keys_values(cache):
    """A cache in either form -> (keys, values), each (B, Hkv, S, Dh)."""
    if isinstance(cache, (list, tuple)):
        return cache[0], cache[1]
    return cache[:, 0], cache[:, 1]


def _write(cache, keys, values, index):
    """Write keys/values (B, Hkv, T, Dh) at [index, index + T) of a cache; returns it in the form it came."""
    if isinstance(cache, (list, tuple)):
        return (_write_pair_part(cache[0], keys, index), _write_pair_part(cache[1], values, index))
    update = ops.stack([keys, values], axis=1)  # 2 x (B, Hkv, T, Dh) -> (B, 2, Hkv, T, Dh)
    return _write_one(cache, update, index, axis=3)


def _write_pair_part(buffer, update, index):
    """buffer (B, Hkv, S_max, Dh) with update (B, Hkv, T, Dh) written at [index, index + T).

    Written through (B * Hkv, S_max, Dh) views, the shape XLA gives the operands of the attention
    products: XLA then writes the buffer in place, where a write on the 4-D shape made it copy the
    whole buffer at every decoding step.
    """
    if _WHERE_WRITES[0]:
        return _write_one(buffer, update, index, axis=2)
    _, heads, length, head_dim = buffer.shape
    flat = ops.reshape(buffer, (-1, length, head_dim))  # (B, Hkv, S_max, Dh) -> (B * Hkv, S_max, Dh)
    flat = _write_one(flat, ops.reshape(update, (-1, update.shape[2], head_dim)), index, axis=1)
    return ops.reshape(flat, (-1, heads, length, head_dim))  # -> (B, Hkv, S_max, Dh)


def _write_one(buffer, update, index, axis):
    """`buffer` with `update` written at [index, index + T) along its sequence `axis`."""
    update = ops.cast(update, buffer.dtype)
    index = ops.cast(index, "int32")
    if update.shape[axis] == 1 and _WHERE_WRITES[0]:
        shape = [1] * len(buffer.shape)
        shape[axis] = -1
        positions = ops.reshape(ops.arange(ops.shape(buffer)[axis], dtype="int32"), shape)  # 1 except S_max at `axis`
        return ops.where(positions == index, update, buffer)
    zero = ops.zeros((), "int32")
    start = [zero] * len(buffer.shape)
    start[axis] = index
    return ops.slice_update(buffer, tuple(start), update)


def _split_mask(attention_mask, query, query_length, key_length):
    """Validate a (B, S) or (B, T, S) mask; return (padding_mask, full_mask)."""
    if attention_mask is None:
        return None, None
    shape = tuple(attention_mask.shape)
    batch = query.shape[0]
    if len(shape) == 2:
        expected = (batch, key_length)
    elif len(shape) == 3:
        expected = (batch, query_length, key_length)
    else:
        raise ValueError(
            "`attention_mask` must have shape (B, S) or (B, T, S). "
            f"Received: attention_mask.shape={shape}"
        )
    for got, want in zip(shape, expected):
        if isinstance(got, int) and isinstance(want, int) and got != want:
            raise ValueError(
                f"`attention_mask` has shape {shape} but the attention needs {expected} "
                "(B batch, T queries, S keys)."
            )
    return (attention_mask, None) if len(shape) == 2 else (None, attention_mask)
