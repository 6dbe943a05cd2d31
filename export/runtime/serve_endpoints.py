"""The HTTP endpoints: OpenAI's completions, chat completions, embeddings and models; the Open Inference
Protocol's health and metadata; Prometheus metrics. Each handler takes (request, service) and returns
a response; `ROUTES` maps the paths to them and `EXCEPTION_HANDLERS` answers the rest as JSON errors.
"""

import asyncio
import base64
import time

import numpy as np
import prometheus_client
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bundle_files import chat_template
from serve_constraints import compile_constraint, constraint_of
from serve_fields import check_fields
from serve_logprobs import prompt_entries
from serve_streaming import completion_response
from serve_tools import template_messages, tool_options
from serve_validation import (
    ApiError,
    check_messages,
    field,
    json_body,
    logprob_options,
    prompt_ids_of,
    sampling_options,
)


def _endpoint(name):
    """Count each answer of the handler (by status) and turn ApiErrors into their JSON answers."""

    def wrap(handler):
        async def answer(request):
            service = request.app.state.service
            try:
                if service.draining and request.method == "POST":
                    raise ApiError("The server is shutting down.", None, 503, {"Retry-After": "1"})
                response = await handler(request, service)
            except ApiError as error:
                response = error.response()
            service.metrics.requests.labels(name, str(response.status_code)).inc()
            return response

        return answer

    return wrap


def _require(service, kind, param):
    if kind == "generator" and service.generator is None:
        raise ApiError(
            f"The model {service.name!r} is an encoder ({service.bundle['task']}): it does not generate; "
            "use /v1/embeddings.",
            param,
        )
    if kind == "encoder" and service.encoder is None:
        raise ApiError(
            f"The model {service.name!r} generates text ({service.bundle['task']}): it has no embeddings; "
            "use /v1/completions.",
            param,
        )


@_endpoint("completions")
async def completions(request, service):
    body = await json_body(request)
    check_fields(body, "completions")
    service.check_model(body)
    _require(service, "generator", "model")
    prompt = field(body, "prompt", (str, list), required=True)
    prompt_ids = prompt_ids_of(service, prompt)
    options, n, stop, stream, usage = sampling_options(body, len(prompt_ids))
    options["logprobs"] = logprob_options(body, False, options["num_beams"])
    service.check_logprobs(options["logprobs"], "logprobs")
    constraint = constraint_of(body)
    if constraint is not None:
        options["grammar"] = await compile_constraint(service, constraint, options["num_beams"])
    max_tokens = field(body, "max_tokens", int, default=16, check=lambda m: m >= 1, rule="a positive integer")
    options["max_tokens"] = service.limits(
        prompt_ids, max_tokens, "max_tokens" in body and body["max_tokens"] is not None
    )
    echo = None
    if field(body, "echo", bool, default=False):
        if service.generator.kind != "decoder":
            raise ApiError("echo needs a causal LM: this model's prompts are sources, not text it continues.", "echo")
        texts = [prompt] if isinstance(prompt, str) else [p if isinstance(p, str) else None for p in prompt]
        if len(texts) != len(prompt_ids):  # one prompt of token ids
            texts = [None]
        texts = [t if t is not None else service.generator.tokenizer.decode(ids) for t, ids in zip(texts, prompt_ids)]
        entries = None
        if options["logprobs"] is not None:
            entries = await prompt_entries(service.generator, prompt_ids, options["logprobs"])
        echo = {"texts": texts, "entries": entries}
    return await completion_response(
        service, request, "completions", prompt_ids, options, n, stop, stream, usage, chat=False, echo=echo
    )


@_endpoint("chat_completions")
async def chat_completions(request, service):
    body = await json_body(request)
    check_fields(body, "chat_completions")
    service.check_model(body)
    _require(service, "generator", "model")
    if service.generator.kind != "decoder" or service.generator.chat_template is None:
        raise ApiError(f"The model {service.name!r} has no chat template: use /v1/completions.", "messages")
    messages = field(body, "messages", list, required=True, check=bool, rule="a non-empty list")
    check_messages(messages)
    try:
        variables = chat_template.check_template_kwargs(body.get("chat_template_kwargs"))
    except ValueError as error:
        raise ApiError(str(error), "chat_template_kwargs") from error
    tools = await asyncio.to_thread(tool_options, body, service.grammars)
    if tools is not None:
        variables = {**variables, "tools": body["tools"]}  # the template renders them
    try:
        text = service.generator.apply_chat_template(
            template_messages(messages), add_generation_prompt=True, **variables
        )
    except ValueError as error:
        raise ApiError(str(error), "messages") from error
    prompt_ids = [service.generator.tokenizer.encode(text, add_special_tokens=False).ids]
    options, n, stop, stream, usage = sampling_options(body, 1)
    options["logprobs"] = logprob_options(body, True, options["num_beams"])
    service.check_logprobs(options["logprobs"], "logprobs")
    constraint = constraint_of(body)
    if constraint is not None and tools is not None and tools["grammar"] is not None:
        raise ApiError("A forced tool call ('tool_choice') and an output constraint cannot both apply.", "tool_choice")
    if constraint is not None:
        options["grammar"] = await compile_constraint(service, constraint, options["num_beams"])
    elif tools is not None and tools["grammar"] is not None:
        options["grammar"] = tools["grammar"]
        if options["num_beams"] > 1 or not service.scheduler.batched:
            raise ApiError(
                "A forced tool call needs sampling (not beam search) and continuous batching.", "tool_choice"
            )
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = field(body, name, int, default=service.max_length, check=lambda m: m >= 1, rule="a positive integer")
    explicit = body.get(name) is not None
    try:
        options["max_tokens"] = service.limits(prompt_ids, max_tokens, explicit)
    except ApiError as error:
        error.param = "messages" if error.param == "prompt" else name
        raise
    return await completion_response(
        service,
        request,
        "chat_completions",
        prompt_ids,
        options,
        n,
        stop,
        stream,
        usage,
        chat=True,
        tools=None if tools is None or tools["choice"] == "none" else tools,
    )


