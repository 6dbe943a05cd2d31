"""Property-based tests (Hypothesis): masks and positional embeddings against the numpy reference,
the KV cache against full forward passes, and the samplers' invariants.

Shapes are drawn from small ranges (and model inputs padded to fixed widths), so that JAX and
TensorFlow compile a handful of shapes and every property runs in a few seconds.
"""

import os

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from keras import ops

from keras_transformer.layers import PositionalEmbedding
from keras_transformer.layers import masks
from keras_transformer.samplers import GreedySampler, RandomSampler
from keras_transformer.samplers.random_sampler import sample_categorical
from tests import reference
from tests.conftest import to_numpy
from tests.samplers.helpers import tiny_gpt

# `make test` draws the same examples on every run (derandomize), so CI cannot pass or fail by
# luck; KT_HYPOTHESIS_EXAMPLES=300 explores fresh random examples (a developer's sweep; a failure
# prints the example to reproduce).
_EXPLORE = int(os.environ.get("KT_HYPOTHESIS_EXAMPLES", "0"))
SETTINGS = settings(
    max_examples=_EXPLORE or 15,
    derandomize=not _EXPLORE,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
seeds = st.integers(0, 2**31 - 1)

VOCAB, MAX_LENGTH = 11, 64  # the model of the cache and padding properties
WIDTH, PREFILL = 16, 8  # full passes on (B, 16); the cache is prefilled with 8 positions


@pytest.fixture(scope="module")
def lm():
    return tiny_gpt(vocabulary_size=VOCAB, max_sequence_length=MAX_LENGTH)


# --- masks ---------------------------------------------------------------------


@SETTINGS
@given(data=st.data())
def test_causal_mask_matches_reference(data):
    key_length = data.draw(st.integers(1, 8))
    query_length = data.draw(st.integers(1, key_length))
    query_start = data.draw(st.none() | st.integers(0, key_length - query_length))
    np.testing.assert_array_equal(
        to_numpy(masks.causal_mask(query_length, key_length, query_start)),
        reference.causal_mask(query_length, key_length, query_start),
    )


@SETTINGS
@given(
    seed=seeds,
    batch=st.integers(1, 3),
    query_length=st.integers(1, 4),
    key_length=st.integers(1, 5),
    use=st.tuples(st.booleans(), st.booleans(), st.booleans()),
)
def test_merged_masks_match_reference(seed, batch, query_length, key_length, use):
    rng = np.random.default_rng(seed)
    padding = rng.random((batch, key_length)) < 0.7 if use[0] else None
    attention = rng.random((batch, query_length, key_length)) < 0.7 if use[1] else None
    causal = reference.causal_mask(query_length, key_length) if use[2] else None
    merged = masks.merge_masks(padding, attention, None if causal is None else ops.convert_to_tensor(causal))
    expected = reference.combine_masks(
        None if padding is None else padding[:, None, None, :],
        None if attention is None else attention[:, None],
        None if causal is None else causal[None, None],
    )
    if expected is None:
        assert merged is None
        return
    merged = to_numpy(merged)
    assert merged.ndim == 4 and merged.shape[1] == 1  # broadcastable to (B, 1, T, S)
    full = (batch, 1, query_length, key_length)
    np.testing.assert_array_equal(np.broadcast_to(merged, full), np.broadcast_to(expected, full))


@pytest.mark.filterwarnings("ignore:You are using a softmax over axis")  # one key is a valid case
@SETTINGS
@given(seed=seeds, rows=st.integers(1, 4), keys=st.integers(1, 6), dtype=st.sampled_from(["float32", "float16"]))
def test_masked_softmax_gives_allowed_keys_all_the_mass(seed, rows, keys, dtype):
    rng = np.random.default_rng(seed)
    mask = rng.random((rows, keys)) < 0.6
    mask[0] = False  # a fully masked row: finite, never NaN
    scores = rng.normal(0.0, 3.0, (rows, keys))
    bias = masks.mask_to_bias(ops.convert_to_tensor(mask), dtype)
    probabilities = to_numpy(ops.softmax(ops.cast(ops.convert_to_tensor(scores), dtype) + bias, axis=-1))
    probabilities = probabilities.astype(np.float64)
    assert np.isfinite(probabilities).all()
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, atol=2e-3)
    if dtype == "float32":
        # -1e9 swamps the scores (float32 spacing there is 64), so the row is uniform. In float16
        # the -3e4 bias has a spacing of 16 and keeps some of the scores' order: finite, not uniform
        # (the attention layer builds its bias in float32 whatever the compute dtype).
        np.testing.assert_allclose(probabilities[0], np.full(keys, 1.0 / keys), atol=1e-6)
    for row in range(1, rows):
        if mask[row].any():
            expected = np.where(mask[row], reference.softmax(np.where(mask[row], scores[row], -np.inf)), 0.0)
            np.testing.assert_allclose(probabilities[row], expected, atol=2e-3 if dtype == "float16" else 1e-6)


