"""The bundle's HTTP server (export/runtime/serve.py), run as deployed: `python BUNDLE/serve.py` in a child process.

Answers are checked against the bundle's own `Generator` (greedy, seeded random, beam, chat),
through the official `openai` client and plain HTTP; continuous batching against the same
requests sent one at a time. The tiny GPT bundle is exported once per session (conftest.py).
"""

import concurrent.futures
import http.client
import importlib.util
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from tests.export import helpers

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

TEMPLATE = (
    "{% if greeting is defined %}{{ greeting }}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PROMPTS = [text[:n] for text in helpers.CORPUS[:4] for n in (3, 8, 14)]


CLI = "import sys; from keras_transformer import cli; sys.exit(cli.main(sys.argv[1:]))"


class Server:
    """`python BUNDLE/serve.py` (or `keras-transformer serve BUNDLE`) on a free localhost port, until `stop`."""

    def __init__(self, bundle, *options, cli=False):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        command = (
            [sys.executable, "-c", CLI, "serve", str(bundle)] if cli else [sys.executable, str(bundle / "serve.py")]
        )
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port), "--log-level", "warning", *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.get("/v2/health/ready")[0] == 200:
                    return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the server did not start: {self.process.stdout.read()}")
            time.sleep(0.1)

    def request(self, method, path, body=None, raw=None):
        """-> (status, parsed JSON body or text, headers)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, text, headers = response.status, response.read().decode(), response.headers
        except urllib.error.HTTPError as error:
            status, text, headers = error.code, error.read().decode(), error.headers
        try:
            return status, json.loads(text), headers
        except json.JSONDecodeError:
            return status, text, headers

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body=None, raw=None):
        return self.request("POST", path, body, raw)

    def metric(self, name):
        """The summed value of a metric's samples (e.g. 'kt_decode_steps_total')."""
        text = self.get("/metrics")[1]
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")
        )

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


