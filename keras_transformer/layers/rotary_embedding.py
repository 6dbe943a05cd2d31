"""Rotary position embedding (RoPE, Su et al. 2021), as Llama, Qwen2 and Mistral apply it.

Axes: B batch, T sequence length, H heads, Dh head size, R rotated dims (R <= Dh, even).
"""

import math

import keras
import numpy as np
from keras import ops

SCALING_TYPES = ("linear", "llama3")


@keras.saving.register_keras_serializable(package="keras_transformer")
class RotaryEmbedding(keras.layers.Layer):
    """Rotates each query/key head by angles proportional to its absolute position.

    Pair i of a head's first R dims, (x[i], x[i + R/2]) (the "rotate half" layout of
    Hugging Face's Llama, not interleaved pairs), is rotated by position * theta_i with
    theta_i = max_wavelength ** (-2 i / R). Dims past R pass through (partial rotary,
    as GPT-NeoX and Phi). A dot product of a rotated query and key then depends on their
    positions only through their distance.

    Args:
        max_wavelength: float, the base of the wavelengths (`rope_theta`), 10000 in Llama.
        rotary_dim: int, R, how many leading dims of each head rotate (even). Defaults to
            the whole head.
        scaling: None, or a dict as Hugging Face's `rope_scaling`:
            {"rope_type": "linear", "factor": f} divides every frequency by f (positions
            interpolated); {"rope_type": "llama3", "factor", "low_freq_factor",
            "high_freq_factor", "original_max_position_embeddings"} divides only the low
            frequencies by f and blends the band between (Llama 3.1).

    Call arguments:
        inputs: (B, T, H, Dh) queries or keys.
        start_index: int or scalar int tensor, the position of the first of the T tokens
            (the cache index while decoding).

    Returns:
        (B, T, H, Dh), rotated.

    Example:
    >>> rope = RotaryEmbedding(max_wavelength=10000)
    >>> keras.ops.shape(rope(keras.random.normal((2, 4, 2, 8)), start_index=3))
    (2, 4, 2, 8)
    """

    def __init__(self, max_wavelength=10000.0, rotary_dim=None, scaling=None, **kwargs):
        super().__init__(**kwargs)
        if not max_wavelength > 1:
            raise ValueError(f"`max_wavelength` must be greater than 1. Received: max_wavelength={max_wavelength}")
        if rotary_dim is not None and (not isinstance(rotary_dim, int) or rotary_dim < 2 or rotary_dim % 2):
            raise ValueError(f"`rotary_dim` must be a positive even int. Received: rotary_dim={rotary_dim}")
        self.max_wavelength = float(max_wavelength)
        self.rotary_dim = rotary_dim
        self.scaling = _check_scaling(scaling)

    def inverse_frequencies(self, head_dim):
        """theta_i for i < R / 2, float32 numpy (R / 2,), scaling applied."""
        rotary_dim = self.rotary_dim or head_dim
        if rotary_dim > head_dim or rotary_dim % 2:
            raise ValueError(
                f"`rotary_dim` must be even and at most the head size. Received: rotary_dim={rotary_dim}, "
                f"head size={head_dim}"
            )
        frequencies = 1.0 / self.max_wavelength ** (np.arange(0, rotary_dim, 2, dtype=np.float32) / rotary_dim)
        return _scaled(frequencies.astype(np.float32), self.scaling)

    def cos_sin(self, positions, head_dim):
        """cos and sin (T, R) of positions (T,) int: each angle twice, for the rotate-half layout."""
        frequencies = ops.convert_to_tensor(self.inverse_frequencies(head_dim))
        angles = ops.cast(positions, "float32")[:, None] * frequencies[None, :]  # (T, 1) x (1, R/2) -> (T, R/2)
        angles = ops.concatenate([angles, angles], axis=-1)  # -> (T, R)
        return ops.cos(angles), ops.sin(angles)

    def call(self, inputs, start_index=0):
        head_dim = inputs.shape[-1]
        rotary_dim = self.rotary_dim or head_dim
        length = ops.shape(inputs)[1]
        positions = ops.arange(length, dtype="int32") + ops.cast(start_index, "int32")
        cos, sin = self.cos_sin(positions, head_dim)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (T, R) -> (1, T, 1, R)
        x = ops.cast(inputs, "float32")
        rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
        half = rotary_dim // 2
        # rotate_half: (x1, x2) -> (-x2, x1) on the two halves of the rotated dims
        turned = ops.concatenate([-rotated[..., half:], rotated[..., :half]], axis=-1)
        rotated = rotated * cos + turned * sin
        outputs = rotated if rotary_dim == head_dim else ops.concatenate([rotated, passed], axis=-1)
        return ops.cast(outputs, inputs.dtype)

    def arguments(self):
        """The constructor's own arguments (what an attention layer's config keeps)."""
        return {"max_wavelength": self.max_wavelength, "rotary_dim": self.rotary_dim, "scaling": self.scaling}

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(self.arguments())
        return config


def _check_scaling(scaling):
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise ValueError(f"`scaling` must be None or a dict. Received: scaling={scaling!r}")
    scaling = dict(scaling)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return None
    if kind not in SCALING_TYPES:
        raise ValueError(f"`scaling['rope_type']` must be one of {SCALING_TYPES}. Received: scaling={scaling!r}")
    needed = ["factor"] + (
        ["low_freq_factor", "high_freq_factor", "original_max_position_embeddings"] if kind == "llama3" else []
    )
    missing = [key for key in needed if key not in scaling]
    if missing:
        raise ValueError(f"`scaling` of rope_type {kind!r} needs {missing}. Received: scaling={scaling!r}")
    if not scaling["factor"] > 0:
        raise ValueError(f"`scaling['factor']` must be positive. Received: factor={scaling['factor']}")
    if kind == "llama3" and not scaling["high_freq_factor"] > scaling["low_freq_factor"]:
        raise ValueError(
            "`scaling['high_freq_factor']` must exceed `low_freq_factor`. "
            f"Received: high_freq_factor={scaling['high_freq_factor']}, low_freq_factor={scaling['low_freq_factor']}"
        )
    out = {"rope_type": kind}
    out.update({key: scaling[key] for key in needed})
    return out


def _scaled(frequencies, scaling):
    """Frequencies (R/2,) after `scaling` (see RotaryEmbedding)."""
    if scaling is None:
        return frequencies
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return (frequencies / factor).astype(np.float32)
    # llama3: long wavelengths (low frequencies) slowed by `factor`, short ones kept, the band between blended.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    context = float(scaling["original_max_position_embeddings"])
    wavelengths = 2 * math.pi / frequencies
    smooth = (context / wavelengths - low) / (high - low)
    blended = (1 - smooth) * frequencies / factor + smooth * frequencies
    out = np.where(wavelengths > context / low, frequencies / factor, frequencies)
    band = (wavelengths >= context / high) & (wavelengths <= context / low)
    return np.where(band, blended, out).astype(np.float32)
