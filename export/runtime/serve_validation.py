"""The server's request checks: a field of a JSON body, the sampling options, prompts and chat messages.

Bad input is an `ApiError`: a 4xx answer whose OpenAI-style JSON error names the field (`param`).
Chat messages are checked by `chat_template.check_message`, the one check the Keras tokenizer and
the runner use too.
"""

import json

from starlette.responses import JSONResponse

from bundle_files import chat_template

MAX_CHOICES = 16  # n, and prompts x n, per request
MAX_STOP_STRINGS = 4  # as OpenAI
MAX_LOGPROBS = 20  # alternatives per token: OpenAI's top_logprobs limit, vLLM's default max_logprobs
MAX_DRAFT = 32  # prompt_lookup_num_tokens, num_draft_tokens: drafts checked per pass


class ApiError(Exception):
    """An answer with an OpenAI-style error body naming the field (`param`)."""

    def __init__(self, message, param=None, status=400, headers=None):
        super().__init__(message)
        self.message, self.param, self.status, self.headers = message, param, status, headers

    def response(self):
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


_MISSING = object()


def field(body, name, types, required=False, default=None, check=None, rule=None):
    """body[name] of one of `types` (bool is not a number) passing `check`, else an ApiError naming it."""
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise ApiError(f"Missing required field {name!r}.", name)
        return default
    types = types if isinstance(types, tuple) else (types,)
    numeric = any(t in (int, float) for t in types)
    if not isinstance(value, types) or (numeric and isinstance(value, bool) and bool not in types):
        names = " or ".join(
            {
                int: "an integer",
                float: "a number",
                str: "a string",
                bool: "a boolean",
                list: "a list",
                dict: "an object",
            }[t]
            for t in types
        )
        raise ApiError(f"{name!r} must be {names}. Received: {name}={value!r}", name)
    if check is not None and not check(value):
        raise ApiError(f"{name!r} must be {rule}. Received: {name}={value!r}", name)
    return value


async def json_body(request):
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(f"The request body is not valid JSON: {error}", "body") from error
    if not isinstance(body, dict):
        raise ApiError(f"The request body must be a JSON object. Received: {type(body).__name__}", "body")
    return body


def _check_speculation(options):
    """Prompt lookup decodes greedily, a draft greedily or by sampling; neither with beams, and not both."""
    lookup, drafts = options["prompt_lookup_num_tokens"], options["num_draft_tokens"]
    if lookup is not None and (options["temperature"] != 0 or options["num_beams"] > 1):
        raise ApiError(
            "Prompt lookup decodes greedily here: it needs temperature 0 and num_beams 1. Received: "
            f"prompt_lookup_num_tokens={lookup}, temperature={options['temperature']}, "
            f"num_beams={options['num_beams']}",
            "prompt_lookup_num_tokens",
        )
    if drafts is not None and (lookup is not None or options["num_beams"] > 1):
        raise ApiError(
            "A draft's speculative decoding needs num_beams 1 and no prompt lookup. Received: "
            f"num_draft_tokens={drafts}, num_beams={options['num_beams']}, prompt_lookup_num_tokens={lookup}",
            "num_draft_tokens",
        )


