"""The main job, end to end: fine-tune the trained `gpt_stdlib` on the Python standard library, generate,
export, deploy.

    make demo                        # default backend (TensorFlow)
    KERAS_BACKEND=jax make demo      # or jax / torch
    python examples/demo.py --steps 300 --out out/demo

Stages: read the corpus (the running interpreter's own standard library, nothing downloaded) ->
load the `gpt_stdlib` preset (a small GPT already trained on it) -> held-out perplexity -> a
short `model.fit` on whole source files, packed into windows (Keras progress bars) -> held-out
perplexity again -> greedy, top-p and beam samples, with the samplers' own options against
repetition -> ONNX bundle export -> generation from the bundle in a process without Keras.
"""

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from keras_transformer import startup

keras = (
    startup.import_keras_quietly()
)  # without TensorFlow's C++ startup lines (KERAS_TRANSFORMER_VERBOSE=1 shows them)
if keras.config.backend() == "tensorflow" and not startup.verbose():
    import tensorflow as tf

    # Each sampler below compiles its own decoding loop, traced once; TensorFlow counts those
    # loops as one function retraced and warns between the samples. Its other messages stay.
    tf.get_logger().addFilter(lambda record: "triggered tf.function retracing" not in record.getMessage())

import keras_transformer as kt  # noqa: E402
from keras_transformer.corpus import stdlib_texts  # noqa: E402

PROMPTS = ["def __init__(self", "    for line in", "import os\n"]
# A 0.9M-parameter model left to itself repeats a line ("import sys" x 16): the samplers' own
# options keep it from looping.
AGAINST_REPETITION = {"repetition_penalty": 1.2, "no_repeat_ngram_size": 4}
HELD_OUT_WINDOWS = 64


class Stages:
    """Times each stage and prints a summary at the end."""

    def __init__(self):
        self.rows = []

    def run(self, title, fn, *args, **kwargs):
        print(f"\n== {title}", flush=True)
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self.rows.append((title, time.perf_counter() - start))
        return result

    def summary(self):
        print("\n== Summary")
        for title, seconds in self.rows:
            print(f"  {title:<52} {seconds:7.1f} s")
        print(f"  {'total':<52} {sum(s for _, s in self.rows):7.1f} s")


def load_model(preset, sequence_length):
    # The preset's weights, with a packing preprocessor: whole files train, cut into windows.
    tokenizer = kt.presets.load_tokenizer(preset)
    preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=sequence_length, packing=True)
    lm = kt.models.GPTCausalLM.from_preset(preset, preprocessor=preprocessor)
    lm.compile(optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.01, clipnorm=1.0))  # low: it is trained
    print(f"  {preset}: GPTCausalLM, {lm.count_params():,} parameters, on the {keras.config.backend()} backend")
    return lm


def load_data(lm, steps, batch_size):
    """Packed windows: `steps * batch_size` drawn from many training files, and a fixed set of held-out ones."""
    files = [text for text in stdlib_texts("train") if text]  # a few stdlib files are empty
    random.Random(0).shuffle(files)
    # Read about four times the text needed (~4 characters per token), then draw windows from all of it:
    # the preset saw every file once already, and a few files alone pull it towards their style.
    needed_chars = 4 * 4 * steps * batch_size * lm.preprocessor.sequence_length
    train = []
    while files and sum(map(len, train)) < needed_chars:
        train.append(files.pop())
    x, y, w = lm.preprocessor(train)
    order = np.random.default_rng(0).permutation(len(y))[: steps * batch_size]
    train_windows = {name: value[order] for name, value in x.items()}, y[order], w[order]
    held_out = first(lm.preprocessor(stdlib_texts("held_out", max_chars=HELD_OUT_WINDOWS * 600)), HELD_OUT_WINDOWS)
    print(
        f"  {len(order)} training windows drawn from {len(train)} whole files and {len(held_out[1])} held-out "
        f"windows of {lm.preprocessor.sequence_length} tokens, from {sys.base_prefix}"
    )
    return train_windows, held_out


