"""Serve this keras_transformer bundle over HTTP: an OpenAI-compatible API, without Keras.

Every ONNX bundle carries a copy of this file (with the runner's files, see `generate.py`, and a
requirements.txt: numpy, onnxruntime, tokenizers, jinja2, starlette, uvicorn, prometheus_client):

    pip install -r BUNDLE/requirements.txt
    python BUNDLE/serve.py --host 127.0.0.1 --port 8000     # or: keras-transformer serve BUNDLE

Endpoints:
    POST /v1/completions        prompt (a string, a list of them, or token ids), max_tokens, temperature
                                (0: greedy), top_p, top_k, seed, stop, n, stream (server-sent events),
                                logprobs (0-20), echo, response_format (json_object, json_schema);
                                extensions: num_beams, length_penalty (beam search, not streamed),
                                timeout (seconds, at most the server's --timeout), structured_outputs
                                (vLLM's: json, regex, choice, grammar; constraint.py),
                                prompt_lookup_num_tokens (greedy speculative decoding: prompt_lookup.py),
                                num_draft_tokens (speculative decoding with the --draft bundle)
    POST /v1/chat/completions   messages, rendered by the bundle's chat template; the same options, and
                                logprobs (true/false) with top_logprobs (0-20), tools and tool_choice
                                (Qwen-style <tool_call> JSON parsed into tool_calls: serve_tools.py)
                                Any other field gets a 400 naming it (serve_fields.py).
                                usage.prompt_tokens_details.cached_tokens: prompt tokens read from
                                the prefix cache
    POST /v1/embeddings         input (a string or a list): encoder bundles; the model's pooled output
    GET  /v1/models, /v1/models/{name}
    GET  /v2, /v2/health/live, /v2/health/ready, /v2/models/{name}[/ready]   (Open Inference Protocol)
    GET  /metrics               Prometheus text: requests, tokens, queue depth, latency, time to first token

LM bundles decode concurrent requests together (`batching.Scheduler`: a request joins the running
batch at a step boundary and leaves it when done; beam search runs beside it, a request at a
time). The decoding threads hand tokens to the event loop once per step (`Relay`), and each
request sends what arrived since its last event as one event. Waiting requests are bounded
(`--max-queue`; beyond, 503 with Retry-After), each has `--timeout` seconds (or the fewer its
`timeout` field asks for; a request still queued then is answered 504 at once and never
decoded), and a client that disconnects frees its row. A causal LM's prompts that start with a
recently seen prefix reuse its keys/values (`prefix_cache.PrefixCache`, `--prefix-cache-tokens N`, on by
default; `--no-prefix-cache`): only the rest is prefilled, and the answers are those without it.
Bad input gets a 4xx answer whose JSON error names the field (`{"error": {"message", "type", "param",
"code"}}`, as OpenAI's). SIGTERM stops taking requests (503, then connections refused), finishes those
in flight, and exits with status 0. The server keeps no state between requests that changes an answer (the
prefix cache only saves work): replicas behind any HTTP load balancer scale it out.

The server, one job per file: this one holds the service (model, scheduler, metrics), the app and its
lifecycle; `serve_validation.py` checks requests, `serve_streaming.py` relays tokens and cuts stop
strings, `serve_endpoints.py` answers each path (a new endpoint goes there, in `ROUTES`).
"""

import argparse
import asyncio
import contextlib
import itertools
import os
import signal
import sys
import threading
import time
import uuid

# The runtime's other modules sit next to this file (a bundle's directory).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import prometheus_client  # noqa: E402
import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402

import batching  # noqa: E402
import prompt_lookup  # noqa: E402
from bundle_files import read_json  # noqa: E402
from constraint import Grammars  # noqa: E402
from decode_loop import auto_stop_tokens  # noqa: E402
from encoder import Encoder  # noqa: E402
from generator import Generator  # noqa: E402
from serve_endpoints import EXCEPTION_HANDLERS, ROUTES  # noqa: E402
from serve_streaming import Relay  # noqa: E402
from serve_validation import MAX_DRAFT, ApiError, field  # noqa: E402