@pytest.fixture(scope="module")
def chat_bundle(exported, tmp_path_factory):
    """The tiny GPT bundle, given a chat template (a bundle made by export, its tokenizer_config.json extended)."""
    bundle = tmp_path_factory.mktemp("serve") / "tiny_gpt"
    shutil.copytree(exported("gpt")["bundle"], bundle)
    config = json.loads((bundle / "tokenizer_config.json").read_text())
    (bundle / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return bundle


@pytest.fixture(scope="module")
def generator(chat_bundle):
    return _runtime(chat_bundle).Generator(chat_bundle)


def _runtime(bundle, name="generate"):
    """A bundle's runtime file as a module (its directory on sys.path, as when the bundle runs)."""
    sys.path.insert(0, str(bundle))
    try:
        spec = importlib.util.spec_from_file_location(name, bundle / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(bundle))


@pytest.fixture(scope="module")
def server(chat_bundle):
    server = Server(chat_bundle, "--max-batch", "64", "--max-queue", "128")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def one_row_server(chat_bundle):
    """One row, 32 waiting sequences: the choices of a request are decoded one after another."""
    server = Server(chat_bundle, "--max-batch", "1", "--max-queue", "32")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _greedy(generator, prompt, max_tokens):
    ids = generator.generate_ids([generator.encode(prompt)], max_tokens)[0]
    return generator.tokenizer.decode(ids, skip_special_tokens=True), ids


def test_bundle_carries_the_server(chat_bundle):
    for name in ("serve.py", "batching.py", "requirements.txt"):
        assert (chat_bundle / name).is_file(), name
    required = (chat_bundle / "requirements.txt").read_text()
    for package in ("numpy", "onnxruntime", "tokenizers", "starlette", "uvicorn", "prometheus_client"):
        assert package in required
    for framework in ("keras", "tensorflow", "torch", "jax"):
        assert f"\n{framework}" not in required


def test_the_server_imports_no_framework(chat_bundle):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import serve; serve.build_app(sys.argv[1]); "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {helpers.FRAMEWORKS!r}))"
    )
    result = subprocess.run([sys.executable, "-c", code, str(chat_bundle)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_scheduler_frees_cancelled_and_late_rows_and_bounds_its_queue(chat_bundle, generator):
    batching = _runtime(chat_bundle, "batching")
    scheduler = batching.Scheduler(generator, max_rows=4, max_queue=2)
    finished = {}

    def sequence(name, **options):
        def on_event(kind, value):
            if kind == "token" and name == "cancelled" and len(sequences[name].generated) == 2:
                sequences[name].cancel()
            if kind == "finish":
                finished[name] = value

        sequences[name] = batching.Sequence(generator.encode("def add("), 30, on_event, **options)
        return sequences[name]

    sequences = {}
    scheduler.submit(sequence("cancelled"))
    scheduler.submit(sequence("late", deadline=time.monotonic() - 1))
    with pytest.raises(batching.QueueFull, match="max_queue=2"):
        scheduler.submit(sequence("third"))
    scheduler.start()
    scheduler.submit(sequence("whole"))
    deadline = time.monotonic() + 30
    while len(finished) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    scheduler.stop(30)
    assert finished == {"cancelled": "cancelled", "late": "timeout", "whole": "length"}
    assert len(sequences["cancelled"].generated) == 2 and not sequences["late"].generated  # freed at the next step
    assert (
        sequences["whole"].generated
        == generator.generate_ids([generator.encode("def add(")], 30, stop_token_ids=None)[0]
    )
    assert scheduler.decoder.size == 0 and not scheduler.active


def test_a_queued_sequence_is_answered_at_its_deadline_and_never_decoded(chat_bundle, generator):
    """The row and the beam-search thread are held by sequences whose readers block at their first token until
    the test lets them go. Sequences queued behind them with a 0.2 s deadline finish with "timeout" once it has
    passed, while the row and the thread are still held (so nothing waited for a row to come free), leave the
    queue at once and are never prefilled or decoded; the held ones then run to their ends."""
    batching = _runtime(chat_bundle, "batching")
    scheduler = batching.Scheduler(generator, max_rows=1).start()
    finished, ids = {}, generator.encode("def add(")
    release, queued_done = threading.Event(), threading.Event()

    def sequence(name, held=False, **options):
        def on_event(kind, value):
            if kind == "token" and held:
                release.wait(60)  # a generous bound: the test releases them as soon as the queued ones finished
            if kind == "finish":
                finished[name] = (value, time.monotonic())
                if {"queued", "queued_beam"} <= set(finished):
                    queued_done.set()

        return batching.Sequence(ids, 30, on_event, **options)

    held = [sequence("held", held=True), sequence("held_beam", held=True, num_beams=2)]
    for item in held:
        scheduler.submit(item)
    deadline = time.monotonic() + 30
    while (not held[0].generated or scheduler.running_whole == 0) and time.monotonic() < deadline:
        time.sleep(0.005)
    submitted = time.monotonic()
    queued = [
        sequence("queued", deadline=submitted + 0.2),
        sequence("queued_beam", num_beams=2, deadline=submitted + 0.2),
    ]
    for item in queued:
        scheduler.submit(item)
    assert scheduler.queue_depth() == 2
    try:
        assert queued_done.wait(30), finished  # (a deadline for the test to fail by, not the property measured)
        depth, still_held = scheduler.queue_depth(), [len(item.generated) for item in held]
    finally:
        release.set()
    assert sorted(finished) == ["queued", "queued_beam"]  # the held ones still running
    # Neither went past its first token: the row's is announced (its reader blocks there); the beam search
    # announces its tokens once it is done, so it is still decoding, or its reader blocks at the first.
    assert still_held[0] == 1 and still_held[1] <= 1, still_held
    for name, (reason, at) in finished.items():
        assert reason == "timeout" and at >= submitted + 0.2, (name, reason, at - submitted)  # at, not before
    assert depth == 0 and not any(item.generated for item in queued)
    scheduler.stop(30)
    assert finished["held"][0] == finished["held_beam"][0] == "length"
    assert held[0].generated == generator.generate_ids([ids], 30, stop_token_ids=None)[0]
    assert scheduler.rows_decoded == 29  # the held row's steps alone


def test_a_running_beam_search_stops_at_its_deadline(chat_bundle):
    """A beam search whose steps take 20 ms (30 tokens: over 0.6 s) with a 0.15 s deadline finishes with
    "timeout" before its first step past the deadline (the deadline is checked before each step: at most the
    one step checked just before it starts after it), announces no token and frees the beam thread: the
    beam search queued after it runs to its end, equal to the runtime's own."""
    batching = _runtime(chat_bundle, "batching")
    # A fresh Generator of its own (its `_step` is slowed below); its loop raises decode_loop's `Interrupted`,
    # the class batching catches (both import the bundle's decode_loop module).
    generator = _runtime(chat_bundle).Generator(chat_bundle)
    step, step_starts = generator._step, []

    def slow_step(*args):
        step_starts.append(time.monotonic())
        time.sleep(0.02)
        return step(*args)

    generator._step = slow_step
    scheduler = batching.Scheduler(generator, max_rows=1).start()
    finished, ids = {}, generator.encode("def add(")

    def sequence(name, prompt_ids, **options):
        def on_event(kind, value):
            if kind == "finish":
                finished[name] = (value, time.monotonic())

        return batching.Sequence(prompt_ids, 30, on_event, num_beams=2, **options)

    started = time.monotonic()
    other = generator.encode("import")  # another request (one prompt's choices would run together)
    late, after = sequence("late", ids, deadline=started + 0.15), sequence("after", other)
    scheduler.submit(late)
    scheduler.submit(after)
    while len(finished) < 2 and time.monotonic() < started + 60:
        time.sleep(0.005)
    scheduler.stop(30)
    assert finished["late"][0] == "timeout", finished
    late_steps = [at for at in step_starts if at < finished["late"][1]]  # "after" starts once "late" finished
    assert sum(at > started + 0.15 for at in late_steps) <= 1, [at - started for at in late_steps]
    assert not late.generated
    assert finished["after"][0] == "length"
    assert after.generated == generator.generate_ids([other], 30, sampler="beam", num_beams=2, stop_token_ids=[])[0]


def test_33_greedy_sequences_share_one_batch_each_as_alone(chat_bundle, generator):
    """33 greedy sequences (prompts and lengths of all kinds) queued before the scheduler starts, 64 rows: all are
    admitted at the first step boundary and decoded together to the end, and each equals its answer alone."""
    batching = _runtime(chat_bundle, "batching")
    scheduler = batching.Scheduler(generator, max_rows=64)
    finished, first_step, eos = [], {}, generator.config["eos_token_id"]

    def on_event(i, kind, value):  # (the decoding thread's scheduler.steps: steps run before this event)
        first_step.setdefault(i, scheduler.steps)
        if kind == "finish":
            finished.append(value)

    sequences = [
        batching.Sequence(
            generator.encode(PROMPTS[i % len(PROMPTS)]),
            8 + i % 17,
            lambda kind, value, i=i: on_event(i, kind, value),
            stop_token_ids=(eos,),
        )
        for i in range(33)
    ]
    for sequence in sequences:
        scheduler.submit(sequence)
    scheduler.start()
    deadline = time.monotonic() + 30
    while len(finished) < 33 and time.monotonic() < deadline:
        time.sleep(0.005)
    scheduler.stop(30)
    alone = [generator.generate_ids([s.prompt_ids], s.max_tokens)[0] for s in sequences]
    assert [s.generated for s in sequences] == alone
    # Every first token came before the first step (all 33 rows admitted at once), then one step per token.
    lengths = [len(s.generated) for s in sequences]
    assert first_step == {i: 0 for i in range(33)}
    assert scheduler.steps == max(lengths) - 1 and scheduler.rows_decoded == sum(lengths) - 33


def test_completions_with_the_openai_client(client, generator):
    expected, ids = _greedy(generator, "def add(", 12)
    answer = client.completions.create(model="tiny_gpt", prompt="def add(", max_tokens=12, temperature=0)
    assert answer.choices[0].text == expected
    assert answer.usage.prompt_tokens == len(generator.encode("def add("))
    assert answer.usage.completion_tokens == len(ids)
    assert answer.choices[0].finish_reason == ("stop" if ids[-1] == generator.config["eos_token_id"] else "length")
    chunks = list(
        client.completions.create(model="tiny_gpt", prompt="def add(", max_tokens=12, temperature=0, stream=True)
    )
    assert "".join(chunk.choices[0].text for chunk in chunks) == expected
    # (tokens waiting together are sent as one event: how many events depends on the load)
    assert chunks[-1].choices[0].finish_reason == answer.choices[0].finish_reason


def test_a_list_of_prompts_gets_a_choice_per_prompt_and_n(client, generator):
    """`prompt` as a list of strings, a list of token-id lists and one list of ids: choice index = prompt * n + c."""
    prompts = ["def add(", "for i in", "import"]
    expected = [_greedy(generator, prompt, 8)[0] for prompt in prompts]
    ids = [generator.encode(prompt) for prompt in prompts]
    answer = client.completions.create(model="tiny_gpt", prompt=prompts, max_tokens=8, temperature=0, n=2)
    assert sorted(c.index for c in answer.choices) == list(range(6))
    assert [c.text for c in sorted(answer.choices, key=lambda c: c.index)] == [e for e in expected for _ in range(2)]
    assert answer.usage.prompt_tokens == 2 * sum(len(row) for row in ids)
    answer = client.completions.create(model="tiny_gpt", prompt=ids, max_tokens=8, temperature=0)
    assert [c.text for c in sorted(answer.choices, key=lambda c: c.index)] == expected
    answer = client.completions.create(model="tiny_gpt", prompt=ids[1], max_tokens=8, temperature=0)
    assert [(c.index, c.text) for c in answer.choices] == [(0, expected[1])]
    texts = ["", "", ""]
    for chunk in client.completions.create(model="tiny_gpt", prompt=prompts, max_tokens=8, temperature=0, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == expected


def test_chat_completions_with_the_openai_client(client, generator):
    messages = [{"role": "user", "content": "def add"}]
    expected = generator.generate(messages, max_new_tokens=10)
    answer = client.chat.completions.create(model="tiny_gpt", messages=messages, max_tokens=10, temperature=0)
    assert answer.choices[0].message.content == expected and answer.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="tiny_gpt", messages=messages, max_tokens=10, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream) == expected


def test_chat_template_kwargs_reach_the_template(server, client, generator):
    """`chat_template_kwargs` in the request body (vLLM's field) renders the template with those variables, as the
    runtime's `generate(..., chat_template_kwargs=...)` does; a variable generation sets itself is a 400."""
    messages, variables = [{"role": "user", "content": "def add"}], {"greeting": "hello"}
    prompt = generator.apply_chat_template(messages, add_generation_prompt=True, **variables)
    assert prompt.startswith("hello\n")
    expected = generator.generate(messages, max_new_tokens=6, chat_template_kwargs=variables)
    answer = client.chat.completions.create(
        model="tiny_gpt", messages=messages, max_tokens=6, temperature=0, extra_body={"chat_template_kwargs": variables}
    )
    assert answer.choices[0].message.content == expected
    assert answer.usage.prompt_tokens == len(generator.tokenizer.encode(prompt, add_special_tokens=False).ids)
    assert (
        answer.usage.prompt_tokens
        > client.chat.completions.create(
            model="tiny_gpt", messages=messages, max_tokens=1, temperature=0
        ).usage.prompt_tokens
    )
    for bad in ({"add_generation_prompt": False}, ["greeting"]):
        status, body, _ = server.post(
            "/v1/chat/completions", {"model": "tiny_gpt", "messages": messages, "chat_template_kwargs": bad}
        )
        assert status == 400 and body["error"]["param"] == "chat_template_kwargs", body
    with pytest.raises(ValueError, match="chat_template_kwargs"):
        generator.generate("def add", chat_template_kwargs=variables)  # prompts, not messages


def test_sampling_options_match_the_runtime(client, generator):
    prompt, ids = "for i in", generator.encode("for i in")
    answer = client.completions.create(
        model="tiny_gpt",
        prompt=prompt,
        max_tokens=10,
        temperature=0.9,
        top_p=0.95,
        extra_body={"top_k": 20},
        seed=7,
        n=3,
    )
    expected = generator.generate_ids([ids] * 3, 10, sampler="random", temperature=0.9, top_p=0.95, top_k=20, seed=7)
    texts = [generator.tokenizer.decode(row, skip_special_tokens=True) for row in expected]
    assert [choice.text for choice in sorted(answer.choices, key=lambda c: c.index)] == texts
    beam = client.completions.create(
        model="tiny_gpt", prompt=prompt, max_tokens=10, extra_body={"num_beams": 3, "length_penalty": 1.0}
    )
    best = generator.generate_ids([ids], 10, sampler="beam", num_beams=3)[0]
    assert beam.choices[0].text == generator.tokenizer.decode(best, skip_special_tokens=True)


def test_stop_strings_cut_the_text(client, generator):
    expected, _ = _greedy(generator, "def add(", 20)
    stop = expected[3:6]
    assert stop and stop in expected
    answer = client.completions.create(model="tiny_gpt", prompt="def add(", max_tokens=20, temperature=0, stop=[stop])
    assert answer.choices[0].text == expected[: expected.index(stop)] and answer.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny_gpt", prompt="def add(", max_tokens=20, temperature=0, stop=stop, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == expected[: expected.index(stop)]


def test_a_greedy_answer_is_the_same_alone_or_among_32_others(server, generator):
    bodies = [
        {"model": "tiny_gpt", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 8 + i % 17, "temperature": 0}
        for i in range(33)
    ]
    alone = [server.post("/v1/completions", body)[1]["choices"][0]["text"] for body in bodies]
    # Among them, seeded draws of two different settings (drawn together per setting, each row its own noise)
    # and a beam search (run beside the batch): each equal to the bundle's Generator.
    ids = generator.encode("for i in")
    others = [
        (
            {"top_p": 0.95, "seed": 7, "n": 2, "temperature": 0.9},
            generator.generate_ids([ids] * 2, 10, sampler="random", temperature=0.9, top_p=0.95, seed=7),
        ),
        (
            {"top_k": 20, "seed": 3, "temperature": 0.7},
            generator.generate_ids([ids], 10, sampler="random", temperature=0.7, top_k=20, seed=3),
        ),
        ({"num_beams": 3}, generator.generate_ids([ids], 10, sampler="beam", num_beams=3)),
    ]
    bodies += [{"model": "tiny_gpt", "prompt": "for i in", "max_tokens": 10, **options} for options, _ in others]
    steps, rows = server.metric("kt_decode_steps_total"), server.metric("kt_decoded_rows_total")
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda body: server.post("/v1/completions", body), bodies))
    assert [status for status, _, _ in together] == [200] * len(bodies)
    assert [answer["choices"][0]["text"] for _, answer, _ in together[:33]] == alone
    for (_, answer, _), (_, expected) in zip(together[33:], others):
        texts = [generator.tokenizer.decode(row, skip_special_tokens=True) for row in expected]
        assert [choice["text"] for choice in sorted(answer["choices"], key=lambda c: c["index"])] == texts
    # Decoded together: more than one row per step on average. How many depends on when the requests arrive over
    # HTTP (1.8 rows seen on a loaded machine, more when quiet); test_33_greedy_sequences_share_one_batch_each_as_alone
    # holds 33 sequences in one batch deterministically.
    mean_batch = (server.metric("kt_decoded_rows_total") - rows) / (server.metric("kt_decode_steps_total") - steps)
    assert mean_batch > 1.2, mean_batch
    assert server.metric("kt_batch_rows") == 0 and server.metric("kt_queue_depth") == 0


BAD_REQUESTS = [
    (None, b'{"model": "tiny_gpt", "prompt": ', 400, "body"),
    ({"prompt": "def"}, None, 400, "model"),
    ({"model": "tiny_gpt"}, None, 400, "prompt"),
    ({"model": "tiny_gpt", "prompt": 3}, None, 400, "prompt"),
    ({"model": "tiny_gpt", "prompt": "def", "max_tokens": "ten"}, None, 400, "max_tokens"),
    ({"model": "tiny_gpt", "prompt": "def", "max_tokens": 0}, None, 400, "max_tokens"),
    ({"model": "tiny_gpt", "prompt": "def", "max_tokens": 48}, None, 400, "max_tokens"),
    ({"model": "tiny_gpt", "prompt": "a " * 60}, None, 400, "prompt"),
    ({"model": "tiny_gpt", "prompt": "def", "temperature": "hot"}, None, 400, "temperature"),
    ({"model": "tiny_gpt", "prompt": "def", "n": 0}, None, 400, "n"),
    ({"model": "tiny_gpt", "prompt": "def", "stream": True, "num_beams": 2}, None, 400, "stream"),
    ({"model": "gpt-4", "prompt": "def"}, None, 404, "model"),
]


def test_bad_input_gets_an_error_naming_the_field_and_the_server_keeps_serving(server, client):
    for body, raw, status, param in BAD_REQUESTS:
        answer_status, answer, _ = server.post("/v1/completions", body, raw)
        assert (answer_status, answer["error"]["param"]) == (status, param), (body, raw, answer)
        assert param in answer["error"]["message"] or param == "body", answer
    status, answer, _ = server.post("/v1/chat/completions", {"model": "tiny_gpt", "messages": [{"content": "x"}]})
    assert status == 400 and answer["error"]["param"] == "messages[0]"
    assert server.post("/v1/embeddings", {"model": "tiny_gpt", "input": "x"})[0] == 400
    assert server.get("/v1/nowhere")[0] == 404 and server.get("/v1/completions")[0] == 405
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="tiny_gpt", prompt="def", max_tokens=-1)
    assert client.completions.create(model="tiny_gpt", prompt="def", max_tokens=2, temperature=0).choices[0].text
    assert server.metric('kt_requests_total{endpoint="completions",status="400"}') >= 10


