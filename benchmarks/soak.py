"""Soak: one model generates 20,000 tokens in a loop of `generate` calls; throughput per window and memory.

    KERAS_BACKEND=jax python benchmarks/soak.py [--tokens 20000] [--window 2000] [--threads N]

A GPT of the `gpt_tiny` preset's shape (4 layers, width 256, 4 heads, vocabulary 8000, 512
positions) with random weights. Every call draws a batch size (1 or 4), ragged prompts of 4..48
tokens and 16..80 new tokens (no early stop), alternating greedy and top-k sampling with a new
seed per call, so the run crosses several length buckets as a long-lived server would. One
backend per process (KERAS_BACKEND). Prints, per window of about 2,000 generated tokens: tokens/s,
resident memory (RSS) and the number of compiled-function traces so far; then the peak RSS.
Throughput should level off after the first windows (compilation) and RSS should stay flat.
"""

import argparse
import gc
import resource
import sys
import time
from pathlib import Path

import keras
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keras_transformer.decoding import compile as compile_lib  # noqa: E402
from keras_transformer.models import GPTBackbone, GPTCausalLM  # noqa: E402
from keras_transformer.samplers import RandomSampler  # noqa: E402

VOCAB = 8000


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20_000, help="generated tokens in all")
    parser.add_argument("--window", type=int, default=2_000, help="tokens per reported window")
    parser.add_argument("--threads", type=int, default=None, help="PyTorch intra-op threads (default: torch's)")
    args = parser.parse_args()
    backend = keras.config.backend()
    if args.threads and backend == "torch":
        import torch

        torch.set_num_threads(args.threads)

    keras.utils.set_random_seed(0)
    lm = GPTCausalLM(
        GPTBackbone(VOCAB, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=512)
    )
    rng = np.random.default_rng(0)
    process = psutil.Process()
    print(
        f"backend={backend} keras={keras.__version__} parameters={lm.count_params():,} "
        f"rss_after_build={process.memory_info().rss / 2**20:.0f} MiB"
    )
    print(f"{'window':>6} {'tokens':>7} {'calls':>5} {'seconds':>8} {'tokens/s':>9} {'rss MiB':>8} {'traces':>6}")

    total, calls, window, window_tokens, window_calls = 0, 0, 1, 0, 0
    window_start = run_start = time.perf_counter()
    while total < args.tokens:
        batch = int(rng.choice([1, 4]))
        shortest = int(rng.integers(4, 45))
        prompts = [rng.integers(1, VOCAB, shortest + int(rng.integers(0, 4))).tolist() for _ in range(batch)]
        new = int(rng.integers(16, 81))
        sampler = "greedy" if calls % 2 == 0 else RandomSampler(top_k=40, seed=calls)
        lm.generate(prompts, max_new_tokens=new, sampler=sampler, stop_token_ids=None)
        total += batch * new
        calls += 1
        window_tokens += batch * new
        window_calls += 1
        if window_tokens >= args.window or total >= args.tokens:
            seconds = time.perf_counter() - window_start
            gc.collect()
            traces = sum(f.traces for f in compile_lib.compiled_cache(lm).functions.values())
            print(
                f"{window:>6} {window_tokens:>7} {window_calls:>5} {seconds:>8.2f} {window_tokens / seconds:>9.1f} "
                f"{process.memory_info().rss / 2**20:>8.0f} {traces:>6}",
                flush=True,
            )
            window, window_tokens, window_calls = window + 1, 0, 0
            window_start = time.perf_counter()
    elapsed = time.perf_counter() - run_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        f"total: {total} tokens in {calls} calls, {elapsed:.1f} s, {total / elapsed:.1f} tokens/s; "
        f"peak RSS {peak:.0f} MiB"
    )


if __name__ == "__main__":
    main()
