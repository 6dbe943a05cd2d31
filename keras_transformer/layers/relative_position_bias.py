"""T5's bucketed relative position bias.

Axes: B batch, T query length, S key length, H heads.
"""

import math

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class RelativePositionBias(keras.layers.Layer):
    """A learned scalar per (bucket of relative distance, head), added to attention logits.

    Distances key_position - query_position are bucketed as in T5: half of the
    buckets hold small distances exactly, the rest grow logarithmically up to
    `max_distance`. Bidirectional (encoder) buckets also split by the sign of
    the distance; causal (decoder) buckets only see keys at or before the query.

    Args:
        num_heads: int, number of attention heads H.
        num_buckets: int, number of distance buckets.
        max_distance: int, distances at or past this share the last bucket.
        bidirectional: bool, True for encoders, False for causal decoders.
        initializer: initializer of the (num_buckets, H) table.

    Call arguments:
        query: (B, T, ...), only its length is used.
        key: (B, S, ...), only its length is used.
        query_start: int or scalar int tensor, position of the first query
            (the cache index during cached decoding).

    Returns:
        Bias of shape (1, H, T, S) in the compute dtype.

    Example:
    >>> x = keras.random.normal((2, 4, 16))
    >>> keras.ops.shape(RelativePositionBias(num_heads=2)(x, x))
    (1, 2, 4, 4)
    """

    def __init__(
        self, num_heads, num_buckets=32, max_distance=128, bidirectional=True, initializer="glorot_uniform", **kwargs
    ):
        super().__init__(**kwargs)
        for name, value in (("num_heads", num_heads), ("num_buckets", num_buckets), ("max_distance", max_distance)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive int. Received: {name}={value}")
        if num_buckets < (4 if bidirectional else 2):
            raise ValueError(f"`num_buckets` is too small to bucket distances. Received: num_buckets={num_buckets}")
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.initializer = keras.initializers.get(initializer)

    def build(self, query_shape=None, key_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.num_buckets, self.num_heads), initializer=self.initializer
        )
        self.built = True

    def call(self, query, key, query_start=0):
        query_length, key_length = query.shape[1], key.shape[1]
        if query_length is None or key_length is None:
            query_length, key_length = ops.shape(query)[1], ops.shape(key)[1]
        query_positions = ops.arange(query_length, dtype="int32") + ops.cast(query_start, "int32")
        key_positions = ops.arange(key_length, dtype="int32")
        relative = key_positions[None, :] - query_positions[:, None]  # (T, S)
        buckets = self._bucket(relative)
        bias = ops.take(self.embeddings, buckets, axis=0)  # (T, S) -> (T, S, H)
        bias = ops.transpose(bias, (2, 0, 1))[None]  # (T, S, H) -> (1, H, T, S)
        return ops.cast(bias, self.compute_dtype)

    def _bucket(self, relative):
        num_buckets = self.num_buckets
        bucket = ops.zeros_like(relative)
        if self.bidirectional:
            num_buckets //= 2
            bucket = ops.cast(relative > 0, "int32") * num_buckets
            distance = ops.abs(relative)
        else:
            distance = ops.maximum(-relative, 0)
        max_exact = num_buckets // 2
        # Distances past max_exact are bucketed logarithmically up to max_distance.
        scaled = ops.log(ops.maximum(ops.cast(distance, "float32"), 1.0) / max_exact)
        scaled = scaled / math.log(self.max_distance / max_exact) * (num_buckets - max_exact)
        large = ops.minimum(max_exact + ops.cast(scaled, "int32"), num_buckets - 1)
        return bucket + ops.where(distance < max_exact, distance, large)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
