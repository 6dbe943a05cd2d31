"""Quantized ONNX bundles against the float bundle: size and greedy speed (gpt_small), fidelity (gpt_stdlib).

    python benchmarks/quantize.py [--repeats 5] [--threads N] [--only size,speed,fidelity] [--bundles DIR]

Each model is exported three times, `export(..., quantize=None | "int8" | "int4")` (a causal LM's
graphs are built by the ONNX kernels, which store the weights quantized as they write them).

- size: every file of each `gpt_small` bundle (124M parameters, random weights at GPT-2 small's
  shape), and its ratio to the float bundle (targets: int8 <= 30%, int4 <= 20%).
- speed: greedy batch 1 through the bundle runner (`Generator`, ONNX Runtime CPU), a prompt of 16
  random ids and 128 new tokens (no early stop); the three bundles alternate for `--repeats`
  rounds (`timing.paired`), tokens/s is each one's best round and the speed-up the median over the
  rounds of float time / quantized time (target >= 1.3x).
- fidelity: `gpt_stdlib`'s held-out windows (its model card's: tools/train_presets.py's
  `gpt_eval_data`, 256 windows of 128 predicted tokens), each window alone through each bundle's
  prefill graph: perplexity (targets: within 3% of float for int8, 8% for int4) and how often the
  top token equals the float graph's; then greedy continuations (32 new tokens) of the first
  `--prompts` held-out windows' first 32 tokens, through the runner, one prompt at a time, against
  the float bundle's: tokens equal position by position, continuations equal in full, and the mean
  number of tokens before the first difference.

Exports run under the TensorFlow backend in this process (the export path; KERAS_BACKEND defaults
to tensorflow here). `--bundles DIR` keeps the float exports in DIR and reuses them on the next run
(the quantized copies are always made anew).
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_presets as recipes  # noqa: E402
from timing import paired  # noqa: E402

from keras_transformer.bundle_runtime import load_bundle_runtime  # noqa: E402
from keras_transformer.export import export_model  # noqa: E402

MODES = ("int8", "int4")
SIZE_TARGETS = {"int8": 0.30, "int4": 0.20}
PERPLEXITY_TARGETS = {"int8": 0.03, "int4": 0.08}
SPEED_TARGET = 1.3
PROMPT, NEW_TOKENS = 16, 128
CONTINUATION_PROMPT, CONTINUATION_TOKENS = 32, 32


def bundles(preset, directory):
    """{"float": dir, "int8": dir, "int4": dir}: the preset's bundles, exported with each `quantize`."""
    import keras_transformer as kt

    directory = Path(directory)
    lm = kt.models.CausalLM.from_preset(preset)
    out = {}
    for mode in ("float", *MODES):
        out[mode] = directory / preset / mode
        start = time.perf_counter()
        export_model(lm, out[mode], overwrite=True, quantize=None if mode == "float" else mode)
        print(f"{preset}: {mode} bundle exported in {time.perf_counter() - start:.1f} s", flush=True)
    return out


def size_table(dirs):
    def total(directory, pattern="*"):
        return sum(f.stat().st_size for f in Path(directory).glob(pattern) if f.is_file())

    print("\nsize: gpt_small bundles (all files; graphs = *.onnx and their external data)")
    print(f"{'bundle':<8}{'MB':>10}{'graphs MB':>11}{'ratio':>8}{'target':>8}")
    reference = total(dirs["float"])
    for name, directory in dirs.items():
        size = total(directory)
        graphs = total(directory, "*.onnx") + total(directory, "*.data")
        target = f"<= {SIZE_TARGETS[name]:.0%}" if name in SIZE_TARGETS else ""
        print(f"{name:<8}{size / 1e6:>10.1f}{graphs / 1e6:>11.1f}{size / reference:>8.1%}{target:>8}")


def speed_table(dirs, repeats, threads):
    generators = {name: load_bundle_runtime(d).Generator(d, num_threads=threads) for name, d in dirs.items()}
    prompt = np.random.default_rng(0).integers(1, 50257, (1, PROMPT)).tolist()

    def run(generator):
        return lambda: generator.generate_ids(prompt, NEW_TOKENS, sampler="greedy", stop_token_ids=None)

    names, load = list(generators), _load()
    firsts, best, per_fn = paired([run(generators[name]) for name in names], repeats)
    print(
        f"\nspeed: gpt_small, greedy batch 1, prompt {PROMPT}, {NEW_TOKENS} new tokens, {repeats} alternating "
        f"rounds, threads {threads or 'ONNX Runtime default'}; load average before: {load}"
    )
    print(f"{'bundle':<8}{'tok/s':>8}{'ms/token':>10}{'speed-up':>10}{'rounds min-max':>16}{'1st call s':>12}")
    for i, name in enumerate(names):
        ratios = [f / q for f, q in zip(per_fn[0], per_fn[i])]  # float time / this bundle's time, per round
        target = f"  (target >= {SPEED_TARGET}x)" if name != "float" else ""
        print(
            f"{name:<8}{NEW_TOKENS / best[i]:>8.1f}{best[i] / NEW_TOKENS * 1e3:>10.1f}{np.median(ratios):>9.2f}x"
            f"{min(ratios):>8.2f}-{max(ratios):.2f}{firsts[i]:>12.1f}{target}"
        )
    print(f"load average after: {_load()}")


