"""Checks shared by the encoder-decoder families (T5, the original Transformer).

Every check compares the model with itself under an invariant (cached decoding against the full
forward pass, a reloaded model against the one saved) or with held-out data; the expected
numbers never come from a stored output of the code under test.

Axes: B batch, S encoder length, T decoder length, V vocabulary.
"""

import json

import keras
import numpy as np

from keras_transformer.models import Backbone
from keras_transformer.tokenizers import UnigramTokenizer
from tests.conftest import to_numpy

SPACE = "\u2581"
# One piece per digit ("▁7"), so a digit string "3 1 4" is exactly 3 tokens.
DIGIT_VOCABULARY = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(f"{SPACE}{d}", -1.0) for d in range(10)]


def digit_tokenizer():
    """<pad>=0, </s>=1, <unk>=2, then "▁0".."▁9" = 3..12."""
    return UnigramTokenizer.from_vocabulary(DIGIT_VOCABULARY)


def trained_tokenizer(rng, vocabulary_size=40):
    """A UnigramTokenizer trained on generated lowercase text (for the preset round trip)."""
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "to", "a", "red", "ball", "translate", "reverse"]
    texts = [" ".join(rng.choice(words, rng.integers(3, 9))) for _ in range(300)]
    return UnigramTokenizer.train(texts, vocabulary_size=vocabulary_size), texts


def reverse_pairs(rng, count, min_length, max_length):
    """(sources, targets): random digit strings and the same digits reversed."""
    sources, targets = [], []
    for _ in range(count):
        digits = [str(d) for d in rng.integers(0, 10, rng.integers(min_length, max_length + 1))]
        sources.append(" ".join(digits))
        targets.append(" ".join(reversed(digits)))
    return sources, targets


def random_inputs(rng, vocabulary_size, encoder_lengths, decoder_lengths, S, T):
    """Model inputs with right padding: ids 0 (pad) past each row's length, masks to match."""
    encoder_mask = np.arange(S)[None, :] < np.asarray(encoder_lengths)[:, None]
    decoder_mask = np.arange(T)[None, :] < np.asarray(decoder_lengths)[:, None]
    B = len(encoder_lengths)
    return {
        "encoder_token_ids": np.where(encoder_mask, rng.integers(1, vocabulary_size, (B, S)), 0).astype("int32"),
        "encoder_padding_mask": encoder_mask,
        "decoder_token_ids": np.where(decoder_mask, rng.integers(1, vocabulary_size, (B, T)), 0).astype("int32"),
        "decoder_padding_mask": decoder_mask,
    }


def assert_cached_decoding_matches_full(task, x, prefill=1, pass_decoder_mask=False, atol=5e-5):
    """Prefill `prefill` decoder tokens, then one token per step: every step's logits must equal
    the full forward pass at that position (on real decoder positions), up to float32 rounding."""
    full = to_numpy(task(x))
    B, T = x["decoder_token_ids"].shape
    S_max = T + 3  # a cache longer than the target: unwritten slots must stay invisible
    encoder_outputs = task.encode(x["encoder_token_ids"], x["encoder_padding_mask"])
    assert tuple(encoder_outputs.shape) == x["encoder_token_ids"].shape + (task.backbone.hidden_dim,)
    cross_cache = task.compute_cross_cache(encoder_outputs)
    cache = np.zeros(task.backbone.cache_shape(B, S_max), "float32")
    S = x["encoder_token_ids"].shape[1]
    assert tuple(cross_cache.shape) == (
        B,
        cache.shape[1],
        2,
        cache.shape[3],
        S,
        cache.shape[5],
    )  # (B, L, 2, Hkv, S, Dh)
    decoder_mask = None
    if pass_decoder_mask:
        decoder_mask = np.zeros((B, S_max), bool)
        decoder_mask[:, :T] = x["decoder_padding_mask"]
    real = x["decoder_padding_mask"]
    start = 0
    for length in [prefill] + [1] * (T - prefill):
        ids = x["decoder_token_ids"][:, start : start + length]
        logits, cache = task.call_with_cache(ids, cache, start, cross_cache, x["encoder_padding_mask"], decoder_mask)
        logits = to_numpy(logits)
        assert logits.dtype == np.float32 and logits.shape == (B, length, full.shape[-1])
        expected = full[:, start : start + length]
        rows = real[:, start : start + length]
        np.testing.assert_allclose(logits[rows], expected[rows], atol=atol, rtol=0, err_msg=f"positions {start}..")
        start += length
    assert tuple(cache.shape) == task.backbone.cache_shape(B, S_max)


