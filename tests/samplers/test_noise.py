"""The counter-based noise of random sampling: one function of (seed, step, row), the same on every
backend and in the Keras-free runner's numpy twin, and uniform.

The statistical tests use fixed seeds (deterministic); each would fail for a biased or correlated
generator: thresholds are the 0.999 quantiles (Kolmogorov-Smirnov, chi-square by Wilson-Hilferty).
"""

import keras
import numpy as np
import pytest

from keras_transformer.samplers import RandomSampler
from keras_transformer.samplers.noise import noise_grid, seed_to_int32, uniform_noise
from tests.conftest import to_numpy
from tests.export.helpers import runtime_noise

Z_999 = 3.09  # the standard normal's 0.999 quantile


def _chi2_limit(dof):
    """The chi-square distribution's 0.999 quantile (Wilson-Hilferty)."""
    return dof * (1 - 2 / (9 * dof) + Z_999 * np.sqrt(2 / (9 * dof))) ** 3


def _grid(seed, steps, rows):
    return to_numpy(noise_grid(seed, (steps, rows)))  # (steps, rows)


@pytest.mark.parametrize("seed", [0, 7, -1, 2**31 - 1, -(2**31)])
def test_noise_matches_the_runtime_numpy_twin(seed):
    numpy_noise = runtime_noise()
    for step in (0, 1, 2, 63, 64, 1000, 2**31 - 1):
        np.testing.assert_array_equal(to_numpy(uniform_noise(seed, step, 257)), numpy_noise(seed, step, 257))


def test_noise_is_in_the_half_open_unit_interval_and_per_row():
    noise = _grid(3, 50, 40)
    assert noise.dtype == np.float32 and noise.min() > 0 and noise.max() <= 1
    np.testing.assert_array_equal(noise[17], to_numpy(uniform_noise(3, 17, 40)))  # the grid is the steps' noise
    # Entry (step, row) does not depend on how many rows the call has.
    np.testing.assert_array_equal(to_numpy(uniform_noise(3, 9, 5)), noise[9, :5])
    assert not np.array_equal(_grid(4, 50, 40), noise)  # another seed, other numbers


def test_seeds_reduce_modulo_2_to_the_32():
    assert seed_to_int32(5) == 5 and seed_to_int32(2**32 + 5) == 5 and seed_to_int32(2**31) == -(2**31)
    sampler = RandomSampler(seed=2**32 + 9)
    np.testing.assert_array_equal(sampler.draw_noise((3, 4)), RandomSampler(seed=9).draw_noise((3, 4)))


def test_unseeded_sampler_draws_a_fresh_seed_per_call():
    sampler = RandomSampler()
    assert sampler.draw_seed() != sampler.draw_seed()  # two calls of `generate` sample differently
    keras.utils.set_random_seed(1)
    first = RandomSampler().draw_seed()
    keras.utils.set_random_seed(1)
    assert RandomSampler().draw_seed() == first  # reproducible through keras.utils.set_random_seed


def test_noise_is_uniform():
    noise = np.concatenate([_grid(seed, 100, 500).ravel() for seed in (0, 1, 12345)])  # 150k numbers
    n = noise.size
    ordered = np.sort(noise.astype(np.float64))
    ks = max(np.max(np.arange(1, n + 1) / n - ordered), np.max(ordered - np.arange(n) / n))
    assert ks < 1.95 / np.sqrt(n)
    bins = 64
    counts = np.bincount(np.minimum((noise * bins).astype(int), bins - 1), minlength=bins)
    chi2 = ((counts - n / bins) ** 2 / (n / bins)).sum()
    assert chi2 < _chi2_limit(bins - 1)


@pytest.mark.parametrize("axis", ["step", "row"])
def test_neighbours_are_independent(axis):
    """Pairs of consecutive steps (same row) or rows (same step) fill the unit square evenly."""
    noise = _grid(5, 300, 300)
    a, b = (noise[:-1], noise[1:]) if axis == "step" else (noise[:, :-1], noise[:, 1:])
    bins = 8
    cells = np.minimum((a * bins).astype(int), bins - 1) * bins + np.minimum((b * bins).astype(int), bins - 1)
    counts = np.bincount(cells.ravel(), minlength=bins * bins)
    expected = cells.size / bins**2
    assert ((counts - expected) ** 2 / expected).sum() < _chi2_limit(bins**2 - 1)
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.02


def test_sampled_tokens_follow_the_softmax():
    """One row's draws over 20000 steps of a call: token frequencies match softmax(logits / T), top-k applied."""
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0, -2.0], "float32")
    steps, temperature = 20000, 0.7
    uniform = RandomSampler(seed=11).draw_noise((steps, 1))[:, 0]  # (steps,): row 0 at every step
    for top_k in (None, 3):
        sampler = RandomSampler(temperature=temperature, top_k=top_k)
        picked = to_numpy(sampler.get_next_token(np.repeat(logits[None], steps, axis=0), uniform))
        scaled = logits.astype(np.float64) / temperature
        if top_k is not None:
            scaled = np.where(scaled < np.sort(scaled)[-top_k], -np.inf, scaled)
        expected = np.exp(scaled - scaled.max())
        expected /= expected.sum()
        counts = np.bincount(picked, minlength=len(logits))
        assert np.all(counts[expected == 0] == 0)
        kept = expected > 0
        chi2 = ((counts[kept] - steps * expected[kept]) ** 2 / (steps * expected[kept])).sum()
        assert chi2 < _chi2_limit(kept.sum() - 1)
