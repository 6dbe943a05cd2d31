"""Gemma 2 / Gemma 3 decoder-only backbone: scaled embeddings, sandwich (1 + w) RMS norms, GeGLU, local and
global layers.

The text layout of Gemma 2 and Gemma 3 (Hugging Face `Gemma2ForCausalLM`, `Gemma3ForCausalLM`): token
embeddings times sqrt(D) (rounded to the embedding's dtype), pre-norm decoder blocks with a second norm
after each sub-layer (four per block), RMS norms that scale by (1 + w), a GeGLU feed-forward (tanh gelu),
attention scaled by `query_pre_attn_scalar` ** -0.5, sliding-window ("sliding_attention") and global
("full_attention") layers each with their own rotary base, optional per-head query/key norms (Gemma 3),
optional soft-capping of the attention logits and of the output logits (Gemma 2), and a final norm.

Axes: B batch, T sequence length, L layers, S_max cache length, Hkv key/value heads,
Dh head size, D model width, V vocabulary.
"""

import math

import keras
import ml_dtypes
import numpy as np

from keras_transformer.layers import TransformerDecoderBlock
from keras_transformer.layers.kv_cache import layer_cache_of, like_cache
from keras_transformer.layers.rms_normalization import RMSNormalization
from keras_transformer.models.backbone import Backbone, call_layer, check_layer_list, check_positive_ints

