"""Llama-style decoder-only backbone: rotary positions, grouped-query attention, RMS norm, SwiGLU.

The layout of Llama 2/3, Qwen2, Mistral and SmolLM2: token embedding (no learned positions),
pre-norm decoder blocks whose self-attention rotates queries and keys (RoPE), a gated SiLU
feed-forward, RMS norms, a final RMS norm.

Axes: B batch, T sequence length, L layers, S_max cache length, Hkv key/value heads,
Dh head size, D model width, V vocabulary.
"""

import keras

from keras_transformer.layers import TransformerDecoderBlock
from keras_transformer.layers.kv_cache import layer_cache_of, like_cache
from keras_transformer.models.backbone import Backbone, call_layer, check_positive_ints


@keras.saving.register_keras_serializable(package="keras_transformer")
class LlamaBackbone(Backbone):
    """Token embedding, `num_layers` causal pre-norm RoPE decoder blocks, a final RMS norm.

    Args:
        vocabulary_size: int, V.
        num_layers: int, L.
        num_heads: int, query heads H.
        hidden_dim: int, D.
        intermediate_dim: int, the SwiGLU width.
        num_key_value_heads: int, key/value heads (grouped-query attention). Defaults to H.
        head_dim: int, Dh. Defaults to D // H.
        max_sequence_length: int, the longest sequence the model is used with (RoPE has no
            table; this bounds the preprocessor and generation).
        rope_max_wavelength: float, RoPE's base (`rope_theta`).
        rope_scaling: None or a Hugging Face `rope_scaling` dict ("linear" or "llama3"),
            see `RotaryEmbedding`.
        rotary_dim: int, rotate only the first dims of each head (partial rotary). Defaults to Dh.
        attention_bias: bool, biases on the query/key/value projections (Qwen2: True).
        attention_output_bias: bool, a bias on the attention output. Defaults to `attention_bias`
            (Llama's `attention_bias` covers all four; Qwen2 has none here).
        mlp_bias: bool, biases in the feed-forward.
        sliding_window: int or None, attention sees only this many positions up to its own (Mistral).
        tie_word_embeddings: bool, the output head is the transposed token embedding.
        norm_epsilon: float, the RMS norms' epsilon.
        dropout: float, dropout on attention and sub-layer outputs.

    Inputs: {"token_ids": (B, T) int, "padding_mask": (B, T) bool}.
    Outputs: hidden states (B, T, D).

    Example:
    >>> import numpy as np
    >>> backbone = LlamaBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                          intermediate_dim=32, num_key_value_heads=1)
    >>> keras.ops.shape(backbone({"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), bool)}))
    (1, 4, 16)
    """

    family = "llama"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        num_key_value_heads=None,
        head_dim=None,
        max_sequence_length=2048,
        rope_max_wavelength=10000.0,
        rope_scaling=None,
        rotary_dim=None,
        attention_bias=False,
        attention_output_bias=None,
        mlp_bias=False,
        sliding_window=None,
        tie_word_embeddings=True,
        norm_epsilon=1e-6,
        dropout=0.0,
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
            tie_weights=tie_word_embeddings,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            dtype=dtype,
            name="token_embedding",
        )
        rotary = {"max_wavelength": rope_max_wavelength, "rotary_dim": rotary_dim, "scaling": rope_scaling}
        self.transformer_layers = _decoder_blocks(
            num_layers,
            num_heads,
            intermediate_dim,
            dropout=dropout,
            norm_epsilon=norm_epsilon,
            use_bias=mlp_bias,
            key_dim=head_dim,
            num_key_value_heads=num_key_value_heads,
            attention_bias=attention_bias,
            attention_output_bias=attention_output_bias,
            rotary_embedding=rotary,
            sliding_window=sliding_window,
            dtype=dtype,
        )
        self.layer_norm = keras.layers.RMSNormalization(epsilon=norm_epsilon, dtype=dtype, name="layer_norm")

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
        x = self.token_embedding(token_ids)  # (B, T) -> (B, T, D)
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
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.max_sequence_length = max_sequence_length
        self.rope_max_wavelength = rope_max_wavelength
        self.rope_scaling = rope_scaling
        self.rotary_dim = rotary_dim
        self.attention_bias = attention_bias
        self.attention_output_bias = attention_output_bias
        self.mlp_bias = mlp_bias
        self.sliding_window = sliding_window
        self.tie_word_embeddings = tie_word_embeddings
        self.norm_epsilon = norm_epsilon
        self.dropout = dropout

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "max_sequence_length": self.max_sequence_length,
                "rope_max_wavelength": self.rope_max_wavelength,
                "rope_scaling": self.rope_scaling,
                "rotary_dim": self.rotary_dim,
                "attention_bias": self.attention_bias,
                "attention_output_bias": self.attention_output_bias,
                "mlp_bias": self.mlp_bias,
                "sliding_window": self.sliding_window,
                "tie_word_embeddings": self.tie_word_embeddings,
                "norm_epsilon": self.norm_epsilon,
                "dropout": self.dropout,
            }
        )
        return config

    # --- cached decoding --------------------------------------------------

    def cache_shape(self, batch_size, max_length):
        """Shape of the key/value cache: (B, L, 2, Hkv, S_max, Dh)."""
        heads = self.num_key_value_heads or self.num_heads
        return (batch_size, self.num_layers, 2, heads, max_length, self.head_dim or self.hidden_dim // self.num_heads)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None, call_layer=call_layer):
        """Run T new tokens at positions [cache_index, cache_index + T), reading and writing the cache.

        token_ids: (B, T). cache: (B, L, 2, Hkv, S_max, Dh), or a list of L per-layer (keys, values) pairs.
        padding_mask: (B, S_max) key mask or None. call_layer: how the layers are called
        (see `backbone.call_layer`). The blocks rotate queries and keys at their absolute positions.
        Returns (hidden (B, T, D), updated cache in the form it came).
        """
        x = call_layer(self.token_embedding, token_ids)  # (B, T, D)
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
        return call_layer(self.layer_norm, x), like_cache(layer_caches, cache)


# --- constructor helpers --------------------------------------------------


def _decoder_blocks(num_layers, num_heads, intermediate_dim, **block_kwargs):
    """Llama's blocks, `transformer_layer_{i}`: causal, pre-norm RMS norms, SwiGLU, N(0, 0.02) kernels."""
    return [
        TransformerDecoderBlock(
            num_heads,
            intermediate_dim,
            activation="gated-silu",
            norm_type="rms_norm",
            norm_first=True,
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
            name=f"transformer_layer_{i}",
            **block_kwargs,
        )
        for i in range(num_layers)
    ]
