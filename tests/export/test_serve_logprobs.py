"""The bundle server's token log-probabilities and its refusal of request fields it does not implement.

Logprobs are checked against the Keras model the bundle was exported from: its log-softmax at each position
by teacher forcing (`lm.score`, one forward pass over the prompt and the answer), within 1e-4 in float32.
The tiny GPT bundle is exported once per session (conftest.py) and served as deployed (`python serve.py`).
"""

import json
import shutil
import threading

import keras
import numpy as np
import pytest

from tests.export.test_serve import TEMPLATE, _runtime

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "tiny_gpt"


@pytest.fixture(scope="module")
def bundle(exported, tmp_path_factory):
    bundle = tmp_path_factory.mktemp("serve_logprobs") / MODEL
    shutil.copytree(exported("gpt")["bundle"], bundle)
    config = json.loads((bundle / "tokenizer_config.json").read_text())
    (bundle / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return bundle


@pytest.fixture(scope="module")
def lm(exported):
    return exported("gpt")["task"]


@pytest.fixture(scope="module")
def runtime(bundle):
    return _runtime(bundle).Generator(bundle)


def _keras_logprobs(lm, ids):
    """The Keras model's log-softmax (T, V) over `ids` by teacher forcing, in float64 from its float32 logits."""
    logits = keras.ops.convert_to_numpy(lm.score(np.array([ids], "int32")))[0].astype(np.float64)
    peak = logits.max(axis=-1, keepdims=True)
    return logits - peak - np.log(np.exp(logits - peak).sum(axis=-1, keepdims=True))


def _check_names(runtime, names, ids):
    """Each token's name is its text, or OpenAI's `bytes:\\xNN` form where it holds part of a character; the
    names' bytes make the tokens' text (special tokens aside)."""
    special = set(runtime.config.get("stop_token_ids") or [runtime.config["eos_token_id"]])
    raw = b""
    for name, token in zip(names, ids, strict=True):
        text = runtime.tokenizer.decode([token], skip_special_tokens=False)
        if "\ufffd" in text:
            assert name.startswith("bytes:\\x"), name
            part = bytes.fromhex(name[len("bytes:") :].replace("\\x", ""))
        else:
            assert name == text
            part = text.encode()
        raw += b"" if token in special else part
    assert raw.decode("utf-8", "replace") == runtime.tokenizer.decode(ids, skip_special_tokens=True)


# Documented OpenAI request fields the server does not implement (each with a value that asks for something).
UNSUPPORTED = {
    "completions": {
        "frequency_penalty": 0.5,
        "presence_penalty": -1.0,
        "logit_bias": {"5": 10},
        "best_of": 3,
        "suffix": "end",
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "not_an_openai_field": 1,
    },
    "chat_completions": {
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
        "logit_bias": {"5": -100},
        "audio": {"voice": "alloy", "format": "wav"},
        "modalities": ["text", "audio"],
        "prediction": {"type": "content", "content": "x"},
        "reasoning_effort": "high",
        "service_tier": "flex",
        "store": True,
        "metadata": {"k": "v"},
        "web_search_options": {},
        "verbosity": "low",
        "prompt_cache_key": "abc",
        "safety_identifier": "user-1",
        "function_call": {"name": "f"},
        "functions": [{"name": "f", "parameters": {"type": "object"}}],
        "not_an_openai_field": 1,
    },
}


def test_a_field_the_server_does_not_implement_gets_a_400_naming_it(server, client):
    base = {
        "completions": {"model": MODEL, "prompt": "def", "max_tokens": 2, "temperature": 0},
        "chat_completions": {
            "model": MODEL,
            "messages": [{"role": "user", "content": "def"}],
            "max_tokens": 2,
            "temperature": 0,
        },
    }
    paths = {"completions": "/v1/completions", "chat_completions": "/v1/chat/completions"}
    for endpoint, fields in UNSUPPORTED.items():
        for name, value in fields.items():
            status, answer, _ = server.post(paths[endpoint], {**base[endpoint], name: value})
            assert status == 400, (endpoint, name, answer)
            assert answer["error"]["param"] == name and name in answer["error"]["message"], answer
            assert answer["error"]["type"] == "invalid_request_error"
        # The neutral values ask for nothing and are accepted (some clients always send them).
        neutral = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "user": "u", "store": False}
        status, answer, _ = server.post(paths[endpoint], {**base[endpoint], **neutral})
        assert status == 200, answer
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], presence_penalty=1)
    assert server.post("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 8})[1]["error"]["param"] == (
        "dimensions"
    )
    assert client.completions.create(model=MODEL, prompt="def", max_tokens=2, temperature=0).choices[0].text