def test_health_models_and_metrics(server):
    assert server.get("/v2/health/live")[:2] == (200, {"live": True})
    assert server.get("/v2/health/ready")[:2] == (200, {"ready": True})
    status, metadata, _ = server.get("/v2/models/tiny_gpt")
    assert status == 200 and metadata["name"] == "tiny_gpt" and metadata["platform"] == "onnxruntime_onnx"
    assert {"name": "decode/input_ids", "datatype": "INT64", "shape": [-1, -1]} in metadata["inputs"]
    assert server.get("/v2/models/other")[0] == 404 and server.get("/v2/models/tiny_gpt/ready")[0] == 200
    assert [m["id"] for m in server.get("/v1/models")[1]["data"]] == ["tiny_gpt"]
    server.post("/v1/completions", {"model": "tiny_gpt", "prompt": "def", "max_tokens": 3, "temperature": 0})
    assert server.metric('kt_requests_total{endpoint="completions",status="200"}') >= 1
    assert server.metric("kt_generated_tokens_total") >= 1 and server.metric("kt_prompt_tokens_total") >= 1
    assert server.metric('kt_time_to_first_token_seconds_count{endpoint="completions"}') >= 1
    assert server.metric('kt_request_latency_seconds_count{endpoint="completions"}') >= 1
    assert "kt_queue_depth" in server.get("/metrics")[1]


