"""RotaryEmbedding and rotary / sliding-window attention against tests/reference.py.

Axes: B batch, T length, H heads, Hkv key/value heads, Dh head size, D width.
"""

import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import KVCache, MultiHeadAttention, RotaryEmbedding
from keras_transformer.layers.kv_cache import BeamCache
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import assert_close, attention_weights, randomize_weights

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
SCALINGS = {"none": None, "linear": {"rope_type": "linear", "factor": 4.0}, "llama3": LLAMA3}


@pytest.mark.parametrize("scaling", sorted(SCALINGS))
@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_matches_reference(scaling, rotary_dim):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, 16)).astype("float32")  # (B, T, H, Dh)
    layer = RotaryEmbedding(max_wavelength=500.0, rotary_dim=rotary_dim, scaling=SCALINGS[scaling])
    for start in (0, 37, 300):  # 300: past the llama3 scaling's original context
        expected = reference.rotary(x, np.arange(start, start + 5), 500.0, rotary_dim, SCALINGS[scaling])
        assert_close(layer(x, start_index=start), expected, atol=2e-4, rtol=1e-4, msg=f"start={start}")


LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.2, 1.5, 2.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
    "original_max_position_embeddings": 16,
    "attention_factor": 1.25,
}


@pytest.mark.parametrize(
    "start, length", [(0, 5), (11, 5), (12, 5), (30, 1)], ids=["short", "last-short", "long", "step"]
)
def test_longrope_matches_reference(start, length):
    """The short factors while the call's last position + 1 is at most 16, the long ones past it (11 + 5 = 16: short;
    12 + 5 = 17: long), the rotated dims times the attention factor, the other dims as they are."""
    x = np.random.default_rng(5).standard_normal((2, length, 3, 12)).astype("float32")  # (B, T, H, Dh), R = 8
    layer = RotaryEmbedding(max_wavelength=500.0, rotary_dim=8, scaling=LONGROPE)
    positions = np.arange(start, start + length)
    expected = reference.longrope_rotary(x, positions, 500.0, 8, LONGROPE)
    assert_close(layer(x, start_index=start), expected, atol=2e-4, rtol=1e-4)
    flipped = dict(LONGROPE, short_factor=LONGROPE["long_factor"], long_factor=LONGROPE["short_factor"])
    unexpected = reference.longrope_rotary(x, positions, 500.0, 8, flipped)  # the other factors: far off
    assert np.abs(to_numpy(layer(x, start_index=start)) - unexpected).max() > 1e-2


def test_longrope_config_round_trip():
    layer = RotaryEmbedding(500.0, rotary_dim=8, scaling=LONGROPE)
    clone = RotaryEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config() and clone.long_after == 16 and clone.attention_factor == 1.25


def test_llama3_scaling_keeps_high_and_slows_low_frequencies():
    base = RotaryEmbedding(10000.0).inverse_frequencies(128)
    scaled = RotaryEmbedding(10000.0, scaling=LLAMA3).inverse_frequencies(128)
    assert scaled[0] == base[0]  # the shortest wavelength is kept
    np.testing.assert_allclose(scaled[-1], base[-1] / 8.0, rtol=1e-6)  # the longest is slowed by the factor


