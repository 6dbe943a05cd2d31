"""The original encoder-decoder Transformer ("Attention Is All You Need", Vaswani et al. 2017).

Axes: B batch, S_enc encoder length, T decoder length, S_max decoder cache length,
L decoder layers, H heads, Hkv key/value heads (= H), Dh head size, D model width, V vocabulary.
"""

import math

import keras

from keras_transformer.layers import PositionalEmbedding, TransformerDecoderBlock, TransformerEncoderBlock
from keras_transformer.layers.kv_cache import layer_cache_of, like_cache
from keras_transformer.models.backbone import call_layer, check_positive_ints
from keras_transformer.models.seq2seq_backbone import Seq2SeqBackbone


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerBackbone(Seq2SeqBackbone):
    """The paper's model: post-norm encoder and decoder stacks over a shared, scaled embedding.

    Source and target tokens share one embedding matrix (section 3.4), multiplied
    by sqrt(D), plus the sinusoidal position encoding (section 3.5), then dropout.
    Each block is post-norm, `LayerNorm(x + Dropout(Sublayer(x)))`, with biases in
    every projection; the decoder blocks add cross-attention over the encoder
    output. There is no final norm (post-norm blocks already end in one). The
    defaults are the paper's base model (6 + 6 layers, D=512, 8 heads, d_ff=2048).

    Args:
        vocabulary_size: int, V (shared source/target vocabulary).
        num_layers: int, encoder layers (and decoder layers unless `num_decoder_layers`).
        num_heads: int, H.
        hidden_dim: int, D (d_model).
        intermediate_dim: int, feed-forward width (d_ff).
        num_decoder_layers: int, decoder layers, defaults to `num_layers`.
        max_sequence_length: int, the longest encoder or decoder input (positions table size).
        dropout: float, P_drop on embeddings, attention probabilities and sub-layer outputs.
        activation: feed-forward activation ("relu" in the paper).
        norm_epsilon: float, LayerNorm epsilon.
        dtype: dtype policy.

    Inputs: {"encoder_token_ids": (B, S_enc) int, "encoder_padding_mask": (B, S_enc) bool,
             "decoder_token_ids": (B, T) int, "decoder_padding_mask": (B, T) bool}.
    Outputs: {"encoder_sequence_output": (B, S_enc, D), "decoder_sequence_output": (B, T, D)}.

    Example:
    >>> import numpy as np
    >>> backbone = TransformerBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                                intermediate_dim=32)
    >>> ids, mask = np.ones((1, 4), "int32"), np.ones((1, 4), bool)
    >>> out = backbone({"encoder_token_ids": ids, "encoder_padding_mask": mask,
    ...                 "decoder_token_ids": ids, "decoder_padding_mask": mask})
    >>> tuple(out["decoder_sequence_output"].shape)
    (1, 4, 16)
    """

    family = "transformer"

    def __init__(
        self,
        vocabulary_size,
        num_layers=6,
        num_heads=8,
        hidden_dim=512,
        intermediate_dim=2048,
        num_decoder_layers=None,
        max_sequence_length=512,
        dropout=0.1,
        activation="relu",
        norm_epsilon=1e-6,
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
        _check_options(dropout, hidden_dim, num_heads, num_decoder_layers)
        decoder_layers = num_decoder_layers or num_layers
        block_kwargs = dict(
            activation=activation,
            dropout=dropout,
            norm_type="layer_norm",
            norm_first=False,
            norm_epsilon=norm_epsilon,
            use_bias=True,
            kernel_initializer="glorot_uniform",
            dtype=dtype,
        )

        # === Layers ===
        # N(0, D^-1/2) rows: scaled by sqrt(D) they enter the model at unit scale, and the tied
        # output projection starts with unit-scale logits.
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            tie_weights=True,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=hidden_dim**-0.5),
            dtype=dtype,
            name="token_embedding",
        )
        self.position_embedding = PositionalEmbedding(
            max_sequence_length, "sinusoidal", dtype=dtype, name="position_embedding"
        )
        self.encoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="encoder_embedding_dropout")
        self.encoder_layers = _encoder_blocks(num_layers, num_heads, intermediate_dim, **block_kwargs)
        self.decoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="decoder_embedding_dropout")
        self.decoder_layers = _decoder_blocks(decoder_layers, num_heads, intermediate_dim, **block_kwargs)

        # === Functional model === (the encoder and decoder stacks, see Seq2SeqBackbone)
        self.build_encoder_decoder(dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.num_decoder_layers = num_decoder_layers
        self.max_sequence_length = max_sequence_length
        self.dropout = dropout
        self.activation = activation
        self.norm_epsilon = norm_epsilon

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "num_decoder_layers": self.num_decoder_layers,
                "max_sequence_length": self.max_sequence_length,
                "dropout": self.dropout,
                "activation": self.activation,
                "norm_epsilon": self.norm_epsilon,
            }
        )
        return config

    # --- the two stacks ---------------------------------------------------

    def embed(self, token_ids, start_index=0, call_layer=call_layer):
        """Token ids (B, T) -> sqrt(D) * embedding + sinusoid for positions start_index.., (B, T, D)."""
        x = call_layer(self.token_embedding, token_ids)  # (B, T) -> (B, T, D)
        x = x * math.sqrt(self.token_embedding.output_dim)
        return x + call_layer(self.position_embedding, x, start_index=start_index)

    def encode(self, encoder_token_ids, encoder_padding_mask, training=None, call_layer=call_layer):
        """Encoder stack: ids (B, S_enc), mask (B, S_enc) -> (B, S_enc, D); `call_layer`: how the layers with
        weights are called (see `backbone.call_layer`)."""
        x = self.encoder_embedding_dropout(self.embed(encoder_token_ids, call_layer=call_layer), training=training)
        for block in self.encoder_layers:
            x = call_layer(block, x, padding_mask=encoder_padding_mask, training=training)
        return x

    def decode(self, decoder_token_ids, decoder_padding_mask, encoder_outputs, encoder_padding_mask, training=None):
        """Decoder stack over the whole target: ids (B, T) -> (B, T, D)."""
        x = self.decoder_embedding_dropout(self.embed(decoder_token_ids), training=training)
        for block in self.decoder_layers:
            x = block(
                x,
                encoder_outputs,
                padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                training=training,
            )
        return x

    # --- cached decoding --------------------------------------------------

    def call_with_cache(
        self,
        decoder_token_ids,
        self_cache,
        cache_index,
        cross_cache,
        encoder_padding_mask,
        decoder_padding_mask=None,
        call_layer=call_layer,
    ):
        """Decode T new tokens at positions [cache_index, cache_index + T), reading and writing the cache.

        decoder_token_ids (B, T); self_cache (B, L, 2, Hkv, S_max, Dh); cross_cache (B, L, 2, Hkv, S_enc, Dh);
        either cache may also be a list of L per-layer (keys, values) pairs of (B, Hkv, S, Dh);
        encoder_padding_mask (B, S_enc); decoder_padding_mask (B, S_max) or None.
        Returns (hidden (B, T, D), updated self_cache in the form it came).
        """
        x = self.embed(decoder_token_ids, start_index=cache_index, call_layer=call_layer)  # (B, T, D)
        layer_caches = []
        for i, block in enumerate(self.decoder_layers):
            x, layer_cache, _ = call_layer(
                block,
                x,
                padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=layer_cache_of(self_cache, i),
                cache_index=cache_index,
                cross_attention_cache=layer_cache_of(cross_cache, i),
            )
            layer_caches.append(layer_cache)
        self_cache = like_cache(layer_caches, self_cache)
        return x, self_cache


