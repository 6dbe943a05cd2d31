"""`CausalLM.generate_constrained(..., json_schema=, regex=, grammar=)`: the host-stepped constrained loop, on the
tiny GPT (random weights: without the constraint it writes no JSON), each answer validated with `jsonschema`."""

import json
import re

import pytest

from keras_transformer.samplers import RandomSampler
from tests.export.helpers import tiny_gpt

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

SCHEMAS = [
    {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
        "required": ["id"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 3},
    {
        "type": "object",
        "properties": {"n": {"type": "string", "maxLength": 4}},
        "required": ["n"],
        "additionalProperties": False,
    },
]
PROMPTS = [[1, 5, 9], [1, 7]]


@pytest.fixture(scope="module")
def lm():
    return tiny_gpt()


def _answer(lm, prompt, row):
    """A row's new tokens -> (their text without the end token, whether it ended with the end token)."""
    new, eos = row[len(prompt) :], lm.preprocessor.tokenizer.eos_token_id
    ended = bool(new) and new[-1] == eos
    return lm.preprocessor.tokenizer.detokenize(new[:-1] if ended else new), ended


@pytest.mark.parametrize("sampler", ["greedy", RandomSampler(temperature=1.0, seed=2)], ids=["greedy", "random"])
def test_json_schemas_hold(lm, sampler):
    for schema in SCHEMAS:
        rows = lm.generate_constrained(PROMPTS, max_new_tokens=30, sampler=sampler, json_schema=schema)
        for prompt, row in zip(PROMPTS, rows):
            assert row[: len(prompt)] == prompt
            text, ended = _answer(lm, prompt, row)
            assert ended, text  # the grammar's end reached: the end token, not the length limit
            jsonschema.validate(json.loads(text), schema)
    free = lm.generate(PROMPTS, max_new_tokens=30, sampler=sampler)
    for prompt, row in zip(PROMPTS, free):
        with pytest.raises(json.JSONDecodeError):
            json.loads(_answer(lm, prompt, list(row))[0])


def test_regex_and_grammar(lm):
    texts = lm.generate_constrained(["def", "for i"], max_new_tokens=20, regex="[0-9]{2}-[a-z]{1,3}")
    starts = [lm.preprocessor.tokenizer.detokenize(p) for p in lm.preprocessor.generate_preprocess(["def", "for i"])]
    for start, text in zip(starts, texts):
        assert re.fullmatch("[0-9]{2}-[a-z]{1,3}", text[len(start) :]), text
    row = lm.generate_constrained([1, 5], max_new_tokens=20, grammar='start: "(" item ("," item)* ")"\nitem: /[ab]/')
    text, _ = _answer(lm, [1, 5], row)
    assert re.fullmatch(r"\([ab](,[ab])*\)", text), text


def test_generate_takes_the_constraint(lm):
    """`generate(json_schema=...)` runs the same loop as `generate_constrained`, and refuses what that loop lacks."""
    schema = SCHEMAS[0]
    rows = lm.generate(PROMPTS, max_new_tokens=30, json_schema=schema)
    assert rows == lm.generate_constrained(PROMPTS, max_new_tokens=30, json_schema=schema)
    for prompt, row in zip(PROMPTS, rows):
        text, ended = _answer(lm, prompt, row)
        assert ended, text
        jsonschema.validate(json.loads(text), schema)
    with pytest.raises(ValueError, match="return_dict=True"):
        lm.generate(PROMPTS, json_schema=schema, return_dict=True)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens=3"):
        lm.generate(PROMPTS, regex="a", prompt_lookup_num_tokens=3)


def test_bad_constraints_are_named(lm):
    with pytest.raises(ValueError, match="json_schema"):
        lm.generate_constrained([1, 5], json_schema={"type": "strin"})
    with pytest.raises(ValueError, match="uniqueItems"):
        lm.generate_constrained([1, 5], json_schema={"type": "array", "uniqueItems": True})
    with pytest.raises(ValueError, match="regex"):
        lm.generate_constrained([1, 5], regex="a[b")
    with pytest.raises(ValueError, match="one of"):
        lm.generate_constrained([1, 5], regex="a", grammar="start: /a/")
    with pytest.raises(ValueError, match="top_k"):
        lm.generate_constrained([1, 5], regex="a", sampler=RandomSampler(top_k=3))
    with pytest.raises(ValueError, match="one of"):
        lm.generate_constrained([1, 5])
    with pytest.raises(ValueError, match="max_sequence_length=48"):
        lm.generate_constrained([1, 5], max_new_tokens=47, regex="[a-z]+")