def _send(server, body):
    """A socket that has sent `body` to /v1/completions (the caller reads the answer, or closes it unread)."""
    connection = socket.create_connection(("127.0.0.1", server.port))
    payload = json.dumps(body)
    connection.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n{payload}".encode()
    )
    return connection


def test_a_client_that_disconnects_frees_its_rows(one_row_server, generator):
    """One row: a request of 16 choices (decoded one after another) waits behind another's 16. Its client goes
    away once the answer's headers came (streamed) or once it is queued (not streamed): its choices are dropped,
    and the rows decoded are those of the request ahead, not the 2 x 16 choices' full work."""
    server = one_row_server
    body = {"model": "tiny_gpt", "prompt": "def add(", "max_tokens": 40, "temperature": 0, "n": 16}
    expected = _greedy(generator, "def add(", 40)
    steps_in_full = 16 * (len(expected[1]) - 1)  # one row: a step per token after the first
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        for stream in (True, False):
            rows = server.metric("kt_decoded_rows_total")
            ahead = pool.submit(server.post, "/v1/completions", body)
            deadline = time.monotonic() + 10
            while server.metric("kt_queue_depth") < 15 and time.monotonic() < deadline:  # its choices queued
                time.sleep(0.002)
            prompt_tokens = server.metric("kt_prompt_tokens_total")
            with _send(server, {**body, "stream": stream}) as connection:
                received, deadline = b"", time.monotonic() + 10
                while stream and b"\r\n\r\n" not in received:  # the headers of the event stream
                    chunk = connection.recv(4096)
                    assert chunk, received
                    received += chunk
                while server.metric("kt_prompt_tokens_total") == prompt_tokens and time.monotonic() < deadline:
                    time.sleep(0.005)
            assert not stream or received.startswith(b"HTTP/1.1 200"), received
            status, answer, _ = ahead.result()
            assert status == 200 and [c["text"] for c in answer["choices"]] == [expected[0]] * 16
            deadline = time.monotonic() + 30
            while server.metric("kt_queue_depth") + server.metric("kt_batch_rows") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.metric("kt_queue_depth") + server.metric("kt_batch_rows") == 0
            decoded = server.metric("kt_decoded_rows_total") - rows - steps_in_full  # beyond the request ahead
            assert decoded < steps_in_full / 2, (stream, decoded, steps_in_full)
    assert server.post("/v1/completions", {**body, "n": 1, "max_tokens": 2})[0] == 200


