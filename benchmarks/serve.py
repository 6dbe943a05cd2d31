"""Serving load: 64 concurrent clients x 8 requests each against gpt_stdlib's bundle (issue 20).

    python benchmarks/serve.py [--bundle DIR] [--clients 64] [--requests 8] [--max-tokens 32]

Exports gpt_stdlib to an ONNX bundle (unless --bundle is given), starts `python BUNDLE/serve.py`
on a free localhost port, then:
1. sends every request once, one at a time: each greedy answer alone, and the sequential time;
2. sends the same requests from 64 concurrent clients (each client its 8 in turn).
Checks that every request is answered and equals its single-request answer, and that the
concurrent throughput is at least 3x the sequential one; prints p50/p99 latency and time to
first token (streamed requests: the first server-sent event carrying text).
"""

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

PROMPTS = ["def ", "import ", "class ", "for i in range(", "if __name__ == ", "return ", "while ", "with open(",
           "try:\n    ", "x = [", "print(", "self.", "def __init__(self", "raise ValueError(", "from os import ",
           "yield "]


def _post(url, body):
    """-> (text, latency, time to first text) of a streamed completion."""
    started = time.perf_counter()
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    text, first = "", None
    with urllib.request.urlopen(request, timeout=300) as response:
        for line in response:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            piece = json.loads(line[6:])["choices"][0]["text"]
            if piece and first is None:
                first = time.perf_counter() - started
            text += piece
    return text, time.perf_counter() - started, first if first is not None else time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=64)
    args = parser.parse_args()
    bundle = args.bundle
    if bundle is None:
        bundle = os.path.join(tempfile.mkdtemp(), "gpt_stdlib")
        code = "import sys; from keras_transformer import cli; sys.exit(cli.main(sys.argv[1:]))"
        subprocess.run([sys.executable, "-c", code, "export", "gpt_stdlib", bundle], check=True,
                       env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, os.path.join(bundle, "serve.py"), "--port", str(port),
                               "--max-batch", str(args.max_batch), "--max-queue", "1024", "--log-level", "warning"])
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/v2/health/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        name = os.path.basename(os.path.abspath(bundle))
        bodies = [[{"model": name, "prompt": PROMPTS[(c * args.requests + r) % len(PROMPTS)] + str(c),
                    "max_tokens": args.max_tokens, "temperature": 0} for r in range(args.requests)]
                  for c in range(args.clients)]
        flat = [body for client in bodies for body in client]
        started = time.perf_counter()
        alone = [_post(url, body) for body in flat]
        sequential = time.perf_counter() - started

        def client(requests):
            return [_post(url, body) for body in requests]

        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            together = [answer for answers in pool.map(client, bodies) for answer in answers]
        concurrent_time = time.perf_counter() - started
    finally:
        server.terminate()
        server.wait(60)

    answered = sum(1 for text, _, _ in together if text is not None)
    equal = sum(a[0] == t[0] for a, t in zip(alone, together))
    speedup = sequential / concurrent_time
    latency = np.array([t[1] for t in together]) * 1000
    ttft = np.array([t[2] for t in together]) * 1000
    alone_latency = np.array([a[1] for a in alone]) * 1000
    print(f"requests: {len(flat)} ({args.clients} clients x {args.requests}), max_tokens={args.max_tokens}, "
          f"greedy, streamed, --max-batch {args.max_batch}")
    print(f"answered: {answered}/{len(flat)}; equal to the single-request answer: {equal}/{len(flat)}")
    print(f"sequential: {sequential:.2f} s ({len(flat) / sequential:.1f} req/s); concurrent: {concurrent_time:.2f} s "
          f"({len(flat) / concurrent_time:.1f} req/s): {speedup:.2f}x")
    print(f"alone: latency p50 {np.percentile(alone_latency, 50):.1f} ms")
    print(f"concurrent: latency p50 {np.percentile(latency, 50):.0f} ms, p99 {np.percentile(latency, 99):.0f} ms; "
          f"time to first token p50 {np.percentile(ttft, 50):.0f} ms, p99 {np.percentile(ttft, 99):.0f} ms")
    ok = answered == len(flat) and equal == len(flat) and speedup >= 3
    print("PASS" if ok else "FAIL: every request answered, each equal to its single-request answer, >= 3x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
