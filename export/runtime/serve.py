"""Serve this keras_transformer bundle over HTTP: an OpenAI-compatible API, without Keras.

Every ONNX bundle carries a copy of this file (with `generate.py`, `batching.py` and a
requirements.txt: numpy, onnxruntime, tokenizers, jinja2, starlette, uvicorn, prometheus_client):

    pip install -r BUNDLE/requirements.txt
    python BUNDLE/serve.py --host 127.0.0.1 --port 8000     # or: keras-transformer serve BUNDLE

Endpoints:
    POST /v1/completions        prompt (a string, a list of them, or token ids), max_tokens, temperature
                                (0: greedy), top_p, top_k, seed, stop, n, stream (server-sent events);
                                extensions: num_beams, length_penalty (beam search, not streamed),
                                timeout (seconds, at most the server's --timeout)
    POST /v1/chat/completions   messages, rendered by the bundle's chat template; the same options
    POST /v1/embeddings         input (a string or a list): encoder bundles; the model's pooled output
    GET  /v1/models, /v1/models/{name}
    GET  /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}[/ready]   (Open Inference Protocol)
    GET  /metrics               Prometheus text: requests, tokens, queue depth, latency, time to first token

LM bundles decode concurrent requests together (`batching.Scheduler`: a request joins the running
batch at a step boundary and leaves it when done; beam search runs beside it, a request at a
time). The decoding threads hand tokens to the event loop once per step (`_Relay`), and each
request sends what arrived since its last event as one event. Waiting requests are bounded
(`--max-queue`; beyond, 503 with Retry-After), each has `--timeout` seconds (or the fewer its
`timeout` field asks for; a request still queued then is answered 504 at once and never
decoded), and a client that disconnects frees its row. Bad input gets a 4xx answer whose JSON
error names the field (`{"error": {"message", "type", "param", "code"}}`, as OpenAI's). SIGTERM stops taking requests
(503, then connections refused), finishes those in flight, and exits with status 0. The server
keeps no state between requests: replicas behind any HTTP load balancer scale it out.
"""

import argparse
import asyncio
import base64
import collections
import contextlib
import itertools
import json
import os
import signal
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # generate.py and batching.py sit next to this file

import numpy as np  # noqa: E402
import prometheus_client  # noqa: E402
import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402
from starlette.responses import JSONResponse, Response, StreamingResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

import batching  # noqa: E402
import generate as runtime  # noqa: E402

MAX_CHOICES = 16  # n, and prompts x n, per request
MAX_STOP_STRINGS = 4  # as OpenAI


