"""Streaming a completion: the decoding threads' tokens relayed to the event loop, text cut at stop strings.

The scheduler's threads post each request's events (index, kind, value) into its `Inbox`; the
`Relay` wakes the event loop once per decode step (not once per token), and each request sends what
arrived since its last event as one server-sent event (or, not streamed, one JSON answer).
"""

import asyncio
import collections
import json
import time

from starlette.responses import JSONResponse, Response, StreamingResponse

from serve_logprobs import TokenStrings, chat_logprobs, completion_logprobs
from serve_tools import START as TOOL_CALL_START
from serve_tools import parse_tool_calls
from serve_validation import ApiError


class Inbox:
    """A request's scheduler events (index, kind, value), and the event-loop Event that says some are waiting."""

    def __init__(self):
        self.events, self.wake, self.disconnected = collections.deque(), asyncio.Event(), False


class Relay:
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


class _Choice:
    """One choice's text as its tokens arrive: stop strings cut it, and what might begin one is held back.
    With `tools` (`serve_tools.tool_options`'s: the declared names, parallel calls or not), the text from the
    first `<tool_call>` on is held back too, and parsed into `tool_calls` once the choice ends (`end_tools`)."""

    def __init__(self, tokenizer, stop, tools=None):
        self.tokenizer, self.stop, self.tools = tokenizer, stop, tools
        self.ids, self.sent, self.finish, self.first_token_at = [], "", None, None
        self.text, self.tool_calls = "", []  # the text so far (before a stop string), what tool calls it held

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

    def end_tools(self):
        """At the choice's end: its tool calls parsed from the text held back; -> the text still to send (the
        held text, when it holds no call that parses)."""
        if self.tools is None:
            return ""
        content, calls = parse_tool_calls(self.text, self.tools["names"])
        self.tool_calls = calls if self.tools["parallel"] else calls[:1]
        return self._send(content if self.tool_calls else self.text, hold=False)

    def _send(self, text, hold=True):
        self.text = text if hold else self.text
        if hold and self.tools is not None:  # from a tool call's start on, or what may begin one
            at = text.find(TOOL_CALL_START)
            if at < 0:
                at = len(text) - max(
                    (k for k in range(1, len(TOOL_CALL_START)) if text.endswith(TOOL_CALL_START[:k])), default=0
                )
            text = text[:at]
        new = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent = text if text.startswith(self.sent) else self.sent
        return new


