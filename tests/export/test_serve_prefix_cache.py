"""The bundle server's prefix cache (export/runtime/prefix_cache.py, batching.py, cache_rows.py): a prompt that
starts with a stored prefix copies its keys/values and prefills only the rest, through the decode graph's
multi-token step, and every answer is the one without the cache.

The tiny GPT (48 positions) is written as a bundle by the ONNX kernels (no tracing, any backend); prompts share
prefixes of 33 tokens, so two whole blocks of 16 (32 positions) are reused.
"""

import time

import numpy as np
import pytest

from tests.export.test_serve import Server, _runtime

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bundle(kernel_gpt):
    return kernel_gpt[1]


@pytest.fixture(scope="module")
def runtime(bundle):
    """The bundle's batching module and its Generator."""
    batching = _runtime(bundle, "batching")
    return batching, _runtime(bundle).Generator(bundle)


@pytest.fixture(scope="module")
def prompts(runtime):
    """32 prompts: three prefixes of 33 tokens (after the start token) with 1 to 9 more, and some without one."""
    generator = runtime[1]
    rng = np.random.default_rng(0)
    vocabulary = generator.bundle["vocabulary_size"]
    prefixes = [rng.integers(1, vocabulary, 33).tolist() for _ in range(3)]
    rows = []
    for i in range(32):
        head = prefixes[i % 3] if i % 8 else rng.integers(1, vocabulary, 20).tolist()
        rows.append([generator.config["bos_token_id"]] + head + rng.integers(1, vocabulary, 1 + i % 9).tolist())
    return rows


def _run(runtime, prompts, prefix_cache_tokens, temperature=0.0, max_tokens=5):
    """Every prompt through a scheduler: 4 first, the rest once those were prefilled -> (sequences, scheduler)."""
    batching, generator = runtime
    scheduler = batching.Scheduler(generator, max_rows=32, prefix_cache_tokens=prefix_cache_tokens)
    finished, entries = [], [[] for _ in prompts]  # each sequence's (token, (logprob, top ids, top logprobs))

    def on_event(i, kind, value):
        (entries[i].append if kind == "token" else finished.append)(value)

    sequences = [
        batching.Sequence(
            ids,
            max_tokens,
            lambda kind, value, i=i: on_event(i, kind, value),
            temperature=temperature,
            seed=5,
            logprobs=3,
        )
        for i, ids in enumerate(prompts)
    ]
    scheduler.start()
    for batch in (sequences[:4], sequences[4:]):
        for sequence in batch:
            scheduler.submit(sequence)
        deadline = time.monotonic() + 60
        while len(finished) < 4 and time.monotonic() < deadline:
            time.sleep(0.005)
    deadline = time.monotonic() + 60
    while len(finished) < len(sequences) and time.monotonic() < deadline:
        time.sleep(0.005)
    scheduler.stop(30)
    return sequences, scheduler, entries


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_answers_are_those_without_the_cache(runtime, prompts, temperature):
    """Greedy and seeded sampling, 32 sequences with mixed prefixes: the same tokens with the cache (default budget,
    and 2 blocks, which evicts), logprobs within 1e-5; the cache was read (cached_tokens), and under the tiny
    budget it held at most its 2 blocks."""
    plain, off, plain_entries = _run(runtime, prompts, 0, temperature)
    assert off.prefix_cache is None and all(s.cached_tokens == 0 for s in plain)
    assert all(len(s.generated) == 5 for s in plain)
    for budget in (4096, 32):
        cached, scheduler, entries = _run(runtime, prompts, budget, temperature)
        assert [s.generated for s in cached] == [s.generated for s in plain]
        assert all(s.cached_tokens in (0, 32) for s in cached)
        for a, b in zip(entries, plain_entries):  # the tokens and their top ids equal, the logprobs within 1e-5
            assert [(token, list(top)) for token, (_, top, _) in a] == [(token, list(top)) for token, (_, top, _) in b]
            for (_, (logprob, _, tops)), (_, (expected, _, expected_tops)) in zip(a, b):
                np.testing.assert_allclose([logprob, *tops], [expected, *expected_tops], atol=1e-5)
        hits = sum(s.cached_tokens > 0 for s in cached)
        assert hits >= (24 if budget == 4096 else 4), [s.cached_tokens for s in cached]
        assert len(scheduler.prefix_cache) <= budget // 16