class ApiError(Exception):
    """An answer with an OpenAI-style error body naming the field (`param`)."""

    def __init__(self, message, param=None, status=400, headers=None):
        super().__init__(message)
        self.message, self.param, self.status, self.headers = message, param, status, headers

    def response(self):
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class Service:
    """The bundle's model, its scheduler (LMs) and the server's metrics; one per app."""

    def __init__(self, bundle_dir, model_name=None, max_batch=32, max_queue=256, timeout=60.0, num_threads=None):
        self.bundle_dir = os.path.abspath(bundle_dir)
        self.bundle = runtime._read_json(os.path.join(self.bundle_dir, "bundle.json"))
        self.name = model_name or os.path.basename(self.bundle_dir.rstrip(os.sep))
        self.timeout, self.draining, self.created = float(timeout), False, int(time.time())
        self.relay = _Relay()
        self._ids, self._id_prefix = itertools.count(), uuid.uuid4().hex[:16]  # ids unique across replicas too
        if self.bundle["kind"] == "encoder":
            self.encoder, self.generator, self.scheduler = runtime.Encoder(self.bundle_dir, num_threads=num_threads), None, None
            self.max_length = int(self.encoder.config["max_length"])
        else:
            self.encoder = None
            self.generator = runtime.Generator(self.bundle_dir, num_threads=num_threads)
            if self.generator.tokenizer is None:
                raise ValueError(f"Serving needs the bundle's tokenizer.json. Received: bundle_dir={bundle_dir!r}")
            self.scheduler = batching.Scheduler(self.generator, max_rows=max_batch, max_queue=max_queue,
                                                on_step=self.relay.flush)
            self.max_length = int(self.generator.config["max_length"])
        self.metrics = _Metrics(self)

    # --- requests -> sequences ------------------------------------------------

    def next_id(self):
        return f"{self._id_prefix}{next(self._ids):016x}"

    def check_model(self, body):
        model = _field(body, "model", str, required=True)
        if model != self.name:
            raise ApiError(f"The model {model!r} does not exist; this server serves {self.name!r}.", "model", 404)

    def submit(self, prompt_ids, options, n, inbox, timeout):
        """Queue n sequences per prompt, due in `timeout` seconds; their events (index, kind, value),
        index = prompt * n + choice, go to `inbox`."""
        sequences = []
        deadline = time.monotonic() + timeout
        stop_ids = () if self.generator.config.get("eos_token_id") is None else (self.generator.config["eos_token_id"],)
        try:
            for p, ids in enumerate(prompt_ids):
                for c in range(n):
                    index = p * n + c
                    sequence = batching.Sequence(ids, on_event=lambda kind, value, index=index: self.relay.post(
                                                     inbox, (index, kind, value)),
                                                 choice=c, stop_token_ids=stop_ids, deadline=deadline, **options)
                    self.scheduler.submit(sequence)
                    sequences.append(sequence)
        except batching.QueueFull as error:
            for sequence in sequences:
                sequence.cancel()
            raise ApiError(f"The server is busy: {error} Retry later.", None, 503, {"Retry-After": "1"}) from error
        return sequences

    def limits(self, prompt_ids, max_tokens, explicit):
        """Check prompt lengths and max_tokens against the model's length; -> the max_tokens to use."""
        longest = max(len(ids) for ids in prompt_ids)
        room = self.max_length - 1 if self.generator.kind == "encoder_decoder" else self.max_length - longest
        if self.generator.kind == "encoder_decoder" and longest > self.max_length:
            raise ApiError(f"The prompt has {longest} tokens; this model reads at most {self.max_length}.", "prompt")
        if room < 1:
            raise ApiError(f"The prompt has {longest} tokens; this model reads at most {self.max_length} in all, "
                           f"so a prompt may hold at most {self.max_length - 1}.", "prompt")
        if not explicit:
            return min(max_tokens, room)
        if max_tokens > room:
            raise ApiError(f"max_tokens={max_tokens} is too large: the prompt has {longest} tokens and the model's "
                           f"length is {self.max_length}, leaving room for at most {room}.", "max_tokens")
        return max_tokens


class _Metrics:
    def __init__(self, service):
        self.registry = prometheus_client.CollectorRegistry()
        labels = dict(registry=self.registry)
        self.requests = prometheus_client.Counter("kt_requests", "HTTP requests answered", ["endpoint", "status"], **labels)
        self.prompt_tokens = prometheus_client.Counter("kt_prompt_tokens", "Prompt tokens read", **labels)
        self.generated_tokens = prometheus_client.Counter("kt_generated_tokens", "Tokens generated", **labels)
        self.latency = prometheus_client.Histogram("kt_request_latency_seconds", "Time from request to last byte",
                                                   ["endpoint"], **labels)
        self.ttft = prometheus_client.Histogram("kt_time_to_first_token_seconds", "Time from request to first token",
                                                ["endpoint"], **labels)
        if service.scheduler is not None:
            self.registry.register(_SchedulerCollector(service.scheduler))


class _SchedulerCollector:
    """The scheduler's own numbers, read at each scrape: queue depth, rows decoding, decode steps and rows stepped."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        scheduler = self.scheduler
        yield GaugeMetricFamily("kt_queue_depth", "Sequences waiting for a batch row", value=scheduler.queue_depth())
        yield GaugeMetricFamily("kt_batch_rows", "Sequences being decoded together", value=scheduler.rows())
        yield CounterMetricFamily("kt_decode_steps", "Batched decode steps run", value=scheduler.steps)
        yield CounterMetricFamily("kt_decoded_rows", "Rows decoded, summed over steps (/ steps: the mean batch)",
                                  value=scheduler.rows_decoded)


class _Inbox:
    """A request's scheduler events (index, kind, value), and the event-loop Event that says some are waiting."""

    def __init__(self):
        self.events, self.wake, self.disconnected = collections.deque(), asyncio.Event(), False


