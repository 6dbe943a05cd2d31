"""TransformerBackbone / TransformerSeq2SeqLM ("Attention Is All You Need").

The reference is tests/reference.py: post-norm encoder and decoder blocks, the paper's sinusoidal
table, the sqrt(D) embedding scale and the tied output projection, in float64 numpy, fed with the
weights read from our model.

Axes: B batch, S encoder length, T decoder length, D width, V vocabulary.
"""

import inspect
import math

import keras
import numpy as np
import pytest

from keras_transformer.models import TransformerBackbone, TransformerSeq2SeqLM, TransformerSeq2SeqLMPreprocessor
from keras_transformer.tokenizers import UnigramTokenizer
from keras_transformer.samplers import BeamSampler
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import block_weights, randomize_weights
from tests.models import seq2seq_helpers as helpers


V, D, H, F, P = 120, 32, 4, 64, 16


def _backbone(**overrides):
    kwargs = dict(
        vocabulary_size=V,
        num_layers=2,
        num_heads=H,
        hidden_dim=D,
        intermediate_dim=F,
        max_sequence_length=P,
        dropout=0.0,
    )
    return TransformerBackbone(**{**kwargs, **overrides})


def _task(rng, **overrides):
    task = TransformerSeq2SeqLM(_backbone(**overrides))
    randomize_weights(task, rng, std=0.3)
    return task


def _inputs(rng):
    return helpers.random_inputs(rng, V, encoder_lengths=[13, 7, 10], decoder_lengths=[9, 4, 9], S=13, T=9)


def _reference_logits(task, x):
    """Encoder outputs (B, S, D) and logits (B, T, V) of the paper's model, in float64 numpy."""
    backbone = task.backbone
    embeddings = to_numpy(backbone.token_embedding.embeddings).astype(np.float64)  # (V, D)

    def embed(ids):
        # Shared embedding scaled by sqrt(D) (3.4) plus the sinusoidal encoding (3.5).
        return embeddings[ids] * math.sqrt(D) + reference.sinusoidal_table(ids.shape[1], D)[None]

    options = dict(activation="relu", norm_type="layer_norm", norm_first=False, epsilon=1e-6)
    x_enc = embed(x["encoder_token_ids"])
    for block in backbone.encoder_layers:
        x_enc = reference.encoder_block(block_weights(block), x_enc, padding_mask=x["encoder_padding_mask"], **options)
    x_dec = embed(x["decoder_token_ids"])
    for block in backbone.decoder_layers:
        x_dec = reference.decoder_block(
            block_weights(block),
            x_dec,
            x_enc,
            padding_mask=x["decoder_padding_mask"],
            encoder_padding_mask=x["encoder_padding_mask"],
            **options,
        )
    return x_enc, x_dec @ embeddings.T  # tied pre-softmax projection: (B, T, D) x (D, V)


def test_matches_numpy_reference(rng):
    task = _task(rng, num_decoder_layers=3)
    backbone = task.backbone
    # Every weight is seen by the reference: the embedding plus the blocks' weights.
    block_count = sum(len(b.weights) for b in backbone.encoder_layers + backbone.decoder_layers)
    assert len(task.weights) == block_count + 1
    x = _inputs(rng)
    expected_encoder, expected_logits = _reference_logits(task, x)
    outputs = backbone(x)
    logits = to_numpy(task(x))
    enc, dec = x["encoder_padding_mask"], x["decoder_padding_mask"]
    assert logits.dtype == np.float32 and logits.shape == (3, 9, V)
    encoder_outputs = to_numpy(outputs["encoder_sequence_output"])
    np.testing.assert_allclose(encoder_outputs[enc], expected_encoder[enc], atol=1e-5, rtol=0)
    np.testing.assert_allclose(logits[dec], expected_logits[dec], atol=1e-5, rtol=0)
    assert np.abs(expected_logits[dec]).max() > 1.0


