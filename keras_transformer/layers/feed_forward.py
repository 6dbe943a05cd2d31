"""Position-wise feed-forward network, plain or gated.

Axes: B batch, T sequence length, D model width, F intermediate width.
"""

import keras

_ACTIVATIONS = {
    "relu": keras.activations.relu,
    "gelu": lambda x: keras.activations.gelu(x, approximate=False),
    "gelu_approximate": lambda x: keras.activations.gelu(x, approximate=True),
    "silu": keras.activations.silu,
}
ACTIVATIONS = tuple(_ACTIVATIONS) + tuple(f"gated-{name}" for name in ("relu", "gelu", "gelu_exact", "silu"))


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """Linear -> activation -> Linear, applied to each position (section 3.3 of the paper).

    Gated variants (T5 v1.1, GLU family) compute act(x W_gate) * (x W_in)
    before the output projection. "gated-gelu" uses the tanh approximation
    of gelu, as T5 v1.1 does; "gated-gelu_exact" the exact one (ModernBERT's GeGLU).

    Args:
        intermediate_dim: int, the inner width F.
        activation: one of "relu", "gelu" (exact), "gelu_approximate" (tanh,
            GPT-2), "silu", "gated-relu", "gated-gelu", "gated-gelu_exact", "gated-silu".
        use_bias: bool, whether the projections have biases.
        dropout: float in [0, 1), dropout after the activation.
        kernel_initializer: initializer of the kernels.
        bias_initializer: initializer of the biases.

    Call arguments:
        inputs: (B, T, D).
        training: bool, whether dropout is active.

    Returns:
        (B, T, D).

    Example:
    >>> keras.ops.shape(FeedForward(32, activation="gated-gelu")(keras.random.normal((2, 4, 16))))
    (2, 4, 16)
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        use_bias=True,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(intermediate_dim, int) or intermediate_dim < 1:
            raise ValueError(
                f"`intermediate_dim` must be a positive int. Received: intermediate_dim={intermediate_dim}"
            )
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}. Received: activation={activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout}")
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.use_bias = use_bias
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self._gated = activation.startswith("gated-")
        self._activation_fn = _ACTIVATIONS[base_activation(activation)]

    def _dense(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        self.intermediate_dense = self._dense(self.intermediate_dim, "intermediate")
        self.intermediate_dense.build(inputs_shape)
        if self._gated:
            self.gate_dense = self._dense(self.intermediate_dim, "gate")
            self.gate_dense.build(inputs_shape)
        self.output_dense = self._dense(hidden_dim, "output")
        self.output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.intermediate_dense(inputs)  # (B, T, D) -> (B, T, F)
        if self._gated:
            hidden = self._activation_fn(self.gate_dense(inputs)) * hidden
        else:
            hidden = self._activation_fn(hidden)
        hidden = self.dropout_layer(hidden, training=training)
        return self.output_dense(hidden)  # (B, T, F) -> (B, T, D)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": self.activation,
                "use_bias": self.use_bias,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


def base_activation(activation):
    """The activation applied inside a FeedForward of `activation`: "gated-gelu" is T5 v1.1's GEGLU, whose gelu is
    the tanh approximation (gelu_new); "gated-gelu_exact" is the exact gelu; "gated-x" is x otherwise."""
    if activation == "gated-gelu":
        return "gelu_approximate"
    return activation.removeprefix("gated-").replace("gelu_exact", "gelu")