class _Relay:
    """Hands the decoding threads' events to the requests on the event loop: an event waits in its
    request's inbox, and the loop is woken once per decode step (`flush`), not once per token.

    A large batch wakes it once per `1 + rows // ROWS_PER_STREAM_STEP` steps: each streamed
    answer then gets a few tokens per server-sent event (a socket write, a wake-up of the client)
    rather than one, which is what a busy server spends its time on; a lone request still gets
    every token as it comes.
    """

    ROWS_PER_STREAM_STEP = 16

    def __init__(self):
        self.loop, self.ready, self.scheduled = None, collections.deque(), False  # deques: safe across threads
        self.steps = 0  # since the last wake-up

    def post(self, inbox, event):
        """From a decoding thread: queue an event for its request."""
        inbox.events.append(event)
        self.ready.append(inbox)

    def flush(self, rows):
        """From a decoding thread, after a step of `rows` rows: wake the loop, unless a wake-up is pending
        already, or the batch is large and its interval has not passed."""
        self.steps += 1
        if self.steps < 1 + rows // self.ROWS_PER_STREAM_STEP:
            return
        self.steps = 0
        if self.ready and not self.scheduled and self.loop is not None:
            self.scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

    def _wake(self):
        self.scheduled = False  # before draining: whatever arrives from now on schedules another wake-up
        while self.ready:
            self.ready.popleft().wake.set()


# --- request bodies ----------------------------------------------------------------

_MISSING = object()


def _field(body, name, types, required=False, default=None, check=None, rule=None):
    """body[name] of one of `types` (bool is not a number) passing `check`, else an ApiError naming it."""
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise ApiError(f"Missing required field {name!r}.", name)
        return default
    types = types if isinstance(types, tuple) else (types,)
    numeric = any(t in (int, float) for t in types)
    if not isinstance(value, types) or (numeric and isinstance(value, bool) and bool not in types):
        names = " or ".join({int: "an integer", float: "a number", str: "a string", bool: "a boolean", list: "a list",
                             dict: "an object"}[t] for t in types)
        raise ApiError(f"{name!r} must be {names}. Received: {name}={value!r}", name)
    if check is not None and not check(value):
        raise ApiError(f"{name!r} must be {rule}. Received: {name}={value!r}", name)
    return value


async def _json_body(request):
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(f"The request body is not valid JSON: {error}", "body") from error
    if not isinstance(body, dict):
        raise ApiError(f"The request body must be a JSON object. Received: {type(body).__name__}", "body")
    return body


def _sampling_options(body, n_prompts):
    """The options every generation endpoint shares -> (Sequence keyword arguments, n, stop strings, stream, usage)."""
    options = dict(
        temperature=_field(body, "temperature", (int, float), default=1.0, check=lambda t: 0 <= t <= 2, rule="in [0, 2]"),
        top_p=_field(body, "top_p", (int, float), default=None, check=lambda p: 0 < p <= 1, rule="in (0, 1]"),
        top_k=_field(body, "top_k", int, default=None, check=lambda k: k >= -1, rule=">= -1 (-1 or 0: no limit)"),
        seed=_field(body, "seed", int),
        num_beams=_field(body, "num_beams", int, default=1, check=lambda k: 1 <= k <= 32, rule="in [1, 32]"),
        length_penalty=_field(body, "length_penalty", (int, float), default=1.0),
        timeout=_field(body, "timeout", (int, float), check=lambda t: t > 0, rule="a positive number of seconds"),
    )
    if options["top_k"] is not None and options["top_k"] < 1:
        options["top_k"] = None
    if options["top_p"] == 1:
        options["top_p"] = None
    n = _field(body, "n", int, default=1, check=lambda n: 1 <= n <= MAX_CHOICES, rule=f"in [1, {MAX_CHOICES}]")
    if n * n_prompts > MAX_CHOICES:
        raise ApiError(f"A request may ask for at most {MAX_CHOICES} choices in all; {n_prompts} prompts x n={n} is "
                       f"{n * n_prompts}.", "n")
    stop = _field(body, "stop", (str, list), default=[])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them. "
                       f"Received: stop={body.get('stop')!r}", "stop")
    stream = _field(body, "stream", bool, default=False)
    stream_options = _field(body, "stream_options", dict, default={})
    if options["num_beams"] > 1:
        if stream:
            raise ApiError("Beam search (num_beams > 1) returns its best hypothesis at the end: it cannot stream.", "stream")
        if n > 1:
            raise ApiError("Beam search returns one (the best) hypothesis per prompt: n must be 1.", "n")
    if _field(body, "logprobs", (bool, int), default=False):
        raise ApiError("logprobs are not supported by this server.", "logprobs")
    return options, n, stop, stream, bool(stream_options.get("include_usage"))


