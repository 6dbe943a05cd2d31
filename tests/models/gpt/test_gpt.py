"""GPT family: round trips, raw-string fit from lists / tf.data / PyDataset, and a learning test.

Numerical parity with Hugging Face GPT-2 (same weights) is in tests/convert/test_hf_gpt2.py;
cached decoding vs full forward passes in tests/samplers/.
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import presets


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _tiny(vocabulary_size=24, max_sequence_length=32, **kwargs):
    config = dict(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=max_sequence_length,
        **kwargs,
    )
    return kt.models.GPTBackbone(**config)


def _ids(batch=3, length=10, vocabulary_size=24, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), bool)
    mask[1, 7:] = False
    return {"token_ids": rng.integers(0, vocabulary_size, (batch, length)).astype("int32"), "padding_mask": mask}


def test_backbone_config_round_trip_gives_identical_outputs():
    backbone = _tiny()
    x = _ids()
    clone = kt.models.GPTBackbone.from_config(backbone.get_config())
    clone.set_weights(backbone.get_weights())
    np.testing.assert_array_equal(_numpy(clone(x)), _numpy(backbone(x)))


def test_causal_lm_keras_file_round_trip(tmp_path):
    lm = kt.models.GPTCausalLM(_tiny())
    x = _ids()
    lm.save(tmp_path / "lm.keras")
    restored = keras.saving.load_model(tmp_path / "lm.keras")
    np.testing.assert_allclose(_numpy(restored(x)), _numpy(lm(x)), atol=1e-6)


def test_logits_are_the_hidden_states_times_the_transposed_embedding():
    lm = kt.models.GPTCausalLM(_tiny())
    x = _ids()
    hidden = _numpy(lm.backbone(x))
    embeddings = _numpy(lm.backbone.token_embedding.embeddings)
    np.testing.assert_allclose(_numpy(lm(x)), hidden @ embeddings.T, atol=1e-5)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="num_layers"):
        kt.models.GPTBackbone(vocabulary_size=10, num_layers=0, num_heads=2, hidden_dim=8, intermediate_dim=8)
    with pytest.raises(ValueError, match="hidden_dim=10"):
        kt.models.GPTBackbone(vocabulary_size=10, num_layers=1, num_heads=4, hidden_dim=10, intermediate_dim=8)
    tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("gpt_tiny"))
    with pytest.raises(ValueError, match="max_sequence_length"):
        kt.models.GPTCausalLM(
            _tiny(vocabulary_size=tokenizer.vocabulary_size, max_sequence_length=16),
            kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=32),
        )


def test_preprocessor_shifts_labels_and_refuses_silent_truncation():
    tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("gpt_tiny"))
    preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=8)
    ids = tokenizer.tokenize("x = 1")
    x, y, w = preprocessor(["x = 1"])
    expected = [tokenizer.bos_token_id] + ids + [tokenizer.eos_token_id]
    n = len(expected)
    assert x["token_ids"][0, : n - 1].tolist() == expected[:-1]
    assert y[0, : n - 1].tolist() == expected[1:]
    assert w[0].tolist() == [1.0] * (n - 1) + [0.0] * (8 - n + 1)
    with pytest.raises(ValueError, match="sequence_length"):
        preprocessor(["word " * 40])
    with pytest.raises(ValueError, match="empty"):
        preprocessor([])


def test_fit_accepts_strings_tf_data_and_py_dataset():
    import tensorflow as tf

    tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("gpt_tiny"))
    lm = kt.models.GPTCausalLM(
        _tiny(vocabulary_size=tokenizer.vocabulary_size),
        kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=16, truncate=True),
    )
    texts = ["def f(x):\n    return x\n", "import os\n", "for i in range(3):\n    pass\n", "x = 1\n"]

    class Texts(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, index):
            return texts[2 * index : 2 * index + 2]

    history = lm.fit(texts, batch_size=2, epochs=1, verbose=0, validation_data=texts[:2]).history
    # Raw validation strings are preprocessed like the training strings.
    assert abs(history["val_loss"][0] - lm.evaluate(texts[:2], verbose=0)[0]) < 1e-5
    losses = [
        history["loss"][0],
        lm.fit(tf.data.Dataset.from_tensor_slices(texts).batch(2), epochs=1, verbose=0).history["loss"][0],
        lm.fit(Texts(), epochs=1, verbose=0).history["loss"][0],
    ]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]  # the three calls keep training the same model


@pytest.mark.slow
def test_gpt_learns_a_deterministic_language_to_99_percent_on_held_out_sequences():
    # Token t+1 = (token t + step) mod 16, offset by 2; each sequence has its own random start and step.
    rng = np.random.default_rng(0)

    def sequences(n):
        starts = rng.integers(0, 16, n)[:, None]
        steps = rng.integers(1, 4, n)[:, None]
        return ((starts + steps * np.arange(17)[None]) % 16 + 2).astype("int32")

    train, held_out = sequences(2048), sequences(256)
    keras.utils.set_random_seed(0)
    lm = kt.models.GPTCausalLM(_tiny(vocabulary_size=18))
    lm.compile(optimizer=keras.optimizers.AdamW(3e-3))

    def split(rows):
        return {"token_ids": rows[:, :-1], "padding_mask": np.ones(rows[:, :-1].shape, bool)}, rows[:, 1:]

    x, y = split(train)
    lm.fit(x, y, batch_size=64, epochs=10, verbose=0)
    x, y = split(held_out)
    predictions = np.argmax(lm.predict(x, batch_size=64, verbose=0), axis=-1)
    # The first two tokens fix start and step; every later token is determined.
    accuracy = float(np.mean(predictions[:, 1:] == y[:, 1:]))
    assert accuracy >= 0.99, accuracy
