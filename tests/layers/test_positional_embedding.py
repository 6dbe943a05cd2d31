"""PositionalEmbedding against the paper's sinusoidal table and a plain table lookup.

Axes: B batch, T sequence length, D model width.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import PositionalEmbedding
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import assert_close, randomize_weights, save_and_load, wrap_in_model

B, T, D, MAX_LENGTH = 2, 5, 8, 64


def _tokens(rng, length=T):
    return rng.standard_normal((B, length, D)).astype("float32")


def test_reference_sinusoid_known_values():
    """The reference table itself, at entries worked out by hand from the paper's formula."""
    table = reference.sinusoidal_table(4, 4)
    np.testing.assert_allclose(table[0], [0.0, 1.0, 0.0, 1.0])
    # pos 3, D 4: dims (0, 1) use 10000^0 = 1, dims (2, 3) use 10000^(2/4) = 100
    np.testing.assert_allclose(table[3], [np.sin(3.0), np.cos(3.0), np.sin(0.03), np.cos(0.03)])


@pytest.mark.parametrize("start_index", [0, 59])
def test_sinusoidal_matches_paper(start_index, rng):
    layer = PositionalEmbedding(MAX_LENGTH, position_type="sinusoidal")
    x = _tokens(rng)
    output = to_numpy(layer(x, start_index=start_index))
    assert layer.weights == []
    expected = reference.sinusoidal_table(MAX_LENGTH, D)[start_index : start_index + T]
    assert output.shape == (B, T, D)
    assert_close(output, np.broadcast_to(expected, (B, T, D)))


def test_learned_lookup(rng):
    layer = PositionalEmbedding(MAX_LENGTH, position_type="learned", initializer="zeros")
    x = _tokens(rng)
    layer(x)
    randomize_weights(layer, rng)
    table = to_numpy(layer.embeddings)
    assert table.shape == (MAX_LENGTH, D)
    for start_index in (0, 7, ops.convert_to_tensor(MAX_LENGTH - T, "int32")):
        expected = reference.learned_positions(table, int(to_numpy(start_index)), T)
        assert_close(layer(x, start_index=start_index), np.broadcast_to(expected, (B, T, D)))


def test_tensor_start_index_sinusoidal(rng):
    """A scalar tensor start index (as in a compiled decoding loop) gives the same rows as an int."""
    layer = PositionalEmbedding(MAX_LENGTH, position_type="sinusoidal")
    x = _tokens(rng, 1)
    expected = reference.sinusoidal_table(MAX_LENGTH, D)[40:41]
    assert_close(layer(x, start_index=ops.convert_to_tensor(40, "int32")), np.broadcast_to(expected, (B, 1, D)))


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("position_type", ["learned", "sinusoidal"])
def test_config_round_trip(position_type, rng):
    layer = PositionalEmbedding(MAX_LENGTH, position_type=position_type, initializer="zeros")
    x = _tokens(rng)
    layer(x)
    randomize_weights(layer, rng)
    config = layer.get_config()
    assert config["max_length"] == MAX_LENGTH and config["position_type"] == position_type
    clone = PositionalEmbedding.from_config(config)
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x, start_index=3)), to_numpy(layer(x, start_index=3)))


def test_keras_save_and_load(rng, tmp_path):
    layer = PositionalEmbedding(MAX_LENGTH, initializer="zeros")
    x = _tokens(rng)
    layer(x)
    randomize_weights(layer, rng)
    model = wrap_in_model(layer, {"tokens": ((T, D), "float32")}, lambda l, i: i["tokens"] + l(i["tokens"]))
    output = to_numpy(model({"tokens": x}))
    assert_close(output, x + reference.learned_positions(to_numpy(layer.embeddings), 0, T))
    restored = save_and_load(model, tmp_path)
    np.testing.assert_allclose(to_numpy(restored({"tokens": x})), output, atol=1e-7)


# ----------------------------------------------------------------------------- dtype policy


@pytest.mark.parametrize("position_type", ["learned", "sinusoidal"])
def test_mixed_bfloat16(position_type, rng):
    layer = PositionalEmbedding(MAX_LENGTH, position_type=position_type, initializer="zeros", dtype="mixed_bfloat16")
    x = _tokens(rng)
    layer(x)
    randomize_weights(layer, rng)
    output = layer(x, start_index=2)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    if position_type == "learned":
        assert keras.backend.standardize_dtype(layer.embeddings.dtype) == "float32"
        expected = to_numpy(layer.embeddings)[2 : 2 + T]
    else:
        expected = reference.sinusoidal_table(MAX_LENGTH, D)[2 : 2 + T]
    output = to_numpy(ops.cast(output, "float32"))
    assert np.all(np.isfinite(output))
    np.testing.assert_allclose(output, np.broadcast_to(expected, (B, T, D)), atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------- bad input


def test_unknown_position_type():
    with pytest.raises(ValueError, match=r"position_type.*rotary"):
        PositionalEmbedding(MAX_LENGTH, position_type="rotary")


def test_bad_max_length():
    with pytest.raises(ValueError, match=r"max_length=0"):
        PositionalEmbedding(0)


@pytest.mark.parametrize("position_type", ["learned", "sinusoidal"])
def test_positions_past_max_length(position_type, rng):
    layer = PositionalEmbedding(16, position_type=position_type, initializer="zeros")
    x = _tokens(rng)
    layer(x, start_index=16 - T)  # the last valid window
    with pytest.raises(ValueError, match=r"max_length") as info:
        layer(x, start_index=16 - T + 1)
    assert "16" in str(info.value)
    with pytest.raises(ValueError, match=r"max_length"):
        layer(_tokens(rng, 17))