def test_cached_decoding_matches_full_forward(rng):
    task = _task(rng, num_decoder_layers=3)
    x = _inputs(rng)
    assert task.backbone.cache_shape(3, 12) == (3, 3, 2, H, 12, D // H)
    helpers.assert_cached_decoding_matches_full(task, x, prefill=1)
    helpers.assert_cached_decoding_matches_full(task, x, prefill=4, pass_decoder_mask=True)


def test_decoder_is_causal_and_encoder_padding_is_ignored(rng):
    task = _task(rng)
    x = _inputs(rng)
    logits = to_numpy(task(x))
    changed = {k: v.copy() for k, v in x.items()}
    changed["decoder_token_ids"][:, 5:] = (changed["decoder_token_ids"][:, 5:] + 7) % V
    changed["encoder_token_ids"][1, 7:] = 5
    out = to_numpy(task(changed))
    np.testing.assert_allclose(out[:, :5], logits[:, :5], atol=1e-5, rtol=0)
    assert np.abs(out[0, 5:] - logits[0, 5:]).max() > 1e-3


def test_structure_follows_the_paper():
    backbone = _backbone()
    assert backbone.family == "transformer"
    block = backbone.decoder_layers[0]
    assert not block.norm_first and block.norm_type == "layer_norm" and block.use_bias and block.use_cross_attention
    assert backbone.position_embedding.position_type == "sinusoidal"
    assert not backbone.position_embedding.weights  # the sinusoid has no weights
    # Paper defaults: the base model.
    parameters = inspect.signature(TransformerBackbone.__init__).parameters
    paper = {"num_layers": 6, "num_heads": 8, "hidden_dim": 512, "intermediate_dim": 2048, "dropout": 0.1}
    assert {name: parameters[name].default for name in paper} == paper


@pytest.mark.parametrize(
    "overrides, name",
    [
        (dict(num_heads=5), "hidden_dim"),
        (dict(num_layers=0), "num_layers"),
        (dict(max_sequence_length=0), "max_sequence_length"),
        (dict(dropout=-0.1), "dropout"),
        (dict(activation="tanh"), "activation"),
    ],
)
def test_invalid_arguments(overrides, name):
    with pytest.raises(ValueError, match=name):
        _backbone(**overrides)


def test_positions_past_max_sequence_length_are_rejected():
    preprocessor = TransformerSeq2SeqLMPreprocessor(helpers.digit_tokenizer(), 8, P + 1)
    with pytest.raises(ValueError, match="max_sequence_length"):
        TransformerSeq2SeqLM(_backbone(), preprocessor)


def test_decoder_start_token_is_bos_when_the_tokenizer_has_one():
    vocabulary = helpers.DIGIT_VOCABULARY + [("<s>", 0.0)]
    backend = UnigramTokenizer.from_vocabulary(vocabulary).backend_tokenizer
    tokenizer = UnigramTokenizer(backend, bos_token="<s>")
    preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, 4, 4)
    x, labels, _ = preprocessor((["1 2"], ["3"]))
    assert preprocessor.decoder_start_token_id == 13
    np.testing.assert_array_equal(x["decoder_token_ids"], [[13, 6, 0, 0]])
    np.testing.assert_array_equal(labels, [[6, 1, 0, 0]])
    assert TransformerSeq2SeqLMPreprocessor(helpers.digit_tokenizer()).decoder_start_token_id == 0  # no BOS: pad


def test_config_round_trip(rng):
    helpers.assert_config_round_trip(_task(rng, num_decoder_layers=3))


def test_keras_save_and_load(rng, tmp_path):
    task = TransformerSeq2SeqLM(_backbone(), TransformerSeq2SeqLMPreprocessor(helpers.digit_tokenizer(), 8, 8))
    randomize_weights(task, rng)
    helpers.assert_keras_round_trip(task, _inputs(rng), tmp_path)


def test_preset_round_trip(rng, tmp_path):
    tokenizer, texts = helpers.trained_tokenizer(rng)
    task = TransformerSeq2SeqLM(
        _backbone(vocabulary_size=tokenizer.vocabulary_size, max_sequence_length=48),
        TransformerSeq2SeqLMPreprocessor(tokenizer, 48, 48),
    )
    randomize_weights(task, rng)
    helpers.assert_preset_round_trip(task, tmp_path, texts[:4], texts[4:8])


@pytest.mark.slow
def test_learns_to_reverse_digits(rng):
    """A tiny model shaped like transformer_base (post-norm, relu, sinusoid, tied embedding)
    learns digit reversal from plain `fit((sources, targets))` on raw strings, and decodes held-out
    sources exactly with greedy and beam search."""
    preprocessor = TransformerSeq2SeqLMPreprocessor(helpers.digit_tokenizer(), 6, 6)
    backbone = TransformerBackbone(
        preprocessor.tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=6,
        dropout=0.0,
    )
    task = TransformerSeq2SeqLM(backbone, preprocessor)
    train = helpers.reverse_pairs(rng, 2048, 3, 5)  # whole batches: one traced shape on TensorFlow
    held_out = helpers.reverse_pairs(np.random.default_rng(99), 300, 3, 5)
    epochs, batch_size = 5, 32
    steps = epochs * -(-len(train[0]) // batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=3e-3, warmup_steps=steps // 10)
    task.compile(optimizer=keras.optimizers.Adam(schedule))
    task.fit(train, batch_size=batch_size, epochs=epochs, verbose=0)
    accuracy = helpers.held_out_accuracy(task, *held_out)
    assert accuracy >= 0.99, accuracy
    evaluated = task.evaluate(held_out, batch_size=100, verbose=0, return_dict=True)
    assert abs(evaluated["accuracy"] - accuracy) < 1e-4

    # Free-running decoding (no teacher forcing) of held-out sources: greedy, then beam search
    # (5 new tokens: the decoder start token and 5 digits fill max_sequence_length=6).
    sources, targets = held_out[0][:64], held_out[1][:64]
    greedy = task.generate(sources, max_new_tokens=5)
    exact = np.mean([g == t for g, t in zip(greedy, targets)])
    assert exact >= 0.95, (exact, [(s, g) for s, g, t in zip(sources, greedy, targets) if g != t][:5])
    beam = task.generate(sources, max_new_tokens=5, sampler=BeamSampler(num_beams=3))
    assert np.mean([b == t for b, t in zip(beam, targets)]) >= exact - 0.02


def test_preprocessor_docstring_example():
    from keras_transformer.models.transformer import transformer_seq2seq_lm_preprocessor

    helpers.run_doctests(transformer_seq2seq_lm_preprocessor)


@pytest.mark.slow
def test_docstring_examples():
    from keras_transformer.models.transformer import transformer_backbone, transformer_seq2seq_lm

    helpers.run_doctests(transformer_backbone, transformer_seq2seq_lm)