__all__ = ["Service", "build_app", "main"]


class Service:
    """The bundle's model, its scheduler (LMs) and the server's metrics; one per app."""

    def __init__(
        self,
        bundle_dir,
        model_name=None,
        max_batch=32,
        max_queue=256,
        timeout=60.0,
        num_threads=None,
        prefix_cache_tokens=batching.PREFIX_CACHE_TOKENS,
        draft=None,
        num_draft_tokens=None,
    ):
        self.bundle_dir = os.path.abspath(bundle_dir)
        self.bundle = read_json(os.path.join(self.bundle_dir, "bundle.json"))
        self.name = model_name or os.path.basename(self.bundle_dir.rstrip(os.sep))
        self.timeout, self.draining, self.created = float(timeout), False, int(time.time())
        self.relay = Relay()
        self._ids, self._id_prefix = itertools.count(), uuid.uuid4().hex[:16]  # ids unique across replicas too
        if self.bundle["kind"] == "encoder":
            self.encoder, self.generator, self.scheduler = Encoder(self.bundle_dir, num_threads=num_threads), None, None
            if draft is not None:
                raise ValueError(f"--draft needs an LM bundle; this one holds an encoder. Received: draft={draft!r}")
            self.max_length = int(self.encoder.config["max_length"])
        else:
            self.encoder = None
            self.generator = Generator(self.bundle_dir, num_threads=num_threads)
            if self.generator.tokenizer is None:
                raise ValueError(f"Serving needs the bundle's tokenizer.json. Received: bundle_dir={bundle_dir!r}")
            self.draft, self.num_draft_tokens = self._draft(draft, num_draft_tokens, num_threads)
            self.scheduler = batching.Scheduler(
                self.generator,
                max_rows=max_batch,
                max_queue=max_queue,
                on_step=self.relay.flush,
                prefix_cache_tokens=prefix_cache_tokens,
                draft=self.draft,
            )
            self.max_length = int(self.generator.config["max_length"])
            self.grammars = Grammars(
                os.path.join(self.bundle_dir, "tokenizer.json"),
                self.bundle["vocabulary_size"],
                auto_stop_tokens(self.generator.config),
            )
        self.metrics = Metrics(self)

    # --- requests -> sequences ------------------------------------------------

    def next_id(self):
        return f"{self._id_prefix}{next(self._ids):016x}"

    def check_model(self, body):
        model = field(body, "model", str, required=True)
        if model != self.name:
            raise ApiError(f"The model {model!r} does not exist; this server serves {self.name!r}.", "model", 404)

    def submit(self, prompt_ids, options, n, inbox, timeout):
        """Queue n sequences per prompt, due in `timeout` seconds; their events (index, kind, value),
        index = prompt * n + choice, go to `inbox`."""
        sequences, options = [], dict(options)
        deadline = time.monotonic() + timeout
        stop_ids = auto_stop_tokens(self.generator.config)
        grammar = options.pop("grammar", None)  # compiled: each sequence gets a matcher of its own
        if options.get("prompt_lookup_num_tokens") is not None:
            self.check_prompt_lookup(grammar, prompt_ids, options["max_tokens"])
        options = self.check_draft(options, grammar, prompt_ids)
        try:
            for p, ids in enumerate(prompt_ids):
                for c in range(n):
                    index = p * n + c
                    sequence = batching.Sequence(
                        ids,
                        on_event=lambda kind, value, index=index: self.relay.post(inbox, (index, kind, value)),
                        choice=c,
                        stop_token_ids=stop_ids,
                        deadline=deadline,
                        constraint=None if grammar is None else self.grammars.matcher(grammar),
                        **options,
                    )
                    self.scheduler.submit(sequence)
                    sequences.append(sequence)
        except batching.QueueFull as error:
            for sequence in sequences:
                sequence.cancel()
            raise ApiError(f"The server is busy: {error} Retry later.", None, 503, {"Retry-After": "1"}) from error
        return sequences

    def check_prompt_lookup(self, grammar, prompt_ids, max_tokens):
        """Prompt lookup needs a causal LM whose decode graph takes several tokens, no constraint, and no longrope
        position crossed."""
        generator, reason = self.generator, None
        if generator.kind != "decoder" or not generator.multi_token:
            reason = "a causal LM bundle whose decode graph takes several tokens per step; this one's takes one"
        elif grammar is not None:
            reason = "no output constraint (response_format, structured_outputs, forced tool calls)"
        if reason is not None:
            raise ApiError(f"prompt_lookup_num_tokens needs {reason}.", "prompt_lookup_num_tokens")
        try:
            prompt_lookup.check_model(generator, "the model", prompt_ids, max_tokens)
        except ValueError as error:
            raise ApiError(str(error), "prompt_lookup_num_tokens") from error

    def _draft(self, draft, num_draft_tokens, num_threads):
        """`--draft BUNDLE` -> (its `Generator`, checked against the model's, or None; `--num-draft-tokens`)."""
        if draft is None:
            if num_draft_tokens is not None:
                raise ValueError(f"--num-draft-tokens needs --draft. Received: num_draft_tokens={num_draft_tokens}")
            return None, None
        if num_draft_tokens is not None and not 1 <= num_draft_tokens <= MAX_DRAFT:
            raise ValueError(f"--num-draft-tokens must be in [1, {MAX_DRAFT}]. Received: {num_draft_tokens}")
        draft = prompt_lookup.check_draft(self.generator, Generator(draft, num_threads=num_threads))
        prompt_lookup.check_model(self.generator, "the model")
        prompt_lookup.check_model(draft, "the draft")
        return draft, num_draft_tokens

    def check_draft(self, options, grammar, prompt_ids):
        """A request's `num_draft_tokens` (or the server's `--num-draft-tokens`, for the requests that can draft:
        one beam, no constraint, no prompt lookup) -> its options; a request the draft cannot serve gets a 400."""
        asked = options.get("num_draft_tokens")
        if asked is None and self.num_draft_tokens is not None and grammar is None and options["num_beams"] == 1:
            if options.get("prompt_lookup_num_tokens") is None:
                options = {**options, "num_draft_tokens": self.num_draft_tokens}
        if options.get("num_draft_tokens") is None:
            return options
        if self.draft is None:
            raise ApiError("num_draft_tokens needs a server started with --draft BUNDLE.", "num_draft_tokens")
        if grammar is not None:
            raise ApiError("num_draft_tokens needs no output constraint (response_format, ...).", "num_draft_tokens")
        try:
            for generator, role in ((self.generator, "the model"), (self.draft, "the draft")):
                prompt_lookup.check_model(generator, role, prompt_ids, options["max_tokens"])
        except ValueError as error:
            raise ApiError(str(error), "num_draft_tokens") from error
        return options

    def check_logprobs(self, top, param):
        """logprobs of a seq2seq bundle without continuous batching would need its decoder's every step again."""
        if top is not None and not self.scheduler.batched and self.generator.kind != "decoder":
            raise ApiError("logprobs need continuous batching for a seq2seq bundle; this one has none.", param)

    def limits(self, prompt_ids, max_tokens, explicit):
        """Check prompt lengths and max_tokens against the model's length; -> the max_tokens to use."""
        longest = max(len(ids) for ids in prompt_ids)
        room = self.max_length - 1 if self.generator.kind == "encoder_decoder" else self.max_length - longest
        if self.generator.kind == "encoder_decoder" and longest > self.max_length:
            raise ApiError(f"The prompt has {longest} tokens; this model reads at most {self.max_length}.", "prompt")
        if room < 1:
            raise ApiError(
                f"The prompt has {longest} tokens; this model reads at most {self.max_length} in all, "
                f"so a prompt may hold at most {self.max_length - 1}.",
                "prompt",
            )
        if not explicit:
            return min(max_tokens, room)
        if max_tokens > room:
            raise ApiError(
                f"max_tokens={max_tokens} is too large: the prompt has {longest} tokens and the model's "
                f"length is {self.max_length}, leaving room for at most {room}.",
                "max_tokens",
            )
        return max_tokens