def test_a_full_queue_answers_503(one_row_server, generator):
    """One row, 32 waiting sequences: requests of 16 choices overflow it; those let in are answered in full."""
    server = one_row_server
    body = {"model": "tiny_gpt", "prompt": "def add(", "max_tokens": 40, "temperature": 0, "n": 16}
    expected = _greedy(generator, "def add(", 40)[0]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: server.post("/v1/completions", body), range(6)))
    busy = [answer for answer in answers if answer[0] == 503]
    assert busy and all(headers["Retry-After"] for _, _, headers in busy), [a[0] for a in answers]
    assert all(a[0] in (200, 503) for a in answers) and busy[0][1]["error"]["message"]
    for status, answer, _ in answers:
        if status == 200:
            assert [c["text"] for c in answer["choices"]] == [expected] * 16


def test_sigterm_refuses_new_connections_and_drains(chat_bundle, generator):
    """One row, 24 requests of 16 x 40 tokens queued (384 sequences one after another: over a second even on a
    fast machine, against uvicorn's 0.1 s shutdown tick; with 32 sequences the answers could all be done
    before the socket closed). SIGTERM: new requests get 503 and then their connections are refused while
    answers are still owed; every queued request is answered in full, and the process exits 0."""
    server = Server(chat_bundle, "--max-batch", "1", "--max-queue", "1024")
    try:
        body = {"model": "tiny_gpt", "prompt": "def add(", "max_tokens": 40, "temperature": 0, "n": 16}
        expected = _greedy(generator, "def add(", 40)[0]
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            answers = [pool.submit(server.post, "/v1/completions", body) for _ in range(24)]
            deadline, queued = time.monotonic() + 20, 24 * 16 * len(generator.encode("def add("))
            while server.metric("kt_prompt_tokens_total") < queued and time.monotonic() < deadline:
                time.sleep(0.005)  # prompt tokens are counted once a request is queued
            server.process.send_signal(signal.SIGTERM)
            refused, deadline = None, time.monotonic() + 10
            while refused is None and time.monotonic() < deadline:  # new requests: 503 until the socket closes
                try:
                    status = server.post("/v1/completions", {**body, "n": 1})[0]
                    assert status == 503, status
                except (urllib.error.URLError, ConnectionError, http.client.RemoteDisconnected) as error:
                    if isinstance(getattr(error, "reason", error), ConnectionRefusedError):
                        refused = sum(not answer.done() for answer in answers)
            assert refused, refused  # refused while answers were still owed
            results = [answer.result() for answer in answers]
        assert [status for status, _, _ in results] == [200] * 24  # queued when SIGTERM came: finished
        assert all([c["text"] for c in answer["choices"]] == [expected] * 16 for _, answer, _ in results)
        assert server.process.wait(30) == 0  # drained, then a clean exit
    finally:
        server.stop()


