"""Constrained decoding in the bundle server (export/runtime/constraint.py, llguidance): OpenAI's
`response_format` (json_object, json_schema) and vLLM's `structured_outputs` (json, regex, choice, grammar),
driven by the official `openai` client, streamed and not, each answer validated with `jsonschema` (or the
regex, the choices). The tiny GPT bundle (random weights) is the session's export (conftest.py); the trained
gpt_stdlib preset is exported once per machine (a causal LM's bundle is built in-process in under a second;
loading the preset is most of the cost) to show that the constraint, not luck, makes the JSON.
"""

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from keras_transformer.models import GPTCausalLM
from tests.export.helpers import TEST_CACHE
from tests.export.test_serve import TEMPLATE, Server, _runtime

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")
pytestmark = pytest.mark.slow

MODEL = "tiny_gpt"
_ROOT = Path(__file__).resolve().parents[2]


def _closed(properties, required):
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


# Short answers: the tiny model reads 48 positions in all.
SCHEMAS = {
    "nested": _closed(
        {
            "u": _closed(
                {"id": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}}, ["id", "ok"]
            )
        },
        ["u"],
    ),
    "array": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    "enums": _closed(
        {"color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M"]}}, ["color", "size"]
    ),
    "bounded_integer": {"type": "integer", "minimum": 10, "maximum": 20},
    "max_length": _closed({"name": {"type": "string", "maxLength": 5}}, ["name"]),
    "optional": _closed(
        {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "boolean"}, "c": {"enum": [1, 2]}}, ["a"]
    ),
}


@pytest.fixture(scope="module")
def bundle(exported, tmp_path_factory):
    bundle = tmp_path_factory.mktemp("serve_structured") / MODEL
    shutil.copytree(exported("gpt")["bundle"], bundle)
    config = json.loads((bundle / "tokenizer_config.json").read_text())
    (bundle / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return bundle


def _valid(text, schema):
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_schema_is_answered_with_json_that_validates(client, name):
    """Greedy chat (json_schema, strict), seeded draws on completions (structured_outputs.json, n=3) and a
    streamed chat: every answer ends by itself (finish "stop", not "length") and validates."""
    schema = SCHEMAS[name]
    messages = [{"role": "user", "content": "j"}]
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, temperature=0, response_format=response_format
    ).choices[0]
    assert answer.finish_reason == "stop", answer
    _valid(answer.message.content, schema)
    drawn = client.completions.create(
        model=MODEL,
        prompt="x",
        max_tokens=40,
        temperature=1.0,
        seed=5,
        n=3,
        extra_body={"structured_outputs": {"json": schema}},
    )
    for choice in drawn.choices:
        assert choice.finish_reason == "stop", choice
        _valid(choice.text, schema)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, temperature=0, response_format=response_format, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer.message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_json_object_regex_choice_and_grammar(client):
    any_object = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        temperature=0.8,
        seed=1,
        response_format={"type": "json_object"},
    ).choices[0]
    assert any_object.finish_reason != "stop" or isinstance(json.loads(any_object.message.content), dict)
    cases = [
        ({"regex": "[0-9]{3}-[a-z]{2}"}, lambda text: re.fullmatch("[0-9]{3}-[a-z]{2}", text)),
        ({"choice": ["yes", "no", "maybe"]}, lambda text: text in ("yes", "no", "maybe")),
        (
            {"grammar": 'start: "(" item ("," item)* ")"\nitem: /[ab]/'},
            lambda text: re.fullmatch(r"\([ab](,[ab])*\)", text),
        ),
        ({"json_object": True}, lambda text: isinstance(json.loads(text), dict)),
    ]
    for structured, check in cases:
        for stream in (False, True):
            answer = client.completions.create(
                model=MODEL,
                prompt="x",
                max_tokens=40,
                temperature=1.0,
                seed=2,
                n=2,
                stream=stream,
                extra_body={"structured_outputs": structured},
            )
            texts, finishes = ["", ""], [None, None]
            for chunk in answer if stream else [answer]:
                for choice in chunk.choices:
                    texts[choice.index] += choice.text
                    finishes[choice.index] = choice.finish_reason or finishes[choice.index]
            for text, finish in zip(texts, finishes):
                assert finish == "length" or check(text), (structured, text)
            assert "stop" in finishes, (structured, texts, finishes)


