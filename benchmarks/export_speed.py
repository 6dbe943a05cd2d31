"""Exported bundle vs Keras: generation tokens/s and encoder latency, in one run.

    KERAS_BACKEND=jax python benchmarks/export_speed.py [--quick]
    KERAS_BACKEND=jax python benchmarks/export_speed.py --t5 [--traced]

Generation: a GPT of 4 layers, width 256, 4 heads, vocabulary 8000 (the `gpt_tiny` preset's
shape, random weights), prompts of 16 tokens, 128 new tokens (no early stop), greedy and
beam search with 4 beams, batch 1 and 8: the ONNX bundle's runner (ONNX Runtime, CPU)
against `lm.generate` on the current backend (compiled loop, timed after a warm-up call).
Encoder: `bert_tiny`'s shape, batch 8 x 128 tokens: ONNX Runtime against Keras
`predict_on_batch`. Prints tokens/s (or ms) and the bundle/Keras ratios (> 1: the bundle is faster).

`--model PRESET [--format F]`: instead, the export itself at a real size: `PRESET` (a registered preset, e.g.
`smollm2_135m` or `qwen2_0_5b`; random weights where it has none) built on the current backend in a child process
and exported with `lm.export(path, format=F)` (default "onnx"; "onnx-int8" / "onnx-int4" for `quantize="int8"` /
`"int4"`); prints the wall time of the export, the peak RSS of the whole export (the child and, under JAX or
PyTorch, the TensorFlow process it may start), the RSS before the export began, and the size of what was written.

`--t5`: instead, T5 generation at `benchmarks/generate_seq2seq.py`'s shape (4 + 4 layers, d 256,
4 heads of 64, d_ff 1024 gated gelu, untied head, vocabulary 8000), sources of 32 tokens, 64 new
tokens (no early stop), greedy and beam-4 at batch 1 and 8: the bundle (its decoder the ONNX
kernels' in-place step) against `lm.generate`. `--traced` (TensorFlow backend, which exports
in-process) also times a bundle whose decoder is the traced fallback step.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import keras
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keras_transformer.bundle_runtime import load_bundle_runtime  # noqa: E402
from keras_transformer.models import (  # noqa: E402
    BertBackbone,
    BertMaskedLM,
    GPTBackbone,
    GPTCausalLM,
    T5Backbone,
    T5Seq2SeqLM,
)
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
    lm = GPTCausalLM(
        GPTBackbone(8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=512)
    )
    bundle = lm.export(Path(directory) / "gpt", format="onnx")
    generator = load_bundle_runtime(bundle).Generator(bundle, num_threads=threads)
    rows = []
    for batch in (1, 8):
        prompts = np.random.default_rng(0).integers(1, 8000, (batch, PROMPT)).tolist()
        for name, keras_sampler, options in (
            ("greedy", "greedy", {"sampler": "greedy"}),
            ("beam-4", BeamSampler(num_beams=4), {"sampler": "beam", "num_beams": 4}),
        ):
            keras_time = best_time(
                lambda: lm.generate(prompts, max_new_tokens=new_tokens, sampler=keras_sampler, stop_token_ids=None),
                repeats,
            )
            onnx_time = best_time(
                lambda: generator.generate_ids(prompts, new_tokens, stop_token_ids=None, **options), repeats
            )
            rows.append(
                (
                    f"generate {name:6s} batch {batch}",
                    batch * new_tokens / keras_time,
                    batch * new_tokens / onnx_time,
                    "tokens/s",
                )
            )
    return rows


def t5_generation(directory, repeats, new_tokens, threads, traced):
    from keras_transformer.export import graphs

    keras.utils.set_random_seed(0)
    lm = T5Seq2SeqLM(
        T5Backbone(
            8000,
            num_layers=4,
            num_heads=4,
            hidden_dim=256,
            intermediate_dim=1024,
            key_dim=64,
            activation="gated-gelu",
            dropout=0.0,
            tie_embedding_weights=False,
        )
    )
    bundles = {"in place": lm.export(Path(directory) / "t5", format="onnx")}
    if traced:  # the decoder the export falls back to when the kernels do not cover a step
        if keras.config.backend() != "tensorflow":
            raise SystemExit("--traced exports in-process: run it with KERAS_BACKEND=tensorflow")
        in_place, graphs._in_place_decode_graph = graphs._in_place_decode_graph, lambda *args: None
        try:
            bundles["traced"] = lm.export(Path(directory) / "t5_traced", format="onnx")
        finally:
            graphs._in_place_decode_graph = in_place
    runtime = load_bundle_runtime(bundles["in place"])
    generators = {name: runtime.Generator(bundle, num_threads=threads) for name, bundle in bundles.items()}
    assert generators["in place"]._in_place and not ("traced" in generators and generators["traced"]._in_place)
    rows = []
    for batch in (1, 8):
        sources = np.random.default_rng(batch).integers(1, 8000, (batch, 32))
        for name, keras_sampler, options in (
            ("greedy", "greedy", {"sampler": "greedy"}),
            ("beam-4", BeamSampler(num_beams=4), {"sampler": "beam", "num_beams": 4}),
        ):
            keras_time = best_time(
                lambda: lm.generate(
                    sources.astype("int32"), max_new_tokens=new_tokens, sampler=keras_sampler, stop_token_ids=None
                ),
                repeats,
            )
            for bundle_name, generator in generators.items():
                onnx_time = best_time(
                    lambda: generator.generate_ids(sources.tolist(), new_tokens, stop_token_ids=None, **options),
                    repeats,
                )
                rows.append(
                    (
                        f"t5 {name:6s} batch {batch} ({bundle_name})",
                        batch * new_tokens / keras_time,
                        batch * new_tokens / onnx_time,
                        "tokens/s",
                    )
                )
    return rows


def encoder(directory, repeats, threads):
    import onnxruntime

    keras.utils.set_random_seed(0)
    model = BertMaskedLM(
        BertBackbone(8000, num_layers=2, num_heads=2, hidden_dim=128, intermediate_dim=512, dropout=0.0)
    )
    bundle = model.export(Path(directory) / "bert", format="onnx")
    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(bundle / "encoder.onnx"), options)
    rng = np.random.default_rng(0)
    feeds = {
        "token_ids": rng.integers(0, 8000, (8, 128)),
        "segment_ids": np.zeros((8, 128), np.int64),
        "padding_mask": np.ones((8, 128), np.int64),
        "mask_positions": rng.integers(0, 128, (8, 20)),
    }
    x = {k: v.astype(bool) if k == "padding_mask" else v.astype("int32") for k, v in feeds.items()}
    keras_time = best_time(lambda: model.predict_on_batch(x), repeats)
    onnx_time = best_time(lambda: session.run(None, feeds), repeats)
    return [("encoder batch 8 x 128 (ms)", 1000 * keras_time, 1000 * onnx_time, "ms")]


def _load():
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "n/a"


MODEL_EXPORT = """
import os, resource, sys, tempfile, time
from pathlib import Path
preset, fmt = sys.argv[1:3]
import keras_transformer as kt
lm = kt.models.CausalLM.from_preset(preset)
params = lm.count_params()
rss = lambda who: resource.getrusage(who).ru_maxrss / 2**20
before = rss(resource.RUSAGE_SELF)
with tempfile.TemporaryDirectory() as directory:
    start = time.perf_counter()
    quantize = fmt.removeprefix("onnx-") if fmt in ("onnx-int8", "onnx-int4") else None
    target = Path(directory) / ("out.gguf" if fmt == "gguf" else "out")  # GGUF: one file
    path = Path(lm.export(target, format=fmt.split("-")[0], quantize=quantize))
    seconds = time.perf_counter() - start
    size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
