"""Long generations cross the loop's cache widths (`cache_widths`): the cache is padded between
chunks, and every step must still see exactly the keys a full forward pass sees."""

import keras
import numpy as np
import pytest

from keras_transformer.samplers import BeamSampler
from keras_transformer.decoding import cache_schedule
from keras_transformer.decoding.cache_schedule import CHUNK, cache_widths
from tests.samplers.helpers import causal_logits, compiled_functions, log_softmax, tiny_gpt

MAX_LENGTH = 320


@pytest.fixture(scope="module")
def lm():
    return tiny_gpt(vocabulary_size=8, max_sequence_length=MAX_LENGTH, seed=3)


@pytest.mark.parametrize(
    "length, prefill",
    [  # every prefill that fits the buffer (a prefill is at most L)
        (length, prefill)
        for length in [1, 64, 128, 129, 192, 576, 1024, 4096]
        for prefill in [0, 1, 100, 128, 129]
        if prefill <= length
    ],
)
def test_cache_widths_cover_the_buffer_in_few_chunks(length, prefill):
    widths = cache_widths(length, prefill)
    assert widths[-1] == length and widths[0] >= max(prefill, 1)
    assert widths == sorted(set(widths))
    assert all(w % CHUNK == 0 for w in widths[:-1])
    if length <= 1024:
        assert len(widths) <= 5


def test_two_widths_keep_the_first_and_the_buffer_length():
    # TensorFlow's loop (chunked=False) grows the cache once: from the first width straight to L.
    assert cache_widths(1024, 0, chunked=False) == [128, 1024]
    assert cache_widths(192, 0, chunked=False) == cache_widths(192, 0) == [128, 192]
    assert cache_widths(1024, 300, chunked=False) == [384, 1024]
    assert cache_widths(256, 200, chunked=False) == [256]
    assert cache_widths(128, 0, chunked=False) == [128]


def _check_against_full_forward(lm, prompts, new_tokens):
    out = lm.generate(prompts, max_new_tokens=new_tokens, stop_token_ids=None, return_dict=True, output_logits=True)
    for prompt, ids, logits, full in zip(prompts, out["outputs"], out["logits"], causal_logits(lm, out["outputs"])):
        assert ids[: len(prompt)] == prompt and len(ids) == len(prompt) + new_tokens
        reference = full[len(prompt) - 1 : -1]  # (new_tokens, V): the predictions of the new tokens
        np.testing.assert_allclose(logits, reference, atol=2e-4, rtol=2e-4)
        assert ids[len(prompt) :] == reference.argmax(-1).tolist()
    return out["outputs"]


def test_greedy_across_chunks_matches_full_forward(lm):
    # Buffer of 256 positions: chunks of width 128 and 256, the second reached at step 129.
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 8, 3).tolist(), rng.integers(0, 8, 9).tolist()]
    assert cache_widths(256, 32) == [128, 256]
    _check_against_full_forward(lm, prompts, 200)


@pytest.mark.parametrize("tensorflow_limit", ["default", 0])
def test_greedy_over_the_whole_buffer_matches_full_forward(lm, tensorflow_limit, monkeypatch):
    # A buffer of 320 positions: widths 128, 256, 320, or 128 then 320 where TensorFlow's loop grows
    # a cache over its byte limit once (a limit of 0 makes it do so here); either way every step
    # must see the full pass's keys. JAX and PyTorch always grow through every width.
    if tensorflow_limit != "default":
        monkeypatch.setattr(cache_schedule, "TENSORFLOW_CHUNKED_CACHE_BYTES", tensorflow_limit)
    assert cache_widths(320, 0) == [128, 256, 320] and cache_widths(320, 0, chunked=False) == [128, 320]
    lm.__dict__.pop("_compiled_decoding", None)  # compile anew: only this test's loops below
    prompt = np.random.default_rng(4).integers(0, 8, 4).tolist()
    _check_against_full_forward(lm, [prompt], MAX_LENGTH - 4)
    loops = {key[2].chunked_cache for key in compiled_functions(lm) if key[0] == "run"}
    two_widths = keras.config.backend() == "tensorflow" and tensorflow_limit == 0
    assert (False in loops) == two_widths


def test_prefill_longer_than_the_first_chunk(lm):
    # A 150-token prompt is prefilled into 160 positions: the loop starts at width 192, not 128.
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 8, 150).tolist(), rng.integers(0, 8, 4).tolist()]
    _check_against_full_forward(lm, prompts, 30)


def test_streaming_across_chunks_gives_the_same_tokens(lm):
    prompt = np.random.default_rng(2).integers(0, 8, 5).tolist()
    steps = []
    out = lm.generate([prompt], max_new_tokens=180, stop_token_ids=None, streamer=steps.append)
    assert out == lm.generate([prompt], max_new_tokens=180, stop_token_ids=None)
    assert [int(s[0]) for s in steps] == out[0][len(prompt) :]


def test_beam_scores_across_chunks_are_the_full_forward_log_probabilities(lm):
    # Beams are reordered at every step, before and after the cache grows: each returned
    # hypothesis's score must be the sum of its tokens' log-probabilities under a full forward pass.
    prompt = np.random.default_rng(3).integers(0, 8, 6).tolist()
    new_tokens = 160
    sampler = BeamSampler(num_beams=3, length_penalty=0.0, num_return_sequences=3)
    out = lm.generate([prompt], max_new_tokens=new_tokens, stop_token_ids=None, sampler=sampler, return_dict=True)
    hypotheses = out["outputs"][0]
    assert len({tuple(h) for h in hypotheses}) == 3
    for hypothesis, score, full in zip(hypotheses, out["scores"][0], causal_logits(lm, hypotheses)):
        assert len(hypothesis) == len(prompt) + new_tokens
        log_probs = log_softmax(full[len(prompt) - 1 : -1])  # (new_tokens, V)
        expected = log_probs[np.arange(new_tokens), hypothesis[len(prompt) :]].sum()
        np.testing.assert_allclose(score, expected, rtol=1e-4, atol=1e-3)