class Metrics:
    def __init__(self, service):
        self.registry = prometheus_client.CollectorRegistry()
        labels = dict(registry=self.registry)
        self.requests = prometheus_client.Counter(
            "kt_requests", "HTTP requests answered", ["endpoint", "status"], **labels
        )
        self.prompt_tokens = prometheus_client.Counter("kt_prompt_tokens", "Prompt tokens read", **labels)
        self.generated_tokens = prometheus_client.Counter("kt_generated_tokens", "Tokens generated", **labels)
        self.latency = prometheus_client.Histogram(
            "kt_request_latency_seconds", "Time from request to last byte", ["endpoint"], **labels
        )
        self.ttft = prometheus_client.Histogram(
            "kt_time_to_first_token_seconds", "Time from request to first token", ["endpoint"], **labels
        )
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
        yield CounterMetricFamily(
            "kt_decoded_rows", "Rows decoded, summed over steps (/ steps: the mean batch)", value=scheduler.rows_decoded
        )
        cache = scheduler.prefix_cache
        yield CounterMetricFamily(
            "kt_prefix_cache_hit_tokens",
            "Prompt tokens read from the prefix cache",
            value=cache.hit_tokens if cache else 0,
        )


def build_app(bundle_dir=None, **service_options):
    """The ASGI app serving the bundle at `bundle_dir` (default: this file's directory). See `Service` for options."""
    service = Service(bundle_dir or os.path.dirname(os.path.abspath(__file__)), **service_options)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        service.relay.loop = asyncio.get_running_loop()
        if service.scheduler is not None:
            service.scheduler.start()
        yield
        service.draining = True
        if service.scheduler is not None:
            await asyncio.to_thread(service.scheduler.stop)

    app = Starlette(routes=ROUTES, lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS)
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
    parser.add_argument(
        "--model-name", default=None, help="the name clients ask for (default: the bundle's directory name)"
    )
    parser.add_argument("--max-batch", type=int, default=32, help="the most requests decoded together")
    parser.add_argument("--max-queue", type=int, default=256, help="the most requests waiting; beyond, 503")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take (waiting included)")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads")
    parser.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=batching.PREFIX_CACHE_TOKENS,
        help="prompt positions whose keys/values are kept for prompts that start the same (blocks of 16, LRU)",
    )
    parser.add_argument("--no-prefix-cache", action="store_true", help="keep no prompt prefix (same as 0 above)")
    parser.add_argument(
        "--draft",
        default=None,
        help="a draft bundle (same vocabulary): requests with num_draft_tokens decode speculatively, a request at a "
        "time beside the batch",
    )
    parser.add_argument(
        "--num-draft-tokens",
        type=int,
        default=None,
        help="with --draft: the drafts per pass of every request that can draft and sets no num_draft_tokens "
        "(default: only requests that set it draft)",
    )
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    app = build_app(
        args.bundle,
        model_name=args.model_name,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        timeout=args.timeout,
        num_threads=args.threads,
        prefix_cache_tokens=0 if args.no_prefix_cache else args.prefix_cache_tokens,
        draft=args.draft,
        num_draft_tokens=args.num_draft_tokens,
    )
    # On SIGTERM, answers in flight get --timeout seconds (each request's own limit) and a little more to finish.
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=args.timeout + 5,
    )
    server = _Server(config, app.state.service)
    print(f"Serving {app.state.service.name!r} on http://{args.host}:{args.port}", flush=True)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