def assert_config_round_trip(task):
    backbone = task.backbone
    config = backbone.get_config()
    rebuilt = type(backbone).from_config(config)
    assert rebuilt.get_config() == config
    assert [tuple(v.shape) for v in rebuilt.weights] == [tuple(v.shape) for v in backbone.weights]
    json.dumps(config)  # plain data
    task_config = task.get_config()
    rebuilt_task = type(task).from_config(task_config)
    assert rebuilt_task.backbone.get_config() == config
    assert [tuple(v.shape) for v in rebuilt_task.weights] == [tuple(v.shape) for v in task.weights]


def assert_keras_round_trip(task, x, tmp_path):
    """`.keras` save/load keeps the architecture, the weights and the preprocessor."""
    path = str(tmp_path / "model.keras")
    task.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is type(task)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(task(x)), atol=1e-6, rtol=0)
    if task.preprocessor is not None:
        assert type(loaded.preprocessor) is type(task.preprocessor)
        assert loaded.preprocessor.get_config() == task.preprocessor.get_config()
    return loaded


def assert_preset_round_trip(task, tmp_path, sources, targets):
    """save_to_preset / from_preset: same logits on the same raw strings, same preprocessing."""
    preset = tmp_path / "preset"
    task.save_to_preset(preset)
    config = json.loads((preset / "config.json").read_text())
    assert config["family"] == task.backbone.family
    loaded = type(task).from_preset(preset)
    x, labels, weights = task.preprocessor((sources, targets))
    x2, labels2, weights2 = loaded.preprocessor((sources, targets))
    for key in x:
        np.testing.assert_array_equal(x2[key], x[key])
    np.testing.assert_array_equal(labels2, labels)
    np.testing.assert_array_equal(weights2, weights)
    np.testing.assert_allclose(to_numpy(loaded(x)), to_numpy(task(x)), atol=1e-6, rtol=0)
    backbone = Backbone.from_preset(preset)  # the generic entry point finds the family's class
    assert type(backbone) is type(task.backbone)
    np.testing.assert_allclose(
        to_numpy(backbone(x)["encoder_sequence_output"]),
        to_numpy(task.backbone(x)["encoder_sequence_output"]),
        atol=1e-6,
        rtol=0,
    )
    return loaded


def held_out_accuracy(task, sources, targets):
    """Teacher-forced token accuracy on real label positions (the end token included), in numpy."""
    x, labels, weights = task.preprocessor((sources, targets))
    predictions = np.argmax(to_numpy(task(x)), axis=-1)
    real = weights > 0
    return float(np.mean(predictions[real] == labels[real]))


def run_doctests(*modules):
    """Run the `Example:` sections of the given modules' docstrings; fail on any mismatch."""
    import doctest

    import keras_transformer.models as models
    from keras_transformer.tokenizers import UnigramTokenizer as _UnigramTokenizer

    globs = {"np": np, "keras": keras, "UnigramTokenizer": _UnigramTokenizer}
    globs.update({name: getattr(models, name) for name in dir(models) if not name.startswith("_")})
    for module in modules:
        result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.ELLIPSIS, report=True)
        assert result.attempted > 0, f"{module.__name__} has no example"
        assert result.failed == 0, f"{module.__name__}: {result.failed} failing example(s)"
