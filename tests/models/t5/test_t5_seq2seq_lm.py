"""T5Backbone / T5Seq2SeqLM: cached decoding, structure, validation, saving, presets, learning.

Numerical parity with Hugging Face is in test_t5_parity.py.

Axes: B batch, S encoder length, T decoder length, L decoder layers, H heads, Dh head size.
"""

import keras
import numpy as np
import pytest

from keras_transformer.layers import RelativePositionBias
from keras_transformer.models import T5Backbone, T5Seq2SeqLM, T5Seq2SeqLMPreprocessor
from tests.conftest import to_numpy
from tests.layers.helpers import randomize_weights
from tests.models import seq2seq_helpers as helpers


V = 120  # the shapes of test_t5_parity.py, so JAX reuses its compiled ops


def _backbone(**overrides):
    kwargs = dict(
        vocabulary_size=V,
        num_layers=2,
        num_heads=4,
        hidden_dim=32,
        intermediate_dim=64,
        key_dim=8,
        dropout=0.0,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=10,
    )
    return T5Backbone(**{**kwargs, **overrides})


def _task(rng, **overrides):
    task = T5Seq2SeqLM(_backbone(**overrides))
    randomize_weights(task, rng, std=0.3)  # unit norms and small weights could hide errors
    return task


def _inputs(rng):
    return helpers.random_inputs(rng, V, encoder_lengths=[13, 7, 10], decoder_lengths=[9, 4, 9], S=13, T=9)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(activation="relu", tie_embedding_weights=True),
        # gated, untied, a deeper decoder than encoder, and a head size unrelated to D / H.
        dict(activation="gated-gelu", tie_embedding_weights=False, num_decoder_layers=3, key_dim=5),
    ],
    ids=["v1_0", "v1_1_deep_decoder"],
)
def test_cached_decoding_matches_full_forward(overrides, rng):
    task = _task(rng, **overrides)
    x = _inputs(rng)
    layers = overrides.get("num_decoder_layers", 2)
    head_dim = overrides.get("key_dim", 8)
    assert task.backbone.cache_shape(3, 12) == (3, layers, 2, 4, 12, head_dim)
    helpers.assert_cached_decoding_matches_full(task, x, prefill=1)
    # A prefill of several tokens, and the decoder key mask given explicitly.
    helpers.assert_cached_decoding_matches_full(task, x, prefill=3, pass_decoder_mask=True)


def test_decoder_is_causal_and_encoder_padding_is_ignored(rng):
    task = _task(rng)
    x = _inputs(rng)
    logits = to_numpy(task(x))
    changed = {k: v.copy() for k, v in x.items()}
    changed["decoder_token_ids"][:, 5:] = (changed["decoder_token_ids"][:, 5:] + 7) % V  # future tokens
    changed["encoder_token_ids"][1, 7:] = 5  # ids under the encoder padding of row 1
    out = to_numpy(task(changed))
    np.testing.assert_allclose(out[:, :5], logits[:, :5], atol=1e-5, rtol=0)
    assert np.abs(out[0, 5:] - logits[0, 5:]).max() > 1e-3  # the changed tokens do matter
    # The source changes the output (cross-attention is wired in).
    other = {**x, "encoder_token_ids": (x["encoder_token_ids"] + 3) % V}
    assert np.abs(to_numpy(task(other))[0] - logits[0]).max() > 1e-3


def test_structure_follows_t5():
    backbone = _backbone(num_decoder_layers=3)
    task = T5Seq2SeqLM(backbone)
    names = [v.path for v in task.weights]
    assert not [n for n in names if n.endswith("bias") and "relative_position_bias" not in n], "T5 has no biases"
    # One relative bias table per stack, shared by the stack's layers (HF: block 0 only).
    tables = [layer for layer in backbone.layers if isinstance(layer, RelativePositionBias)]
    assert sorted(t.name for t in tables) == ["decoder_relative_position_bias", "encoder_relative_position_bias"]
    assert backbone.encoder_relative_position_bias.bidirectional
    assert not backbone.decoder_relative_position_bias.bidirectional
    assert len(backbone.encoder_layers) == 2 and len(backbone.decoder_layers) == 3
    block = backbone.decoder_layers[0]
    assert block.norm_first and block.norm_type == "rms_norm" and block.attention_scale == 1.0 and not block.use_bias
    assert task.lm_head is None and T5Seq2SeqLM(_backbone(tie_embedding_weights=False)).lm_head is not None
    assert backbone.family == "t5"


