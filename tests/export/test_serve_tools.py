"""Tool calls in the bundle server (export/runtime/serve_tools.py): `tools` rendered by the chat template, the
answer's Qwen-style `<tool_call>` JSON parsed into OpenAI's `tool_calls` (as vLLM's hermes parser), streamed and
not, and `tool_choice` "required" or a named function enforced by the grammar engine, driven by the official
`openai` client and checked with `jsonschema`. The trained gpt_stdlib preset's bundle (128 positions: room for
a call) is shared with test_serve_structured.py, given a small chat template that renders tools.
"""

import json

import pytest

from tests.export.test_serve import _runtime
from tests.export.test_serve_structured import stdlib_bundle

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")
pytestmark = pytest.mark.slow

MODEL = "gpt_stdlib"
TEMPLATE = (
    "{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m.role }}: "
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": -99, "maximum": 99},
        "b": {"type": "integer", "minimum": -9, "maximum": 9},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "the weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
PARAMETERS = {"get_weather": WEATHER, "add": ADD}
MESSAGES = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    bundle = stdlib_bundle(tmp_path_factory.mktemp("tools"))
    config = json.loads((bundle / "tokenizer_config.json").read_text())
    (bundle / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return bundle


def _streamed(chunks):
    """A streamed chat answer -> (content, [(name, arguments)], finish_reason), accumulated as a client does."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": "", "id": call.id})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], finish


def _check_calls(calls, names):
    """Each call names a declared function (one of `names`) and its arguments validate against its parameters."""
    assert calls
    for name, arguments in calls:
        assert name in names, name
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])


def test_the_template_renders_the_tools(client, bundle):
    generator = _runtime(bundle).Generator(bundle)
    text = generator.apply_chat_template(MESSAGES, add_generation_prompt=True, tools=TOOLS)
    assert text.startswith("tools: get_weather add\n")
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=1)
    assert answer.usage.prompt_tokens == len(generator.tokenizer.encode(text, add_special_tokens=False).ids)
    assert (
        answer.usage.prompt_tokens
        > client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1).usage.prompt_tokens
    )
    # An earlier call (arguments as OpenAI sends them: JSON text) and its result reach the template as objects.
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    rendered = generator.apply_chat_template(
        [
            *history[:1],
            {**history[1], "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            history[2],
        ],
        add_generation_prompt=True,
        tools=TOOLS,
    )
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in rendered
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=1)
    assert answer.usage.prompt_tokens == len(generator.tokenizer.encode(rendered, add_special_tokens=False).ids)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_required_and_named_tool_choice_always_give_valid_calls(client, stream):
    """Greedy and seeded draws: every answer is a tool call (finish "tool_calls") naming a declared function
    (the named one, when named) with arguments that validate against its parameters."""
    for tool_choice, names in (
        ("required", set(PARAMETERS)),
        ({"type": "function", "function": {"name": "add"}}, {"add"}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"}),
    ):
        for temperature in (0, 1.0):
            options = dict(
                model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, temperature=temperature, seed=3
            )
            if stream:
                content, calls, finish = _streamed(client.chat.completions.create(**options, stream=True))
            else:
                choice = client.chat.completions.create(**options).choices[0]
                content, finish = choice.message.content, choice.finish_reason
                calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
                assert all(c.type == "function" and c.id.startswith("call_") for c in choice.message.tool_calls or [])
            assert finish == "tool_calls" and not content, (tool_choice, content, calls)
            _check_calls(calls, names)


def test_auto_parses_the_calls_the_model_writes(client):
    """tool_choice "auto": text the model writes in the Hermes form (here made so by a regex constraint) comes
    back as tool calls, the text before them as content; without a call, the text stays content."""
    written = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    regex = "Sure\\. " + written.replace("{", "\\{").replace("}", "\\}")
    options = dict(
        model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=0, extra_body={"structured_outputs": {"regex": regex}}
    )
    choice = client.chat.completions.create(**options).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Sure. "
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("add", {"a": 1, "b": 2})
    ]
    assert _streamed(client.chat.completions.create(**options, stream=True)) == (
        "Sure. ",
        [("add", '{"a": 1, "b": 2}')],
        "tool_calls",
    )
    twice = "Sure\\. " + (written + "\n" + written).replace("{", "\\{").replace("}", "\\}")
    for parallel, count in ((True, 2), (False, 1)):
        choice = client.chat.completions.create(
            **{**options, "extra_body": {"structured_outputs": {"regex": twice}}}, parallel_tool_calls=parallel
        ).choices[0]
        assert [c.function.name for c in choice.message.tool_calls] == ["add"] * count, choice
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=8)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
    none = client.chat.completions.create(**{**options, "tool_choice": "none"}).choices[0]
    assert none.message.tool_calls is None and none.message.content == "Sure. " + written


def test_hermes_parsing_as_vllm(bundle):
    tools = _runtime(bundle, "serve_tools")
    names = {"add", "get_weather"}
    two = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'
    two += '<tool_call>{"name": "get_weather"}</tool_call>'
    content, calls = tools.parse_tool_calls("I will call. " + two, names)
    assert content == "I will call. " and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("add", '{"a": 1}'),
        ("get_weather", "{}"),
    ]
    assert tools.parse_tool_calls('<tool_call>{"name": "add", "arguments": {}}', names)[1]  # unterminated last call
    for text in (
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        "plain",
    ):
        assert tools.parse_tool_calls(text, names) == (text, [])


BAD_TOOLS = [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"not": {}}}}]}, "tools[0]"),
    ({"tools": [TOOLS[0], {"type": "function", "function": {"name": "bad name!"}}]}, "tools[1]"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1]"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "rm"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "num_beams": 2}, "tool_choice"),
]


def test_bad_tools_get_a_400_naming_the_field_and_the_server_keeps_serving(server, client):
    for fields, param in BAD_TOOLS:
        status, answer, _ = server.post(
            "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **fields}
        )
        assert (status, answer["error"]["param"]) == (400, param), (fields, answer)
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required")
    assert answer.choices[0].finish_reason == "tool_calls"
