"""Exported bundle vs Keras: generation tokens/s and encoder latency, in one run.

    KERAS_BACKEND=jax python benchmarks/export_speed.py [--quick]

Generation: a GPT of 4 layers, width 256, 4 heads, vocabulary 8000 (the `gpt_tiny` preset's
shape, random weights), prompts of 16 tokens, 128 new tokens (no early stop), greedy and
beam search with 4 beams, batch 1 and 8: the ONNX bundle's runner (ONNX Runtime, CPU)
against `lm.generate` on the current backend (compiled loop, timed after a warm-up call).
Encoder: `bert_tiny`'s shape, batch 8 x 128 tokens: ONNX Runtime against Keras
`predict_on_batch`. Prints tokens/s (or ms) and the bundle/Keras ratios (> 1: the bundle is faster).
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keras_transformer.cli import load_bundle_runtime  # noqa: E402
from keras_transformer.models import BertBackbone, BertMaskedLM, GPTBackbone, GPTCausalLM  # noqa: E402
from keras_transformer.samplers import BeamSampler  # noqa: E402

PROMPT, NEW_TOKENS = 16, 128


def best_time(fn, repeats):
    fn()  # warm-up: compilation, session initialisation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def generation(directory, repeats, new_tokens, threads):
    keras.utils.set_random_seed(0)
    lm = GPTCausalLM(GPTBackbone(8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024,
                                 max_sequence_length=512))
    bundle = lm.export(Path(directory) / "gpt", format="onnx")
    generator = load_bundle_runtime(bundle).Generator(bundle, num_threads=threads)
    rows = []
    for batch in (1, 8):
        prompts = np.random.default_rng(0).integers(1, 8000, (batch, PROMPT)).tolist()
        for name, keras_sampler, options in (
            ("greedy", "greedy", {"sampler": "greedy"}),
            ("beam-4", BeamSampler(num_beams=4), {"sampler": "beam", "num_beams": 4}),
        ):
            keras_time = best_time(lambda: lm.generate(prompts, max_new_tokens=new_tokens, sampler=keras_sampler,
                                                       stop_token_ids=None), repeats)
            onnx_time = best_time(lambda: generator.generate_ids(prompts, new_tokens, stop_token_ids=None, **options),
                                  repeats)
            rows.append((f"generate {name:6s} batch {batch}", batch * new_tokens / keras_time,
                         batch * new_tokens / onnx_time, "tokens/s"))
    return rows


def encoder(directory, repeats, threads):
    import onnxruntime

    keras.utils.set_random_seed(0)
    model = BertMaskedLM(BertBackbone(8000, num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=512,
                                      dropout=0.0))
    bundle = model.export(Path(directory) / "bert", format="onnx")
    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(bundle / "encoder.onnx"), options)
    rng = np.random.default_rng(0)
    feeds = {"token_ids": rng.integers(0, 8000, (8, 128)), "segment_ids": np.zeros((8, 128), np.int64),
             "padding_mask": np.ones((8, 128), np.int64), "mask_positions": rng.integers(0, 128, (8, 20))}
    x = {k: v.astype(bool) if k == "padding_mask" else v.astype("int32") for k, v in feeds.items()}
    keras_time = best_time(lambda: model.predict_on_batch(x), repeats)
    onnx_time = best_time(lambda: session.run(None, feeds), repeats)
    return [("encoder batch 8 x 128 (ms)", 1000 * keras_time, 1000 * onnx_time, "ms")]


def _load():
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 timed repeat, 32 new tokens")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    args = parser.parse_args()
    repeats, new_tokens = (1, 32) if args.quick else (3, NEW_TOKENS)
    load_before = _load()
    with tempfile.TemporaryDirectory() as directory:
        rows = generation(directory, repeats, new_tokens, args.threads) + encoder(directory, repeats, args.threads)
    backend = keras.config.backend()
    threads = args.threads or "default"
    print(f"\nKeras backend: {backend}; ONNX Runtime on CPU, {threads} threads. Ratio > 1: the bundle is faster.")
    # Both sides use every core: other work on the machine changes the numbers, and the ratios
    # (spinning ONNX Runtime threads suffer most), so the load is part of the result.
    print(f"Load average (1 min) before / after: {load_before} / {_load()} on {os.cpu_count()} CPUs.")
    print(f"{'':34s} {'keras':>10s} {'onnx':>10s} {'ratio':>7s}")
    for name, keras_value, onnx_value, unit in rows:
        ratio = onnx_value / keras_value if unit == "tokens/s" else keras_value / onnx_value
        print(f"{name:34s} {keras_value:10.1f} {onnx_value:10.1f} {ratio:7.2f}  {unit}")


if __name__ == "__main__":
    main()
