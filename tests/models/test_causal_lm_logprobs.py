"""`CausalLM.score` (keras-hub's contract) and the chosen tokens' logprobs in `generate(..., return_dict=True,
output_logits=True)`, against the model's own forward pass, one row at a time, and numpy's log-softmax."""

import keras
import numpy as np
import pytest

from keras_transformer.samplers import RandomSampler
from tests.export.helpers import tiny_gpt

TEXTS = ["def add(a, b):", "for i in", "the quick brown fox jumps"]


@pytest.fixture(scope="module")
def lm():
    return tiny_gpt()


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    peak = logits.max(axis=-1, keepdims=True)
    return logits - peak - np.log(np.exp(logits - peak).sum(axis=-1, keepdims=True))


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def test_score_of_strings_is_each_rows_own_forward_pass(lm):
    """Strings are tokenized as `generate` reads prompts and right-padded: each row's logits at its real
    positions are those of the row scored alone (ids, no padding), and the implicit next-token loss is minus
    the log-softmax at the next token, 0 at the last position and on padding."""
    rows = lm.preprocessor.generate_preprocess(TEXTS)
    logits = _numpy(lm.score(TEXTS))  # (B, T, V)
    loss = _numpy(lm.score(TEXTS, scoring_mode="loss"))  # (B, T)
    assert (
        logits.shape == (3, max(len(r) for r in rows), lm.backbone.vocabulary_size) and loss.shape == logits.shape[:2]
    )
    for b, row in enumerate(rows):
        alone = _numpy(lm.score(np.array([row], "int32")))[0]  # (T_b, V)
        np.testing.assert_allclose(logits[b, : len(row)], alone, atol=1e-5)
        expected = -_log_softmax(alone)[np.arange(len(row) - 1), row[1:]]
        np.testing.assert_allclose(loss[b, : len(row) - 1], expected, atol=1e-4)
        assert not loss[b, len(row) - 1 :].any()


def test_score_loss_with_target_ids(lm):
    ids = np.array([[1, 5, 9, 12, 7], [1, 7, 3, 0, 0]], "int32")
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    targets = np.array([[5, 9, 12, 7, 2], [7, 3, 4, 4, 4]], "int32")
    logits = _numpy(lm.score(ids, padding_mask=mask))
    loss = _numpy(lm.score(ids, padding_mask=mask, scoring_mode="loss", target_ids=targets))
    expected = -np.take_along_axis(_log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(loss, expected, atol=1e-4)
    np.testing.assert_allclose(logits[1, :3], _numpy(lm.score(ids[1:, :3]))[0], atol=1e-5)


def test_bad_score_arguments_are_named(lm):
    ids = np.array([[1, 5, 9]], "int32")
    with pytest.raises(ValueError, match="scoring_mode='probs'"):
        lm.score(ids, scoring_mode="probs")
    with pytest.raises(ValueError, match="target_ids=None"):
        lm.score(ids, scoring_mode="loss")
    with pytest.raises(ValueError, match="max_sequence_length=48"):
        lm.score(np.ones((1, 49), "int32"))
    with pytest.raises(ValueError, match="padding_mask"):
        lm.score("def", padding_mask=np.ones((1, 2)))


@pytest.mark.parametrize(
    "sampler", ["greedy", RandomSampler(temperature=0.6, top_k=20, seed=3)], ids=["greedy", "random"]
)
def test_generate_returns_the_chosen_tokens_logprobs(lm, sampler):
    """Each row's logprobs are the log-softmax of the raw logits (before temperature and top-k) at the chosen
    token, and equal the model's by teacher forcing (`score` over the prompt and the new tokens)."""
    prompts = [[1, 5, 9], [1, 7]]
    out = lm.generate(prompts, max_new_tokens=6, sampler=sampler, return_dict=True, output_logits=True)
    for prompt, row, row_logits, logprobs in zip(prompts, out["outputs"], out["logits"], out["logprobs"]):
        new = row[len(prompt) :]
        assert logprobs.dtype == np.float32 and logprobs.shape == (len(new),)
        np.testing.assert_allclose(logprobs, _log_softmax(row_logits)[np.arange(len(new)), new], atol=1e-5)
        forced = _log_softmax(_numpy(lm.score(np.array([row[:-1]], "int32")))[0])[len(prompt) - 1 :]
        np.testing.assert_allclose(logprobs, forced[np.arange(len(new)), new], atol=1e-4)
    assert lm.generate(prompts, max_new_tokens=2, return_dict=True)["logprobs"] is None