def fidelity_table(dirs, prompts):
    import keras_transformer as kt
    from keras_transformer import presets

    record = json.loads((presets.resolve("gpt_stdlib") / "metrics.json").read_text())
    tokenizer = kt.models.CausalLM.from_preset("gpt_stdlib").preprocessor.tokenizer
    inputs, labels = recipes.gpt_eval_data(tokenizer)
    assert recipes.fingerprint(inputs, labels) == record["eval_data_sha256"], "other held-out data than the card's"
    generators = {name: load_bundle_runtime(d).Generator(d) for name, d in dirs.items()}
    scores = {name: _held_out(generator.sessions["prefill"], inputs, labels) for name, generator in generators.items()}
    starts = inputs[:prompts, :CONTINUATION_PROMPT].tolist()
    continuations = {
        name: [
            generator.generate_ids([row], CONTINUATION_TOKENS, sampler="greedy", stop_token_ids=None)[0]
            for row in starts
        ]
        for name, generator in generators.items()
    }
    reference_ppl, reference_top = scores["float"]
    print(
        f"\nfidelity: gpt_stdlib, {len(inputs)} held-out windows of {inputs.shape[1]} predicted tokens, each alone "
        f"through the prefill graph (card, Keras float32: perplexity {record['metrics']['perplexity']:.4f}); "
        f"greedy continuations of {CONTINUATION_TOKENS} tokens after the first {CONTINUATION_PROMPT} tokens of "
        f"{prompts} held-out windows, one at a time"
    )
    print(
        f"{'bundle':<8}{'perplexity':>11}{'vs float':>10}{'target':>9}{'top-1 = float':>15}"
        f"{'tokens = float':>16}{'rows = float':>14}{'tokens before 1st diff':>24}"
    )
    for name in dirs:
        ppl, top = scores[name]
        same = np.array(continuations[name]) == np.array(continuations["float"])  # (N, new tokens)
        prefix = np.where(same.all(1), same.shape[1], np.argmin(same, axis=1))
        target = f"<= {PERPLEXITY_TARGETS[name]:.0%}" if name in PERPLEXITY_TARGETS else ""
        print(
            f"{name:<8}{ppl:>11.4f}{ppl / reference_ppl - 1:>+10.2%}{target:>9}{np.mean(top == reference_top):>15.2%}"
            f"{same.mean():>16.2%}{f'{same.all(1).sum()}/{len(same)}':>14}{prefix.mean():>24.1f}"
        )


def _held_out(session, inputs, labels):
    """Perplexity over every label and the argmax at every position, one window per run: (float, (W, T))."""
    nll, top = 0.0, []
    for ids, target in zip(inputs.astype(np.int64), labels):
        logits = session.run(["logits"], {"input_ids": ids[None], "attention_mask": np.ones((1, ids.size), np.int64)})
        logits = logits[0][0].astype(np.float64)  # (T, V)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        nll -= log_probs[np.arange(target.size), target].sum()
        top.append(logits.argmax(-1))
    return float(np.exp(nll / labels.size)), np.array(top)


def _load():
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads (default: its own)")
    parser.add_argument("--prompts", type=int, default=32, help="held-out prompts for the greedy continuations")
    parser.add_argument("--only", default="size,speed,fidelity", help="a comma-separated subset of size,speed,fidelity")
    parser.add_argument("--bundles", default=None, help="keep (and reuse) the float exports in this directory")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    import onnxruntime

    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), "
        f"onnxruntime {onnxruntime.__version__}, load average {_load()}"
    )
    scratch = None if args.bundles else tempfile.TemporaryDirectory(prefix="quantize_benchmark_")
    directory = args.bundles or scratch.name
    try:
        if parts & {"size", "speed"}:
            small = bundles("gpt_small", directory)
            if "size" in parts:
                size_table(small)
            if "speed" in parts:
                speed_table(small, args.repeats, args.threads)
        if "fidelity" in parts:
            fidelity_table(bundles("gpt_stdlib", directory), args.prompts)
    finally:
        if scratch is not None:
            scratch.cleanup()


if __name__ == "__main__":
    main()