def test_greedy_completion_logprobs_are_the_keras_models(client, lm, runtime):
    """`logprobs: 5`: each token's logprob is the Keras model's log-softmax at its position (teacher forcing);
    the chosen token (greedy) is the most likely of the top 5, which are sorted and are the model's top 5."""
    prompt_ids = runtime.encode("def add(")
    ids = runtime.generate_ids([prompt_ids], 12)[0]
    answer = client.completions.create(model=MODEL, prompt="def add(", max_tokens=12, temperature=0, logprobs=5)
    logprobs = answer.choices[0].logprobs
    reference = _keras_logprobs(lm, prompt_ids + ids[:-1])[len(prompt_ids) - 1 :]  # (N, V)
    _check_names(runtime, logprobs.tokens, ids)
    strings = logprobs.tokens
    np.testing.assert_allclose(logprobs.token_logprobs, reference[np.arange(len(ids)), ids], atol=1e-4)
    for position, top in enumerate(logprobs.top_logprobs):
        values = list(top.values())
        assert list(top)[0] == strings[position] and values == sorted(values, reverse=True)
        np.testing.assert_allclose(values, np.sort(reference[position])[::-1][:5], atol=1e-4)
    assert logprobs.text_offset == list(np.cumsum([0] + [len(s) for s in strings[:-1]]))
    assert client.completions.create(model=MODEL, prompt="def add(", max_tokens=3).choices[0].logprobs is None


def test_chat_logprobs_streamed_and_not(client, lm, runtime):
    """Chat: `logprobs: true, top_logprobs: 3` in OpenAI's shape; the streamed chunks carry the same entries."""
    messages = [{"role": "user", "content": "for i in"}]
    text = runtime.apply_chat_template(messages, add_generation_prompt=True)
    prompt_ids = runtime.tokenizer.encode(text, add_special_tokens=False).ids
    ids = runtime.generate_ids([prompt_ids], 10)[0]
    options = dict(model=MODEL, messages=messages, max_tokens=10, temperature=0, logprobs=True, top_logprobs=3)
    content = client.chat.completions.create(**options).choices[0].logprobs.content
    reference = _keras_logprobs(lm, prompt_ids + ids[:-1])[len(prompt_ids) - 1 :]
    assert len(content) == len(ids)
    _check_names(runtime, [entry.token for entry in content], ids)
    for position, (entry, token) in enumerate(zip(content, ids)):
        assert entry.bytes == list(entry.token.encode() if not entry.token.startswith("bytes:") else b"") or (
            bytes(entry.bytes).hex() == entry.token[len("bytes:") :].replace("\\x", "")
        )
        assert abs(entry.logprob - reference[position, token]) < 1e-4
        top = [alternative.logprob for alternative in entry.top_logprobs]
        assert entry.top_logprobs[0].token == entry.token and top == sorted(top, reverse=True) and len(top) == 3
        np.testing.assert_allclose(top, np.sort(reference[position])[::-1][:3], atol=1e-4)
    streamed = []
    for chunk in client.chat.completions.create(**options, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in streamed] == [
        (e.token, e.logprob, [t.token for t in e.top_logprobs]) for e in content
    ]
    without = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, logprobs=True)
    assert without.choices[0].logprobs.content[0].top_logprobs == []