def test_a_request_past_its_timeout_gets_504_and_frees_its_rows(chat_bundle, generator):
    """One row, a 1 s timeout, 48 requests of 16 x 40 tokens (768 sequences, one at a time: several seconds
    even on a fast machine, where 256 took about 1 s):
    those not done in time get 504 and their rows and places are freed. A request sent behind them with its
    own 0.1 s timeout gets its 504 at once, while they are still running, not when a row would come free; then
    the server serves on. Started as `keras-transformer serve BUNDLE` (which hands the process over to the
    bundle's serve.py)."""
    server = Server(chat_bundle, "--max-batch", "1", "--max-queue", "1024", "--timeout", "1", cli=True)
    try:
        body = {"model": "tiny_gpt", "prompt": "def add(", "max_tokens": 40, "temperature": 0, "n": 16}
        with concurrent.futures.ThreadPoolExecutor(48) as pool:
            answers = [pool.submit(server.post, "/v1/completions", body) for _ in range(48)]
            deadline, queued = time.monotonic() + 20, 48 * 16 * len(generator.encode("def add("))
            while server.metric("kt_prompt_tokens_total") < queued and time.monotonic() < deadline:
                time.sleep(0.005)  # prompt tokens are counted once a request is queued: all 48 are
            started = time.monotonic()
            status, late, _ = server.post("/v1/completions", {**body, "n": 1, "timeout": 0.1})
            waited, running = time.monotonic() - started, sum(not answer.done() for answer in answers)
            answers = [answer.result() for answer in answers]
        assert status == 504 and "timeout of 0.1 s" in late["error"]["message"], late
        # Answered at its deadline (not before), while requests queued ahead of it were still owed their answers:
        # it did not wait for the queue ahead (nor for a row to come free) to be answered.
        assert waited >= 0.1 and running > 0, (waited, running)
        statuses = [status for status, _, _ in answers]
        assert 504 in statuses and set(statuses) <= {200, 504}, statuses
        assert "timeout of 1 s" in next(answer for status, answer, _ in answers if status == 504)["error"]["message"]
        deadline = time.monotonic() + 10  # a late request's other choices leave the queue at the next steps
        while server.metric("kt_batch_rows") + server.metric("kt_queue_depth") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.metric("kt_batch_rows") == 0 and server.metric("kt_queue_depth") == 0
        assert server.post("/v1/completions", {**body, "n": 1, "max_tokens": 1})[0] == 200
        status, answer, _ = server.post("/v1/completions", {**body, "timeout": 0})
        assert status == 400 and answer["error"]["param"] == "timeout"
    finally:
        server.stop()


