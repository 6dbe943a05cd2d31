"""`kt.metrics.Perplexity` against a numpy reference: exp of the weighted mean token cross-entropy."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from tests.conftest import to_numpy

B, T, V = 3, 6, 11  # batch, tokens, vocabulary


def reference_perplexity(batches, from_logits=True):
    """exp(sum of w * cross-entropy over every token of every batch / sum of w), in float64.

    `batches`: (labels (B, T), predictions (B, T, V), sample_weight None, (B,) or (B, T)) tuples."""
    total = weight = 0.0
    for labels, predictions, sample_weight in batches:
        p = np.asarray(predictions, "float64")
        if from_logits:
            shifted = p - p.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
        else:
            log_probs = np.log(p)
        cross_entropy = -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]  # (B, T)
        w = np.ones_like(cross_entropy) if sample_weight is None else np.asarray(sample_weight, "float64")
        w = np.broadcast_to(w.reshape(w.shape + (1,) * (2 - w.ndim)), cross_entropy.shape)  # (B,) -> (B, 1)
        total += (w * cross_entropy).sum()
        weight += w.sum()
    return np.exp(total / weight)


def _batch(rng, batch=B, length=T, weights=None, scale=3.0):
    labels = rng.integers(0, V, (batch, length)).astype("int32")
    logits = (scale * rng.standard_normal((batch, length, V))).astype("float32")
    if weights == "mask":  # a padding mask: the last tokens of some rows are padding
        sample_weight = (np.arange(length)[None, :] < rng.integers(1, length + 1, (batch, 1))).astype("float32")
    elif weights == "tokens":
        sample_weight = rng.uniform(0.0, 2.0, (batch, length)).astype("float32")
    elif weights == "rows":
        sample_weight = rng.uniform(0.5, 2.0, (batch,)).astype("float32")
    else:
        sample_weight = None
    return labels, logits, sample_weight


def _perplexity(batches, **kwargs):
    metric = kt.metrics.Perplexity(**kwargs)
    for labels, predictions, sample_weight in batches:
        metric.update_state(labels, predictions, sample_weight=sample_weight)
    return float(to_numpy(metric.result()))


@pytest.mark.parametrize("weights", [None, "mask", "tokens", "rows"])
def test_perplexity_is_exp_of_the_weighted_mean_cross_entropy(rng, weights):
    """One batch, then three (batch sizes 3, 1 and 4) accumulated: the token-weighted mean over all of them."""
    batches = [_batch(rng, weights=weights)]
    np.testing.assert_allclose(_perplexity(batches), reference_perplexity(batches), rtol=1e-5)
    batches = [_batch(rng, batch=size, weights=weights) for size in (3, 1, 4)]
    np.testing.assert_allclose(_perplexity(batches), reference_perplexity(batches), rtol=1e-5)


def test_tokens_of_weight_zero_do_not_count(rng):
    labels, logits, mask = _batch(rng, weights="mask")
    assert 0 < mask.sum() < mask.size
    changed = logits.copy()
    changed[mask == 0] = rng.standard_normal(changed[mask == 0].shape) * 10  # padding positions only
    assert _perplexity([(labels, changed, mask)]) == pytest.approx(_perplexity([(labels, logits, mask)]), rel=1e-6)
    # ...while the same change counts when those tokens are weighted.
    assert abs(_perplexity([(labels, changed, None)]) / _perplexity([(labels, logits, None)]) - 1) > 1e-2


def test_probabilities_with_from_logits_false(rng):
    labels, logits, mask = _batch(rng, weights="mask")
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities = (probabilities / probabilities.sum(-1, keepdims=True)).astype("float32")
    batches = [(labels, probabilities, mask)]
    np.testing.assert_allclose(
        _perplexity(batches, from_logits=False), reference_perplexity(batches, from_logits=False), rtol=1e-5
    )
    np.testing.assert_allclose(
        _perplexity(batches, from_logits=False), reference_perplexity([(labels, logits, mask)]), rtol=1e-5
    )


def test_half_precision_logits_are_reduced_in_float32(rng):
    """Mixed-precision models give float16 logits: large ones lose nothing further (the cross-entropy runs in
    float32; in float16 it would be off by about 1e-3)."""
    labels, logits, mask = _batch(rng, weights="mask", scale=20.0)
    half = logits.astype("float16")
    batches = [(labels, half, mask)]
    np.testing.assert_allclose(_perplexity(batches), reference_perplexity(batches), rtol=1e-5)


def test_reset_state_forgets_earlier_batches(rng):
    first, second = _batch(rng, weights="mask"), _batch(rng, weights="mask")
    metric = kt.metrics.Perplexity()
    metric.update_state(*first[:2], sample_weight=first[2])
    metric.reset_state()
    metric.update_state(*second[:2], sample_weight=second[2])
    np.testing.assert_allclose(float(to_numpy(metric.result())), reference_perplexity([second]), rtol=1e-5)


def test_batches_of_different_lengths_count_every_token_once(rng):
    batches = [_batch(rng, length=4, weights="mask"), _batch(rng, length=12, weights="mask")]
    np.testing.assert_allclose(_perplexity(batches), reference_perplexity(batches), rtol=1e-5)


def test_config_round_trip():
    """(`from_config` and the registered name, which is what `keras.saving` uses: its `serialize_keras_object`
    would import TensorFlow under every backend, seconds for nothing checked here.)"""
    metric = kt.metrics.Perplexity(from_logits=False, name="ppl")
    assert keras.saving.get_registered_object("keras_transformer>Perplexity") is kt.metrics.Perplexity
    restored = kt.metrics.Perplexity.from_config(metric.get_config())
    assert (restored.from_logits, restored.name) == (False, "ppl")
    assert restored.get_config() == metric.get_config()
