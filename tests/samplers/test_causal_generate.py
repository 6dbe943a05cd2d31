"""Generation from a tiny random GPT: cached logits vs full forward passes, ragged prompts,
random sampling against the model's logits, retracing, input forms and bad inputs."""

import keras
import numpy as np
import pytest

from keras_transformer.samplers import BeamSampler, RandomSampler
from keras_transformer.decoding.generate import LENGTH_BUCKET
from tests.conftest import to_numpy
from tests.samplers.helpers import causal_logits, compiled_functions, is_eager_backend

PROMPTS = [[3, 4, 5, 7, 2, 6, 5, 3], [7, 1]]  # ragged: row 1 is padded by 6
NEW = 12
VOCAB = 8


@pytest.fixture(scope="module")
def lm(gpt):
    return gpt


@pytest.fixture(scope="module")
def greedy(lm):
    return lm.generate(PROMPTS, max_new_tokens=NEW, stop_token_ids=None)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _check_logits(lm, out):
    """The loop's logits of every generated token equal full forward passes over the final ids."""
    references = []
    for prompt, ids, logits, full in zip(PROMPTS, out["outputs"], out["logits"], causal_logits(lm, out["outputs"])):
        assert ids[: len(prompt)] == prompt and len(ids) == len(prompt) + NEW
        reference = full[len(prompt) - 1 : -1]  # (NEW, V): the predictions of the new tokens
        np.testing.assert_allclose(logits, reference, atol=2e-4, rtol=2e-4)
        references.append(reference)
    return references


def test_cached_logits_match_full_forward_and_greedy_is_argmax(lm, greedy):
    out = lm.generate(PROMPTS, max_new_tokens=NEW, stop_token_ids=None, return_dict=True, output_logits=True)
    assert out["outputs"] == greedy
    for prompt, ids, reference in zip(PROMPTS, greedy, _check_logits(lm, out)):
        assert ids[len(prompt) :] == reference.argmax(-1).tolist()


def test_padding_never_changes_a_continuation(lm, greedy):
    # Alone: a batch of two copies, so nothing is padded (and the compiled loop is reused).
    long_prompt = np.random.default_rng(1).integers(0, VOCAB, 30).tolist()
    alone = [lm.generate([p, p], max_new_tokens=NEW, stop_token_ids=None)[0] for p in PROMPTS + [long_prompt]]
    assert alone[:2] == greedy
    together = lm.generate([PROMPTS[1], long_prompt], max_new_tokens=NEW, stop_token_ids=None)  # 28 pads
    assert together == [alone[1], alone[2]]


def test_greedy_equals_one_beam(lm, greedy):
    assert lm.generate(PROMPTS, max_new_tokens=NEW, stop_token_ids=None, sampler=BeamSampler(num_beams=1)) == greedy
    plain = lm.generate(PROMPTS, max_new_tokens=NEW, stop_token_ids=None, return_dict=True)
    assert plain == {"outputs": greedy, "scores": None, "logits": None, "logprobs": None}


def test_random_sampling_stays_in_the_top_k_and_the_nucleus(lm, greedy):
    temperature, top_k, top_p = 1.5, 4, 0.8
    sampler = RandomSampler(temperature=temperature, top_k=top_k, top_p=top_p, seed=7)
    out = lm.generate(
        PROMPTS, max_new_tokens=NEW, stop_token_ids=None, sampler=sampler, return_dict=True, output_logits=True
    )
    for prompt, ids, reference in zip(PROMPTS, out["outputs"], _check_logits(lm, out)):
        for token, logits in zip(ids[len(prompt) :], reference):
            assert token in np.argsort(-logits)[:top_k]
            probabilities = _softmax(logits / temperature)
            assert probabilities[probabilities > probabilities[token]].sum() < top_p + 1e-6
    assert out["outputs"] != greedy  # it does sample
    again = lm.generate(
        PROMPTS, max_new_tokens=NEW, stop_token_ids=None, sampler=sampler, return_dict=True, output_logits=True
    )
    assert again["outputs"] == out["outputs"]  # same seed, same tokens
    other = lm.generate(
        PROMPTS,
        max_new_tokens=NEW,
        stop_token_ids=None,
        return_dict=True,
        output_logits=True,
        sampler=RandomSampler(temperature=temperature, top_k=top_k, top_p=top_p, seed=8),
    )
    assert other["outputs"] != out["outputs"]


