"""Samplers on constructed logits (eager, no model): greedy, temperature / top-k / top-p, names, configs."""

import keras
import numpy as np
import pytest

from keras_transformer import decoding, samplers
from keras_transformer.samplers import BeamSampler, GreedySampler, RandomSampler
from tests.conftest import to_numpy

ROWS, VOCAB = 4000, 12


@pytest.fixture(scope="module")
def logits():
    return np.random.default_rng(3).normal(0.0, 1.5, (ROWS, VOCAB)).astype("float32")


def _pick(sampler, logits, seed=0):
    uniform = (
        sampler.draw_noise((1, len(logits)))[0]
        if seed is None
        else RandomSampler(seed=seed).draw_noise((1, len(logits)))[0]
    )
    return to_numpy(sampler.get_next_token(keras.ops.convert_to_tensor(logits), keras.ops.convert_to_tensor(uniform)))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_greedy_is_argmax(logits):
    np.testing.assert_array_equal(_pick(GreedySampler(), logits), logits.argmax(-1))


def test_random_sampler_follows_the_softmax(logits):
    # One fixed row, sampled ROWS times: the frequencies match softmax(logits / T).
    row = np.repeat(logits[:1], ROWS, axis=0)
    for temperature in (1.0, 0.5):
        picked = _pick(RandomSampler(temperature=temperature), row, seed=int(temperature * 10))
        frequencies = np.bincount(picked, minlength=VOCAB) / ROWS
        expected = _softmax(logits[0].astype(np.float64) / temperature)
        assert np.abs(frequencies - expected).max() < 4 * np.sqrt(expected.max() / ROWS) + 1e-3


def test_top_k_never_leaves_the_top_k(logits):
    for k in (1, 3):
        picked = _pick(RandomSampler(top_k=k), logits)
        top = np.argsort(-logits, axis=-1)[:, :k]
        assert all(p in t for p, t in zip(picked, top))
    assert len(set(_pick(RandomSampler(top_k=3), logits).tolist())) > 3  # it does sample


def test_samplers_take_numpy_logits_and_noise(logits):
    """`get_next_token` is public: numpy inputs work on every backend, with every filter."""
    uniform = RandomSampler(seed=1).draw_noise((1, len(logits)))[0]
    for sampler in (GreedySampler(), RandomSampler(top_k=2, top_p=0.9, temperature=0.8)):
        picked = to_numpy(sampler.get_next_token(logits, uniform))
        expected = to_numpy(
            sampler.get_next_token(keras.ops.convert_to_tensor(logits), keras.ops.convert_to_tensor(uniform))
        )
        np.testing.assert_array_equal(picked, expected)
    top2 = np.argsort(-logits, axis=-1)[:, :2]
    assert all(p in t for p, t in zip(picked, top2))


def test_top_p_never_leaves_the_nucleus(logits):
    for top_p, temperature in ((0.5, 1.0), (0.9, 0.7)):
        picked = _pick(RandomSampler(top_p=top_p, temperature=temperature), logits)
        probabilities = _softmax(logits.astype(np.float64) / temperature)
        for p, row in zip(picked, probabilities):
            # the mass of the tokens strictly more likely than the pick is below top_p
            assert row[row > row[p]].sum() < top_p + 1e-6
        # and the sampler uses more than the argmax
        assert (picked != logits.argmax(-1)).mean() > 0.05


def test_temperature_near_zero_is_greedy(logits):
    np.testing.assert_array_equal(_pick(RandomSampler(temperature=1e-4), logits), logits.argmax(-1))


def test_filtered_tokens_never_sampled_even_with_extreme_noise():
    logits = np.array([[0.0, 5.0, -1e9, 4.0, -1e9]] * 4, "float32")
    uniform = np.array([1.0, 1e-7, 0.5, 0.999999], "float32")
    picked = to_numpy(
        RandomSampler().get_next_token(keras.ops.convert_to_tensor(logits), keras.ops.convert_to_tensor(uniform))
    )
    assert set(picked.tolist()) <= {0, 1, 3}


def test_same_seed_same_noise():
    assert np.array_equal(RandomSampler(seed=5).draw_noise((7, 3)), RandomSampler(seed=5).draw_noise((7, 3)))
    assert not np.array_equal(RandomSampler(seed=5).draw_noise((7, 3)), RandomSampler(seed=6).draw_noise((7, 3)))
    noise = RandomSampler().draw_noise((100, 3))
    assert noise.min() > 0 and noise.max() <= 1


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: RandomSampler(temperature=0), "temperature"),
        (lambda: RandomSampler(temperature=-1.0), "temperature"),
        (lambda: RandomSampler(top_p=0.0), "top_p"),
        (lambda: RandomSampler(top_p=1.5), "top_p"),
        (lambda: RandomSampler(top_k=0), "top_k"),
        (lambda: RandomSampler(top_k=2.5), "top_k"),
        (lambda: BeamSampler(num_beams=0), "num_beams"),
        (lambda: BeamSampler(num_beams=2, num_return_sequences=3), "num_return_sequences"),
        (lambda: BeamSampler(early_stopping="sometimes"), "early_stopping"),
    ],
)
def test_bad_arguments_raise(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_names_and_config_round_trip():
    assert isinstance(samplers.get("greedy"), GreedySampler)
    assert isinstance(samplers.get("beam"), BeamSampler) and samplers.get("beam").num_beams == 4
    assert samplers.get("top_k").top_k == 50 and samplers.get("top_p").top_p == 0.9
    assert isinstance(samplers.get("random"), RandomSampler)
    with pytest.raises(ValueError, match="sampler"):
        samplers.get("nucleus")
    for sampler in (
        GreedySampler(),
        RandomSampler(0.7, top_k=5, top_p=0.8, seed=3),
        BeamSampler(num_beams=5, length_penalty=0.6, early_stopping="never", num_return_sequences=2),
    ):
        restored = samplers.deserialize(samplers.serialize(sampler))
        assert type(restored) is type(sampler) and restored.get_config() == sampler.get_config()
        assert type(sampler).from_config(sampler.get_config()).get_config() == sampler.get_config()


@pytest.mark.parametrize(
    "name",
    ["DecodeOptions", "LENGTH_BUCKET", "PREFILL_BUCKET", "cache_widths", "generate", "trace_prepare", "trace_run"],
)
def test_engine_names_moved_to_decoding_with_a_warning(name):
    """The engine's names, once exported by `samplers`, are read there with a DeprecationWarning that names
    their new home, and are the engine's own objects."""
    with pytest.warns(DeprecationWarning, match=f"keras_transformer.decoding.{name}"):
        moved = getattr(samplers, name)
    assert moved is getattr(decoding, name)
    with pytest.raises(AttributeError, match="no attribute 'decode_loop'"):
        getattr(samplers, "decode_loop")