def sampling_options(body, n_prompts):
    """The options every generation endpoint shares -> (Sequence keyword arguments, n, stop strings, stream, usage)."""
    options = dict(
        temperature=field(
            body, "temperature", (int, float), default=1.0, check=lambda t: 0 <= t <= 2, rule="in [0, 2]"
        ),
        top_p=field(body, "top_p", (int, float), default=None, check=lambda p: 0 < p <= 1, rule="in (0, 1]"),
        top_k=field(body, "top_k", int, default=None, check=lambda k: k >= -1, rule=">= -1 (-1 or 0: no limit)"),
        seed=field(body, "seed", int),
        num_beams=field(body, "num_beams", int, default=1, check=lambda k: 1 <= k <= 32, rule="in [1, 32]"),
        length_penalty=field(body, "length_penalty", (int, float), default=1.0),
        timeout=field(body, "timeout", (int, float), check=lambda t: t > 0, rule="a positive number of seconds"),
        prompt_lookup_num_tokens=field(
            body, "prompt_lookup_num_tokens", int, check=lambda k: 1 <= k <= MAX_DRAFT, rule=f"in [1, {MAX_DRAFT}]"
        ),
        num_draft_tokens=field(
            body, "num_draft_tokens", int, check=lambda k: 1 <= k <= MAX_DRAFT, rule=f"in [1, {MAX_DRAFT}]"
        ),
    )
    _check_speculation(options)
    if options["top_k"] is not None and options["top_k"] < 1:
        options["top_k"] = None
    if options["top_p"] == 1:
        options["top_p"] = None
    n = field(body, "n", int, default=1, check=lambda n: 1 <= n <= MAX_CHOICES, rule=f"in [1, {MAX_CHOICES}]")
    if n * n_prompts > MAX_CHOICES:
        raise ApiError(
            f"A request may ask for at most {MAX_CHOICES} choices in all; {n_prompts} prompts x n={n} is "
            f"{n * n_prompts}.",
            "n",
        )
    stop = field(body, "stop", (str, list), default=[])
    stop = [stop] if isinstance(stop, str) else stop
    if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(
            f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them. "
            f"Received: stop={body.get('stop')!r}",
            "stop",
        )
    stream = field(body, "stream", bool, default=False)
    stream_options = field(body, "stream_options", dict, default={})
    unknown = sorted(
        key for key, value in stream_options.items() if key != "include_usage" and value not in (None, False)
    )
    if unknown:
        raise ApiError(
            "'stream_options' takes 'include_usage' only on this server. "
            f"Received: stream_options={stream_options!r:.80}",
            "stream_options",
        )
    if options["num_beams"] > 1:
        if stream:
            raise ApiError(
                "Beam search (num_beams > 1) returns its best hypothesis at the end: it cannot stream.", "stream"
            )
        if n > 1:
            raise ApiError("Beam search returns one (the best) hypothesis per prompt: n must be 1.", "n")
    return options, n, stop, stream, bool(stream_options.get("include_usage"))


def logprob_options(body, chat, num_beams):
    """How many alternatives to report with each token's log-probability, or None: chat's `logprobs` (a
    boolean) and `top_logprobs`, a completion's `logprobs` (an integer)."""
    rule = f"an integer in [0, {MAX_LOGPROBS}]"
    if chat:
        top = field(body, "top_logprobs", int, check=lambda k: 0 <= k <= MAX_LOGPROBS, rule=rule)
        wanted = field(body, "logprobs", bool, default=False)
        if top is not None and not wanted:
            raise ApiError("'top_logprobs' needs 'logprobs': true.", "top_logprobs")
        top = (top or 0) if wanted else None
    else:
        top = field(body, "logprobs", int, check=lambda k: 0 <= k <= MAX_LOGPROBS, rule=rule)
    if top is not None and num_beams > 1:
        raise ApiError(
            f"logprobs are not available with beam search (num_beams={num_beams}): a beam's tokens are chosen "
            "by its sequence's score, not one at a time.",
            "logprobs",
        )
    return top


def prompt_ids_of(service, prompt):
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
            raise ApiError(
                "'prompt' must be a string, a list of strings, a list of token ids or a list of them. "
                f"Received: an item {item!r:.80}",
                "prompt",
            )
        if not ids:
            raise ApiError("The prompt encodes to no token at all.", "prompt")
        return ids

    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], int)):
        return [ids_of(prompt)]
    if not isinstance(prompt, list) or not prompt:
        raise ApiError(f"'prompt' must be a string or a non-empty list. Received: prompt={prompt!r:.80}", "prompt")
    return [ids_of(item) for item in prompt]


def check_messages(messages):
    """Each chat message of a request's `messages` (a non-empty list) -> an ApiError naming the first bad one."""
    for m, message in enumerate(messages):
        try:
            chat_template.check_message(message, f"messages[{m}]")
        except ValueError as error:
            raise ApiError(str(error), f"messages[{m}]") from error