def test_echoed_prompt_logprobs_equal_lm_score(client, lm, runtime):
    """`echo: true` with `logprobs`: the prompt's tokens come first, the first with no logprob, the others
    minus `lm.score(..., scoring_mode="loss")` of the next token; the text starts with the prompt. Streamed:
    the prompt's text and logprobs come first."""
    prompt = "for i in range(10):"
    prompt_ids = runtime.encode(prompt)
    answer = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=2
    ).choices[0]
    expected = runtime.generate_ids([prompt_ids], 4)[0]
    assert answer.text == prompt + runtime.tokenizer.decode(expected, skip_special_tokens=True)
    logprobs = answer.logprobs
    assert len(logprobs.tokens) == len(prompt_ids) + len(expected)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    targets = np.array([prompt_ids[1:] + [0]], "int32")
    loss = keras.ops.convert_to_numpy(
        lm.score(np.array([prompt_ids], "int32"), scoring_mode="loss", target_ids=targets)
    )
    np.testing.assert_allclose(logprobs.token_logprobs[1 : len(prompt_ids)], -loss[0, :-1], atol=1e-4)
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=2, stream=True
        )
    )
    assert chunks[0].choices[0].text == prompt and "".join(c.choices[0].text for c in chunks) == answer.text
    streamed = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == logprobs.token_logprobs
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0, echo=True)
    assert plain.choices[0].text == answer.text and plain.choices[0].logprobs is None


BAD_LOGPROBS = [
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "num_beams": 2}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": 1, "num_beams": 3}, "logprobs"),
    ("/v1/completions", {"echo": "yes"}, "echo"),
]


def test_bad_logprob_requests_get_a_400_and_the_server_keeps_serving(server):
    for path, fields, param in BAD_LOGPROBS:
        body = {"model": MODEL, "max_tokens": 2, **fields}
        body.update(
            {"prompt": "def"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
        )
        status, answer, _ = server.post(path, body)
        assert (status, answer["error"]["param"]) == (400, param), (fields, answer)
        assert param in answer["error"]["message"], answer
    status, answer, _ = server.post(
        "/v1/completions", {"model": MODEL, "prompt": "def", "max_tokens": 2, "logprobs": 0}
    )
    assert status == 200 and answer["choices"][0]["logprobs"]["top_logprobs"][0] == {
        answer["choices"][0]["logprobs"]["tokens"][0]: answer["choices"][0]["logprobs"]["token_logprobs"][0]
    }


def test_logprobs_of_a_sequence_run_whole_equal_the_batched_ones(bundle, runtime):
    """A bundle without continuous batching runs a sequence whole (`Generator.generate_ids`) and scores its
    tokens afterwards by teacher forcing (the prefill graph over the prompt and the tokens): the same tokens and
    entries as the batched path's step-by-step logits, within 1e-5."""
    batching = _runtime(bundle, "batching")
    prompt = runtime.encode("for i in")
    answers = {}
    for name in ("batched", "whole"):
        scheduler = batching.Scheduler(runtime, max_rows=2)
        if name == "whole":
            scheduler.decoder = None  # as a bundle whose decode graph cannot write its caches in place
        events, done = [], threading.Event()

        def on_event(kind, value, events=events, done=done):
            events.append((kind, value))
            if kind != "token":
                done.set()

        scheduler.start()
        scheduler.submit(batching.Sequence(prompt, 10, on_event, logprobs=4))
        assert done.wait(60)
        scheduler.stop(30)
        answers[name] = [value for kind, value in events if kind == "token"]
    assert (
        [t for t, _ in answers["whole"]]
        == [t for t, _ in answers["batched"]]
        == runtime.generate_ids([prompt], 10, stop_token_ids=None)[0]
    )
    for (_, whole), (_, batched) in zip(answers["whole"], answers["batched"]):
        assert whole[1] == batched[1]  # the same top ids
        np.testing.assert_allclose([whole[0], *whole[2]], [batched[0], *batched[2]], atol=1e-5)