def test_prefill_after_a_prefix_equals_the_whole_prefill(runtime, prompts):
    """`BatchDecoder.prefill_after` (the stored prefix, then the rest in one multi-token step) against `prefill`:
    the next position's logits and every position's keys/values within 1e-5."""
    batching, generator = runtime
    decoder = batching.BatchDecoder(generator, 2)
    prompt = prompts[1]
    logits, state = decoder.prefill([prompt])
    whole = decoder.keys_values(state, 0)  # 2L x (Hkv, S, Dh)
    after_logits, after = decoder.prefill_after([kv[:, :32] for kv in whole], prompt[32:])
    np.testing.assert_allclose(after_logits, logits, atol=1e-5)
    for a, b in zip(decoder.keys_values(after, 0), whole):
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert np.argmax(after_logits) == np.argmax(logits)


def test_the_store_is_block_granular_and_least_recently_used(bundle, runtime):
    PrefixCache = _runtime(bundle, "prefix_cache").PrefixCache
    cache = PrefixCache(max_tokens=8, block_size=4)  # 2 blocks
    kv = [np.arange(2 * 12 * 3, dtype=np.float32).reshape(2, 12, 3) + i for i in range(4)]  # 2 layers, 12 positions
    a, b = list(range(12)), [7] * 12
    cache.store(a, kv)  # 3 whole blocks, 2 kept: a[0:4], a[4:8]
    assert len(cache) == 2 and cache.lookup(a)[0] == 8
    length, past = cache.lookup(a[:8] + [99])
    assert length == 8 and all(np.array_equal(p, k[:, :8]) for p, k in zip(past, kv))
    assert cache.lookup(a[:8])[0] == 4  # the last token is left to run
    assert cache.lookup([5] * 4 + a[4:8] + [1])[0] == 0  # a block is found only after its own prefix
    cache.store(b, kv)  # evicts a's blocks, the least recently used
    assert cache.lookup(a)[0] == 0 and cache.lookup(b)[0] == 8
    with pytest.raises(ValueError, match="max_tokens=-1"):
        PrefixCache(max_tokens=-1)
    with pytest.raises(ValueError, match="prefix_cache_tokens=-3"):
        runtime[0].Scheduler(runtime[1], prefix_cache_tokens=-3)


@pytest.mark.parametrize("options", [(), ("--no-prefix-cache",)])
def test_the_server_reports_cached_tokens(bundle, runtime, prompts, options):
    """Through the openai client: a prompt after another with the same 33-token prefix reports 32 cached tokens
    in `usage.prompt_tokens_details` (0 with --no-prefix-cache, and for the first), streamed too, and the
    answers are the bundle Generator's."""
    generator = runtime[1]
    server = Server(bundle, *options)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        cached, texts = [], []
        for prompt in (prompts[1], prompts[4], prompts[7]):  # the same prefix, other tails
            answer = client.completions.create(model="tiny_gpt", prompt=prompt, max_tokens=4, temperature=0)
            cached.append(answer.usage.prompt_tokens_details.cached_tokens)
            texts.append(answer.choices[0].text)
        stream = client.completions.create(
            model="tiny_gpt",
            prompt=prompts[10],
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        cached.append([chunk.usage for chunk in stream if chunk.usage][0].prompt_tokens_details.cached_tokens)
        hits = int(server.metric("kt_prefix_cache_hit_tokens_total"))
    finally:
        server.stop()
    expected = [generator.generate_ids([p], 4)[0] for p in (prompts[1], prompts[4], prompts[7])]
    assert texts == [generator.tokenizer.decode(ids, skip_special_tokens=True) for ids in expected]
    assert cached == ([0, 0, 0, 0] if options else [0, 32, 32, 32])
    assert hits == sum(cached)
