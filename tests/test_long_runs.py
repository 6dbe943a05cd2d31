"""Long runs: 200 `generate` calls with varied prompt lengths, batch sizes, samplers and seeds compile
a bounded number of times and do not grow resident memory."""

import gc

import keras
import numpy as np
import psutil
import pytest

from keras_transformer.samplers import RandomSampler
from tests.samplers.helpers import compiled_functions, is_eager_backend, tiny_gpt

VOCAB, MAX_LENGTH = 8, 64
BATCH_SIZES = (1, 3)
CALLS = 200
RSS_GROWTH_MB = 8  # allowed growth between call 100 and call 200


@pytest.fixture(scope="module")
def lm():
    return tiny_gpt(vocabulary_size=VOCAB, max_sequence_length=MAX_LENGTH)


def _call(lm, rng, batch_size, sampler):
    """Ragged prompts of 2..33 tokens (one prefill bucket), 1..3 new tokens: a short loop per call."""
    shortest = int(rng.integers(2, 32))
    prompts = [rng.integers(0, VOCAB, shortest + int(rng.integers(0, 3))).tolist() for _ in range(batch_size)]
    new = int(rng.integers(1, 4))
    out = lm.generate(prompts, max_new_tokens=new, stop_token_ids=None, sampler=sampler)
    assert [len(o) for o in out] == [len(p) + new for p in prompts]
    assert all(o[: len(p)] == p for o, p in zip(out, prompts))


def _sampler(i):
    return "greedy" if i % 2 == 0 else RandomSampler(top_k=4, seed=i)  # a new seed at every call


def _traces(lm):
    return sum(f.traces for f in compiled_functions(lm).values())


@pytest.mark.slow  # 11-19 s on the shared 2-core machine (about 6 compilations + 206 calls)
def test_many_generate_calls_compile_a_bounded_number_of_times_and_keep_memory_flat(lm):
    rng = np.random.default_rng(0)
    for batch_size in BATCH_SIZES:  # every batch size with both samplers
        for i in range(2):
            _call(lm, rng, batch_size, _sampler(i))
    functions = dict(compiled_functions(lm))
    warm_traces = _traces(lm)
    # One prefill per batch size; one loop per sampler kind and batch size (seeds never retrace).
    # TensorFlow decodes one row with its own loop (a padded step, see `samplers.sampler.decode`).
    own_one_row_loops = 2 if keras.config.backend() == "tensorflow" and 1 in BATCH_SIZES else 0
    assert len(functions) == 3 + own_one_row_loops  # prepare, greedy loop, random loop (+ their one-row loops)
    if not is_eager_backend():
        assert warm_traces == len(BATCH_SIZES) * 3

    process = psutil.Process()
    rss = {}
    for i in range(CALLS):
        _call(lm, rng, int(rng.choice(BATCH_SIZES)), _sampler(i))
        if i + 1 in (100, CALLS):
            gc.collect()
            rss[i + 1] = process.memory_info().rss / 2**20
    assert compiled_functions(lm).keys() == functions.keys()
    if not is_eager_backend():
        assert _traces(lm) == warm_traces  # 200 calls, no retrace
    assert rss[CALLS] - rss[100] < RSS_GROWTH_MB, rss