BAD = [
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "strin"}}}},
        "response_format",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"not": {}}}}},
        "response_format",
    ),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s"}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"structured_outputs": {"regex": "a[b"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "start: ("}}, "structured_outputs"),
    ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a"}, "num_beams": 2}, "structured_outputs"),
]


def test_bad_constraints_get_a_400_naming_the_field_and_the_server_keeps_serving(server, client):
    for fields, param in BAD:
        for path, base in (
            ("/v1/completions", {"prompt": "x"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
        ):
            status, answer, _ = server.post(path, {"model": MODEL, "max_tokens": 4, **base, **fields})
            assert (status, answer["error"]["param"]) == (400, param), (path, fields, answer)
            assert param in answer["error"]["message"], answer
    answer = client.completions.create(
        model=MODEL, prompt="x", max_tokens=8, extra_body={"structured_outputs": {"choice": ["ok"]}}
    )
    assert answer.choices[0].text == "ok"


def test_the_stop_token_is_allowed_exactly_when_the_grammar_accepts(bundle):
    """The mask over every prefix of a regex's matches: the stop token is allowed iff the text so far matches,
    it is all that is allowed once nothing can follow, and a mask never allows nothing."""
    constraint, sequence = _runtime(bundle, "constraint"), _runtime(bundle, "sequence")
    generator = _runtime(bundle).Generator(bundle)
    eos, vocabulary = generator.config["eos_token_id"], generator.bundle["vocabulary_size"]
    grammars = constraint.Grammars(bundle / "tokenizer.json", vocabulary, [eos])
    grammar = grammars.compile("regex", "[0-9]{2,3}")
    matcher = grammars.matcher(grammar)
    digits = [generator.tokenizer.token_to_id(d) for d in "123"]
    for step, token in enumerate([None, *digits]):
        if token is not None:
            assert matcher.consume_token(token)
        allowed = constraint.allowed_tokens([matcher], vocabulary)[0]
        assert allowed.any() and allowed[eos] == (step >= 2) == matcher.is_accepting()
        assert allowed.sum() == 1 if step == 3 else allowed.sum() > 1
    # `choose` masks a constrained row (greedy) and leaves the raw logits to the caller; a matcher in error
    # (it was fed a token the grammar refuses) allows the stop token only, so its sequence ends.
    rows = [sequence.Sequence([1], 4, lambda *a: None, stop_token_ids=(eos,), constraint=grammars.matcher(grammar))]
    logits = np.zeros((1, vocabulary), np.float32)
    logits[0, eos] = 5.0
    chosen = sequence.choose(rows, logits, np.array([1]))
    assert chosen[0] in digits or generator.tokenizer.id_to_token(int(chosen[0])).isdigit()
    assert logits[0, eos] == 5.0
    broken = grammars.matcher(grammar)
    broken.consume_token(generator.tokenizer.token_to_id("a"))
    rows[0].constraint = broken
    assert sequence.choose(rows, np.zeros((1, vocabulary), np.float32), np.array([1]))[0] == eos


def stdlib_bundle(directory):
    """The trained gpt_stdlib preset's ONNX bundle, exported once per machine (keyed by the preset's files and
    the package's and runtime's sources), copied into `directory`."""
    digest = hashlib.sha256()
    for folder, pattern in (("models/gpt_stdlib", "*"), ("keras_transformer", "*.py"), ("export/runtime", "*")):
        for file in sorted((_ROOT / folder).rglob(pattern)):
            digest.update(str(file.relative_to(_ROOT)).encode() + file.read_bytes())
    stored = TEST_CACHE / f"gpt_stdlib-{digest.hexdigest()[:32]}"
    if not stored.is_dir():
        staging = Path(directory) / "staging"
        GPTCausalLM.from_preset("gpt_stdlib").export(staging, format="onnx")
        TEST_CACHE.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, stored, dirs_exist_ok=True)
    bundle = Path(directory) / "gpt_stdlib"
    shutil.copytree(stored, bundle)
    return bundle


@pytest.fixture(scope="module")
def stdlib_server(tmp_path_factory):
    server = Server(stdlib_bundle(tmp_path_factory.mktemp("stdlib")))
    yield server
    server.stop()


def test_the_trained_preset_writes_valid_json_only_under_the_constraint(stdlib_server):
    """gpt_stdlib (trained on Python code) continues prompts with code: never JSON of the schema. Under the
    constraint, every answer is JSON that validates."""
    schema = _closed(
        {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "address": _closed({"city": {"type": "string", "maxLength": 10}}, ["city"]),
        },
        ["name", "age", "address"],
    )
    client = openai.OpenAI(base_url=stdlib_server.url + "/v1", api_key="unused", max_retries=0)
    for prompt in ["def f(x):", "import json\n", "config = ", "x = {", '{"name": "']:
        free = client.completions.create(model="gpt_stdlib", prompt=prompt, max_tokens=60, temperature=0).choices[0]
        with pytest.raises((json.JSONDecodeError, jsonschema.ValidationError)):
            _valid(free.text, schema)
        for temperature in (0, 1.0):
            constrained = client.completions.create(
                model="gpt_stdlib",
                prompt=prompt,
                max_tokens=80,
                temperature=temperature,
                seed=4,
                extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}},
            ).choices[0]
            assert constrained.finish_reason == "stop", constrained
            _valid(constrained.text, schema)
