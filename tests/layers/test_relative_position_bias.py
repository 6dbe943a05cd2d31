"""RelativePositionBias against a from-the-paper T5 bucketing.

Axes: B batch, T query length, S key length, H heads.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import RelativePositionBias
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import assert_close, randomize_weights, save_and_load, wrap_in_model

H = 2
L = 24  # the query/key length of most tests (one set of shapes: JAX compiles each op per shape)


def _inputs(rng, query_length, key_length, width=4):
    query = rng.standard_normal((1, query_length, width)).astype("float32")
    key = rng.standard_normal((1, key_length, width)).astype("float32")
    return query, key


def _built(rng, query, key, **kwargs):
    layer = RelativePositionBias(num_heads=H, initializer="zeros", **kwargs)
    layer(query, key)
    randomize_weights(layer, rng)
    return layer


def test_reference_buckets_known_values():
    """The reference bucketing at values worked out by hand (T5 defaults: 32 buckets, distance 128).

    Bidirectional: 16 buckets per direction, 8 exact. Keys after the query (n > 0) use buckets 16..31.
    Beyond 8, bucket = 8 + floor(log(|n| / 8) / log(128 / 8) * 8): |n| = 16 -> 10, 32 -> 12, 64 -> 14.
    Unidirectional: 32 buckets for n <= 0, 16 exact, n > 0 -> 0; |n| = 32 -> 16 + floor(16 / 3) = 21.
    """
    bucket = reference.relative_position_bucket
    assert [bucket(n) for n in (0, -1, -7, -8, -15, -16, -32, -64, -127, -128, -1000)] == [
        0, 1, 7, 8, 9, 10, 12, 14, 15, 15, 15
    ]  # fmt: skip
    assert [bucket(n) for n in (1, 7, 8, 16, 1000)] == [17, 23, 24, 26, 31]
    assert [bucket(n, bidirectional=False) for n in (5, 0, -15, -16, -32, -127, -128, -500)] == [
        0, 0, 15, 16, 21, 31, 31, 31
    ]  # fmt: skip


@pytest.mark.parametrize(
    "bidirectional, num_buckets, max_distance, query_length, key_length, query_start",
    [
        (True, 8, 20, L, L, 0),  # every bucket of a small table, both signs
        (False, 8, 20, L, L, 0),
        (True, 32, 128, 2, 300, 140),  # T5 defaults, distances past max_distance both ways
        (False, 32, 128, 2, 300, 140),  # a late decoder position
    ],
)
def test_matches_reference(bidirectional, num_buckets, max_distance, query_length, key_length, query_start, rng):
    query, key = _inputs(rng, query_length, key_length)
    layer = _built(rng, query, key, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    table = to_numpy(layer.embeddings)
    assert table.shape == (num_buckets, H)
    expected = reference.relative_position_bias(
        table, query_length, key_length, bidirectional, num_buckets, max_distance, query_start
    )
    output = layer(query, key, query_start=query_start)
    assert tuple(output.shape) == (1, H, query_length, key_length)
    assert_close(output, expected, atol=0, rtol=0)  # a lookup: exact
    if query_start:
        tensor_start = ops.convert_to_tensor(query_start, "int32")
        assert_close(layer(query, key, query_start=tensor_start), expected, atol=0, rtol=0)


def test_cached_step_equals_slice_of_full(rng):
    """The bias of query t alone (query_start=t) is row t of the full bias."""
    query, key = _inputs(rng, L, L)
    layer = _built(rng, query, key, bidirectional=False, num_buckets=8, max_distance=20)
    full = to_numpy(layer(query, key))
    step = to_numpy(layer(query[:, 21:23], key, query_start=21))
    np.testing.assert_array_equal(step, full[:, :, 21:23])


# ----------------------------------------------------------------------------- round trips


def test_config_round_trip(rng):
    query, key = _inputs(rng, L, L)
    layer = _built(rng, query, key, num_buckets=8, max_distance=20, bidirectional=False)
    config = layer.get_config()
    assert (config["num_heads"], config["num_buckets"], config["max_distance"], config["bidirectional"]) == (
        H, 8, 20, False
    )  # fmt: skip
    clone = RelativePositionBias.from_config(config)
    clone(query, key)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(query, key)), to_numpy(layer(query, key)))


def test_keras_save_and_load(rng, tmp_path):
    query, key = _inputs(rng, L, L)
    layer = _built(rng, query, key, num_buckets=8, max_distance=20)
    model = wrap_in_model(
        layer, {"query": ((L, 4), "float32"), "key": ((L, 4), "float32")}, lambda l, i: l(i["query"], i["key"])
    )
    expected = reference.relative_position_bias(to_numpy(layer.embeddings), L, L, True, 8, 20)
    assert_close(model({"query": query, "key": key}), expected)
    restored = save_and_load(model, tmp_path)
    np.testing.assert_array_equal(
        to_numpy(restored({"query": query, "key": key})), to_numpy(model({"query": query, "key": key}))
    )


# ----------------------------------------------------------------------------- dtype policy


def test_mixed_bfloat16(rng):
    query, key = _inputs(rng, L, L)
    layer = RelativePositionBias(
        num_heads=H, num_buckets=8, max_distance=20, initializer="zeros", dtype="mixed_bfloat16"
    )
    layer(query, key)
    randomize_weights(layer, rng)
    output = layer(query, key)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    expected = reference.relative_position_bias(to_numpy(layer.embeddings), L, L, True, 8, 20)
    np.testing.assert_allclose(to_numpy(ops.cast(output, "float32")), expected, atol=1e-2, rtol=1e-2)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, pattern", [(dict(num_heads=0), r"num_heads=0"), (dict(num_heads=2, num_buckets=0), r"num_buckets=0")]
)
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        RelativePositionBias(**kwargs)
