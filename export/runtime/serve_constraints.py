"""A request's output constraint: OpenAI's `response_format` and vLLM's `structured_outputs`.

`response_format`: {"type": "text"} (none), {"type": "json_object"} (any JSON object), or {"type":
"json_schema", "json_schema": {"name", "schema", "strict", "description"}}. `structured_outputs` (vLLM):
exactly one of "json" (a schema, or its JSON text), "regex", "choice" (a list of strings), "grammar" (Lark
or GBNF) or "json_object": true. The grammar is compiled and checked here (`constraint.Grammars`): what is
wrong with it is a 400 naming the field.
"""

import asyncio
import json

from serve_validation import ApiError, field

_JSON_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
_STRUCTURED_KEYS = {"json", "regex", "choice", "grammar", "json_object"}


def constraint_of(body):
    """The request's constraint -> None, or (kind, spec, the field that asked for it)."""
    response_format = field(body, "response_format", dict)
    structured = field(body, "structured_outputs", dict)
    if response_format is not None and structured is not None:
        raise ApiError("Give 'response_format' or 'structured_outputs', not both.", "structured_outputs")
    if response_format is not None:
        kind = response_format.get("type")
        if kind == "text":
            return None
        if kind == "json_object":
            return "json", True, "response_format"
        if kind != "json_schema":
            raise ApiError(
                "'response_format.type' must be 'text', 'json_object' or 'json_schema'. "
                f"Received: response_format={response_format!r:.120}",
                "response_format",
            )
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ApiError(
                "'response_format.json_schema' must be an object holding the 'schema' (an object). "
                f"Received: response_format={response_format!r:.120}",
                "response_format",
            )
        unknown = sorted(set(spec) - _JSON_SCHEMA_KEYS)
        if unknown:
            raise ApiError(
                f"'response_format.json_schema' takes {sorted(_JSON_SCHEMA_KEYS)}. Received: {unknown}",
                "response_format",
            )
        return "json", spec["schema"], "response_format"
    if structured is None:
        return None
    given = {key: value for key, value in structured.items() if value is not None and value is not False}
    unknown = sorted(set(given) - _STRUCTURED_KEYS)
    if unknown or len(given) != 1:
        raise ApiError(
            f"'structured_outputs' takes exactly one of {sorted(_STRUCTURED_KEYS)}. Received: {sorted(given)}",
            "structured_outputs",
        )
    ((kind, spec),) = given.items()
    if kind == "json_object":
        return "json", True, "structured_outputs"
    if kind == "json" and isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as error:
            raise ApiError(f"'structured_outputs.json' is not valid JSON: {error}", "structured_outputs") from error
    return kind, spec, "structured_outputs"


async def compile_constraint(service, constraint, num_beams):
    """(kind, spec, param) -> the compiled grammar (on a thread: a large schema takes a while), or a 400."""
    kind, spec, param = constraint
    if num_beams > 1:
        raise ApiError(f"'{param}' is not available with beam search (num_beams={num_beams}).", param)
    if not service.scheduler.batched:
        raise ApiError(f"'{param}' needs a bundle with continuous batching; this one has none.", param)
    try:
        return await asyncio.to_thread(service.grammars.compile, kind, spec)
    except ValueError as error:
        raise ApiError(f"'{param}' ({kind}) is not a grammar this server can follow: {error}", param) from error