def _prompt_ids(service, prompt):
    """A completion's prompt -> a list of id lists: a string, a list of strings, ids or a list of id lists."""
    vocabulary = service.bundle["vocabulary_size"]

    def ids_of(item):
        if isinstance(item, str):
            ids = service.generator.encode(item)
        elif isinstance(item, list) and item and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
            if not all(0 <= t < vocabulary for t in item):
                raise ApiError(f"Token ids must be in [0, {vocabulary}).", "prompt")
            ids = list(item)
        else:
            raise ApiError("'prompt' must be a string, a list of strings, a list of token ids or a list of them. "
                           f"Received: an item {item!r:.80}", "prompt")
        if not ids:
            raise ApiError("The prompt encodes to no token at all.", "prompt")
        return ids

    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        return [ids_of(prompt)]
    if not isinstance(prompt, list) or not prompt:
        raise ApiError(f"'prompt' must be a string or a non-empty list. Received: prompt={prompt!r:.80}", "prompt")
    return [ids_of(item) for item in prompt]


# --- generation -------------------------------------------------------------------


class _Choice:
    """One choice's text as its tokens arrive: stop strings cut it, and what might begin one is held back."""

    def __init__(self, tokenizer, stop):
        self.tokenizer, self.stop = tokenizer, stop
        self.ids, self.sent, self.finish, self.first_token_at = [], "", None, None

    def add(self, tokens):
        """New tokens -> the new text to send (possibly empty); sets `finish` = "stop" when a stop string appears.

        Without stop strings the text is decoded once for all the tokens; with them, token by token
        (the first stop string completed is the one that cuts)."""
        if not self.stop:
            self.ids.extend(tokens)
            return self._text(self.tokenizer.decode(self.ids, skip_special_tokens=True))
        new = ""
        for token in tokens:
            self.ids.append(token)
            new += self._text(self.tokenizer.decode(self.ids, skip_special_tokens=True))
            if self.finish is not None:
                break
        return new

    def _text(self, text):
        cut = min((text.find(s) for s in self.stop if s in text), default=-1)
        if cut >= 0:
            self.finish = "stop"
            return self._send(text[:cut])
        if text.endswith("\ufffd"):  # a character split across tokens: wait for its end
            return ""
        held = max((k for s in self.stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
        return self._send(text[: len(text) - held])

    def close(self):
        """-> the text held back (the sequence ended without completing a stop string)."""
        return self._send(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _send(self, text):
        new = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text if text.startswith(self.sent) else self.sent
        return new


async def _watch_disconnect(request, inbox):
    """Wakes the request's reader when its client goes away (a streamed answer learns it from Starlette)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    inbox.disconnected = True
    inbox.wake.set()


async def _generate(service, request, endpoint, prompt_ids, options, n, stop, stream, include_usage, chat):
    started, inbox = time.perf_counter(), _Inbox()
    options = dict(options)
    requested = options.pop("timeout")
    timeout = service.timeout if requested is None else min(requested, service.timeout)
    sequences = service.submit(prompt_ids, options, n, inbox, timeout)
    prompt_tokens = sum(len(ids) for ids in prompt_ids) * n
    service.metrics.prompt_tokens.inc(prompt_tokens)
    choices = [_Choice(service.generator.tokenizer, stop) for _ in sequences]
    prefix = "chatcmpl" if chat else "cmpl"
    head = {"id": f"{prefix}-{service.next_id()}", "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": service.name}
    usage = lambda: {"prompt_tokens": prompt_tokens, "completion_tokens": sum(len(c.ids) for c in choices),  # noqa: E731
                     "total_tokens": prompt_tokens + sum(len(c.ids) for c in choices)}

    def choice_text(index, tokens, finish):
        """Choice `index`'s new tokens and its finish (None: not yet) -> the text they add (raises on a timeout)."""
        choice, text = choices[index], ""
        if tokens and choice.finish is None:  # (after a stop string, tokens come until the scheduler drops the row)
            if choice.first_token_at is None:
                choice.first_token_at = time.perf_counter()
                if sum(c.first_token_at is not None for c in choices) == 1:  # the request's first token
                    service.metrics.ttft.labels(endpoint).observe(choice.first_token_at - started)
            before = len(choice.ids)
            text = choice.add(tokens)
            service.metrics.generated_tokens.inc(len(choice.ids) - before)
            if choice.finish is not None:
                sequences[index].cancel()
        if finish is not None:
            if finish == "timeout":
                raise ApiError(f"The request ran past its timeout of {timeout:g} s.", None, 504)
            if choice.finish is None:
                text += choice.close()
                choice.finish = "stop" if finish == "stop" else "length"
        return text

    async def deltas():
        """(index, text, finish or None) as tokens arrive: every token of a choice that waits when the request
        wakes (once per decode step at most) goes out as one piece; ends when every sequence has finished."""
        remaining = len(sequences)
        watcher = None if stream else asyncio.ensure_future(_watch_disconnect(request, inbox))
        try:
            while remaining:
                await inbox.wake.wait()
                inbox.wake.clear()
                if inbox.disconnected:
                    return
                tokens, finishes = collections.defaultdict(list), {}
                while inbox.events:
                    index, kind, value = inbox.events.popleft()
                    if kind == "token":
                        tokens[index].append(value)
                    elif kind == "finish":
                        finishes[index] = value
                    else:
                        raise ApiError(f"Generation failed: {value}", None, 500)
                for index in sorted(tokens.keys() | finishes.keys()):
                    text = choice_text(index, tokens.get(index), finishes.get(index))
                    finish = choices[index].finish if index in finishes else None
                    remaining -= index in finishes
                    if text or finish:
                        yield index, text, finish
        finally:  # the client went away, or an error: free every row
            for sequence in sequences:
                sequence.cancel()
            if watcher is not None:
                watcher.cancel()
            service.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    if not stream:
        texts = ["" for _ in choices]
        async for index, text, _ in deltas():
            texts[index] += text
        if inbox.disconnected:
            return Response(status_code=499)
        body = [{"index": i, "finish_reason": c.finish, "logprobs": None,
                 **({"message": {"role": "assistant", "content": texts[i]}} if chat else {"text": texts[i]})}
                for i, c in enumerate(choices)]
        return JSONResponse({**head, "choices": body, "usage": usage()})

    async def events_stream():
        chunk = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
        if chat:
            for i in range(len(choices)):
                yield _sse({**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                  "finish_reason": None, "logprobs": None}]})
        # An event per delta: the chunk's fixed fields are encoded once, each delta's own by hand.
        before = f'data: {_json(chunk)[:-1]}, "choices": [{{"index": '
        try:
            async for index, text, finish in deltas():
                if chat:
                    delta = f'{{"content": {_json(text)}}}' if text or not finish else "{}"
                    part = f'"delta": {delta}'
                else:
                    part = f'"text": {_json(text)}'
                yield f'{before}{index}, {part}, "finish_reason": {_json(finish)}, "logprobs": null}}]}}\n\n'
        except ApiError as error:
            yield _sse({"error": {"message": error.message, "type": "server_error", "param": None, "code": None}})
            return
        if include_usage:
            yield _sse({**chunk, "choices": [], "usage": usage()})
        yield "data: [DONE]\n\n"

    return StreamingResponse(events_stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


_json = json.JSONEncoder(ensure_ascii=False).encode


def _sse(payload):
    return f"data: {_json(payload)}\n\n"


# --- endpoints --------------------------------------------------------------------


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
        raise ApiError(f"The model {service.name!r} is an encoder ({service.bundle['task']}): it does not generate; "
                       "use /v1/embeddings.", param)
    if kind == "encoder" and service.encoder is None:
        raise ApiError(f"The model {service.name!r} generates text ({service.bundle['task']}): it has no embeddings; "
                       "use /v1/completions.", param)


@_endpoint("completions")
async def completions(request, service):
    body = await _json_body(request)
    service.check_model(body)
    _require(service, "generator", "model")
    prompt_ids = _prompt_ids(service, _field(body, "prompt", (str, list), required=True))
    options, n, stop, stream, usage = _sampling_options(body, len(prompt_ids))
    max_tokens = _field(body, "max_tokens", int, default=16, check=lambda m: m >= 1, rule="a positive integer")
    options["max_tokens"] = service.limits(prompt_ids, max_tokens, "max_tokens" in body and body["max_tokens"] is not None)
    if _field(body, "echo", bool, default=False):
        raise ApiError("echo is not supported by this server.", "echo")
    return await _generate(service, request, "completions", prompt_ids, options, n, stop, stream, usage, chat=False)


@_endpoint("chat_completions")
async def chat_completions(request, service):
    body = await _json_body(request)
    service.check_model(body)
    _require(service, "generator", "model")
    if service.generator.kind != "decoder" or service.generator.chat_template is None:
        raise ApiError(f"The model {service.name!r} has no chat template: use /v1/completions.", "messages")
    messages = _field(body, "messages", list, required=True, check=bool, rule="a non-empty list")
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or not isinstance(
                message.get("content"), (str, list, type(None))):
            raise ApiError(f"Each message must be an object with a string 'role' and a 'content'. Received: "
                           f"messages[{m}]={message!r:.80}", f"messages[{m}]")
    try:
        text = service.generator.apply_chat_template(messages, add_generation_prompt=True)
    except ValueError as error:
        raise ApiError(str(error), "messages") from error
    prompt_ids = [service.generator.tokenizer.encode(text, add_special_tokens=False).ids]
    options, n, stop, stream, usage = _sampling_options(body, 1)
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, name, int, default=service.max_length, check=lambda m: m >= 1, rule="a positive integer")
    explicit = body.get(name) is not None
    try:
        options["max_tokens"] = service.limits(prompt_ids, max_tokens, explicit)
    except ApiError as error:
        error.param = "messages" if error.param == "prompt" else name
        raise
    return await _generate(service, request, "chat_completions", prompt_ids, options, n, stop, stream, usage, chat=True)


@_endpoint("embeddings")
async def embeddings(request, service):
    body = await _json_body(request)
    service.check_model(body)
    _require(service, "encoder", "model")
    texts = _field(body, "input", (str, list), required=True)
    texts = [texts] if isinstance(texts, str) else texts
    if not texts or not all(isinstance(t, str) and t for t in texts) or len(texts) > 256:
        raise ApiError("'input' must be a non-empty string or a list of 1 to 256 of them.", "input")
    encoding = _field(body, "encoding_format", str, default="float", check=lambda e: e in ("float", "base64"),
                      rule="'float' or 'base64'")
    started = time.perf_counter()
    try:
        feeds = service.encoder.pack(texts)
    except ValueError as error:
        raise ApiError(str(error), "input") from error
    outputs = await asyncio.to_thread(service.encoder, texts)
    vectors = outputs["pooled_output"].astype(np.float32)  # (B, D): the model's own pooling ([CLS], dense, tanh)
    service.metrics.latency.labels("embeddings").observe(time.perf_counter() - started)
    tokens = int(feeds["padding_mask"].sum())
    service.metrics.prompt_tokens.inc(tokens)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.tobytes()).decode() if encoding == "base64" else v.tolist()}
            for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": service.name,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _model_card(service):
    return {"id": service.name, "object": "model", "created": service.created, "owned_by": "keras_transformer"}


