"""Multi-head scaled dot-product attention with masks, bias and a key/value cache.

Axes: B batch, T query length, S key length, H query heads, Hkv key/value heads,
Dh head size, D model width.
"""

import math

import keras
from keras import ops

from keras_transformer.layers.kv_cache import as_cache
from keras_transformer.layers.masks import causal_mask, mask_to_bias, merge_masks, split_mask
from keras_transformer.layers.rms_normalization import rms_norm
from keras_transformer.layers.rotary_embedding import RotaryEmbedding


QUERY_KEY_NORMS = (None, "head", "full")


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
        use_bias: bool, whether the query, key and value projections have biases.
        output_bias: bool, whether the output projection has one. Defaults to `use_bias`
            (Qwen2 has query/key/value biases and none on the output).
        rotary_embedding: a `RotaryEmbedding` (or its config dict) applied to the
            projected queries and keys at their absolute positions (Llama); None for none.
        sliding_window: int, with the causal mask a query attends only the last
            `sliding_window` positions up to its own (Mistral). None for no window.
        query_key_norm: None, "head" or "full": an RMS norm of the projected queries and
            keys before the rotary embedding, over each head's Dh values ("head": Qwen3,
            Gemma 3) or over all heads' H * Dh (Hkv * Dh for keys) values ("full": OLMoE).
        query_key_norm_epsilon: float, that norm's epsilon.
        query_key_norm_scale_offset: float, that norm scales by offset + w (Gemma: 1.0), see `RMSNormalization`.
        logit_soft_cap: float or None, logits (after the scale) become cap * tanh(logits / cap) (Gemma 2).
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
            or j <= cache_index + i with a cache (and, with a sliding window,
            j > that position - sliding_window).
        cache: a key/value cache (see `kv_cache.py`): a `KVCache`, `BeamCache` or
            `PaddedQueryCache`, or the plain forms a (keys, values) pair of
            (B, Hkv, S_max, Dh) tensors or one (B, 2, Hkv, S_max, Dh) tensor (keys
            [:, 0], values [:, 1]); heads before positions, as Hugging Face's
            `past_key_values`. With `cache_index`, the new keys/values are written at
            [cache_index, cache_index + T) and attention runs over the whole cache
            (the cache does both, whatever its kind); without it, the cache holds fixed
            keys/values (cross-attention) and `key`/`value` are ignored.
        cache_index: int or scalar int tensor, where to write in the cache.
        return_attention_scores: bool, also return the probabilities.
        training: bool, whether dropout is active.

    Returns:
        output (B, T, D); `(output, scores)` with scores (B, H, T, S) when
        `return_attention_scores`; the updated cache is appended when a cache
        is given, in the form it came.

    Example:
    >>> layer = MultiHeadAttention(num_heads=2)
    >>> x = keras.random.normal((2, 4, 16))
    >>> keras.ops.shape(layer(x, use_causal_mask=True))
    (2, 4, 16)
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
        output_bias=None,
        rotary_embedding=None,
        sliding_window=None,
        query_key_norm=None,
        query_key_norm_epsilon=1e-6,
        query_key_norm_scale_offset=0.0,
        logit_soft_cap=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"`num_heads` must be a positive int. Received: num_heads={num_heads}")
        if key_dim is not None and (not isinstance(key_dim, int) or key_dim < 1):
            raise ValueError(f"`key_dim` must be a positive int. Received: key_dim={key_dim}")
        if num_key_value_heads is not None and (
            not isinstance(num_key_value_heads, int) or num_key_value_heads < 1 or num_heads % num_key_value_heads
        ):
            raise ValueError(
                "`num_key_value_heads` must be a positive divisor of `num_heads`. "
                f"Received: num_key_value_heads={num_key_value_heads}, num_heads={num_heads}"
            )
        _check_rate("dropout", dropout)
        if scale is not None and scale <= 0:
            raise ValueError(f"`scale` must be positive. Received: scale={scale}")
        if sliding_window is not None and (not isinstance(sliding_window, int) or sliding_window < 1):
            raise ValueError(
                f"`sliding_window` must be a positive int or None. Received: sliding_window={sliding_window}"
            )
        if query_key_norm not in QUERY_KEY_NORMS:
            raise ValueError(
                f"`query_key_norm` must be one of {QUERY_KEY_NORMS}. Received: query_key_norm={query_key_norm!r}"
            )
        if query_key_norm_epsilon <= 0:
            raise ValueError(
                f"`query_key_norm_epsilon` must be positive. Received: query_key_norm_epsilon={query_key_norm_epsilon}"
            )
        if logit_soft_cap is not None and not logit_soft_cap > 0:
            raise ValueError(f"`logit_soft_cap` must be positive or None. Received: logit_soft_cap={logit_soft_cap}")
        if isinstance(rotary_embedding, dict):
            rotary_embedding = RotaryEmbedding(**rotary_embedding, dtype=self.dtype_policy, name="rotary_embedding")
        if rotary_embedding is not None and not isinstance(rotary_embedding, RotaryEmbedding):
            raise ValueError(
                "`rotary_embedding` must be a RotaryEmbedding, its config dict or None. "
                f"Received: rotary_embedding={rotary_embedding!r}"
            )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.num_key_value_heads = num_key_value_heads
        self.use_bias = use_bias
        self.output_bias = output_bias
        self.rotary_embedding = rotary_embedding
        self.sliding_window = sliding_window
        self.query_key_norm = query_key_norm
        self.query_key_norm_epsilon = query_key_norm_epsilon
        self.query_key_norm_scale_offset = query_key_norm_scale_offset
        self.logit_soft_cap = logit_soft_cap
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

        def projection(name, equation, output_shape, bias_axes, use_bias=self.use_bias):
            return keras.layers.EinsumDense(
                equation,
                output_shape=output_shape,
                bias_axes=bias_axes if use_bias else None,
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
        output_bias = self.use_bias if self.output_bias is None else self.output_bias
        self.output_dense = projection("attention_output", "bthk,hkd->btd", (None, hidden_dim), "d", output_bias)
        self.output_dense.build((query_shape[0], query_shape[1], H, Dh))
        if self.query_key_norm is not None:
            per_head = self.query_key_norm == "head"
            self.query_norm = self._norm("query_norm", Dh if per_head else H * Dh)
            self.key_norm = self._norm("key_norm", Dh if per_head else Hkv * Dh)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def _norm(self, name, width):
        norm = rms_norm(
            self.query_key_norm_epsilon, self.query_key_norm_scale_offset, dtype=self.dtype_policy, name=name
        )
        norm.build((None, None, width))
        return norm

    def normalize(self, x, role):
        """Queries (B, T, H, Dh) (`role` "query") or keys (B, T, Hkv, Dh) ("key") through their RMS norm,
        per head or over all heads as `query_key_norm` says; unchanged without one."""
        if self.query_key_norm is None:
            return x
        norm = self.query_norm if role == "query" else self.key_norm
        if self.query_key_norm == "head":
            return norm(x)
        shape = ops.shape(x)
        return ops.reshape(norm(ops.reshape(x, (shape[0], shape[1], -1))), shape)  # over (B, T, heads * Dh)

    def cap_logits(self, logits):
        """Scaled float32 logits, soft-capped as `logit_soft_cap` says (unchanged without a cap)."""
        if self.logit_soft_cap is None:
            return logits
        return ops.tanh(logits / self.logit_soft_cap) * self.logit_soft_cap

    def compute_cache(self, value, key=None):
        """Projected keys and values of `value` (B, S, D) -> (B, 2, Hkv, S, Dh), for cross-attention."""
        key = value if key is None else key
        keys = self.normalize(self.key_dense(key), "key")
        kv = ops.stack([keys, self.value_dense(value)], axis=1)  # (B, 2, S, Hkv, Dh)
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
        q = self.normalize(self.query_dense(query), "query")  # (B, T, H, Dh)
        if cache is not None and cache_index is not None:
            # A step: the cache writes the new keys/values and attends, whatever its kind.
            # A padded query's copies are not positions of the sequence (longrope picks its factors by its length).
            q, k = self.rotate(q, self._keys(key), cache_index, getattr(as_cache(cache), "real_queries", None))
            output, scores, updated = as_cache(cache).attend(
                self,
                q,
                k,
                self.value_dense(value),
                cache_index,
                attention_mask,
                attention_bias,
                use_causal_mask,
                return_attention_scores,
                training,
            )
            cache = updated.like(cache)
        else:
            if cache is not None:  # fixed (cross-attention) keys/values (B, Hkv, S, Dh)
                (k, v), sequence_axis = as_cache(cache).fixed(), 2
            else:
                k, v, sequence_axis = self._keys(key), self.value_dense(value), 1  # (B, S, Hkv, Dh)
                q, k = self.rotate(q, k, 0)
            query_length, key_length = q.shape[1], k.shape[sequence_axis]
            if query_length is None or key_length is None:
                query_length, key_length = ops.shape(q)[1], ops.shape(k)[sequence_axis]
            causal = causal_mask(query_length, key_length, window=self.sliding_window) if use_causal_mask else None
            mask = merge_masks(*split_mask(attention_mask, query, query_length, key_length), causal)
            attend = self._attend if cache is None else self.attend_cached
            output, scores = attend(q, k, v, mask, attention_bias, return_attention_scores, training)
        output = self.output_dense(output)  # (B, T, H, Dh) -> (B, T, D)

        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache,)
        return outputs[0] if len(outputs) == 1 else outputs

    def _keys(self, key):
        """(B, S, D) -> projected (and normed) keys (B, S, Hkv, Dh), not rotated yet."""
        return self.normalize(self.key_dense(key), "key")

    def rotate(self, q, k, start_index, real_length=None):
        """Queries (B, T, H, Dh) and keys (B, T, Hkv, Dh) at positions [start_index, start_index + T),
        rotated by the rotary embedding if the layer has one (`real_length`: see `RotaryEmbedding.call`)."""
        if self.rotary_embedding is None:
            return q, k
        rotary = self.rotary_embedding
        return (
            rotary(q, start_index=start_index, real_length=real_length),
            rotary(k, start_index=start_index, real_length=real_length),
        )

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
        fused = self.logit_soft_cap is None and self.compute_dtype != "float16"  # the fused kernel caps nothing
        if not return_scores and not use_dropout and fused:
            if bias is not None:
                bias = ops.cast(bias, q.dtype)
            output = ops.dot_product_attention(q, k, v, bias=bias, scale=self._scale)
            return output, None
        # Logits and softmax in float32 whatever the compute dtype.
        logits = ops.einsum("bthk,bshk->bhts", ops.cast(q, "float32"), ops.cast(k, "float32"))
        logits = self.cap_logits(logits * self._scale)  # (B, H, T, S)
        if bias is not None:
            logits = logits + bias
        scores = ops.softmax(logits, axis=-1)
        probs = ops.cast(self.dropout_layer(scores, training=training), v.dtype)
        output = ops.einsum("bhts,bshk->bthk", probs, v)  # (B, H, T, S) x (B, S, H, Dh) -> (B, T, H, Dh)
        return output, ops.cast(scores, self.compute_dtype)

    def attend_cached(self, q, k, v, mask, attention_bias, return_scores, training):
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
        logits = self.cap_logits(ops.reshape(logits, (batch, H, query_length, key_length)))  # -> (B, H, T, S)
        if mask is not None:
            logits = logits + mask_to_bias(mask, "float32")  # (B|1, 1, T, S)
        if attention_bias is not None:
            logits = logits + ops.cast(attention_bias, "float32")
        scores = ops.softmax(logits, axis=-1)
        probs = scores
        if training and self.dropout > 0:
            probs = self.dropout_layer(scores, training=training)
        probs = ops.reshape(
            ops.cast(probs, v.dtype), (batch * Hkv, G * query_length, key_length)
        )  # (B * Hkv, G * T, S)
        values = ops.reshape(v, (batch * Hkv, key_length, Dh))  # (B, Hkv, S, Dh) -> (B * Hkv, S, Dh)
        output = ops.einsum("nqs,nsk->nqk", probs, values)  # (B * Hkv, G * T, Dh)
        output = ops.reshape(output, (batch, H, query_length, Dh))  # -> (B, H, T, Dh)
        output = ops.transpose(output, (0, 2, 1, 3))  # -> (B, T, H, Dh)
        return output, (ops.cast(scores, self.compute_dtype) if return_scores else None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "use_bias": self.use_bias,
                "output_bias": self.output_bias,
                "rotary_embedding": None if self.rotary_embedding is None else self.rotary_embedding.arguments(),
                "sliding_window": self.sliding_window,
                "query_key_norm": self.query_key_norm,
                "query_key_norm_epsilon": self.query_key_norm_epsilon,
                "query_key_norm_scale_offset": self.query_key_norm_scale_offset,
                "logit_soft_cap": self.logit_soft_cap,
                "dropout": self.dropout,
                "scale": self.scale,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
