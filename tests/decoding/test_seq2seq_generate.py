"""Generation from tiny random encoder-decoder models (T5 and the original Transformer): cached
decoding vs full forward passes, strings, and beam search over cross-attention caches."""

import numpy as np
import pytest

from keras_transformer.models import (
    T5Backbone,
    T5Seq2SeqLM,
    T5Seq2SeqLMPreprocessor,
    TransformerBackbone,
    TransformerSeq2SeqLM,
    TransformerSeq2SeqLMPreprocessor,
)
from keras_transformer.samplers import BeamSampler
from keras_transformer.tokenizers import UnigramTokenizer
from tests.layers.helpers import randomize_weights
from tests.samplers.helpers import exhaustive_beam, prefix_log_probs, seq2seq_logits

TEXTS = ["1 2 3", "3 2 1", "2 1 3", "1 3"]
SOURCES = [[3, 5, 6, 4, 1], [4, 1]]  # ragged encoder inputs (1 is </s>)
NEW = 6


@pytest.fixture(scope="module")
def tokenizer():
    return UnigramTokenizer.train(TEXTS * 20, vocabulary_size=8)  # 7 pieces


def _build(family, tokenizer):
    config = dict(
        vocabulary_size=tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=32,
        dropout=0.0,
    )
    if family == "t5":
        task, preprocessor = T5Seq2SeqLM(T5Backbone(**config)), T5Seq2SeqLMPreprocessor
    else:
        task, preprocessor = TransformerSeq2SeqLM(TransformerBackbone(**config)), TransformerSeq2SeqLMPreprocessor
    task.preprocessor = preprocessor(tokenizer, encoder_sequence_length=32, decoder_sequence_length=16)
    randomize_weights(task, np.random.default_rng(4), std=0.5)
    return task


@pytest.fixture(scope="module")
def t5(tokenizer):
    return _build("t5", tokenizer)


@pytest.fixture(scope="module")
def transformer(tokenizer):
    return _build("transformer", tokenizer)


@pytest.fixture(params=["t5", "transformer"])
def lm(request):
    return request.getfixturevalue(request.param)


def test_cached_decoding_matches_full_forward(lm):
    out = lm.generate(SOURCES, max_new_tokens=NEW, return_dict=True, output_logits=True)  # stops at </s>
    start = lm.preprocessor.decoder_start_token_id
    full = seq2seq_logits(lm, SOURCES, out["outputs"])
    for ids, logits, reference in zip(out["outputs"], out["logits"], full):
        assert ids[0] == start and 1 < len(ids) <= NEW + 1
        np.testing.assert_allclose(logits, reference[:-1], atol=2e-4, rtol=2e-4)
        assert ids[1:] == reference[:-1].argmax(-1).tolist()  # greedy: step-by-step argmax
        assert 1 not in ids[1:-1]


def test_one_source_decodes_as_it_would_in_a_batch(lm):
    # One row takes its own loop on TensorFlow (each step pads its token to two, see `decode`):
    # the logits must still be the full forward's, the tokens those of the row in a batch.
    batch = lm.generate(SOURCES, max_new_tokens=NEW, return_dict=True)["outputs"]
    for source, expected in zip(SOURCES, batch):
        out = lm.generate([source], max_new_tokens=NEW, return_dict=True, output_logits=True)
        assert out["outputs"] == [expected]
        reference = seq2seq_logits(lm, [source], out["outputs"])[0]
        np.testing.assert_allclose(out["logits"][0], reference[:-1], atol=2e-4, rtol=2e-4)


def test_strings_in_strings_out(lm):
    sources = ["1 2 3", "3 1"]
    encoder_ids, encoder_mask = lm.preprocessor.generate_preprocess(sources)
    ids = [row[mask].tolist() for row, mask in zip(encoder_ids, encoder_mask)]
    expected = lm.preprocessor.generate_postprocess(
        lm.generate(ids, max_new_tokens=NEW, return_dict=True, output_logits=True)["outputs"]
    )
    texts = lm.generate(sources, max_new_tokens=NEW, return_dict=True, output_logits=True)["outputs"]
    assert texts == expected and all(isinstance(t, str) for t in texts)


def test_beam_over_cross_caches_finds_the_exhaustive_best(t5, tokenizer):
    lm = t5
    vocabulary_size, eos, start, steps = tokenizer.vocabulary_size, tokenizer.eos_token_id, 0, 3
    sampler = BeamSampler(num_beams=vocabulary_size**2, num_return_sequences=3)
    out = lm.generate(SOURCES, max_new_tokens=steps, sampler=sampler, return_dict=True)
    for source, results, scores in zip(SOURCES, out["outputs"], out["scores"]):
        table = prefix_log_probs(
            lambda continuations: seq2seq_logits(
                lm, [source] * len(continuations), [[start] + c for c in continuations]
            ),
            vocabulary_size,
            steps,
        )
        best = exhaustive_beam(table, vocabulary_size, eos, 1.0, steps)[:3]
        assert [r[1:] for r in results] == [sequence for _, sequence in best]
        np.testing.assert_allclose(scores, [score for score, _ in best], atol=1e-4)
