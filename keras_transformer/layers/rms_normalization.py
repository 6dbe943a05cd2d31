"""RMS normalization whose scale may be offset: x / sqrt(mean(x^2) + epsilon) * (offset + w).

Axes: D the normalized (last) axis.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class RMSNormalization(keras.layers.RMSNormalization):
    """Keras's `RMSNormalization` with an option: the learned scale `w` is applied as `scale_offset + w`.

    Gemma's norms store `w` and scale by (1 + w) (`scale_offset=1.0`), the whole product in float32 and
    cast back to the input's dtype, as `transformers` computes it: storing 1 + w instead would round it in
    a 16-bit checkpoint. With `scale_offset=0.0` it is Keras's layer. `w` starts at 1 - `scale_offset`, so
    a new layer scales by one either way.

    Args:
        scale_offset: float, added to the learned scale.
        (other arguments as `keras.layers.RMSNormalization`.)

    Call arguments:
        x: (..., D).

    Returns:
        (..., D), in the layer's compute dtype.

    Example:
    >>> norm = RMSNormalization(scale_offset=1.0)
    >>> y = norm(keras.ops.ones((1, 4)))
    >>> [round(float(v), 3) for v in keras.ops.convert_to_numpy(y)[0]]
    [1.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, scale_offset=0.0, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(scale_offset, (int, float)) or isinstance(scale_offset, bool):
            raise ValueError(f"`scale_offset` must be a float. Received: scale_offset={scale_offset!r}")
        self.scale_offset = float(scale_offset)

    def build(self, input_shape):
        super().build(input_shape)
        if self.scale_offset:
            self.scale.assign(ops.full(self.scale.shape, 1.0 - self.scale_offset, self.scale.dtype))

    def call(self, x):
        if not self.scale_offset:
            return super().call(x)
        scale = ops.cast(self.scale, "float32") + self.scale_offset  # (D,), in float32 before any rounding
        y = ops.rms_normalization(ops.cast(x, "float32"), scale=scale, axis=self.axis, epsilon=self.epsilon)
        return ops.cast(y, self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config["scale_offset"] = self.scale_offset
        return config


def rms_norm(epsilon, scale_offset=0.0, **kwargs):
    """Keras's RMS norm, or this one where the scale is offset (the layer type every runtime's kernel table keys)."""
    if scale_offset:
        return RMSNormalization(scale_offset=scale_offset, epsilon=epsilon, **kwargs)
    return keras.layers.RMSNormalization(epsilon=epsilon, **kwargs)