def test_embeddings_of_an_encoder_bundle(exported):
    bundle = exported("bert")["bundle"]
    server = Server(bundle)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        texts = ["a good film", "the quick brown fox"]
        name = bundle.name
        answer = client.embeddings.create(model=name, input=texts)  # the client asks for base64
        expected = _runtime(bundle).Encoder(bundle)(texts)["pooled_output"]
        np.testing.assert_allclose(np.array([item.embedding for item in answer.data]), expected, rtol=1e-5, atol=1e-6)
        status, body, _ = server.post("/v1/embeddings", {"model": name, "input": texts[0], "encoding_format": "float"})
        assert status == 200 and len(body["data"][0]["embedding"]) == expected.shape[1]
        assert server.post("/v1/embeddings", {"model": name, "input": 5})[1]["error"]["param"] == "input"
        assert server.post("/v1/completions", {"model": name, "prompt": "x"})[1]["error"]["param"] == "model"
    finally:
        server.stop()


@pytest.fixture(scope="module")
def t5_bundle(exported, tmp_path_factory):
    """The tiny T5's ONNX bundle: the session's export (conftest.py; tests/export runs in one worker, so it is
    already there), copied as the GPT bundle is, under the name the requests give."""
    bundle = tmp_path_factory.mktemp("serve_t5") / "tiny_t5"
    shutil.copytree(exported("t5")["bundle"], bundle)
    return bundle