# --- positional embeddings ---------------------------------------------------------


@SETTINGS
@given(data=st.data(), dim=st.integers(1, 9), max_length=st.integers(1, 40), batch=st.integers(1, 2))
def test_sinusoidal_positions_match_the_paper(data, dim, max_length, batch):
    length = data.draw(st.integers(1, max_length))
    start = data.draw(st.integers(0, max_length - length))
    layer = PositionalEmbedding(max_length, "sinusoidal")
    out = to_numpy(layer(np.zeros((batch, length, dim), "float32"), start_index=start))
    expected = reference.sinusoidal_table(max_length, dim)[start : start + length]
    np.testing.assert_allclose(out, np.broadcast_to(expected, (batch, length, dim)), atol=1e-6, rtol=0)


@SETTINGS
@given(data=st.data(), seed=seeds, dim=st.integers(1, 4), max_length=st.integers(1, 12))
def test_learned_positions_are_rows_of_the_table_and_shift_with_the_start(data, seed, dim, max_length):
    length = data.draw(st.integers(1, max_length))
    start = data.draw(st.integers(0, max_length - length))
    layer = PositionalEmbedding(max_length, "learned")
    layer.build((None, None, dim))
    table = np.random.default_rng(seed).normal(size=(max_length, dim)).astype("float32")
    layer.embeddings.assign(table)
    out = to_numpy(layer(np.zeros((1, length, dim), "float32"), start_index=start))
    np.testing.assert_array_equal(out[0], reference.learned_positions(table, start, length).astype("float32"))
    with pytest.raises(ValueError, match="max_length"):  # past the table: refused, never wrapped or clipped
        layer(np.zeros((1, length + 1, dim), "float32"), start_index=max_length - length)


# --- the KV cache ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache_step(lm):
    """`call_with_cache`, jitted under JAX (one compile per shape instead of one dispatch per op)."""
    if keras.config.backend() != "jax":
        return lambda token_ids, cache, index: lm.call_with_cache(token_ids, cache, ops.convert_to_tensor(index))
    import jax

    return jax.jit(lm.call_with_cache)


@SETTINGS
@given(seed=seeds, data=st.data())
def test_cached_steps_match_full_forward_for_any_lengths_and_padding(lm, cache_step, seed, data):
    """Prefill the first p positions (the rest of the prefill window holds junk that later steps
    overwrite, as in the generation loop), then one token per step: the logits of every real
    position equal a full forward pass over right-padded rows of random lengths. Rows are
    independent, so a fixed batch of 3 ragged rows covers batches of any lengths."""
    batch = 3
    rng = np.random.default_rng(seed)
    lengths = [data.draw(st.integers(1, WIDTH)) for _ in range(batch)]
    prefilled = data.draw(st.integers(1, PREFILL))
    tokens = rng.integers(0, VOCAB, (batch, WIDTH)).astype("int32")
    padding_mask = np.arange(WIDTH)[None, :] < np.array(lengths)[:, None]
    pads = rng.integers(0, VOCAB, (batch, WIDTH)).astype("int32")  # padding ids are arbitrary
    full = to_numpy(lm({"token_ids": np.where(padding_mask, tokens, pads), "padding_mask": padding_mask}))

    cache = ops.zeros(lm.backbone.cache_shape(batch, WIDTH))
    window = tokens[:, :PREFILL].copy()
    window[:, prefilled:] = pads[:, prefilled:PREFILL]  # junk past the prefill
    logits, cache = cache_step(window, cache, np.array(0, "int32"))
    cached = [to_numpy(logits)[:, :prefilled]]
    for i in range(prefilled, WIDTH):
        logits, cache = cache_step(tokens[:, i : i + 1], cache, np.array(i, "int32"))
        cached.append(to_numpy(logits))
    cached = np.concatenate(cached, axis=1)  # (B, WIDTH, V)
    for row, length in enumerate(lengths):
        np.testing.assert_allclose(cached[row, :length], full[row, :length], atol=1e-4, rtol=1e-4)


