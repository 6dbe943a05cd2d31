"""Position embeddings: the paper's sinusoidal table or a learned table.

Axes: B batch, T sequence length, D model width.
"""

import keras
import numpy as np
from keras import ops

POSITION_TYPES = ("learned", "sinusoidal")


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEmbedding(keras.layers.Layer):
    """Position embeddings for positions `start_index .. start_index + T - 1`.

    "sinusoidal" is exactly section 3.5 of "Attention Is All You Need":
    PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).
    It has no weights and is computed for the requested positions only.
    "learned" is a trainable (max_length, D) table, as in BERT and GPT-2.

    Args:
        max_length: int, the number of positions the model supports.
        position_type: "learned" or "sinusoidal".
        initializer: initializer of the learned table.

    Call arguments:
        inputs: (B, T, D), the token embeddings the positions are added to.
        start_index: int or scalar int tensor, the position of the first
            token (non-zero during cached decoding).

    Returns:
        Position embeddings broadcast to (B, T, D), in the compute dtype.

    Example:
    >>> tokens = keras.random.normal((2, 4, 16))
    >>> keras.ops.shape(tokens + PositionalEmbedding(16, "sinusoidal")(tokens))
    (2, 4, 16)
    """

    def __init__(self, max_length, position_type="learned", initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"`max_length` must be a positive int. Received: max_length={max_length}")
        if position_type not in POSITION_TYPES:
            raise ValueError(
                f"`position_type` must be one of {POSITION_TYPES}. Received: position_type={position_type!r}"
            )
        self.max_length = max_length
        self.position_type = position_type
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        if self.position_type == "sinusoidal":
            # Computed once in float64 and rounded once: float32 angles would lose ~1e-5 at position 500.
            self._table = ops.convert_to_tensor(_sinusoid_table(self.max_length, hidden_dim), "float32")
        else:
            self.embeddings = self.add_weight(
                name="embeddings", shape=(self.max_length, hidden_dim), initializer=self.initializer
            )
        self.built = True

    def call(self, inputs, start_index=0):
        length = inputs.shape[1]
        if isinstance(start_index, int) and isinstance(length, int):
            if start_index < 0 or start_index + length > self.max_length:
                raise ValueError(
                    f"Positions {start_index}..{start_index + length - 1} are past the model's "
                    f"`max_length`={self.max_length}. Received: sequence length {length}, "
                    f"start_index={start_index}"
                )
        if length is None:
            length = ops.shape(inputs)[1]
        hidden_dim = inputs.shape[-1]
        full = ops.convert_to_tensor(self.embeddings) if self.position_type == "learned" else self._table  # (P, D)
        start = ops.cast(start_index, "int32")
        table = ops.slice(full, (start, ops.zeros((), "int32")), (length, hidden_dim))  # (T, D)
        table = ops.cast(table, self.compute_dtype)
        return ops.broadcast_to(table[None], ops.shape(inputs))  # (T, D) -> (B, T, D)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "position_type": self.position_type,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config


def _sinusoid_table(max_length, hidden_dim):
    """(max_length, D) table, sin on even and cos on odd feature indices."""
    positions = np.arange(max_length, dtype=np.float64)[:, None]  # (P, 1)
    pair = (np.arange(hidden_dim) // 2 * 2).astype(np.float64)  # 2i for both members of a pair
    angles = positions / np.power(10000.0, pair / hidden_dim)[None, :]  # (P, D)
    return np.where(np.arange(hidden_dim) % 2 == 0, np.sin(angles), np.cos(angles))
