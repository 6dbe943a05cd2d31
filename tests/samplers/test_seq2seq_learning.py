"""A tiny encoder-decoder trained to reverse digit strings decodes held-out sources exactly."""

import keras
import numpy as np
import pytest

from keras_transformer.models import TransformerBackbone, TransformerSeq2SeqLM, TransformerSeq2SeqLMPreprocessor
from keras_transformer.samplers import BeamSampler
from tests.models import seq2seq_helpers as helpers


@pytest.mark.slow
def test_greedy_and_beam_decoding_reverse_held_out_digits():
    preprocessor = TransformerSeq2SeqLMPreprocessor(helpers.digit_tokenizer(), 6, 6)
    backbone = TransformerBackbone(
        preprocessor.tokenizer.vocabulary_size, num_layers=2, num_heads=4, hidden_dim=32, intermediate_dim=64,
        max_sequence_length=8, dropout=0.0,
    )
    task = TransformerSeq2SeqLM(backbone, preprocessor)
    train = helpers.reverse_pairs(np.random.default_rng(0), 1200, 3, 4)
    sources, targets = helpers.reverse_pairs(np.random.default_rng(99), 64, 3, 4)
    epochs, batch_size = 8, 32  # 300 steps
    steps = epochs * -(-len(train[0]) // batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=3e-3, warmup_steps=steps // 10)
    task.compile(optimizer=keras.optimizers.Adam(schedule))
    task.fit(train, batch_size=batch_size, epochs=epochs, verbose=0)

    greedy = task.generate(sources, max_new_tokens=6)
    exact = np.mean([g == t for g, t in zip(greedy, targets)])
    assert exact >= 0.95, (exact, [(s, g) for s, g, t in zip(sources, greedy, targets) if g != t][:5])
    beam = task.generate(sources, max_new_tokens=6, sampler=BeamSampler(num_beams=3))
    assert np.mean([b == t for b, t in zip(beam, targets)]) >= exact - 0.02
