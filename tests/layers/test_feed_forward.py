"""FeedForward against the numpy reference, for every activation.

Axes: B batch, T sequence length, D model width, F intermediate width.
"""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import FeedForward
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import assert_close, feed_forward_weights, randomize_weights, save_and_load, wrap_in_model

B, T, D, F = 2, 5, 8, 16
ACTIVATIONS = ["relu", "gelu", "gelu_approximate", "silu", "gated-relu", "gated-gelu", "gated-gelu_exact", "gated-silu"]


def _inputs(rng):
    # std 2 so that the activations' tails (where exact and tanh gelu differ) are exercised
    return (2.0 * rng.standard_normal((B, T, D))).astype("float32")


def _built(rng, x, **kwargs):
    layer = FeedForward(F, kernel_initializer="zeros", **kwargs)
    layer(x)
    randomize_weights(layer, rng, std=0.5)
    return layer


def test_reference_activations_known_values():
    """Anchor the reference activations: exact gelu at x = 1 is Phi(1) = 0.8413447..., the tanh
    form differs from it by about 1.6e-4 there; silu(1) = 1 / (1 + e^-1)."""
    x = np.array([-1.0, 0.0, 1.0])
    np.testing.assert_allclose(reference.gelu(x), [-0.15865525393145707, 0.0, 0.8413447460685429], atol=1e-15)
    np.testing.assert_allclose(reference.gelu_approximate(x)[2], 0.8411919906082768, atol=1e-15)
    np.testing.assert_allclose(reference.silu(x)[2], 1 / (1 + math.exp(-1)), atol=1e-15)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_matches_reference(activation, rng):
    x = _inputs(rng)
    layer = _built(rng, x, activation=activation)
    weights = feed_forward_weights(layer)
    assert ("gate_kernel" in weights) == activation.startswith("gated-")
    assert_close(layer(x), reference.feed_forward(weights, x, activation))


def test_exact_and_tanh_gelu_differ(rng):
    """The two gelu variants must not silently be the same function (differences ~1e-3 at |x|~2)."""
    x = _inputs(rng)
    exact, approximate = _built(rng, x, activation="gelu"), FeedForward(F, activation="gelu_approximate")
    approximate(x)
    approximate.set_weights(exact.get_weights())
    assert np.abs(to_numpy(exact(x)) - to_numpy(approximate(x))).max() > 1e-4


def test_without_bias(rng):
    x = _inputs(rng)
    layer = _built(rng, x, activation="gated-silu", use_bias=False)
    weights = feed_forward_weights(layer)
    assert sorted(weights) == ["gate_kernel", "intermediate_kernel", "output_kernel"]
    assert_close(layer(x), reference.feed_forward(weights, x, "gated-silu"))


def test_dropout_only_in_training(rng):
    x = _inputs(rng)
    layer = _built(rng, x, activation="relu", dropout=0.5)
    expected = reference.feed_forward(feed_forward_weights(layer), x, "relu")
    assert_close(layer(x), expected)
    assert_close(layer(x, training=False), expected)
    assert np.abs(to_numpy(layer(x, training=True)) - expected).max() > 1e-3


# ----------------------------------------------------------------------------- round trips


def test_config_round_trip(rng):
    x = _inputs(rng)
    layer = _built(rng, x, activation="gated-gelu", use_bias=False, dropout=0.1)
    config = layer.get_config()
    assert (config["intermediate_dim"], config["activation"], config["use_bias"], config["dropout"]) == (
        F, "gated-gelu", False, 0.1
    )  # fmt: skip
    clone = FeedForward.from_config(config)
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x)), to_numpy(layer(x)))


def test_keras_save_and_load(rng, tmp_path):
    x = _inputs(rng)
    layer = _built(rng, x, activation="gelu")
    model = wrap_in_model(layer, {"x": ((T, D), "float32")}, lambda l, i: l(i["x"]))
    expected = reference.feed_forward(feed_forward_weights(layer), x, "gelu")
    output = to_numpy(model({"x": x}))
    assert_close(output, expected)
    restored = save_and_load(model, tmp_path)
    np.testing.assert_allclose(to_numpy(restored({"x": x})), output, atol=1e-7)


# ----------------------------------------------------------------------------- dtype policy


def test_mixed_bfloat16(rng):
    x = _inputs(rng)
    layer32 = _built(rng, x, activation="gated-gelu")
    layer16 = FeedForward(F, activation="gated-gelu", kernel_initializer="zeros", dtype="mixed_bfloat16")
    layer16(x)
    layer16.set_weights(layer32.get_weights())
    output = layer16(x)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    output = to_numpy(ops.cast(output, "float32"))
    expected = to_numpy(layer32(x))
    assert np.all(np.isfinite(output))
    np.testing.assert_allclose(output, expected, atol=0.05 * np.abs(expected).max(), rtol=5e-2)


# ----------------------------------------------------------------------------- bad input


def test_unknown_activation():
    with pytest.raises(ValueError, match=r"activation.*swish"):
        FeedForward(F, activation="swish")


def test_bad_intermediate_dim():
    with pytest.raises(ValueError, match=r"intermediate_dim=0"):
        FeedForward(0)