LAYER_TYPES = ("full_attention", "sliding_attention")
QUERY_KEY_NORMS = (None, "head")
# The constructor's arguments that make the config, in its order (`get_config` writes them all).
CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "num_key_value_heads",
    "head_dim",
    "max_sequence_length",
    "query_pre_attn_scalar",
    "rope_max_wavelength",
    "rope_scaling",
    "local_rope_max_wavelength",
    "sliding_window",
    "layer_types",
    "query_key_norm",
    "attention_bias",
    "attention_logit_soft_cap",
    "final_logit_soft_cap",
    "tie_word_embeddings",
    "norm_epsilon",
    "dropout",
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class GemmaBackbone(Backbone):
    """Scaled token embedding, `num_layers` causal RoPE decoder blocks with pre and post norms, a final norm.

    Args:
        vocabulary_size: int, V.
        num_layers: int, L.
        num_heads: int, query heads H.
        hidden_dim: int, D.
        intermediate_dim: int, the GeGLU width.
        num_key_value_heads: int, key/value heads (grouped-query attention). Defaults to H.
        head_dim: int, Dh. Defaults to D // H.
        max_sequence_length: int, the longest sequence the model is used with (bounds the preprocessor,
            generation and the exported rotary tables).
        query_pre_attn_scalar: float, the attention logits are scaled by its inverse square root.
            Defaults to Dh.
        rope_max_wavelength: float, the global layers' RoPE base (`rope_theta`).
        rope_scaling: None or a Hugging Face `rope_scaling` dict ("linear" or "llama3") of the global layers,
            see `RotaryEmbedding`.
        local_rope_max_wavelength: float, the sliding layers' RoPE base (`rope_local_base_freq`). Defaults to
            `rope_max_wavelength`.
        sliding_window: int or None, a "sliding_attention" layer attends this many positions up to its own.
        layer_types: None (every layer global) or a list of L entries, "full_attention" or "sliding_attention".
        query_key_norm: None or "head": (1 + w) RMS norms of each head's queries and keys (Gemma 3).
        attention_bias: bool, biases on the four attention projections.
        attention_logit_soft_cap: float or None, attention logits become cap * tanh(logits / cap) (Gemma 2).
        final_logit_soft_cap: float or None, the same on the output logits (Gemma 2).
        tie_word_embeddings: bool, the output head is the transposed token embedding.
        norm_epsilon: float, the RMS norms' epsilon.
        dropout: float, dropout on attention and sub-layer outputs.

    Inputs: {"token_ids": (B, T) int, "padding_mask": (B, T) bool}.
    Outputs: hidden states (B, T, D).

    Example:
    >>> import numpy as np
    >>> backbone = GemmaBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                          intermediate_dim=32, num_key_value_heads=1, sliding_window=4,
    ...                          layer_types=["sliding_attention", "full_attention"])
    >>> keras.ops.shape(backbone({"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), bool)}))
    (1, 4, 16)
    """

    family = "gemma"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        num_key_value_heads=None,
        head_dim=None,
        max_sequence_length=8192,
        query_pre_attn_scalar=None,
        rope_max_wavelength=10000.0,
        rope_scaling=None,
        local_rope_max_wavelength=None,
        sliding_window=None,
        layer_types=None,
        query_key_norm=None,
        attention_bias=False,
        attention_logit_soft_cap=None,
        final_logit_soft_cap=None,
        tie_word_embeddings=True,
        norm_epsilon=1e-6,
        dropout=0.0,
        dtype=None,
        **kwargs,
    ):
        config = {name: value for name, value in locals().items() if name in CONFIG}  # before any other local
        _check(config)
        # === Layers ===
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            tie_weights=tie_word_embeddings,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            logit_soft_cap=final_logit_soft_cap,
            dtype=dtype,
            name="token_embedding",
        )
        self.transformer_layers = _decoder_blocks(config, dtype)
        self.layer_norm = RMSNormalization(scale_offset=1.0, epsilon=norm_epsilon, dtype=dtype, name="layer_norm")
        # sqrt(D) rounded to the embedding's dtype, as transformers multiplies by it.
        self._embedding_scale = _rounded(math.sqrt(hidden_dim), self.token_embedding.compute_dtype)

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
        x = self.token_embedding(token_ids) * self._embedding_scale  # (B, T) -> (B, T, D)
        for block in self.transformer_layers:
            x = block(x, padding_mask=padding_mask)
        outputs = self.layer_norm(x)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask}, outputs=outputs, dtype=dtype, **kwargs
        )

        # === Config ===
        for name, value in config.items():  # every argument in CONFIG, as checked above
            setattr(self, name, value)

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in CONFIG})
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
        (see `backbone.call_layer`). Returns (hidden (B, T, D), updated cache in the form it came).
        """
        x = call_layer(self.token_embedding, token_ids) * self._embedding_scale  # (B, T, D)
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


def _check(config):
    """Validate the config in place (`layer_types` as a list), with messages naming the argument."""
    check_positive_ints(
        **{name: config[name] for name in CONFIG[:5]}, max_sequence_length=config["max_sequence_length"]
    )
    config["layer_types"] = check_layer_list("layer_types", config["layer_types"], config["num_layers"], LAYER_TYPES)
    if config["query_key_norm"] not in QUERY_KEY_NORMS:
        raise ValueError(
            f"`query_key_norm` must be one of {QUERY_KEY_NORMS}. Received: query_key_norm={config['query_key_norm']!r}"
        )
    scalar = config["query_pre_attn_scalar"]
    if scalar is not None and not scalar > 0:
        raise ValueError(f"`query_pre_attn_scalar` must be positive. Received: query_pre_attn_scalar={scalar}")


def _rounded(value, dtype):
    """A Python float `value` rounded to `dtype` (float32, float16 or bfloat16)."""
    return float(np.asarray(value, dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype))


def _decoder_blocks(config, dtype):
    """Gemma's blocks, `transformer_layer_{i}`: causal, pre and post (1 + w) RMS norms, GeGLU (tanh gelu), N(0, 0.02)
    kernels; layer i windowed, with the local rotary base, where `layer_types[i]` is "sliding_attention"."""
    head_dim = config["head_dim"] or config["hidden_dim"] // config["num_heads"]
    scalar = config["query_pre_attn_scalar"] or head_dim
    local_base = config["local_rope_max_wavelength"] or config["rope_max_wavelength"]
    rotary = {
        "full_attention": {"max_wavelength": config["rope_max_wavelength"], "scaling": config["rope_scaling"]},
        "sliding_attention": {"max_wavelength": local_base, "scaling": None},
    }
    layer_types = config["layer_types"] or ["full_attention"] * config["num_layers"]
    return [
        TransformerDecoderBlock(
            config["num_heads"],
            config["intermediate_dim"],
            activation="gated-gelu",
            norm_type="rms_norm_plus_one",
            norm_first=True,
            post_norm=True,
            norm_epsilon=config["norm_epsilon"],
            dropout=config["dropout"],
            use_bias=False,
            key_dim=config["head_dim"],
            num_key_value_heads=config["num_key_value_heads"],
            attention_scale=float(scalar) ** -0.5,
            attention_bias=config["attention_bias"],
            rotary_embedding=rotary[layer_type],
            sliding_window=config["sliding_window"] if layer_type == "sliding_attention" else None,
            query_key_norm=config["query_key_norm"],
            attention_logit_soft_cap=config["attention_logit_soft_cap"],
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
            dtype=dtype,
            name=f"transformer_layer_{i}",
        )
        for i, layer_type in enumerate(layer_types)
    ]