@pytest.mark.slow  # cheap on TensorFlow and torch; JAX compiles the training-mode ops afresh (~10 s)
def test_dropout_only_in_training(rng):
    task = T5Seq2SeqLM(_backbone(dropout=0.3))
    x = _inputs(rng)
    np.testing.assert_allclose(to_numpy(task(x)), to_numpy(task(x)), atol=0)
    assert np.abs(to_numpy(task(x, training=True)) - to_numpy(task(x))).max() > 1e-3


@pytest.mark.parametrize(
    "overrides, name",
    [
        (dict(num_heads=0), "num_heads"),
        (dict(key_dim=0), "key_dim"),
        (dict(key_dim=None, num_heads=5), "hidden_dim"),
        (dict(num_decoder_layers=0), "num_decoder_layers"),
        (dict(activation="swish"), "activation"),
        (dict(relative_attention_num_buckets=0), "relative_attention_num_buckets"),
        (dict(dropout=1.5), "dropout"),
    ],
)
def test_invalid_arguments(overrides, name):
    with pytest.raises(ValueError, match=name):
        _backbone(**overrides)


def test_preprocessor_longer_than_backbone_is_rejected():
    preprocessor = T5Seq2SeqLMPreprocessor(helpers.digit_tokenizer(), 16, 8)
    with pytest.raises(ValueError, match="max_sequence_length"):
        T5Seq2SeqLM(_backbone(max_sequence_length=12), preprocessor)


def test_config_round_trip(rng):
    helpers.assert_config_round_trip(_task(rng, tie_embedding_weights=False, num_decoder_layers=3))


def test_keras_save_and_load(rng, tmp_path):
    task = T5Seq2SeqLM(_backbone(tie_embedding_weights=False), T5Seq2SeqLMPreprocessor(helpers.digit_tokenizer(), 8, 8))
    randomize_weights(task, rng)
    loaded = helpers.assert_keras_round_trip(task, _inputs(rng), tmp_path)
    np.testing.assert_allclose(to_numpy(loaded.lm_head.kernel), to_numpy(task.lm_head.kernel))


def test_preset_round_trip(rng, tmp_path):
    tokenizer, texts = helpers.trained_tokenizer(rng)
    backbone = _backbone(vocabulary_size=tokenizer.vocabulary_size, tie_embedding_weights=False)
    task = T5Seq2SeqLM(backbone, T5Seq2SeqLMPreprocessor(tokenizer, 48, 48))
    randomize_weights(task, rng)
    loaded = helpers.assert_preset_round_trip(task, tmp_path, texts[:4], texts[4:8])
    assert loaded.preprocessor.decoder_start_token_id == tokenizer.pad_token_id == 0


@pytest.mark.slow
def test_learns_to_reverse_digits(rng):
    """Plain `fit((sources, targets))` on raw strings; teacher-forced accuracy on held-out pairs."""
    preprocessor = T5Seq2SeqLMPreprocessor(helpers.digit_tokenizer(), 6, 6)
    backbone = T5Backbone(
        preprocessor.tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=8,
        hidden_dim=32,
        intermediate_dim=64,
        dropout=0.0,
        max_sequence_length=6,
    )
    task = T5Seq2SeqLM(backbone, preprocessor)
    train = helpers.reverse_pairs(rng, 4096, 3, 5)  # whole batches: one traced shape on TensorFlow
    held_out = helpers.reverse_pairs(np.random.default_rng(99), 300, 3, 5)
    epochs, batch_size = 6, 64
    steps = epochs * -(-len(train[0]) // batch_size)
    schedule = keras.optimizers.schedules.CosineDecay(0.0, steps, warmup_target=1e-2, warmup_steps=steps // 10)
    task.compile(optimizer=keras.optimizers.Adam(schedule))
    history = task.fit(train, batch_size=batch_size, epochs=epochs, verbose=0, validation_data=held_out)
    accuracy = helpers.held_out_accuracy(task, *held_out)
    assert accuracy >= 0.99, accuracy
    evaluated = task.evaluate(held_out, batch_size=100, verbose=0, return_dict=True)
    assert abs(evaluated["accuracy"] - accuracy) < 1e-4  # the compiled metric counts the same tokens
    # Raw (sources, targets) validation data is preprocessed like the training data.
    assert abs(history.history["val_accuracy"][-1] - accuracy) < 1e-4


@pytest.mark.slow
def test_docstring_examples():
    from keras_transformer.models.t5 import t5_backbone, t5_seq2seq_lm

    helpers.run_doctests(t5_backbone, t5_seq2seq_lm)