@_endpoint("models")
async def models(request, service):
    return JSONResponse({"object": "list", "data": [_model_card(service)]})


@_endpoint("model")
async def model(request, service):
    if request.path_params["name"] != service.name:
        raise ApiError(f"The model {request.path_params['name']!r} does not exist; this server serves "
                       f"{service.name!r}.", "model", 404)
    return JSONResponse(_model_card(service))


@_endpoint("health_live")
async def health_live(request, service):
    return JSONResponse({"live": True})


@_endpoint("health_ready")
async def health_ready(request, service):
    return JSONResponse({"ready": not service.draining}, status_code=503 if service.draining else 200)


@_endpoint("server_metadata")
async def server_metadata(request, service):
    return JSONResponse({"name": "keras_transformer", "version": str(service.bundle.get("format_version")),
                         "extensions": []})


_DATATYPES = {"int64": "INT64", "float": "FP32", "float32": "FP32", "double": "FP64", "int32": "INT32", "float16": "FP16", "bool": "BOOL"}


@_endpoint("model_metadata")
async def model_metadata(request, service):
    """Open Inference Protocol model metadata: the bundle's graphs' tensors (dynamic axes as -1)."""
    _known_model(request, service)

    def tensors(graph, side):
        return [{"name": f"{graph}/{t['name']}", "datatype": _DATATYPES.get(t.get("dtype"), str(t.get("dtype")).upper()),
                 "shape": [d if isinstance(d, int) else -1 for d in t.get("shape", [])]}
                for t in service.bundle["graphs"][graph][side]]

    graphs = service.bundle["graphs"]
    return JSONResponse({"name": service.name, "versions": ["1"], "platform": "onnxruntime_onnx",
                         "inputs": [t for g in graphs for t in tensors(g, "inputs")],
                         "outputs": [t for g in graphs for t in tensors(g, "outputs")],
                         "parameters": {"kind": service.bundle["kind"], "task": service.bundle["task"],
                                        "max_length": service.max_length}})