def first(windows, n):
    x, y, w = windows
    return {name: value[:n] for name, value in x.items()}, y[:n], w[:n]


def evaluate(lm, held_out, when):
    x, y, w = held_out
    results = lm.evaluate(x, y, sample_weight=w, batch_size=16, verbose=0, return_dict=True)
    print(f"  {when}: held-out perplexity {results['perplexity']:.1f}, next-token accuracy {results['accuracy']:.1%}")
    return results["perplexity"]


def train(lm, windows, batch_size):
    x, y, w = windows
    lm.fit(x, y, sample_weight=w, batch_size=batch_size, epochs=1, verbose=1)


def show(name, outputs, prompts=PROMPTS):
    print(f"  --- {name}")
    for prompt, text in zip(prompts, outputs):
        continuation = text[len(prompt) :] if text.startswith(prompt) else text
        print("    " + (prompt + continuation).replace("\n", "\n    ").rstrip())
        print("    ...")


def sample(lm, max_new_tokens):
    # The same greedy search, left alone and then with the options against repetition.
    show("greedy, as is", lm.generate(PROMPTS[-1:], max_new_tokens=max_new_tokens), PROMPTS[-1:])
    options = ", ".join(f"{k}={v}" for k, v in AGAINST_REPETITION.items())
    samplers = {
        f"greedy, {options}": "greedy",
        f"top-p 0.9 (temperature 0.7, seed 1), {options}": kt.samplers.RandomSampler(
            temperature=0.7, top_p=0.9, seed=1
        ),
        f"beam search (4 beams), {options}": kt.samplers.BeamSampler(num_beams=4),
    }
    for name, sampler in samplers.items():
        show(name, lm.generate(PROMPTS, max_new_tokens=max_new_tokens, sampler=sampler, **AGAINST_REPETITION))


def export(lm, out):
    bundle = out / "gpt_onnx"
    lm.export(bundle, format="onnx", overwrite=True)
    print(f"  ONNX bundle: {bundle} ({', '.join(sorted(p.name for p in bundle.iterdir()))})")
    return bundle


def run_bundle(bundle, max_new_tokens):
    command = [
        sys.executable,
        str(bundle / "generate.py"),
        "--prompt",
        PROMPTS[0],
        "--sampler",
        "beam",
        "--max-new-tokens",
        str(max_new_tokens),
    ]
    print("  $", " ".join(repr(c) if " " in c else c for c in command))
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    print("    " + result.stdout.strip().replace("\n", "\n    "))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt_stdlib", help="the trained preset to start from")
    parser.add_argument("--steps", type=int, default=100, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default="out/demo")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(0)

    stages = Stages()
    lm = stages.run(f"Load the trained preset {args.preset!r}", load_model, args.preset, args.sequence_length)
    train_windows, held_out = stages.run(
        "Read the standard library and pack it into windows", load_data, lm, args.steps, args.batch_size
    )
    before = stages.run("Evaluate on held-out files, before training", evaluate, lm, held_out, "before")
    stages.run("Train with model.fit", train, lm, train_windows, args.batch_size)
    after = stages.run("Evaluate on held-out files, after training", evaluate, lm, held_out, "after")
    print(f"  held-out perplexity {before:.1f} -> {after:.1f}")
    stages.run("Save the trained preset", lm.save_to_preset, out / "gpt_preset")
    print(f"  preset: {out / 'gpt_preset'}")
    stages.run("Generate: greedy, top-p and beam search", sample, lm, args.max_new_tokens)
    bundle = stages.run("Export an ONNX bundle", export, lm, out)
    stages.run("Generate from the bundle without Keras", run_bundle, bundle, args.max_new_tokens)
    stages.summary()
    print(f"\nEverything was written under {out}")


if __name__ == "__main__":
    main()