peak = max(rss(resource.RUSAGE_SELF), rss(resource.RUSAGE_CHILDREN))
print(f"export {preset} ({params / 1e6:.0f}M parameters, {params * 4 / 2**30:.2f} GB float32) backend "
      f"{os.environ['KERAS_BACKEND']} format {fmt}: {seconds:.1f} s, "
      f"peak RSS {peak:.2f} GB (before the export {before:.2f} GB), written {size / 2**30:.2f} GB", flush=True)
"""


def model_export(preset, format):
    """The export of `preset` at its real size, in a child process on this backend (see the module docstring)."""
    env = dict(os.environ, KERAS_BACKEND=keras.config.backend())
    subprocess.run([sys.executable, "-c", MODEL_EXPORT, preset, format], check=True, env=env)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 timed repeat, 32 new tokens")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    parser.add_argument("--t5", action="store_true", help="T5 generation instead (64 new tokens)")
    parser.add_argument("--traced", action="store_true", help="with --t5: also the traced-decoder bundle (TensorFlow)")
    parser.add_argument("--model", help="export this preset at its real size instead (e.g. smollm2_135m)")
    parser.add_argument(
        "--format", default="onnx", help="with --model: onnx, onnx-int8, onnx-int4, tf_saved_model, huggingface or gguf"
    )
    args = parser.parse_args()
    if args.model:
        return model_export(args.model, args.format)
    repeats, new_tokens = (1, 32) if args.quick else (3, NEW_TOKENS)
    load_before = _load()
    with tempfile.TemporaryDirectory() as directory:
        if args.t5:
            rows = t5_generation(directory, repeats, 32 if args.quick else 64, args.threads, args.traced)
        else:
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