@_endpoint("model_ready")
async def model_ready(request, service):
    _known_model(request, service)
    return JSONResponse({"name": service.name, "ready": not service.draining},
                        status_code=503 if service.draining else 200)


def _known_model(request, service):
    if request.path_params["name"] != service.name:
        raise ApiError(f"The model {request.path_params['name']!r} does not exist; this server serves "
                       f"{service.name!r}.", "name", 404)


async def metrics(request):
    registry = request.app.state.service.metrics.registry
    return Response(prometheus_client.generate_latest(registry), media_type=prometheus_client.CONTENT_TYPE_LATEST)


async def _http_error(request, error):
    param = "path" if error.status_code == 404 else "method" if error.status_code == 405 else None
    message = {404: f"No such endpoint: {request.url.path}",
               405: f"{request.method} is not allowed on {request.url.path}"}.get(error.status_code, str(error.detail))
    return ApiError(message, param, error.status_code).response()


async def _server_error(request, error):
    return ApiError(f"Internal error: {type(error).__name__}: {error}", None, 500).response()


def build_app(bundle_dir=None, **service_options):
    """The ASGI app serving the bundle at `bundle_dir` (default: this file's directory). See `Service` for options."""
    service = Service(bundle_dir or os.path.dirname(os.path.abspath(__file__)), **service_options)
    routes = [
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

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.relay.loop = asyncio.get_running_loop()
        if service.scheduler is not None:
            service.scheduler.start()
        yield
        service.draining = True
        if service.scheduler is not None:
            await asyncio.to_thread(service.scheduler.stop)

    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.service = service
    return app


class _Server(uvicorn.Server):
    """uvicorn's server, ending cleanly on SIGTERM/SIGINT: readiness turns 503 and new requests get 503 at
    once; uvicorn then closes the listening socket (new connections are refused), waits for the answers
    in flight, and the scheduler finishes what it holds. The process exits with status 0 (uvicorn
    itself would raise the signal again once drained, so that the process dies of it)."""

    def __init__(self, config, service):
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig, frame):
        self.service.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Serve this keras_transformer bundle over HTTP (OpenAI-compatible).")
    parser.add_argument("--bundle", default=os.path.dirname(os.path.abspath(__file__)), help="bundle directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-name", default=None, help="the name clients ask for (default: the bundle's directory name)")
    parser.add_argument("--max-batch", type=int, default=32, help="the most requests decoded together")
    parser.add_argument("--max-queue", type=int, default=256, help="the most requests waiting; beyond, 503")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take (waiting included)")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    app = build_app(args.bundle, model_name=args.model_name, max_batch=args.max_batch, max_queue=args.max_queue,
                    timeout=args.timeout, num_threads=args.threads)
    # On SIGTERM, answers in flight get --timeout seconds (each request's own limit) and a little more to finish.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, timeout_keep_alive=5,
                            timeout_graceful_shutdown=args.timeout + 5)
    server = _Server(config, app.state.service)
    print(f"Serving {app.state.service.name!r} on http://{args.host}:{args.port}", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