def test_rotated_dot_products_depend_on_distance_only():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 1, 1, 1, 8)).astype("float32")
    layer = RotaryEmbedding(100.0)

    def score(query_position, key_position):
        return float(
            np.sum(to_numpy(layer(q, start_index=query_position)) * to_numpy(layer(k, start_index=key_position)))
        )

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_wavelength=1.0), "max_wavelength"),
        (dict(rotary_dim=5), "rotary_dim"),
        (dict(scaling={"rope_type": "yarn", "factor": 2.0}), "rope_type"),
        (dict(scaling={"rope_type": "llama3", "factor": 2.0}), "low_freq_factor"),
        (dict(scaling={"rope_type": "linear", "factor": 0.0}), "factor"),
        (dict(scaling={"rope_type": "longrope", "short_factor": [1.0]}), "long_factor"),
        (dict(scaling={**LONGROPE, "long_factor": [1.0, 2.0]}), "one length"),
        (dict(scaling={**LONGROPE, "short_factor": [1.0, 0.0, 1.0, 1.0]}), "short_factor"),
        (dict(scaling={**LONGROPE, "original_max_position_embeddings": 0}), "original_max_position_embeddings"),
        (dict(scaling={**LONGROPE, "attention_factor": -1.0}), "attention_factor"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(**kwargs)


def test_rotary_dim_longer_than_head():
    with pytest.raises(ValueError, match="rotary_dim"):
        RotaryEmbedding(rotary_dim=32)(np.zeros((1, 2, 1, 16), "float32"))


def test_config_round_trip():
    layer = RotaryEmbedding(123.0, rotary_dim=4, scaling=LLAMA3)
    clone = RotaryEmbedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


# ----------------------------------------------------------------------------- attention


def _attention(rng, x, **kwargs):
    layer = MultiHeadAttention(num_heads=4, num_key_value_heads=2, kernel_initializer="zeros", **kwargs)
    layer(x)
    randomize_weights(layer, rng)
    return layer


ROPE = {"max_wavelength": 50.0, "rotary_dim": 4, "scaling": {"rope_type": "linear", "factor": 2.0}}


@pytest.mark.parametrize("window", [None, 3])
def test_attention_full_pass_matches_reference(window):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 7, 16)).astype("float32")
    mask = np.array([[1] * 7, [1] * 5 + [0] * 2], bool)  # right padding
    layer = _attention(rng, x, rotary_embedding=ROPE, sliding_window=window, output_bias=False)
    assert layer.output_dense.bias is None and layer.query_dense.bias is not None
    expected = reference.multi_head_attention(
        attention_weights(layer),
        x,
        attention_mask=mask,
        use_causal_mask=True,
        rotary_kwargs=ROPE,
        sliding_window=window,
    )
    got = layer(x, attention_mask=mask, use_causal_mask=True)
    assert_close(got[0], expected[0], atol=1e-4)
    assert_close(got[1, :5], expected[1, :5], atol=1e-4)  # the real positions


@pytest.mark.parametrize("window", [None, 3])
def test_cached_steps_match_the_full_pass(window):
    """Prefill 3 positions, then one per step: the cache keeps rotated keys, the window slides over it."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 16)).astype("float32")
    layer = _attention(rng, x, rotary_embedding=ROPE, sliding_window=window)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = KVCache(ops.zeros((2, 2, 9, 4)), ops.zeros((2, 2, 9, 4)))  # (B, Hkv, S, Dh), wider than needed
    out, cache = layer(x[:, :3], use_causal_mask=True, cache=cache, cache_index=0)
    steps = [to_numpy(out)]
    for i in range(3, 7):
        out, cache = layer(x[:, i : i + 1], use_causal_mask=True, cache=cache, cache_index=i)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_beam_cache_applies_the_window():
    """One beam slot per row (K = 1) reads exactly what a plain cache does, sliding window included."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 16)).astype("float32")
    layer = _attention(rng, x, rotary_embedding=ROPE, sliding_window=2)
    full = to_numpy(layer(x, use_causal_mask=True))
    cache = BeamCache(ops.zeros((2, 2, 4, 6)), ops.zeros((2, 2, 6, 4)), ops.zeros((2, 1, 6), "int32"))
    steps = []
    for i in range(6):
        out, cache = layer(x[:, i : i + 1], use_causal_mask=True, cache=cache, cache_index=i)
        steps.append(to_numpy(out))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_bad_window():
    with pytest.raises(ValueError, match="sliding_window"):
        MultiHeadAttention(num_heads=2, sliding_window=0)


def test_attention_serialises_rotary_and_window():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 4, 16)).astype("float32")
    layer = _attention(rng, x, rotary_embedding=ROPE, sliding_window=2, output_bias=False)
    clone = MultiHeadAttention.from_config(layer.get_config())
    clone(x)
    for source, target in zip(layer.weights, clone.weights):
        target.assign(source)
    np.testing.assert_allclose(
        to_numpy(clone(x, use_causal_mask=True)), to_numpy(layer(x, use_causal_mask=True)), atol=1e-6
    )
    assert clone.rotary_embedding.arguments() == RotaryEmbedding(**ROPE).arguments()
    assert clone.sliding_window == 2 and clone.output_dense.bias is None