async def _watch_disconnect(request, inbox):
    """Wakes the request's reader when its client goes away (a streamed answer learns it from Starlette)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    inbox.disconnected = True
    inbox.wake.set()


async def completion_response(
    service, request, endpoint, prompt_ids, options, n, stop, stream, include_usage, chat, echo=None, tools=None
):
    """Submit a completion (n sequences per prompt) -> its answer: one JSON body, or a stream of
    server-sent events when `stream`. `chat` picks the chat completion's shapes over the text one's.
    `echo`: None, or {"texts": each prompt's text, "entries": None or each prompt's token logprob entries}:
    each choice's text starts with its prompt's (and its logprobs with the prompt's tokens'). `tools`: None, or
    `serve_tools.tool_options`'s answer: the calls of the declared functions are parsed out of each chat choice."""
    completion = _Completion(service, request, endpoint, prompt_ids, options, n, stop, chat, echo, tools)
    if not stream:
        return await completion.json_response()
    return StreamingResponse(
        completion.events(include_usage),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class _Completion:
    """A submitted request: its sequences on the scheduler, its choices' text as it comes, its answer."""

    def __init__(self, service, request, endpoint, prompt_ids, options, n, stop, chat, echo, tools):
        self.started, self.inbox = time.perf_counter(), Inbox()
        self.logprobs, self.strings = options["logprobs"] is not None, TokenStrings(service.generator.tokenizer)
        self.prompt_ids, self.n, self.echo = prompt_ids, n, echo
        self.service, self.request, self.endpoint, self.chat = service, request, endpoint, chat
        options = dict(options)
        requested = options.pop("timeout")
        self.timeout = service.timeout if requested is None else min(requested, service.timeout)
        self.sequences = service.submit(prompt_ids, options, n, self.inbox, self.timeout)
        self.prompt_tokens = sum(len(ids) for ids in prompt_ids) * n
        service.metrics.prompt_tokens.inc(self.prompt_tokens)
        self.choices = [_Choice(service.generator.tokenizer, stop, tools) for _ in self.sequences]
        prefix = "chatcmpl" if chat else "cmpl"
        self.head = {
            "id": f"{prefix}-{service.next_id()}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": service.name,
        }

    def usage(self):
        """OpenAI's usage object: the tokens of the prompts (once per sequence) and those generated so far."""
        completion_tokens = sum(len(c.ids) for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            # read from the prefix cache instead of prefilled
            "prompt_tokens_details": {"cached_tokens": sum(s.cached_tokens for s in self.sequences)},
            **self._prediction_tokens(),
        }

    def _prediction_tokens(self):
        """With speculative decoding, its drafts kept and rejected (OpenAI's names for predicted outputs' counts)."""
        if not any(s.speculative for s in self.sequences):
            return {}
        accepted = sum(s.accepted for s in self.sequences)
        rejected = sum(s.drafted for s in self.sequences) - accepted
        return {
            "completion_tokens_details": {
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
            }
        }

    def _echoed(self, index):
        """Choice `index`'s echoed prompt: (text, ids, logprob entries or None); ("", [], []) without echo."""
        if self.echo is None:
            return "", [], []
        prompt = index // self.n
        entries = self.echo["entries"][prompt] if self.echo["entries"] is not None else None
        return self.echo["texts"][prompt], self.prompt_ids[prompt], entries

    def _logprobs(self, index, ids, entries, first):
        """Choice `index`'s logprobs object for tokens `ids` with `entries` (None when not asked for);
        `first`: these start the choice (an echoed prompt's tokens come first)."""
        if not self.logprobs:
            return None
        if self.chat:
            return chat_logprobs(self.strings, ids, entries)
        if first:
            _, prompt_ids, prompt_entries = self._echoed(index)
            ids, entries = list(prompt_ids) + list(ids), list(prompt_entries or []) + list(entries)
        return completion_logprobs(self.strings, ids, entries)

    async def json_response(self):
        """The answer not streamed: every choice's whole text (or 499 when the client went away)."""
        texts = [self._echoed(i)[0] for i in range(len(self.choices))]
        entries = [[] for _ in self.choices]
        async for index, text, _, new in self._deltas(watch_disconnect=True):
            texts[index] += text
            entries[index] += new
        if self.inbox.disconnected:
            return Response(status_code=499)
        body = [
            {
                "index": i,
                "finish_reason": c.finish,
                "logprobs": self._logprobs(i, c.ids[: len(entries[i])], entries[i], True),
                **({"message": _message(texts[i], c.tool_calls)} if self.chat else {"text": texts[i]}),
            }
            for i, c in enumerate(self.choices)
        ]
        return JSONResponse({**self.head, "choices": body, "usage": self.usage()})

    async def events(self, include_usage):
        """The streamed answer's server-sent events: (chat) each choice's role, (echo) each choice's prompt, a
        delta per piece of text, the usage if asked, then [DONE]; an error during generation ends the stream
        with an error event."""
        chat = self.chat
        chunk = {**self.head, "object": "chat.completion.chunk" if chat else "text_completion"}
        for i in range(len(self.choices)):
            if chat:
                delta = {"delta": {"role": "assistant", "content": ""}}
            elif self.echo is not None:
                delta = {"text": self._echoed(i)[0]}
            else:
                continue
            logprobs = None if chat else self._logprobs(i, [], [], True)
            yield _sse({**chunk, "choices": [{"index": i, **delta, "finish_reason": None, "logprobs": logprobs}]})
        # An event per delta: the chunk's fixed fields are encoded once, each delta's own by hand.
        before = f'data: {_json(chunk)[:-1]}, "choices": [{{"index": '
        sent = [0] * len(self.choices)  # tokens whose logprobs went out, per choice
        try:
            async for index, text, finish, entries in self._deltas(watch_disconnect=False):
                if chat:
                    delta = f'{{"content": {_json(text)}}}' if text or not finish else "{}"
                    calls = self.choices[index].tool_calls if finish else None
                    if calls:  # the calls, whole, with the choice's last event
                        listed = [{"index": k, **call} for k, call in enumerate(calls)]
                        delta = f'{delta[:-1]}{", " if len(delta) > 2 else ""}"tool_calls": {_json(listed)}}}'
                    part = f'"delta": {delta}'
                else:
                    part = f'"text": {_json(text)}'
                logprobs = "null"
                if self.logprobs:
                    ids = self.choices[index].ids[sent[index] : sent[index] + len(entries)]
                    sent[index] += len(entries)
                    logprobs = _json(self._logprobs(index, ids, entries, False))
                yield f'{before}{index}, {part}, "finish_reason": {_json(finish)}, "logprobs": {logprobs}}}]}}\n\n'
        except ApiError as error:
            yield _sse({"error": {"message": error.message, "type": "server_error", "param": None, "code": None}})
            return
        if include_usage:
            yield _sse({**chunk, "choices": [], "usage": self.usage()})
        yield "data: [DONE]\n\n"

    async def _deltas(self, watch_disconnect):
        """(index, text, finish or None, logprob entries) as tokens arrive: every token of a choice that waits
        when the request wakes (once per decode step at most) goes out as one piece; ends when every sequence
        has finished. The entries are those of the tokens the choice took (none past a stop string).

        `watch_disconnect`: also wake when the client goes away (a streamed answer learns it from Starlette)."""
        inbox, remaining = self.inbox, len(self.sequences)
        watcher = asyncio.ensure_future(_watch_disconnect(self.request, inbox)) if watch_disconnect else None
        try:
            while remaining:
                await inbox.wake.wait()
                inbox.wake.clear()
                if inbox.disconnected:
                    return
                tokens, finishes, logprobs = _drain(inbox)
                for index in sorted(tokens.keys() | finishes.keys()):
                    text, taken = self._choice_text(index, tokens.get(index), finishes.get(index))
                    finish = self.choices[index].finish if index in finishes else None
                    remaining -= index in finishes
                    entries = logprobs.get(index, [])[:taken]
                    if text or finish or entries:
                        yield index, text, finish, entries
        finally:  # the client went away, or an error: free every row
            for sequence in self.sequences:
                sequence.cancel()
            if watcher is not None:
                watcher.cancel()
            self.service.metrics.latency.labels(self.endpoint).observe(time.perf_counter() - self.started)

    def _choice_text(self, index, tokens, finish):
        """Choice `index`'s new tokens and its finish (None: not yet) -> (the text they add, how many of the
        tokens it took) (raises on a timeout)."""
        choice, text, metrics, taken = self.choices[index], "", self.service.metrics, 0
        if tokens and choice.finish is None:  # (after a stop string, tokens come until the scheduler drops the row)
            if choice.first_token_at is None:
                choice.first_token_at = time.perf_counter()
                if sum(c.first_token_at is not None for c in self.choices) == 1:  # the request's first token
                    metrics.ttft.labels(self.endpoint).observe(choice.first_token_at - self.started)
            before = len(choice.ids)
            text = choice.add(tokens)
            taken = len(choice.ids) - before
            metrics.generated_tokens.inc(taken)
            if choice.finish is not None:
                self.sequences[index].cancel()
        if finish is not None:
            if finish == "timeout":
                raise ApiError(f"The request ran past its timeout of {self.timeout:g} s.", None, 504)
            if choice.finish is None:
                text += choice.close()
                choice.finish = "stop" if finish == "stop" else "length"
            text += choice.end_tools()
            if choice.tool_calls:
                choice.finish = "tool_calls"
        return text, taken


def _message(text, tool_calls):
    """A chat choice's message: its text, and its tool calls when it made some (then no text is None)."""
    if not tool_calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": tool_calls}


def _drain(inbox):
    """The events waiting in `inbox` -> ({index: [token, ...]}, {index: finish}, {index: [logprob entry, ...]});
    a failure raises."""
    tokens, finishes, logprobs = collections.defaultdict(list), {}, collections.defaultdict(list)
    while inbox.events:
        index, kind, value = inbox.events.popleft()
        if kind == "token":
            if isinstance(value, tuple):  # (token, its logprob entry)
                value, entry = value
                logprobs[index].append(entry)
            tokens[index].append(value)
        elif kind == "finish":
            finishes[index] = value
        else:
            raise ApiError(f"Generation failed: {value}", None, 500)
    return tokens, finishes, logprobs


_json = json.JSONEncoder(ensure_ascii=False).encode


def _sse(payload):
    return f"data: {_json(payload)}\n\n"
