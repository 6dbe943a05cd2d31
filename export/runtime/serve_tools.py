"""Tool calls on chat completions: `tools` and `tool_choice`, the calls written Qwen-style (Hermes), as vLLM's
`hermes` parser reads them:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The chat template renders the tools (the request's `tools`, as OpenAI sends them, become the template's
`tools`). The answer's calls are parsed into OpenAI's `tool_calls` (`finish_reason: "tool_calls"`); the text
before the first `<tool_call>` is the message's content. `tool_choice: "required"` or a named function is
enforced by a grammar (`constraint.py`): the answer is one call of a declared function whose arguments
follow its `parameters` schema. "auto" lets the model choose; "none" parses nothing.
"""

import json
import re
import uuid

from serve_validation import ApiError, field

START, END = "<tool_call>", "</tool_call>"
_CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)  # vLLM's hermes pattern
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def tool_options(body, grammars):
    """The request's tools -> None (no tools, or tool_choice "none" with none), or {"names": declared names,
    "choice": "auto" | "required" | "none" | a name, "grammar": the compiled grammar forcing calls, or None,
    "parallel": `parallel_tool_calls` (False: at most one call is returned, the first)}."""
    tools = field(body, "tools", list)
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise ApiError(f"'tool_choice' needs 'tools'. Received: tool_choice={choice!r:.80}", "tool_choice")
        return None
    schemas = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in schemas:
            raise ApiError(
                'Each tool must be {"type": "function", "function": {"name", "description", "parameters"}} with a '
                f"new name of 1 to 64 letters, digits, '_' or '-'. Received: tools[{i}]={tool!r:.120}",
                f"tools[{i}]",
            )
        parameters = function.get("parameters", _EMPTY_PARAMETERS)
        try:
            grammars.compile("json", parameters)
        except ValueError as error:
            raise ApiError(f"tools[{i}] ({name}): its 'parameters' are not a JSON schema: {error}", f"tools[{i}]")
        schemas[name] = parameters
    if choice is None or choice in ("auto", "none", "required"):
        choice = choice or "auto"
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        choice = choice["function"].get("name")
        if choice not in schemas:
            raise ApiError(
                f"'tool_choice' names {choice!r}, which is not among the tools {sorted(schemas)}.", "tool_choice"
            )
    else:
        raise ApiError(
            "'tool_choice' must be 'none', 'auto', 'required' or "
            f'{{"type": "function", "function": {{"name": ...}}}}. Received: tool_choice={choice!r:.80}',
            "tool_choice",
        )
    parallel = field(body, "parallel_tool_calls", bool, default=True)
    grammar = None
    if choice not in ("auto", "none"):
        forced = schemas if choice == "required" else {choice: schemas[choice]}
        grammar = grammars.compile("lark", _calls_grammar(forced))
    return {"names": set(schemas), "choice": choice, "grammar": grammar, "parallel": parallel}


def _calls_grammar(schemas):
    """Lark: one call, `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`, a JSON schema (llguidance's
    %json) naming one of `schemas` with arguments that follow its parameters. One: a grammar that allowed any
    number of calls lets a model that repeats itself run to max_tokens, and its last call would not parse."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in schemas.items()
    ]
    call = {"anyOf": calls} if len(calls) > 1 else calls[0]
    call = {**call, "x-guidance": {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}}
    return f'start: call\ncall: "{START}\\n" body "\\n{END}"\nbody: %json {json.dumps(call)}'


def template_tools(body):
    """The request's tools as the chat template reads them (OpenAI's objects, as transformers passes them)."""
    return body.get("tools") or None


def template_messages(messages):
    """Messages for the template: an assistant's earlier tool calls with their arguments as objects (OpenAI
    sends them as JSON text; the templates write them with `tojson`), as vLLM renders them."""
    rendered = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_arguments_as_object(call) for call in calls]}
        rendered.append(message)
    return rendered


def _arguments_as_object(call):
    function = call.get("function") if isinstance(call, dict) else None
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            return {**call, "function": {**function, "arguments": json.loads(function["arguments"])}}
        except json.JSONDecodeError:
            pass
    return call


def parse_tool_calls(text, names):
    """The answer's text -> (content, [OpenAI tool calls]); as vLLM's hermes parser, a call that does not
    parse (or names no declared function) leaves the whole text as content and no calls."""
    start = text.find(START)
    if start < 0:
        return text, []
    calls = []
    for match in _CALLS.finditer(text, start):
        raw = (match.group(1) if match.group(1) is not None else match.group(2)).strip()
        if not raw and match.group(2) is not None:  # a last call begun, nothing written yet
            continue
        try:
            call = json.loads(raw)
        except json.JSONDecodeError:
            return text, []
        if not isinstance(call, dict) or call.get("name") not in names:
            return text, []
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    return text[:start], calls