# --- constructor helpers --------------------------------------------------


def _check_options(dropout, hidden_dim, num_heads, num_decoder_layers):
    """The checks beyond `check_positive_ints`: a ValueError naming the first bad argument."""
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"`dropout` must be a float in [0, 1). Received: dropout={dropout!r}")
    if hidden_dim % num_heads:
        raise ValueError(
            f"`hidden_dim` must be divisible by `num_heads`. Received: hidden_dim={hidden_dim}, num_heads={num_heads}"
        )
    if num_decoder_layers is not None:
        check_positive_ints(num_decoder_layers=num_decoder_layers)


def _encoder_blocks(num_layers, num_heads, intermediate_dim, **block_kwargs):
    """The encoder stack's blocks, `encoder_layer_{i}`: bidirectional self-attention + feed-forward."""
    return [
        TransformerEncoderBlock(num_heads, intermediate_dim, name=f"encoder_layer_{i}", **block_kwargs)
        for i in range(num_layers)
    ]


def _decoder_blocks(num_layers, num_heads, intermediate_dim, **block_kwargs):
    """The decoder stack's blocks, `decoder_layer_{i}`: causal self-attention, cross-attention, feed-forward."""
    return [
        TransformerDecoderBlock(
            num_heads, intermediate_dim, use_cross_attention=True, name=f"decoder_layer_{i}", **block_kwargs
        )
        for i in range(num_layers)
    ]
