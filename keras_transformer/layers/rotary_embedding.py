"""Rotary position embedding (RoPE, Su et al. 2021), as Llama, Qwen2, Mistral and Phi-3 apply it.

Axes: B batch, T sequence length, H heads, Dh head size, R rotated dims (R <= Dh, even).
"""

import math

import keras
import numpy as np
from keras import ops

SCALING_TYPES = ("linear", "llama3", "longrope")
# The keys each scaling needs besides "rope_type".
_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings", "attention_factor"),
}


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
            frequencies by f and blends the band between (Llama 3.1); {"rope_type": "longrope",
            "short_factor", "long_factor" (R/2 divisors each), "original_max_position_embeddings" N,
            "attention_factor" a} divides theta_i by short_factor[i], or by long_factor[i] in a call
            whose sequence (its last position + 1) is longer than N, and multiplies cos and sin by a
            (Phi-3, as transformers' dynamic longrope update).

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

    def inverse_frequencies(self, head_dim, long=False):
        """theta_i for i < R / 2, float32 numpy (R / 2,), scaling applied; `long`: longrope's long factors
        (the frequencies of a sequence longer than `long_after`; the same as the short ones otherwise)."""
        rotary_dim = self.rotary_dim or head_dim
        if rotary_dim > head_dim or rotary_dim % 2:
            raise ValueError(
                f"`rotary_dim` must be even and at most the head size. Received: rotary_dim={rotary_dim}, "
                f"head size={head_dim}"
            )
        exponents = np.arange(0, rotary_dim, 2, dtype=np.float32) / rotary_dim
        if self.long_after is not None:
            factors = self.scaling["long_factor" if long else "short_factor"]
            if len(factors) != rotary_dim // 2:
                raise ValueError(
                    f"longrope's factors must number rotary_dim / 2 = {rotary_dim // 2}. "
                    f"Received: {len(factors)} factors"
                )
            # As transformers: 1 / (factor_i * base ** (2 i / R)), in float32.
            return (1.0 / (np.asarray(factors, np.float32) * self.max_wavelength**exponents)).astype(np.float32)
        frequencies = 1.0 / self.max_wavelength**exponents
        return _scaled(frequencies.astype(np.float32), self.scaling)

    @property
    def long_after(self):
        """longrope's `original_max_position_embeddings` N (a call whose last position + 1 exceeds N rotates with
        the long factors), or None for the other scalings, whose frequencies never change."""
        if self.scaling is None or self.scaling["rope_type"] != "longrope":
            return None
        return int(self.scaling["original_max_position_embeddings"])

    @property
    def attention_factor(self):
        """What cos and sin are multiplied by: longrope's `attention_factor`, else 1.0."""
        return 1.0 if self.long_after is None else float(self.scaling["attention_factor"])

    def cos_sin(self, positions, head_dim, sequence_length=None):
        """cos and sin (T, R) of positions (T,) int: each angle twice, for the rotate-half layout, times the
        attention factor. `sequence_length` (scalar: the call's last position + 1) picks longrope's factors."""
        frequencies = ops.convert_to_tensor(self.inverse_frequencies(head_dim))
        if self.long_after is not None:
            long = ops.convert_to_tensor(self.inverse_frequencies(head_dim, long=True))
            frequencies = ops.where(sequence_length > self.long_after, long, frequencies)  # (R/2,)
        angles = ops.cast(positions, "float32")[:, None] * frequencies[None, :]  # (T, 1) x (1, R/2) -> (T, R/2)
        angles = ops.concatenate([angles, angles], axis=-1)  # -> (T, R)
        if self.attention_factor == 1.0:
            return ops.cos(angles), ops.sin(angles)
        return ops.cos(angles) * self.attention_factor, ops.sin(angles) * self.attention_factor

    def call(self, inputs, start_index=0, real_length=None):
        """inputs (B, T, heads, Dh) at positions [start_index, start_index + T). real_length: None, or how many of
        the T positions are real (a padded query's copies are not): the call's length that picks longrope's
        factors is start_index + real_length."""
        head_dim = inputs.shape[-1]
        rotary_dim = self.rotary_dim or head_dim
        length = ops.shape(inputs)[1]
        start = ops.cast(start_index, "int32")
        positions = ops.arange(length, dtype="int32") + start
        real = length if real_length is None else real_length
        cos, sin = self.cos_sin(positions, head_dim, sequence_length=start + real)
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
    needed = list(_SCALING_KEYS[kind])
    missing = [key for key in needed if key not in scaling]
    if missing:
        raise ValueError(f"`scaling` of rope_type {kind!r} needs {missing}. Received: scaling={scaling!r}")
    if kind == "longrope":
        return _check_longrope(scaling, needed)
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


def _check_longrope(scaling, needed):
    """longrope's entries, checked: two lists of positive factors of one length, a positive original length and
    attention factor."""
    short, long = scaling["short_factor"], scaling["long_factor"]
    for key in ("short_factor", "long_factor"):
        factors = scaling[key]
        if not isinstance(factors, (list, tuple)) or not factors or not all(float(f) > 0 for f in factors):
            raise ValueError(f"`scaling['{key}']` must be a list of positive numbers. Received: {key}={factors!r}")
    if len(short) != len(long):
        raise ValueError(
            "`scaling['short_factor']` and `scaling['long_factor']` must have one length. "
            f"Received: {len(short)} and {len(long)} factors"
        )
    original = scaling["original_max_position_embeddings"]
    if not isinstance(original, int) or original < 1:
        raise ValueError(
            f"`scaling['original_max_position_embeddings']` must be a positive int. Received: {original!r}"
        )
    if not scaling["attention_factor"] > 0:
        raise ValueError(
            f"`scaling['attention_factor']` must be positive. Received: attention_factor={scaling['attention_factor']}"
        )
    out = {key: scaling[key] for key in needed}
    out.update(short_factor=[float(f) for f in short], long_factor=[float(f) for f in long])
    return {"rope_type": "longrope", **out, "attention_factor": float(scaling["attention_factor"])}


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
