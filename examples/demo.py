"""The main job, end to end: train a small GPT on the Python standard library, generate, export, deploy.

    make demo                        # default backend (TensorFlow)
    KERAS_BACKEND=jax make demo      # or jax / torch
    python examples/demo.py --steps 300 --out out/demo

Stages: read the corpus (the running interpreter's own standard library, nothing downloaded) ->
train with `model.fit` (Keras progress bars) -> held-out perplexity -> greedy, top-p and beam
samples -> ONNX bundle export -> generation from the bundle in a process without Keras.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.corpus import stdlib_texts  # noqa: E402

PROMPTS = ["def __init__(self", "import os\n", "    for line in"]


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
            print(f"  {title:<42} {seconds:7.1f} s")
        print(f"  {'total':<42} {sum(s for _, s in self.rows):7.1f} s")


def windows(tokenizer, texts, length, limit):
    """Concatenate the files' tokens (separated by the end token) and cut windows of `length + 1` ids."""
    ids = []
    for text in texts:
        ids.extend(tokenizer.tokenize(text))
        ids.append(tokenizer.eos_token_id)
        if len(ids) >= limit * (length + 1):
            break
    n = len(ids) // (length + 1)
    return np.asarray(ids[: n * (length + 1)], "int32").reshape(n, length + 1)


def as_batch(rows):
    x = {"token_ids": rows[:, :-1], "padding_mask": np.ones(rows[:, :-1].shape, bool)}
    return x, rows[:, 1:], np.ones(rows[:, 1:].shape, "float32")


def load_data(tokenizer, sequence_length, steps, batch_size):
    train = windows(tokenizer, stdlib_texts("train"), sequence_length, steps * batch_size)
    held_out = windows(tokenizer, stdlib_texts("held_out"), sequence_length, 64)
    print(f"  {len(train)} training windows and {len(held_out)} held-out windows of {sequence_length} tokens "
          f"from {sys.base_prefix}")
    return train, held_out


def build_model(tokenizer, sequence_length):
    backbone = kt.models.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size, num_layers=2, num_heads=4, hidden_dim=128,
        intermediate_dim=512, max_sequence_length=256,
    )
    preprocessor = kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=sequence_length)
    lm = kt.models.GPTCausalLM(backbone, preprocessor)
    lm.compile(optimizer=keras.optimizers.AdamW(3e-3, weight_decay=0.01))
    print(f"  GPTCausalLM: {lm.count_params():,} parameters on the {keras.config.backend()} backend")
    return lm


def train(lm, train_rows, epochs, batch_size):
    x, y, w = as_batch(train_rows)
    lm.fit(x, y, sample_weight=w, batch_size=batch_size, epochs=epochs, verbose=1)


def evaluate(lm, held_out):
    x, y, w = as_batch(held_out)
    results = lm.evaluate(x, y, sample_weight=w, batch_size=16, verbose=0, return_dict=True)
    print(f"  held-out loss {results['loss']:.3f}, perplexity {results['perplexity']:.1f}, "
          f"next-token accuracy {results['accuracy']:.1%}")


def sample(lm):
    samplers = {
        "greedy": "greedy",
        "top-p 0.9": kt.samplers.RandomSampler(temperature=0.8, top_p=0.9, seed=1),
        "beam 4": kt.samplers.BeamSampler(num_beams=4),
    }
    for name, sampler in samplers.items():
        outputs = lm.generate(PROMPTS, max_new_tokens=32, sampler=sampler)
        print(f"  --- {name}")
        for prompt, text in zip(PROMPTS, outputs):
            print("   ", repr(prompt), "->", repr(text[len(prompt):] if text.startswith(prompt) else text))


def export(lm, out):
    bundle = out / "gpt_onnx"
    lm.export(bundle, format="onnx", overwrite=True)
    print(f"  ONNX bundle: {bundle} ({', '.join(sorted(p.name for p in bundle.iterdir()))})")
    return bundle


def run_bundle(bundle):
    command = [sys.executable, str(bundle / "generate.py"), "--prompt", PROMPTS[0], "--sampler", "greedy",
               "--max-new-tokens", "32"]
    print("  $", " ".join(repr(c) if " " in c else c for c in command))
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    print("   ", result.stdout.strip().replace("\n", "\n    "))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=250, help="training steps (batches)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--out", default="out/demo")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(0)

    stages = Stages()
    tokenizer = kt.tokenizers.Tokenizer.load(kt.presets.resolve("gpt_tiny"))
    train_rows, held_out = stages.run("Read the standard library and tokenize", load_data, tokenizer,
                                      args.sequence_length, args.steps, args.batch_size)
    lm = stages.run("Build the model", build_model, tokenizer, args.sequence_length)
    stages.run("Train with model.fit", train, lm, train_rows, 1, args.batch_size)
    stages.run("Evaluate on held-out files", evaluate, lm, held_out)
    stages.run("Save the trained preset", lm.save_to_preset, out / "gpt_preset")
    print(f"  preset: {out / 'gpt_preset'}")
    stages.run("Generate: greedy, top-p and beam search", sample, lm)
    bundle = stages.run("Export an ONNX bundle", export, lm, out)
    stages.run("Generate from the bundle without Keras", run_bundle, bundle)
    stages.summary()
    print(f"\nEverything was written under {out}")


if __name__ == "__main__":
    main()
