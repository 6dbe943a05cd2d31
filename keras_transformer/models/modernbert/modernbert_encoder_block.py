"""ModernBERT's encoder layer: pre-norm, bias-free LayerNorms, rotary self-attention (global or local), GeGLU.

Axes: B batch, T query length, S key length, D model width.
"""

import keras
from keras import ops

from keras_transformer.layers import FeedForward, MultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_transformer")
class ModernBertEncoderBlock(keras.layers.Layer):
    """One ModernBERT layer: x + Attention(Norm(x)), then x + GeGLU(Norm(x)).

    Its own small class rather than options on `TransformerEncoderBlock`: its norms have no bias, the first
    layer has no attention norm at all (`attention_norm=False`: the embeddings' norm precedes it), and a local
    layer attends a symmetric window. The attention and the feed-forward are the shared layers:
    `MultiHeadAttention` (no biases, a rotary embedding of this layer's base) and `FeedForward` (gated, no biases).

    Args:
        num_heads: int, attention heads.
        intermediate_dim: int, the GeGLU width F.
        rope_max_wavelength: float, this layer's rotary base (ModernBERT: 160000 global, 10000 local).
        local_window: int or None. A query attends only keys at most `local_window` positions away on either
            side (ModernBERT's local layers: `local_attention // 2`); None attends every key (global layers).
        attention_norm: bool, whether the attention input is normalised (False: ModernBERT's first layer).
        activation: the feed-forward's gated activation (see `FeedForward`), "gated-gelu_exact" in ModernBERT.
        dropout: float in [0, 1), on attention probabilities and output and inside the feed-forward.
        norm_epsilon: float, LayerNorm epsilon.
        kernel_initializer: initializer of the kernels.

    Call arguments:
        inputs: (B, T, D).
        padding_mask: (B, T) bool, True for real tokens (keys that may be attended).
        training: bool.

    Returns:
        (B, T, D).

    Example:
    >>> block = ModernBertEncoderBlock(num_heads=2, intermediate_dim=32, local_window=1)
    >>> keras.ops.shape(block(keras.random.normal((2, 5, 16))))
    (2, 5, 16)
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        rope_max_wavelength=10000.0,
        local_window=None,
        attention_norm=True,
        activation="gated-gelu_exact",
        dropout=0.0,
        norm_epsilon=1e-5,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if local_window is not None and (not isinstance(local_window, int) or local_window < 0):
            raise ValueError(f"`local_window` must be an int >= 0 or None. Received: local_window={local_window!r}")
        if not activation.startswith("gated-"):
            raise ValueError(f"`activation` must be a gated one (GeGLU). Received: activation={activation!r}")
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.rope_max_wavelength = rope_max_wavelength
        self.local_window = local_window
        self.attention_norm = attention_norm
        self.activation = activation
        self.dropout = dropout
        self.norm_epsilon = norm_epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

        # === Layers ===
        self.self_attention_norm = self._norm("self_attention_norm") if attention_norm else None
        self.self_attention = MultiHeadAttention(
            num_heads,
            use_bias=False,
            dropout=dropout,
            rotary_embedding={"max_wavelength": rope_max_wavelength},
            kernel_initializer=kernel_initializer,
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.feed_forward_norm = self._norm("feed_forward_norm")
        self.feed_forward = FeedForward(
            intermediate_dim,
            activation=activation,
            use_bias=False,
            dropout=dropout,
            kernel_initializer=kernel_initializer,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def _norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=self.norm_epsilon, center=False, dtype=self.dtype_policy, name=name
        )

    def build(self, inputs_shape):
        if self.self_attention_norm is not None:
            self.self_attention_norm.build(inputs_shape)
        self.self_attention.build(inputs_shape)
        self.feed_forward_norm.build(inputs_shape)
        self.feed_forward.build(inputs_shape)
        self.built = True

    def attention_mask(self, inputs, padding_mask):
        """The keys each query may attend: (B, T, S) bool for a local layer (its window, and the padding mask),
        the padding mask (B, S) or None for a global one."""
        if self.local_window is None:
            return padding_mask
        positions = ops.arange(ops.shape(inputs)[1], dtype="int32")
        distance = ops.abs(positions[:, None] - positions[None, :])  # (T, 1) - (1, S) -> (T, S)
        window = ops.less_equal(distance, self.local_window)[None, :, :]  # (1, T, S)
        if padding_mask is None:
            return ops.broadcast_to(window, (ops.shape(inputs)[0], ops.shape(inputs)[1], ops.shape(inputs)[1]))
        return ops.logical_and(window, ops.cast(padding_mask, "bool")[:, None, :])  # (B, 1, S) -> (B, T, S)

    def call(self, inputs, padding_mask=None, training=None):
        x = inputs
        h = x if self.self_attention_norm is None else ops.cast(self.self_attention_norm(x), self.compute_dtype)
        h = self.self_attention(h, attention_mask=self.attention_mask(x, padding_mask), training=training)
        x = x + self.dropout_layer(h, training=training)
        h = ops.cast(self.feed_forward_norm(x), self.compute_dtype)
        return x + self.feed_forward(h, training=training)

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "rope_max_wavelength": self.rope_max_wavelength,
                "local_window": self.local_window,
                "attention_norm": self.attention_norm,
                "activation": self.activation,
                "dropout": self.dropout,
                "norm_epsilon": self.norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