def test_one_row_decodes_as_it_would_alone(lm, greedy):
    # TensorFlow pads each step of a one-row call to two tokens (its XLA runs one-row products at
    # half speed): the tokens, logits, streamed arrays and noise must still be the one row's.
    prompt = PROMPTS[0]
    out = lm.generate([prompt], max_new_tokens=NEW, stop_token_ids=None, return_dict=True, output_logits=True)
    assert out["outputs"] == [greedy[0]] and [np.shape(x) for x in out["logits"]] == [(NEW, VOCAB)]
    _check_logits(lm, out)
    steps = []
    assert lm.generate([prompt], max_new_tokens=NEW, stop_token_ids=None, streamer=steps.append) == [greedy[0]]
    assert [s.shape for s in steps] == [(1,)] * NEW and [int(s[0]) for s in steps] == greedy[0][len(prompt) :]

    sampler = RandomSampler(temperature=2.0, seed=3)
    out = lm.generate(
        [prompt], max_new_tokens=NEW, stop_token_ids=None, sampler=sampler, return_dict=True, output_logits=True
    )
    length = -(-(len(prompt) + NEW) // LENGTH_BUCKET) * LENGTH_BUCKET  # the call's buffer: rounded up to its bucket
    uniform = sampler.draw_noise((length, 1))[len(prompt) : len(prompt) + NEW, 0]  # the call's noise of its row
    expected = to_numpy(sampler.get_next_token(np.asarray(out["logits"][0]), uniform))  # (NEW,)
    assert out["outputs"][0][len(prompt) :] == expected.tolist()
    assert out["outputs"][0] != greedy[0]  # it does sample


def test_temperature_near_zero_matches_greedy(lm, greedy):
    assert (
        lm.generate(PROMPTS, max_new_tokens=NEW, stop_token_ids=None, sampler=RandomSampler(temperature=1e-4)) == greedy
    )


def test_compiled_once_per_batch_size_and_bucket(lm, greedy):
    functions = compiled_functions(lm)  # the greedy loop of batch 2 and bucket 64 already ran
    traces = {key: f.traces for key, f in functions.items()}
    for batch, new in (([[4, 4, 2], [7, 6, 5, 4, 3]], 5), ([[1, 2], [3, 4, 5, 6, 7, 1, 2, 3, 4]], 20)):
        lm.generate(batch, max_new_tokens=new, stop_token_ids=None)
    assert compiled_functions(lm).keys() == functions.keys()  # no new compiled function
    if not is_eager_backend():
        assert {key: f.traces for key, f in functions.items()} == traces  # and no retrace
        lm.generate([[4, 4, 2]] * 3, max_new_tokens=5, stop_token_ids=None)  # batch 3: prefill and loop trace once
        assert sum(f.traces for f in functions.values()) == sum(traces.values()) + 2


def test_compiled_loop_reads_the_current_weights(lm, greedy):
    beta = lm.backbone.layer_norm.beta
    original = keras.ops.convert_to_numpy(beta)
    try:
        beta.assign(original + np.random.default_rng(5).normal(0.0, 2.0, original.shape).astype("float32"))
        out = lm.generate(PROMPTS, max_new_tokens=NEW, stop_token_ids=None)
        assert out != greedy
        for prompt, ids, full in zip(PROMPTS, out, causal_logits(lm, out)):
            assert ids[len(prompt) :] == full[len(prompt) - 1 : -1].argmax(-1).tolist()
    finally:
        beta.assign(original)
    assert lm.generate(PROMPTS, max_new_tokens=NEW, stop_token_ids=None) == greedy


def test_array_inputs_give_arrays(lm, greedy):
    expected = np.array([greedy[0], greedy[0]])
    array = lm.generate(np.array([PROMPTS[0]] * 2), max_new_tokens=NEW, stop_token_ids=None)
    assert isinstance(array, np.ndarray) and array.dtype == np.int32
    np.testing.assert_array_equal(array, expected)
    tensor = keras.ops.convert_to_tensor(np.array([PROMPTS[0]] * 2, "int32"))
    np.testing.assert_array_equal(lm.generate(tensor, max_new_tokens=NEW, stop_token_ids=None), expected)


@pytest.mark.parametrize(
    "inputs, kwargs, match",
    [
        (PROMPTS, {"max_new_tokens": 0}, "max_new_tokens"),
        (PROMPTS, {"max_new_tokens": 2.5}, "max_new_tokens"),
        ([[1] * 60], {"max_new_tokens": 5}, "max_sequence_length=64"),
        ([[1, 2], []], {}, "empty prompt"),
        ([], {}, "empty batch"),
        (np.zeros((0, 3), "int32"), {}, "empty batch"),
        ([[1, 8]], {}, "token id 8"),
        ([[1, -1]], {}, "token id -1, outside \\[0, vocabulary_size=8\\)"),
        (np.array([[1.0, 2.0]]), {}, "integer"),
        (PROMPTS, {"sampler": "nucleus"}, "sampler"),
        (PROMPTS, {"stop_token_ids": [8]}, "stop_token_ids"),
        (PROMPTS, {"min_new_tokens": -1}, "min_new_tokens"),
        (PROMPTS, {"repetition_penalty": 0.0}, "repetition_penalty"),
        (PROMPTS, {"no_repeat_ngram_size": -2}, "no_repeat_ngram_size"),
        (PROMPTS, {"sampler": "beam", "streamer": print}, "streamer"),
        (PROMPTS, {"output_logits": True}, "output_logits"),
        (PROMPTS, {"output_logits": True, "return_dict": True, "sampler": "beam"}, "output_logits"),
        ("a string", {}, "preprocessor"),
    ],
)
def test_bad_inputs_raise(lm, inputs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        lm.generate(inputs, **kwargs)
