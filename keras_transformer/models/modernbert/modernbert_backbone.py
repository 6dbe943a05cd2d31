"""ModernBERT encoder backbone (Warner et al. 2024): rotary positions, global and local attention, GeGLU, no biases.

Axes: B batch, T sequence length, D model width, V vocabulary.
"""

import keras

from keras_transformer.models.backbone import Backbone, check_layer_list, check_positive_ints
from keras_transformer.models.modernbert.modernbert_encoder_block import ModernBertEncoderBlock

LAYER_TYPES = ("full_attention", "sliding_attention")
# The constructor's arguments that make the config, in its order (`get_config` writes them all).
CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "max_sequence_length",
    "layer_types",
    "local_attention",
    "global_rope_max_wavelength",
    "local_rope_max_wavelength",
    "dropout",
    "activation",
    "norm_epsilon",
    "initializer_range",
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class ModernBertBackbone(Backbone):
    """Token embedding, LayerNorm, `num_layers` pre-norm `ModernBertEncoderBlock`s, a final LayerNorm.

    It follows Hugging Face `ModernBertModel`: no position table (each layer rotates its queries and keys, global
    layers with base `global_rope_max_wavelength`, local ones with `local_rope_max_wavelength`), local layers
    attending a symmetric window of `local_attention // 2` positions each side, every norm without a bias, no
    projection biases, a GeGLU feed-forward, and no attention norm in the first layer. Its layers:
    `token_embedding` (a `keras.layers.ReversibleEmbedding`, which the masked LM's decoder reuses),
    `embeddings_layer_norm`, `transformer_layer_{i}`, `final_norm`.

    Args:
        vocabulary_size: int, V.
        num_layers: int, the number of encoder blocks.
        num_heads: int, attention heads.
        hidden_dim: int, D (a multiple of num_heads).
        intermediate_dim: int, the GeGLU width.
        max_sequence_length: int, the longest input (ModernBERT: 8192; nothing is learned per position).
        layer_types: None or a list of num_layers entries, "full_attention" or "sliding_attention". None is
            ModernBERT's default: every third layer global, starting with the first.
        local_attention: int, the total width of a local layer's window (a query sees `local_attention // 2`
            positions on each side).
        global_rope_max_wavelength: float, the rotary base of global layers.
        local_rope_max_wavelength: float, the rotary base of local layers.
        dropout: float in [0, 1), on embeddings, attention probabilities and outputs, and in the feed-forward.
        activation: the feed-forward's gated activation ("gated-gelu_exact": GeGLU with the exact gelu).
        norm_epsilon: float, LayerNorm epsilon.
        initializer_range: float, stddev of the truncated normal that initialises every embedding and kernel.
        dtype: dtype policy of the layers.

    Inputs:
        {"token_ids": (B, T) int32, "padding_mask": (B, T) bool}.

    Outputs:
        {"sequence_output": (B, T, D)}: the final norm of the last block's hidden states.

    Example:
    >>> import numpy as np
    >>> backbone = ModernBertBackbone(vocabulary_size=100, num_layers=3, num_heads=2, hidden_dim=16,
    ...                               intermediate_dim=32, local_attention=4)
    >>> outputs = backbone({"token_ids": np.ones((1, 6), "int32"), "padding_mask": np.ones((1, 6), bool)})
    >>> keras.ops.shape(outputs["sequence_output"])
    (1, 6, 16)
    """

    family = "modernbert"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=8192,
        layer_types=None,
        local_attention=128,
        global_rope_max_wavelength=160000.0,
        local_rope_max_wavelength=10000.0,
        dropout=0.0,
        activation="gated-gelu_exact",
        norm_epsilon=1e-5,
        initializer_range=0.02,
        dtype=None,
        **kwargs,
    ):
        config = {name: value for name, value in locals().items() if name in CONFIG}  # before any other local
        check_positive_ints(vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=num_heads)
        check_positive_ints(hidden_dim=hidden_dim, intermediate_dim=intermediate_dim)
        check_positive_ints(max_sequence_length=max_sequence_length, local_attention=local_attention)
        config["layer_types"] = check_layer_list("layer_types", layer_types, num_layers, LAYER_TYPES)
        _check_options(hidden_dim, num_heads, dropout, initializer_range)
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)

        # === Layers ===
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size,
            hidden_dim,
            tie_weights=True,
            embeddings_initializer=initializer,
            dtype=dtype,
            name="token_embedding",
        )
        self.embeddings_layer_norm = keras.layers.LayerNormalization(
            epsilon=norm_epsilon, center=False, dtype=dtype, name="embeddings_layer_norm"
        )
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.transformer_layers = [
            ModernBertEncoderBlock(
                num_heads,
                intermediate_dim,
                attention_norm=i > 0,
                activation=activation,
                dropout=dropout,
                norm_epsilon=norm_epsilon,
                kernel_initializer=initializer,
                dtype=dtype,
                name=f"transformer_layer_{i}",
                **_attention_kind(config, i),
            )
            for i in range(num_layers)
        ]
        self.final_norm = keras.layers.LayerNormalization(
            epsilon=norm_epsilon, center=False, dtype=dtype, name="final_norm"
        )

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
        x = self.token_embedding(token_ids)  # (B, T) -> (B, T, D)
        x = self.embeddings_dropout(self.embeddings_layer_norm(x))
        for block in self.transformer_layers:
            x = block(x, padding_mask=padding_mask)
        x = self.final_norm(x)
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs={"sequence_output": x},
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        for name, value in config.items():
            setattr(self, name, value)

    def get_config(self):
        config = super().get_config()
        config.update({name: getattr(self, name) for name in CONFIG})
        return config

    def layer_type(self, index):
        """ "full_attention" or "sliding_attention": the attention of layer `index`."""
        return _layer_type(self.layer_types, index)


# --- constructor helpers --------------------------------------------------


def default_layer_types(num_layers, global_every=3):
    """ModernBERT's pattern: layer i is global when i is a multiple of `global_every` (its
    `global_attn_every_n_layers`), local otherwise."""
    return ["sliding_attention" if i % global_every else "full_attention" for i in range(num_layers)]


def _layer_type(layer_types, index):
    return (layer_types or default_layer_types(index + 1))[index]


def _attention_kind(config, index):
    """The block arguments that differ between global and local layers: the rotary base and the window."""
    if _layer_type(config["layer_types"], index) == "full_attention":
        return {"rope_max_wavelength": float(config["global_rope_max_wavelength"]), "local_window": None}
    return {
        "rope_max_wavelength": float(config["local_rope_max_wavelength"]),
        "local_window": config["local_attention"] // 2,
    }


def _check_options(hidden_dim, num_heads, dropout, initializer_range):
    """The checks beyond `check_positive_ints`: a ValueError naming the first bad argument."""
    if hidden_dim % num_heads:
        raise ValueError(
            f"`hidden_dim` must be a multiple of `num_heads`. Received: hidden_dim={hidden_dim}, num_heads={num_heads}"
        )
    if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
        raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout!r}")
    if not (isinstance(initializer_range, (int, float)) and initializer_range > 0):
        raise ValueError(f"`initializer_range` must be positive. Received: initializer_range={initializer_range!r}")
