"""Stop tokens, min_new_tokens, repetition_penalty, no_repeat_ngram_size and the streamer, on a
bigram LM whose logits are constructed (table[previous token]), against a numpy reference."""

import numpy as np
import pytest

from tests.samplers.helpers import BigramLM, bigram_greedy

VOCAB, NEW = 12, 10


@pytest.fixture(scope="module")
def table():
    """Random logits plus a strong successor: 0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 1 and 9 -> 6 -> 7 -> 8 -> 6."""
    table = np.random.default_rng(11).normal(0.0, 1.0, (VOCAB, VOCAB))
    successor = {0: 1, 1: 2, 2: 3, 3: 4, 4: 5, 5: 1, 9: 6, 6: 7, 7: 8, 8: 6, 10: 1, 11: 6}
    for token, following in successor.items():
        table[token, following] += 6.0
    return table.astype("float32")


@pytest.fixture(scope="module")
def lm(table):
    return BigramLM(table)


@pytest.fixture(scope="module")
def case(table):
    """Two ragged prompts and a stop token (2) that row 0 reaches at its second new token and row 1 never."""
    prompts, stop = [[11, 0], [9]], 2
    assert bigram_greedy(table, prompts[0], NEW)[3] == stop and stop not in bigram_greedy(table, prompts[1], NEW)
    return prompts, stop


def test_greedy_matches_reference_without_stop(lm, table, case):
    prompts, _ = case
    out = lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=None)
    assert out == [bigram_greedy(table, p, NEW) for p in prompts]


def test_stop_tokens_stop_rows_independently(lm, table, case):
    prompts, stop = case
    out = lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop])
    expected = [bigram_greedy(table, p, NEW, stop_token_ids=(stop,)) for p in prompts]
    assert out == expected
    assert out[0][-1] == stop and len(out[0]) == len(prompts[0]) + 2  # row 0 stopped after 2 tokens
    assert len(out[1]) == len(prompts[1]) + NEW  # row 1 ran to max_new_tokens


def test_min_new_tokens_bans_stop_tokens_until_reached(lm, table, case):
    prompts, stop = case
    out = lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop], min_new_tokens=4)
    expected = [bigram_greedy(table, p, NEW, stop_token_ids=(stop,), min_new_tokens=4) for p in prompts]
    assert out == expected
    assert stop not in out[0][2:6]
    assert out != lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop])


def test_repetition_penalty(lm, table, case):
    prompts, _ = case
    out = lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=None, repetition_penalty=8.0)
    assert out == [bigram_greedy(table, p, NEW, repetition_penalty=8.0) for p in prompts]
    assert out != [bigram_greedy(table, p, NEW) for p in prompts]  # the penalty changed something


@pytest.mark.parametrize("n", [1, 2])
def test_no_repeat_ngram_size(lm, table, case, n):
    prompts, _ = case
    out = lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=None, no_repeat_ngram_size=n)
    assert out == [bigram_greedy(table, p, NEW, no_repeat_ngram_size=n) for p in prompts]
    for row in out:
        ngrams = [tuple(row[j : j + n]) for j in range(len(row) - n + 1)]
        assert len(ngrams) == len(set(ngrams))
    assert out != [bigram_greedy(table, p, NEW) for p in prompts]


def test_streamer_receives_exactly_the_generated_tokens(lm, case):
    prompts, stop = case
    prompts = [prompts[0] + [1, 2, 3], prompts[1]]  # ragged: row 0 is 5 tokens, row 1 one
    steps = []
    out = lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop], streamer=steps.append)
    assert out == lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop])
    assert all(isinstance(s, np.ndarray) and s.shape == (2,) for s in steps)
    streamed = [[int(s[row]) for s in steps if s[row] >= 0] for row in range(2)]
    assert streamed == [out[row][len(prompts[row]) :] for row in range(2)]