def test_a_seq2seq_bundle_is_served(t5_bundle):
    """T5: concurrent requests decoded together (sources of different lengths, their cross-attention rows
    masked), each equal to the bundle's Generator (greedy, seeded draws with choice c as row c, and beam
    search beside the batch), streamed too; bad input names its field."""
    bundle = t5_bundle
    generator = _runtime(bundle).Generator(bundle)
    server = Server(bundle)
    try:
        name, sources = bundle.name, ["a good film", "the fox", "hello"]
        cases = [
            ({"prompt": text, "temperature": 0}, generator.generate_ids([generator.encode(text)], 12))
            for text in sources
        ]
        ids = generator.encode(sources[0])
        cases += [
            (
                {"prompt": sources[0], "temperature": 0.8, "seed": 5, "n": 2},
                generator.generate_ids([ids] * 2, 12, sampler="random", temperature=0.8, seed=5),
            ),
            ({"prompt": sources[0], "num_beams": 3}, generator.generate_ids([ids], 12, sampler="beam", num_beams=3)),
        ]
        steps, rows = server.metric("kt_decode_steps_total"), server.metric("kt_decoded_rows_total")
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            answers = list(
                pool.map(
                    lambda case: server.post("/v1/completions", {"model": name, "max_tokens": 12, **case[0]}), cases
                )
            )
        for (status, answer, _), (_, expected) in zip(answers, cases):
            assert status == 200, answer
            texts = [generator.tokenizer.decode(row, skip_special_tokens=True) for row in expected]
            assert [c["text"] for c in sorted(answer["choices"], key=lambda c: c["index"])] == texts
        mean_batch = (server.metric("kt_decoded_rows_total") - rows) / (server.metric("kt_decode_steps_total") - steps)
        assert mean_batch > 1, mean_batch
        stream = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0).completions.create(
            model=name, prompt=sources[1], max_tokens=12, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].text for chunk in stream) == answers[1][1]["choices"][0]["text"]
        status, answer, _ = server.post("/v1/completions", {"model": name, "prompt": "x", "max_tokens": 600})
        assert status == 400 and answer["error"]["param"] == "max_tokens"
        assert (
            server.post("/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "x"}]})[1][
                "error"
            ]["param"]
            == "messages"
        )
    finally:
        server.stop()
