"""The forms `generate` accepts and returns (strings, id lists, arrays; n results per input), on a
bigram LM with constructed logits and a real tokenizer and preprocessor."""

import numpy as np
import pytest

from keras_transformer.models import GPTCausalLMPreprocessor
from keras_transformer.samplers import BeamSampler
from keras_transformer.tokenizers import BytePairTokenizer
from tests.samplers.helpers import BigramLM, bigram_greedy

TEXTS = ["def add(a, b):\n    return a + b\n", "print(x)\n", "for i in range(3):\n    pass\n"]


@pytest.fixture(scope="module")
def lm():
    tokenizer = BytePairTokenizer.train(TEXTS * 5, vocabulary_size=300)
    table = np.random.default_rng(2).normal(0.0, 3.0, (tokenizer.vocabulary_size,) * 2).astype("float32")
    table[:, tokenizer.eos_token_id] += 7.0  # the end token is likely: some rows stop early
    return BigramLM(table, preprocessor=GPTCausalLMPreprocessor(tokenizer, sequence_length=32))


def test_strings_in_strings_out(lm):
    preprocessor = lm.preprocessor
    eos = preprocessor.tokenizer.eos_token_id
    prompts = ["def add", "print(", "for i"]
    ids = preprocessor.generate_preprocess(prompts)
    out_ids = lm.generate(ids, max_new_tokens=8)  # stop_token_ids="auto": the end token
    assert out_ids == [bigram_greedy(lm.table, p, 8, stop_token_ids=(eos,)) for p in ids]
    assert any(row[-1] == eos and len(row) < len(p) + 8 for row, p in zip(out_ids, ids))  # one row stopped
    texts = lm.generate(prompts, max_new_tokens=8)
    assert texts == preprocessor.generate_postprocess(out_ids)
    assert all(isinstance(t, str) and t.startswith(p) for t, p in zip(texts, prompts))
    assert lm.generate(prompts[1], max_new_tokens=8) == texts[1]


def test_id_forms(lm):
    prompt = [5, 9, 12]
    expected = bigram_greedy(lm.table, prompt, 6)
    assert lm.generate(prompt, max_new_tokens=6, stop_token_ids=None) == expected
    single = lm.generate(np.array(prompt), max_new_tokens=6, stop_token_ids=None)
    assert isinstance(single, np.ndarray) and single.tolist() == expected
    ragged = lm.generate([prompt, [7]], max_new_tokens=6, stop_token_ids=None)
    assert ragged == [expected, bigram_greedy(lm.table, [7], 6)]


def test_padded_array_output(lm):
    eos = lm.preprocessor.tokenizer.eos_token_id
    rows = lm.generate(np.array([[5, 9], [7, 1], [3, 3]]), max_new_tokens=8)
    expected = [bigram_greedy(lm.table, p, 8, stop_token_ids=(eos,)) for p in ([5, 9], [7, 1], [3, 3])]
    width = max(len(e) for e in expected)
    assert rows.shape == (3, width)
    for row, e in zip(rows, expected):
        assert row[: len(e)].tolist() == e and (row[len(e) :] == lm.preprocessor.tokenizer.pad_token_id).all()


def test_several_results_per_input(lm):
    beam = BeamSampler(num_beams=3, num_return_sequences=2)
    texts = lm.generate(["def add", "print("], max_new_tokens=4, sampler=beam, return_dict=True)
    assert len(texts["outputs"]) == 2 and all(
        len(group) == 2 and all(isinstance(t, str) for t in group) for group in texts["outputs"]
    )
    assert texts["scores"].shape == (2, 2) and (texts["scores"][:, 0] >= texts["scores"][:, 1]).all()
    ids = lm.preprocessor.generate_preprocess(["def add", "print("])
    assert len(ids[0]) == len(ids[1])  # so that a 2-D array holds them
    array = lm.generate(np.array(ids), max_new_tokens=4, sampler=beam)  # (B, n, T), padded
    listed = lm.generate(ids, max_new_tokens=4, sampler=beam)  # B lists of n id lists
    pad = lm.preprocessor.tokenizer.pad_token_id
    assert array.ndim == 3 and array.shape[:2] == (2, 2)
    assert [[row + [pad] * (array.shape[2] - len(row)) for row in group] for group in listed] == array.tolist()
    assert [lm.preprocessor.generate_postprocess(group) for group in listed] == texts["outputs"]
