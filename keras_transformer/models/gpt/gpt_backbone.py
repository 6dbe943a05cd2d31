"""GPT-style decoder-only backbone (GPT-2 layout: learned positions, pre-norm, final norm).

Axes: B batch, T sequence length, L layers, S_max cache length, H heads,
Dh head size, D model width, V vocabulary.
"""

import keras

from keras_transformer.layers import PositionalEmbedding, TransformerDecoderBlock
from keras_transformer.layers.kv_cache import layer_cache_of, like_cache
from keras_transformer.models.backbone import Backbone, call_layer, check_positive_ints


@keras.saving.register_keras_serializable(package="keras_transformer")
class GPTBackbone(Backbone):
    """Token + learned position embeddings, `num_layers` causal pre-norm decoder blocks, a final norm.

    Args:
        vocabulary_size: int, V.
        num_layers: int, L.
        num_heads: int, H.
        hidden_dim: int, D.
        intermediate_dim: int, feed-forward width.
        max_sequence_length: int, the number of learned positions.
        dropout: float, dropout on embeddings, attention and sub-layer outputs.
        activation: feed-forward activation ("gelu_approximate" as GPT-2).
        norm_epsilon: float, LayerNorm epsilon.
        num_key_value_heads: int, grouped-query attention (default H).

    Inputs: {"token_ids": (B, T) int, "padding_mask": (B, T) bool}.
    Outputs: hidden states (B, T, D).

    Example:
    >>> import numpy as np
    >>> backbone = GPTBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32)
    >>> keras.ops.shape(backbone({"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), bool)}))
    (1, 4, 16)
    """

    family = "gpt"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=1024,
        dropout=0.0,
        activation="gelu_approximate",
        norm_epsilon=1e-5,
        num_key_value_heads=None,
        dtype=None,
        **kwargs,
    ):
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            num_layers=num_layers,
            num_heads=num_heads,
            hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim,
            max_sequence_length=max_sequence_length,
        )
        # === Layers ===
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            tie_weights=True,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            dtype=dtype,
            name="token_embedding",
        )
        self.position_embedding = PositionalEmbedding(
            max_sequence_length,
            "learned",
            initializer=keras.initializers.RandomNormal(stddev=0.01),
            dtype=dtype,
            name="position_embedding",
        )
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.transformer_layers = _decoder_blocks(
            num_layers,
            num_heads,
            intermediate_dim,
            activation=activation,
            dropout=dropout,
            norm_epsilon=norm_epsilon,
            num_key_value_heads=num_key_value_heads,
            dtype=dtype,
        )
        self.layer_norm = keras.layers.LayerNormalization(epsilon=norm_epsilon, dtype=dtype, name="layer_norm")

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
        x = self.token_embedding(token_ids)  # (B, T) -> (B, T, D)
        x = x + self.position_embedding(x)
        x = self.embeddings_dropout(x)
        for block in self.transformer_layers:
            x = block(x, padding_mask=padding_mask)
        outputs = self.layer_norm(x)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask}, outputs=outputs, dtype=dtype, **kwargs
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.max_sequence_length = max_sequence_length
        self.dropout = dropout
        self.activation = activation
        self.norm_epsilon = norm_epsilon
        self.num_key_value_heads = num_key_value_heads

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "max_sequence_length": self.max_sequence_length,
                "dropout": self.dropout,
                "activation": self.activation,
                "norm_epsilon": self.norm_epsilon,
                "num_key_value_heads": self.num_key_value_heads,
            }
        )
        return config

    # --- cached decoding --------------------------------------------------

    def cache_shape(self, batch_size, max_length):
        """Shape of the key/value cache: (B, L, 2, Hkv, S_max, Dh)."""
        heads = self.num_key_value_heads or self.num_heads
        return (batch_size, self.num_layers, 2, heads, max_length, self.hidden_dim // self.num_heads)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None, call_layer=call_layer):
        """Run T new tokens at positions [cache_index, cache_index + T), reading and writing the cache.

        token_ids: (B, T). cache: (B, L, 2, Hkv, S_max, Dh), or a list of L per-layer (keys, values) pairs
        of (B, Hkv, S_max, Dh).
        padding_mask: (B, S_max) key mask or None.
        call_layer: how the layers are called (see `backbone.call_layer`).
        Returns (hidden (B, T, D), updated cache in the form it came).
        """
        x = call_layer(self.token_embedding, token_ids)  # (B, T, D)
        x = x + call_layer(self.position_embedding, x, start_index=cache_index)
        layer_caches = []
        for i, block in enumerate(self.transformer_layers):
            x, layer_cache = call_layer(
                block,
                x,
                padding_mask=padding_mask,
                self_attention_cache=layer_cache_of(cache, i),
                cache_index=cache_index,
            )
            layer_caches.append(layer_cache)
        cache = like_cache(layer_caches, cache)
        return call_layer(self.layer_norm, x), cache


# --- constructor helpers --------------------------------------------------


def _decoder_blocks(num_layers, num_heads, intermediate_dim, **block_kwargs):
    """GPT-2's blocks, `transformer_layer_{i}`: causal, pre-norm, N(0, 0.02) kernels."""
    return [
        TransformerDecoderBlock(
            num_heads,
            intermediate_dim,
            norm_first=True,
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
            name=f"transformer_layer_{i}",
            **block_kwargs,
        )
        for i in range(num_layers)
    ]