# --- samplers ------------------------------------------------------------------------


def _logits(seed, rows, vocabulary):
    return np.random.default_rng(seed).normal(0.0, 2.0, (rows, vocabulary)).astype("float32")  # no ties


@SETTINGS
@given(seed=seeds, rows=st.integers(1, 4), vocabulary=st.sampled_from([2, 7, 16]))
def test_greedy_is_argmax(seed, rows, vocabulary):
    logits = _logits(seed, rows, vocabulary)
    uniform = np.random.default_rng(seed + 1).random(rows).astype("float32") + 1e-6
    tokens = GreedySampler().get_next_token(ops.convert_to_tensor(logits), ops.convert_to_tensor(uniform))
    np.testing.assert_array_equal(to_numpy(tokens), logits.argmax(-1))


@settings(SETTINGS, max_examples=_EXPLORE or 10)
@given(
    seed=seeds,
    rows=st.integers(1, 3),
    vocabulary=st.sampled_from([7, 16]),
    top_k=st.integers(1, 8),
    top_p=st.none() | st.floats(0.05, 1.0),
    temperature=st.sampled_from([0.5, 1.0, 2.0]),
)
def test_random_sampling_stays_in_the_top_k_and_the_nucleus(seed, rows, vocabulary, top_k, top_p, temperature):
    logits = _logits(seed, rows, vocabulary)
    uniform = 1.0 - np.random.default_rng(seed + 1).random(rows).astype("float32")  # (0, 1]
    sampler = RandomSampler(temperature=temperature, top_k=top_k, top_p=top_p)
    tokens = to_numpy(sampler.get_next_token(ops.convert_to_tensor(logits), ops.convert_to_tensor(uniform)))
    for row, token in enumerate(tokens):
        order = np.argsort(-logits[row])
        assert token in order[:top_k]  # top-k: one of the k largest logits
        if top_p is not None:  # nucleus (after temperature and top-k): the more likely tokens hold < top_p
            kept = logits[row] >= np.sort(logits[row])[-min(top_k, vocabulary)]
            probabilities = reference.softmax(np.where(kept, logits[row].astype(np.float64) / temperature, -np.inf))
            assert probabilities[probabilities > probabilities[token]].sum() < top_p + 1e-5
    if top_k == 1:
        np.testing.assert_array_equal(tokens, logits.argmax(-1))


@SETTINGS
@given(seed=seeds, rows=st.integers(1, 4), vocabulary=st.sampled_from([2, 7, 16]))
def test_categorical_sampling_inverts_the_cdf(seed, rows, vocabulary):
    logits = _logits(seed, rows, vocabulary)
    uniform = 1.0 - np.random.default_rng(seed + 1).random(rows)  # (0, 1]
    cdf = np.cumsum(reference.softmax(logits.astype(np.float64)), axis=-1)
    assume(np.abs(cdf - uniform[:, None]).min() > 1e-4)  # not on a boundary (float32 rounding)
    expected = (cdf >= uniform[:, None]).argmax(-1)
    tokens = sample_categorical(ops.convert_to_tensor(logits), ops.convert_to_tensor(uniform.astype("float32")))
    np.testing.assert_array_equal(to_numpy(tokens), expected)


@settings(SETTINGS, max_examples=_EXPLORE or 10)
@given(
    seed=seeds,
    length=st.integers(2, 12),
    other=st.integers(2, 16),
    new=st.integers(1, 6),
    sampler=st.sampled_from(["greedy", "random"]),
)
def test_padding_never_changes_a_continuation(lm, seed, length, other, new, sampler):
    """A prompt decodes the same next to a prompt of any other length (padded or padding), with
    greedy and with seeded sampling (a row's noise depends only on the seed and the row index)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB, length).tolist()
    neighbour = rng.integers(0, VOCAB, other).tolist()
    make = (lambda: "greedy") if sampler == "greedy" else (lambda: RandomSampler(top_k=5, seed=seed))
    alone = lm.generate([prompt, prompt], max_new_tokens=new, stop_token_ids=None, sampler=make())
    together = lm.generate([prompt, neighbour], max_new_tokens=new, stop_token_ids=None, sampler=make())
    assert together[0] == alone[0]
    if sampler == "greedy":
        assert alone[1] == alone[0]
