"""BERT-style encoder-only backbone (Devlin et al. 2019): post-norm encoder blocks, a pooled [CLS] output.

Axes: B batch, T sequence length, D model width, V vocabulary.
"""

import keras

from keras_transformer.layers import PositionalEmbedding, TransformerEncoderBlock
from keras_transformer.models.backbone import Backbone, check_positive_ints


# The constructor's arguments that make the config, in its order (`get_config` writes them all).
CONFIG = (
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "intermediate_dim",
    "max_sequence_length",
    "num_segments",
    "dropout",
    "activation",
    "norm_epsilon",
    "initializer_range",
    "position_offset",
)


@keras.saving.register_keras_serializable(package="keras_transformer")
class BertBackbone(Backbone):
    """Token + segment + learned position embeddings, `num_layers` post-norm encoder blocks, a tanh pooler.

    The layout of BERT, RoBERTa and XLM-R (RoBERTa's positions start past its padding id: `position_offset`), and
    of DistilBERT (`num_segments=0`: no segment embedding; its masked LM does not read the pooler).
    It follows Hugging Face `BertModel` one to one, so its weights map
    onto ours by name: `token_embedding` (word_embeddings), `segment_embedding`
    (token_type_embeddings), `position_embedding`, `embeddings_layer_norm`,
    `transformer_layer_{i}` (one `TransformerEncoderBlock` per layer, exact
    gelu) and `pooled_dense` (the pooler). The token embedding is a
    `keras.layers.ReversibleEmbedding`, so a masked LM head can reuse it.

    Args:
        vocabulary_size: int, V.
        num_layers: int, the number of encoder blocks.
        num_heads: int, attention heads.
        hidden_dim: int, D (a multiple of num_heads).
        intermediate_dim: int, feed-forward width.
        max_sequence_length: int, the number of learned positions.
        num_segments: int, the number of segment ("token type") ids; 0: no segment embedding (DistilBERT), and
            `segment_ids` must be zeros.
        dropout: float in [0, 1), on embeddings, attention probabilities and
            sub-layer outputs.
        activation: feed-forward activation ("gelu" is BERT's exact erf gelu).
        norm_epsilon: float, LayerNorm epsilon.
        initializer_range: float, stddev of the truncated normal that initialises
            every embedding and kernel (Hugging Face's `initializer_range`). BERT's
            0.02 suits widths in the hundreds; tiny models learn much faster with
            about 1 / sqrt(hidden_dim).
        position_offset: int, the row of the position table the first token reads (0; RoBERTa and XLM-R:
            their padding id + 1 = 2). The table has max_sequence_length + position_offset rows.
        dtype: dtype policy of the layers.

    Inputs:
        {"token_ids": (B, T) int32, "segment_ids": (B, T) int32, "padding_mask": (B, T) bool}.

    Outputs:
        {"sequence_output": (B, T, D), "pooled_output": (B, D)}: the last
        block's hidden states, and tanh(W h_[CLS] + b) of the first token.

    Example:
    >>> import numpy as np
    >>> backbone = BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32)
    >>> outputs = backbone({"token_ids": np.ones((1, 4), "int32"), "segment_ids": np.zeros((1, 4), "int32"),
    ...                     "padding_mask": np.ones((1, 4), bool)})
    >>> keras.ops.shape(outputs["sequence_output"]), keras.ops.shape(outputs["pooled_output"])
    ((1, 4, 16), (1, 16))
    """

    family = "bert"

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=512,
        num_segments=2,
        dropout=0.1,
        activation="gelu",
        norm_epsilon=1e-12,
        initializer_range=0.02,
        position_offset=0,
        dtype=None,
        **kwargs,
    ):
        config = {name: value for name, value in locals().items() if name in CONFIG}  # before any other local
        check_positive_ints(vocabulary_size=vocabulary_size, num_layers=num_layers, num_heads=num_heads)
        check_positive_ints(hidden_dim=hidden_dim, intermediate_dim=intermediate_dim)
        check_positive_ints(max_sequence_length=max_sequence_length)
        _check_options(hidden_dim, num_heads, dropout, initializer_range, position_offset, num_segments)
        initializer = keras.initializers.TruncatedNormal(stddev=initializer_range)

        # === Layers ===
        embedding = dict(embeddings_initializer=initializer, dtype=dtype)
        self.token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size, hidden_dim, tie_weights=True, name="token_embedding", **embedding
        )
        self.segment_embedding = None
        if num_segments:
            self.segment_embedding = keras.layers.Embedding(
                num_segments, hidden_dim, name="segment_embedding", **embedding
            )
        self.position_embedding = PositionalEmbedding(
            max_sequence_length + position_offset,
            "learned",
            initializer=initializer,
            dtype=dtype,
            name="position_embedding",
        )
        self.embeddings_layer_norm = keras.layers.LayerNormalization(
            epsilon=norm_epsilon, dtype=dtype, name="embeddings_layer_norm"
        )
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.transformer_layers = _encoder_blocks(
            num_layers,
            num_heads,
            intermediate_dim,
            activation=activation,
            dropout=dropout,
            norm_epsilon=norm_epsilon,
            kernel_initializer=initializer,
            dtype=dtype,
        )
        self.pooled_dense = keras.layers.Dense(
            hidden_dim, activation="tanh", kernel_initializer=initializer, dtype=dtype, name="pooled_dense"
        )

        # === Functional model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(None,), dtype="bool", name="padding_mask")
        x = self.token_embedding(token_ids)  # (B, T) -> (B, T, D)
        if self.segment_embedding is not None:
            x = x + self.segment_embedding(segment_ids)
        x = x + self.position_embedding(x, start_index=position_offset)
        x = self.embeddings_layer_norm(x)
        x = self.embeddings_dropout(x)
        for block in self.transformer_layers:
            x = block(x, padding_mask=padding_mask)
        pooled = self.pooled_dense(x[:, 0, :])  # the [CLS] token: (B, T, D) -> (B, D)
        super().__init__(
            inputs={"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask},
            outputs={"sequence_output": x, "pooled_output": pooled},
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


# --- constructor helpers --------------------------------------------------


def _check_options(hidden_dim, num_heads, dropout, initializer_range, position_offset, num_segments):
    """The checks beyond `check_positive_ints`: a ValueError naming the first bad argument."""
    for name, value in (("position_offset", position_offset), ("num_segments", num_segments)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`{name}` must be an int >= 0. Received: {name}={value!r}")
    if hidden_dim % num_heads:
        raise ValueError(
            f"`hidden_dim` must be a multiple of `num_heads`. Received: hidden_dim={hidden_dim}, num_heads={num_heads}"
        )
    if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
        raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout!r}")
    if not (isinstance(initializer_range, (int, float)) and initializer_range > 0):
        raise ValueError(f"`initializer_range` must be positive. Received: initializer_range={initializer_range!r}")


def _encoder_blocks(num_layers, num_heads, intermediate_dim, **block_kwargs):
    """BERT's blocks, `transformer_layer_{i}`: post-norm, LayerNorm(x + Dropout(Sublayer(x)))."""
    return [
        TransformerEncoderBlock(
            num_heads, intermediate_dim, norm_first=False, name=f"transformer_layer_{i}", **block_kwargs
        )
        for i in range(num_layers)
    ]
