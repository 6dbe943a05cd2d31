"""Where a JAX decoding step's time goes: XLA's matrix products vs everything else, ours and keras-hub's.

    KERAS_BACKEND=jax python benchmarks/step_profile.py [--model t5|llama] [--beams 1] [--batch 1]

Builds the two models of `generate_seq2seq.py` (T5) or `generate_llama.py` (the SmolLM2-135M
shape), same shapes, random weights; times each one's `generate` (best of 5, unprofiled), then
profiles one more call of each with
`jax.profiler` and sums XLA's CPU thunks by kind: matrix products (`dot`, and the dots XLA
hands to YNNPACK/XNNPACK/oneDNN as `*_fusion` custom kernels) and the rest. Both models run the
same products on the same shapes, so keras-hub's step time over our products' time bounds the
ratio any change outside the matrix products can reach. XLA runs independent thunks on both
cores at once and the profiler slows them, so the sums are scaled to the unprofiled step: our
products' share of our thunk time, times our step time.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


PRODUCT = re.compile(r"^(dot|ynn_fusion|xnn_fusion|onednn)")
CONTAINER = re.compile(r"^(while|conditional|call)(\.\d+)?$")


def thunk_seconds(fn):
    """Run fn once under the profiler -> {"products": s, "other": s} summed over XLA's CPU thunks."""
    import jax

    with tempfile.TemporaryDirectory() as log_dir:
        jax.profiler.start_trace(log_dir, create_perfetto_trace=True)
        fn()
        jax.profiler.stop_trace()
        (trace,) = glob.glob(f"{log_dir}/plugins/profile/*/perfetto_trace.json.gz")
        events = json.load(gzip.open(trace))
    events = events["traceEvents"] if isinstance(events, dict) else events
    sums = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or "hlo_op" not in (event.get("args") or {}) or CONTAINER.match(name):
            continue
        sums["products" if PRODUCT.match(name) else "other"] += event.get("dur", 0) / 1e6
    return sums


def best_seconds(fn, repeats=5):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def calls(model, batch, beams):
    """-> (description, steps per call, {name: a function generating once})."""
    rng = np.random.default_rng(batch)
    if model == "t5":
        import generate_seq2seq as bench

        sources = rng.integers(1, bench.VOCABULARY, (batch, bench.SOURCE)).astype("int32")
        runs = {
            name: (lambda m=cls(): m.generate(sources, beams))
            for name, cls in (("ours", bench.Ours), ("keras-hub", bench.KerasHub))
        }
        return "T5 (generate_seq2seq.py's shape)", bench.NEW_TOKENS, runs
    import generate_llama as bench

    prompts = rng.integers(1, bench._config()["vocabulary_size"], (batch, bench.PROMPT)).astype("int32")
    runs = {
        name: (lambda m=cls(): m.generate(prompts, bench.NEW_TOKENS, beams))
        for name, cls in (("ours", bench.Ours), ("keras-hub", bench.KerasHub))
    }
    return f"Llama ({bench.PRESET}'s shape)", bench.NEW_TOKENS, runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("t5", "llama"), default="t5")
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    args = parser.parse_args()
    if keras.config.backend() != "jax":
        raise SystemExit("step_profile.py profiles XLA's thunks on JAX: run it with KERAS_BACKEND=jax.")
    what, steps, runs = calls(args.model, args.batch, args.beams)
    print(f"{what} generate on JAX, batch {args.batch}, {args.beams} beam(s), {steps} steps; ms per step")
    print(f"{'':<12}{'step (wall)':>12}{'products':>10}{'other':>8}")
    step = {}
    for name, run in runs.items():
        run()  # compile
        step[name] = best_seconds(run) / steps
        sums = thunk_seconds(run)
        products, other = sums["products"] / steps, sums["other"] / steps
        print(f"{name:<12}{step[name] * 1e3:>12.3f}{products * 1e3:>10.3f}{other * 1e3:>8.3f}", flush=True)
        if name == "ours":
            our_products = step[name] * products / (products + other)  # scaled to the unprofiled step
    print(
        f"ratio now (keras-hub step / ours): {step['keras-hub'] / step['ours']:.2f}; our products take "
        f"{our_products * 1e3:.3f} ms of our step: keras-hub step / that = {step['keras-hub'] / our_products:.2f} "
        "(the ratio with nothing but our products)"
    )


if __name__ == "__main__":
    main()
