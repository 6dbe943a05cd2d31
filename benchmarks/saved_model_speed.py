"""The SavedModel's `generate` signatures against Keras `generate` on TensorFlow, and its export time, in one run.

    KERAS_BACKEND=tensorflow python benchmarks/saved_model_speed.py [--repeats 4] [--against OTHER_CHECKOUT]

A GPT of 4 layers, width 256, 4 heads, vocabulary 8000, max_length 512 (`export_speed.py`'s generation
shape, random weights), prompts of 16 tokens, 128 new tokens (no early stop), greedy and beam search with
4 beams at batch 1 and 8. Times `lm.export(path, format="tf_saved_model")`, then the loaded SavedModel's
`generate` / `generate_beam` (TensorFlow graph, no XLA) against `lm.generate` (the XLA-compiled loop),
each after a warm-up call, the calls alternating round by round (best of `--repeats`), and prints tokens/s
and the SavedModel/Keras ratio (> 1: the SavedModel is faster).

`--against OTHER_CHECKOUT`: also export the same model (same seed) with another checkout of this repository
(e.g. a `git worktree` of an older commit), in a child process, and time its SavedModel in the same rounds:
the last column is this tree's speed over the other's.
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

from keras_transformer.models import GPTBackbone, GPTCausalLM  # noqa: E402
from keras_transformer.samplers import BeamSampler  # noqa: E402

PROMPT, NEW_TOKENS = 16, 128

EXPORT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import keras
from keras_transformer.models import GPTBackbone, GPTCausalLM
keras.utils.set_random_seed(0)
lm = GPTCausalLM(GPTBackbone(8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024,
                             max_sequence_length=512))
start = time.perf_counter()
lm.export(sys.argv[2], format="tf_saved_model")
print(f"{time.perf_counter() - start:.1f}")
"""


def export(checkout, path):
    """Export the benchmark's model with the checkout's code, in a child process: its export seconds."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [sys.executable, "-c", EXPORT, str(checkout), str(path)], env=env, check=True, capture_output=True, text=True
    )
    return float(result.stdout.split()[-1])


def paired_best(fns, repeats):
    """Best seconds of each function, called in turn round by round after one warm-up call each."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: min(values) for name, values in times.items()}


def served_calls(model, prompts):
    import tensorflow as tf

    served = {"token_ids": tf.constant(prompts, tf.int32), "padding_mask": tf.ones(prompts.shape, tf.bool)}
    common = {
        "max_new_tokens": tf.constant(NEW_TOKENS),
        "min_new_tokens": tf.constant(NEW_TOKENS),  # no early stop
        "repetition_penalty": tf.constant(1.0),
    }
    greedy = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    return {
        "greedy": lambda: model.signatures["generate"](
            **served, **common, **{k: tf.constant(v) for k, v in greedy.items()}
        ),
        "beam-4": lambda: model.signatures["generate_beam"](**served, **common, length_penalty=tf.constant(1.0)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--against", type=Path, default=None, help="another checkout whose SavedModel is timed too")
    args = parser.parse_args()
    if keras.config.backend() != "tensorflow":
        raise SystemExit("run with KERAS_BACKEND=tensorflow (the SavedModels are loaded in this process)")
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    lm = GPTCausalLM(
        GPTBackbone(8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=512)
    )
    with tempfile.TemporaryDirectory() as directory:
        checkouts = {"this tree": Path(__file__).resolve().parents[1]}
        if args.against is not None:
            checkouts["against"] = args.against.resolve()
        models = {}
        for name, checkout in checkouts.items():
            seconds = export(checkout, Path(directory) / name.replace(" ", "_"))
            print(f"export ({name}, {checkout}): {seconds:.1f} s", flush=True)
            models[name] = tf.saved_model.load(str(Path(directory) / name.replace(" ", "_")))
        print(
            f"{'case':16s} {'Keras tok/s':>12s} " + " ".join(f"{name:>12s}" for name in models) + "  SavedModel/Keras"
        )
        for batch in (1, 8):
            prompts = np.random.default_rng(0).integers(1, 8000, (batch, PROMPT))
            for case, keras_sampler in (("greedy", "greedy"), ("beam-4", BeamSampler(num_beams=4))):
                fns = {name: served_calls(model, prompts)[case] for name, model in models.items()}
                fns["keras"] = lambda: lm.generate(
                    prompts.tolist(), max_new_tokens=NEW_TOKENS, sampler=keras_sampler, stop_token_ids=None
                )
                best = paired_best(fns, args.repeats)
                speed = {name: batch * NEW_TOKENS / seconds for name, seconds in best.items()}
                row = f"{case} batch {batch}"
                columns = " ".join(f"{speed[name]:12.1f}" for name in models)
                ratio = speed["this tree"] / speed["keras"]
                against = (
                    f"  this tree / against {speed['this tree'] / speed['against']:.2f}" if "against" in speed else ""
                )
                print(f"{row:16s} {speed['keras']:12.1f} {columns}  {ratio:.2f}{against}", flush=True)


if __name__ == "__main__":
    main()
