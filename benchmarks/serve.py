"""Serving load: 64 concurrent clients x 8 requests each against gpt_stdlib's bundle (issue 20).

    python benchmarks/serve.py [--bundle DIR] [--clients 64] [--requests 8] [--max-tokens 32] [--rounds 1]

Exports gpt_stdlib to an ONNX bundle (unless --bundle is given), starts `python BUNDLE/serve.py`
on a free localhost port, then, each round:
1. sends every request once, one at a time: each greedy answer alone, and the sequential time;
2. sends the same requests from 64 concurrent clients (each client its 8 in turn, over its own
   keep-alive connection, as an HTTP client with a connection pool does).
Checks that every request is answered and equals its single-request answer, and that the
concurrent throughput is at least 3x the sequential one; prints p50/p99 latency and time to
first token (the first server-sent event carrying text), the mean batch the server decoded
(from its /metrics) and the load average.

The clients are asyncio streams in one thread of this process, reading the chunked
server-sent events as they come: a light client, so that what is measured is the server
(64 client threads parsing HTTP would compete with it for the GIL and the cores).
"""

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

PROMPTS = [
    "def ",
    "import ",
    "class ",
    "for i in range(",
    "if __name__ == ",
    "return ",
    "while ",
    "with open(",
    "try:\n    ",
    "x = [",
    "print(",
    "self.",
    "def __init__(self",
    "raise ValueError(",
    "from os import ",
    "yield ",
]


class Client:
    """One keep-alive HTTP/1.1 connection sending streamed completions one after another."""

    def __init__(self, port):
        self.port, self.reader, self.writer = port, None, None

    async def complete(self, body):
        """-> (text, latency s, time to first text s) of one streamed completion."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        started = time.perf_counter()
        payload = json.dumps({**body, "stream": True}).encode()
        self.writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
        )
        status = await self.reader.readline()
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        if not status.startswith(b"HTTP/1.1 200") or headers.get("transfer-encoding") != "chunked":
            body = await self.reader.readexactly(int(headers.get("content-length", 0)))
            raise RuntimeError(f"{status.decode().strip()}: {body.decode()}")
        pieces, first = [], None
        while True:  # chunks: a hex size line, the data and CRLF; a zero size ends the answer
            size = int((await self.reader.readline()).strip(), 16)
            if size == 0:
                await self.reader.readline()
                break
            data = (await self.reader.readexactly(size + 2))[:-2]
            for event in data.split(b"\n\n"):
                if event.startswith(b"data: {"):
                    piece = json.loads(event[6:])["choices"][0]["text"]
                    if piece and first is None:
                        first = time.perf_counter() - started
                    pieces.append(piece)
        latency = time.perf_counter() - started
        return "".join(pieces), latency, latency if first is None else first

    def close(self):
        if self.writer is not None:
            self.writer.close()


async def _sequential(port, flat):
    client = Client(port)
    try:
        return [await client.complete(body) for body in flat]
    finally:
        client.close()


async def _concurrent(port, bodies):
    async def run(requests):
        client = Client(port)
        try:
            return [await client.complete(body) for body in requests]
        finally:
            client.close()

    answers = await asyncio.gather(*(run(requests) for requests in bodies), return_exceptions=True)
    return [
        answer
        for result in answers
        for answer in (result if isinstance(result, list) else [(None, np.nan, np.nan)] * len(bodies[0]))
    ]


def _metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1, help="sequential + concurrent rounds against one server")
    parser.add_argument("--threads", type=int, default=None, help="the server's ONNX Runtime intra-op threads")
    args = parser.parse_args()
    bundle = args.bundle
    if bundle is None:
        bundle = os.path.join(tempfile.mkdtemp(), "gpt_stdlib")
        code = "import sys; from keras_transformer import cli; sys.exit(cli.main(sys.argv[1:]))"
        subprocess.run(
            [sys.executable, "-c", code, "export", "gpt_stdlib", bundle],
            check=True,
            env={**os.environ, "KERAS_BACKEND": "tensorflow"},
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            os.path.join(bundle, "serve.py"),
            "--port",
            str(port),
            "--max-batch",
            str(args.max_batch),
            "--max-queue",
            "1024",
            "--log-level",
            "warning",
            *(["--threads", str(args.threads)] if args.threads else []),
        ]
    )
    name = os.path.basename(os.path.abspath(bundle))
    bodies = [
        [
            {
                "model": name,
                "prompt": PROMPTS[(c * args.requests + r) % len(PROMPTS)] + str(c),
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            for r in range(args.requests)
        ]
        for c in range(args.clients)
    ]
    flat = [body for client in bodies for body in client]
    ok = True
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/v2/health/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        print(
            f"requests: {len(flat)} ({args.clients} clients x {args.requests}), max_tokens={args.max_tokens}, "
            f"greedy, streamed, --max-batch {args.max_batch}, --threads {args.threads or 'default'}; "
            f"{os.cpu_count()} cores"
        )
        for round_ in range(1, args.rounds + 1):
            load = os.getloadavg()[0]
            started = time.perf_counter()
            alone = asyncio.run(_sequential(port, flat))
            sequential = time.perf_counter() - started
            steps, rows = _metric(url, "kt_decode_steps_total"), _metric(url, "kt_decoded_rows_total")
            started = time.perf_counter()
            together = asyncio.run(_concurrent(port, bodies))
            concurrent = time.perf_counter() - started
            mean_batch = (_metric(url, "kt_decoded_rows_total") - rows) / (
                _metric(url, "kt_decode_steps_total") - steps
            )

            answered = sum(1 for text, _, _ in together if text is not None)
            equal = sum(a[0] == t[0] for a, t in zip(alone, together))
            speedup = sequential / concurrent
            latency, ttft = np.array([t[1] for t in together]) * 1000, np.array([t[2] for t in together]) * 1000
            alone_latency, alone_ttft = np.array([a[1] for a in alone]) * 1000, np.array([a[2] for a in alone]) * 1000
            print(f"round {round_} (load average {load:.2f} -> {os.getloadavg()[0]:.2f}):")
            print(f"  answered: {answered}/{len(flat)}; equal to the single-request answer: {equal}/{len(flat)}")
            print(
                f"  sequential: {sequential:.2f} s ({len(flat) / sequential:.1f} req/s); concurrent: "
                f"{concurrent:.2f} s ({len(flat) / concurrent:.1f} req/s): {speedup:.2f}x; "
                f"mean batch {mean_batch:.1f} rows"
            )
            print(
                f"  alone: latency p50 {np.percentile(alone_latency, 50):.1f} ms, time to first token p50 "
                f"{np.percentile(alone_ttft, 50):.1f} ms"
            )
            print(
                f"  concurrent: latency p50 {np.nanpercentile(latency, 50):.0f} ms, p99 "
                f"{np.nanpercentile(latency, 99):.0f} ms; time to first token p50 {np.nanpercentile(ttft, 50):.0f} ms, "
                f"p99 {np.nanpercentile(ttft, 99):.0f} ms"
            )
            ok = ok and answered == len(flat) and equal == len(flat) and speedup >= 3
    finally:
        server.terminate()
        status = server.wait(60)
    print(f"server exit status after SIGTERM: {status}")
    print("PASS" if ok else "FAIL: every request answered, each equal to its single-request answer, >= 3x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
