"""T5 encoder-decoder backbone (Raffel et al. 2020): RMS pre-norm, no biases, relative position bias.

Axes: B batch, S_enc encoder length, T decoder length, S_max decoder cache length,
L decoder layers, H heads, Hkv key/value heads (= H), Dh head size (T5's d_kv),
D model width, V vocabulary.
"""

import keras

from keras_transformer.layers import RelativePositionBias, TransformerDecoderBlock, TransformerEncoderBlock
from keras_transformer.layers.kv_cache import cache_keys, layer_cache_of, like_cache
from keras_transformer.models.backbone import call_layer, check_positive_ints
from keras_transformer.models.seq2seq_backbone import Seq2SeqBackbone


@keras.saving.register_keras_serializable(package="keras_transformer")
class T5Backbone(Seq2SeqBackbone):
    """T5: shared token embedding, pre-norm encoder and decoder stacks with relative position bias.

    Every block normalises its input with RMS norm (no mean, no bias), has no
    biases in any projection and does not scale attention logits (T5 folds the
    1/sqrt(Dh) into its initialisation). Each stack computes its bucketed
    relative position bias once (bidirectional for the encoder, causal for the
    decoder) and adds it in the self-attention of all its layers; cross-attention
    has no position bias. Both stacks end with an RMS norm and dropout. T5 has
    no absolute positions: `max_sequence_length` only bounds the preprocessor.

    Sub-layer names follow Hugging Face's T5ForConditionalGeneration so a
    converter can map weights one to one:
        shared                                   -> token_embedding
        encoder.block.0...relative_attention_bias -> encoder_relative_position_bias
        encoder.block.{i}.layer.0 (SelfAttention q/k/v/o, layer_norm)
                                                 -> encoder_layer_{i}.self_attention, .self_attention_norm
        encoder.block.{i}.layer.1 (DenseReluDense wi | wi_0, wi_1, wo; layer_norm)
                                                 -> encoder_layer_{i}.feed_forward (intermediate_dense |
                                                    gate_dense, intermediate_dense; output_dense),
                                                    .feed_forward_norm
        encoder.final_layer_norm                 -> encoder_layer_norm
        decoder.*                                -> decoder_* likewise, layer.1 EncDecAttention ->
                                                    decoder_layer_{i}.cross_attention, .cross_attention_norm
    (Dense kernels are the transposed torch weights; attention kernels are reshaped to (D, H, Dh)
    and (H, Dh, D).)

    Args:
        vocabulary_size: int, V.
        num_layers: int, encoder layers (and decoder layers unless `num_decoder_layers`).
        num_heads: int, H.
        hidden_dim: int, D (T5's d_model).
        intermediate_dim: int, feed-forward width (T5's d_ff).
        key_dim: int, head size Dh (T5's d_kv). Defaults to D // H.
        num_decoder_layers: int, decoder layers, defaults to `num_layers`.
        dropout: float, dropout on embeddings, attention probabilities, sub-layer and stack outputs.
        activation: "relu" (T5 v1.0) or "gated-gelu" (T5 v1.1); any `FeedForward` activation works.
        norm_epsilon: float, RMS norm epsilon.
        relative_attention_num_buckets: int, relative distance buckets.
        relative_attention_max_distance: int, distances past this share the last bucket.
        tie_embedding_weights: bool, whether the LM head reuses the token embedding (T5 v1.0)
            or has its own projection (T5 v1.1); read by `T5Seq2SeqLM`.
        max_sequence_length: int, the longest encoder or decoder input a preprocessor may make.
        dtype: dtype policy.

    Inputs: {"encoder_token_ids": (B, S_enc) int, "encoder_padding_mask": (B, S_enc) bool,
             "decoder_token_ids": (B, T) int, "decoder_padding_mask": (B, T) bool}.
    Outputs: {"encoder_sequence_output": (B, S_enc, D), "decoder_sequence_output": (B, T, D)}.

    Example:
    >>> import numpy as np
    >>> backbone = T5Backbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                       intermediate_dim=32)
    >>> ids, mask = np.ones((1, 4), "int32"), np.ones((1, 4), bool)
    >>> out = backbone({"encoder_token_ids": ids, "encoder_padding_mask": mask,
    ...                 "decoder_token_ids": ids, "decoder_padding_mask": mask})
    >>> tuple(out["decoder_sequence_output"].shape)
    (1, 4, 16)
    """

    family = "t5"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        key_dim=None,
        num_decoder_layers=None,
        dropout=0.1,
        activation="relu",
        norm_epsilon=1e-6,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        tie_embedding_weights=True,
        max_sequence_length=512,
        dtype=None,
        **kwargs,
    ):
        check_positive_ints(
            vocabulary_size=vocabulary_size,
            num_layers=num_layers,
            num_heads=num_heads,
            hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim,
            relative_attention_num_buckets=relative_attention_num_buckets,
            relative_attention_max_distance=relative_attention_max_distance,
            max_sequence_length=max_sequence_length,
        )
        _check_options(dropout, hidden_dim, num_heads, key_dim, num_decoder_layers)
        decoder_layers = num_decoder_layers or num_layers
        block_kwargs = _block_options(activation, dropout, norm_epsilon, key_dim, dtype)
        bias_kwargs = dict(
            num_buckets=relative_attention_num_buckets, max_distance=relative_attention_max_distance, dtype=dtype
        )
        bias_kwargs["initializer"] = keras.initializers.RandomNormal(stddev=hidden_dim**-0.5)

        # === Layers ===
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            tie_weights=True,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0),
            dtype=dtype,
            name="token_embedding",
        )
        self.encoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="encoder_embedding_dropout")
        self.encoder_relative_position_bias = RelativePositionBias(
            num_heads, bidirectional=True, name="encoder_relative_position_bias", **bias_kwargs
        )
        self.encoder_layers = _encoder_blocks(num_layers, num_heads, intermediate_dim, **block_kwargs)
        self.encoder_layer_norm = keras.layers.RMSNormalization(
            epsilon=norm_epsilon, dtype=dtype, name="encoder_layer_norm"
        )
        self.encoder_output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="encoder_output_dropout")
        self.decoder_embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="decoder_embedding_dropout")
        self.decoder_relative_position_bias = RelativePositionBias(
            num_heads, bidirectional=False, name="decoder_relative_position_bias", **bias_kwargs
        )
        self.decoder_layers = _decoder_blocks(decoder_layers, num_heads, intermediate_dim, **block_kwargs)
        self.decoder_layer_norm = keras.layers.RMSNormalization(
            epsilon=norm_epsilon, dtype=dtype, name="decoder_layer_norm"
        )
        self.decoder_output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="decoder_output_dropout")

        # === Functional model === (the encoder and decoder stacks, see Seq2SeqBackbone)
        self.build_encoder_decoder(dtype=dtype, **kwargs)

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.num_decoder_layers = num_decoder_layers
        self.dropout = dropout
        self.activation = activation
        self.norm_epsilon = norm_epsilon
        self.relative_attention_num_buckets = relative_attention_num_buckets
        self.relative_attention_max_distance = relative_attention_max_distance
        self.tie_embedding_weights = tie_embedding_weights
        self.max_sequence_length = max_sequence_length

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "num_heads": self.num_heads,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "key_dim": self.key_dim,
                "num_decoder_layers": self.num_decoder_layers,
                "dropout": self.dropout,
                "activation": self.activation,
                "norm_epsilon": self.norm_epsilon,
                "relative_attention_num_buckets": self.relative_attention_num_buckets,
                "relative_attention_max_distance": self.relative_attention_max_distance,
                "tie_embedding_weights": self.tie_embedding_weights,
                "max_sequence_length": self.max_sequence_length,
            }
        )
        return config

    # --- the two stacks ---------------------------------------------------

    def encode(self, encoder_token_ids, encoder_padding_mask, training=None, call_layer=call_layer):
        """Encoder stack: ids (B, S_enc), mask (B, S_enc) -> (B, S_enc, D); `call_layer`: how the layers with
        weights are called (see `backbone.call_layer`)."""
        x = call_layer(self.token_embedding, encoder_token_ids)  # (B, S_enc) -> (B, S_enc, D)
        x = self.encoder_embedding_dropout(x, training=training)
        bias = call_layer(self.encoder_relative_position_bias, x, x)  # (1, H, S_enc, S_enc), shared by all layers
        for block in self.encoder_layers:
            x = call_layer(block, x, padding_mask=encoder_padding_mask, attention_bias=bias, training=training)
        x = call_layer(self.encoder_layer_norm, x)
        return self.encoder_output_dropout(x, training=training)

    def decode(self, decoder_token_ids, decoder_padding_mask, encoder_outputs, encoder_padding_mask, training=None):
        """Decoder stack over the whole target: ids (B, T) -> (B, T, D)."""
        x = self.token_embedding(decoder_token_ids)  # (B, T) -> (B, T, D)
        x = self.decoder_embedding_dropout(x, training=training)
        bias = self.decoder_relative_position_bias(x, x)  # (1, H, T, T), causal buckets
        for block in self.decoder_layers:
            x = block(
                x,
                encoder_outputs,
                padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_bias=bias,
                training=training,
            )
        x = self.decoder_layer_norm(x)
        return self.decoder_output_dropout(x, training=training)

    # --- cached decoding --------------------------------------------------

    def cache_head_dim(self):
        """Dh: T5's d_kv (`key_dim`) when set, else D / H."""
        return self.key_dim or self.hidden_dim // self.num_heads

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
        call_layer: how the layers are called (see `backbone.call_layer`).
        Returns (hidden (B, T, D), updated self_cache in the form it came).
        """
        x = call_layer(self.token_embedding, decoder_token_ids)  # (B, T, D)
        # Queries at cache_index.., keys over the whole cache; keys past the queries are causally masked.
        keys = cache_keys(layer_cache_of(self_cache, 0))[:, 0]  # (B, S_max, Dh): only its length counts
        bias = call_layer(self.decoder_relative_position_bias, x, keys, query_start=cache_index)  # (1, H, T, S_max)
        layer_caches = []
        for i, block in enumerate(self.decoder_layers):
            x, layer_cache, _ = call_layer(
                block,
                x,
                padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_bias=bias,
                self_attention_cache=layer_cache_of(self_cache, i),
                cache_index=cache_index,
                cross_attention_cache=layer_cache_of(cross_cache, i),
            )
            layer_caches.append(layer_cache)
        self_cache = like_cache(layer_caches, self_cache)
        return call_layer(self.decoder_layer_norm, x), self_cache


# --- constructor helpers --------------------------------------------------


def _check_options(dropout, hidden_dim, num_heads, key_dim, num_decoder_layers):
    """The checks beyond `check_positive_ints`: a ValueError naming the first bad argument."""
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"`dropout` must be a float in [0, 1). Received: dropout={dropout!r}")
    if key_dim is not None:
        check_positive_ints(key_dim=key_dim)
    elif hidden_dim % num_heads:
        raise ValueError(
            "`hidden_dim` must be divisible by `num_heads` when `key_dim` is not set. "
            f"Received: hidden_dim={hidden_dim}, num_heads={num_heads}"
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


def _block_options(activation, dropout, norm_epsilon, key_dim, dtype):
    """The options T5's encoder and decoder blocks share: pre-norm RMS, no biases, unscaled attention."""
    return dict(
        activation=activation,
        dropout=dropout,
        norm_type="rms_norm",
        norm_first=True,
        norm_epsilon=norm_epsilon,
        use_bias=False,
        key_dim=key_dim,
        attention_scale=1.0,
        # fan-in scaling keeps unscaled attention logits near unit variance at initialisation.
        kernel_initializer=keras.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal"),
        dtype=dtype,
    )