@_endpoint("embeddings")
async def embeddings(request, service):
    body = await json_body(request)
    check_fields(body, "embeddings")
    service.check_model(body)
    _require(service, "encoder", "model")
    texts = field(body, "input", (str, list), required=True)
    texts = [texts] if isinstance(texts, str) else texts
    if not texts or not all(isinstance(t, str) and t for t in texts) or len(texts) > 256:
        raise ApiError("'input' must be a non-empty string or a list of 1 to 256 of them.", "input")
    encoding = field(
        body,
        "encoding_format",
        str,
        default="float",
        check=lambda e: e in ("float", "base64"),
        rule="'float' or 'base64'",
    )
    started = time.perf_counter()
    try:
        feeds = service.encoder.pack(texts)
    except ValueError as error:
        raise ApiError(str(error), "input") from error
    outputs = await asyncio.to_thread(service.encoder, texts)
    # (B, D): a TextEmbedder's own pooling and normalisation, else BERT's pooled output ([CLS], dense, tanh)
    vectors = (outputs["embeddings"] if "embeddings" in outputs else outputs["pooled_output"]).astype(np.float32)
    service.metrics.latency.labels("embeddings").observe(time.perf_counter() - started)
    tokens = int(feeds["padding_mask"].sum())
    service.metrics.prompt_tokens.inc(tokens)
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.tobytes()).decode() if encoding == "base64" else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": service.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


def _model_card(service):
    return {"id": service.name, "object": "model", "created": service.created, "owned_by": "keras_transformer"}


@_endpoint("models")
async def models(request, service):
    return JSONResponse({"object": "list", "data": [_model_card(service)]})


@_endpoint("model")
async def model(request, service):
    if request.path_params["name"] != service.name:
        raise ApiError(
            f"The model {request.path_params['name']!r} does not exist; this server serves {service.name!r}.",
            "model",
            404,
        )
    return JSONResponse(_model_card(service))


@_endpoint("health_live")
async def health_live(request, service):
    return JSONResponse({"live": True})


@_endpoint("health_ready")
async def health_ready(request, service):
    return JSONResponse({"ready": not service.draining}, status_code=503 if service.draining else 200)


@_endpoint("server_metadata")
async def server_metadata(request, service):
    return JSONResponse(
        {"name": "keras_transformer", "version": str(service.bundle.get("format_version")), "extensions": []}
    )


_DATATYPES = {
    "int64": "INT64",
    "float": "FP32",
    "float32": "FP32",
    "double": "FP64",
    "int32": "INT32",
    "float16": "FP16",
    "bool": "BOOL",
}


@_endpoint("model_metadata")
async def model_metadata(request, service):
    """Open Inference Protocol model metadata: the bundle's graphs' tensors (dynamic axes as -1)."""
    _known_model(request, service)

    def tensors(graph, side):
        return [
            {
                "name": f"{graph}/{t['name']}",
                "datatype": _DATATYPES.get(t.get("dtype"), str(t.get("dtype")).upper()),
                "shape": [d if isinstance(d, int) else -1 for d in t.get("shape", [])],
            }
            for t in service.bundle["graphs"][graph][side]
        ]

    graphs = service.bundle["graphs"]
    return JSONResponse(
        {
            "name": service.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx",
            "inputs": [t for g in graphs for t in tensors(g, "inputs")],
            "outputs": [t for g in graphs for t in tensors(g, "outputs")],
            "parameters": {
                "kind": service.bundle["kind"],
                "task": service.bundle["task"],
                "max_length": service.max_length,
            },
        }
    )


@_endpoint("model_ready")
async def model_ready(request, service):
    _known_model(request, service)
    return JSONResponse(
        {"name": service.name, "ready": not service.draining}, status_code=503 if service.draining else 200
    )


def _known_model(request, service):
    if request.path_params["name"] != service.name:
        raise ApiError(
            f"The model {request.path_params['name']!r} does not exist; this server serves {service.name!r}.",
            "name",
            404,
        )


async def metrics(request):
    registry = request.app.state.service.metrics.registry
    return Response(prometheus_client.generate_latest(registry), media_type=prometheus_client.CONTENT_TYPE_LATEST)


async def _http_error(request, error):
    param = "path" if error.status_code == 404 else "method" if error.status_code == 405 else None
    message = {
        404: f"No such endpoint: {request.url.path}",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(error.status_code, str(error.detail))
    return ApiError(message, param, error.status_code).response()


async def _server_error(request, error):
    return ApiError(f"Internal error: {type(error).__name__}: {error}", None, 500).response()


ROUTES = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/v1/models", models),
    Route("/v1/models/{name:path}", model),
    Route("/v2", server_metadata),
    Route("/v2/health/live", health_live),
    Route("/v2/health/ready", health_ready),
    Route("/v2/models/{name}", model_metadata),
    Route("/v2/models/{name}/ready", model_ready),
    Route("/metrics", metrics),
]
EXCEPTION_HANDLERS = {HTTPException: _http_error, Exception: _server_error}
