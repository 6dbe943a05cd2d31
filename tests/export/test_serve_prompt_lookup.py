"""Prompt-lookup speculative decoding in the bundle (export/runtime/prompt_lookup.py, issue 41): drafts copied from
earlier n-grams and checked in one multi-token pass give exactly the tokens of plain greedy decoding, the bundle's
and Keras's, and the server takes `prompt_lookup_num_tokens` per request and reports the drafts it kept.

The tiny GPT bundle written by the ONNX kernels (conftest.py's `kernel_gpt`); prompts that repeat themselves,
so that drafts are found and some are kept.
"""

import numpy as np
import pytest

from keras_transformer.samplers import GreedySampler
from tests.export.test_serve import Server, _runtime

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
NEW = 12


@pytest.fixture(scope="module")
def bundle(kernel_gpt):
    return kernel_gpt[1]


@pytest.fixture(scope="module")
def generator(bundle):
    return _runtime(bundle).Generator(bundle)


@pytest.fixture(scope="module")
def prompts(generator):
    """Copy-heavy prompts: a random run of tokens, then its start again (and a short one with no repeat)."""
    rng = np.random.default_rng(4)
    bos, vocabulary = generator.config["bos_token_id"], generator.bundle["vocabulary_size"]
    rows = []
    for length, repeat in ((12, 6), (9, 4), (15, 8), (5, 0)):
        run = rng.integers(1, vocabulary, length).tolist()
        rows.append([bos] + run + run[:repeat])
    return rows


@pytest.fixture(scope="module")
def greedy(kernel_gpt, generator, prompts):
    """Plain greedy tokens: the bundle's, checked equal to Keras's `generate`."""
    task = kernel_gpt[0]
    plain = generator.generate_ids(prompts, NEW)
    keras_rows = task.generate(prompts, max_new_tokens=NEW, sampler=GreedySampler())
    assert [list(map(int, row[len(p) :])) for p, row in zip(prompts, keras_rows)] == plain
    return plain


@pytest.mark.parametrize("num_tokens", [1, 3, 5])
def test_prompt_lookup_gives_the_greedy_tokens(generator, prompts, greedy, num_tokens):
    found = generator.generate_ids(prompts, NEW, prompt_lookup_num_tokens=num_tokens)
    assert found == greedy
    drafted = sum(d for d, _ in generator.prompt_lookup_counts)
    accepted = sum(a for _, a in generator.prompt_lookup_counts)
    assert 0 < accepted <= drafted  # drafts were found, and some kept: the verify pass ran on several tokens


def test_drafts_come_from_the_latest_earlier_ngram(bundle):
    draft = _runtime(bundle, "prompt_lookup").draft
    assert draft([1, 2, 3, 9, 1, 2, 4, 7, 1, 2], 3) == [4, 7, 1]  # the latest "1 2" before the last
    assert draft([5, 3, 8, 3], 2, max_ngram=2) == [8, 3]  # no earlier "8 3": the last token alone
    assert draft([1, 2, 3], 4) == []
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens"):
        _runtime(bundle).Generator(bundle).generate_ids([[1, 2]], 3, prompt_lookup_num_tokens=0)


def test_the_server_takes_prompt_lookup_per_request(bundle, generator, prompts, greedy):
    """Streamed and not, through the openai client: the greedy text, and usage's accepted/rejected prediction
    tokens as the Generator counts them; bad values get a 400 naming the field, and the server keeps serving."""
    server = Server(bundle)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        options = dict(model="tiny_gpt", max_tokens=NEW, temperature=0, extra_body={"prompt_lookup_num_tokens": 3})
        answer = client.completions.create(prompt=prompts[0], **options)
        stream = client.completions.create(
            prompt=prompts[2], stream=True, stream_options={"include_usage": True}, **options
        )
        chunks = list(stream)
        plain = client.completions.create(model="tiny_gpt", prompt=prompts[0], max_tokens=NEW, temperature=0)
        bad = [
            server.post("/v1/completions", {"model": "tiny_gpt", "prompt": "def", **fields})
            for fields in (
                {"prompt_lookup_num_tokens": 0, "temperature": 0},
                {"prompt_lookup_num_tokens": 3},  # temperature 1 by default
                {"prompt_lookup_num_tokens": 3, "temperature": 0, "num_beams": 2},
            )
        ]
        after = server.post("/v1/completions", {"model": "tiny_gpt", "prompt": "def", "max_tokens": 2})
    finally:
        server.stop()
    texts = [generator.tokenizer.decode(greedy[i], skip_special_tokens=True) for i in (0, 2)]
    assert [answer.choices[0].text, "".join(c.choices[0].text for c in chunks if c.choices)] == texts
    assert plain.choices[0].text == texts[0] and plain.usage.completion_tokens_details is None
    generator.generate_ids([prompts[0], prompts[2]], NEW, prompt_lookup_num_tokens=3)
    for usage, (drafted, accepted) in zip((answer.usage, chunks[-1].usage), generator.prompt_lookup_counts):
        details = usage.completion_tokens_details
        assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (
            accepted,
            drafted - accepted,
        )
    assert [(status, body["error"]["param"]) for status, body, _ in bad] == [(400, "prompt_lookup_num_tokens")] * 3
    assert after[0] == 200
