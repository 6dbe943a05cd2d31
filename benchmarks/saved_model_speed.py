"""The SavedModel's `generate` signatures against Keras `generate` on TensorFlow, and its export time, in one run.

    KERAS_BACKEND=tensorflow python benchmarks/saved_model_speed.py [--repeats 3]

A GPT of 4 layers, width 256, 4 heads, vocabulary 8000, max_length 512 (`export_speed.py`'s generation
shape, random weights), prompts of 16 tokens, 128 new tokens (no early stop), greedy and beam search with
4 beams at batch 1 and 8. Times `lm.export(path, format="tf_saved_model")`, then the loaded SavedModel's
`generate` / `generate_beam` (TensorFlow graph, no XLA) against `lm.generate` (the XLA-compiled loop),
each after a warm-up call, and prints tokens/s and the SavedModel/Keras ratio (> 1: the SavedModel is faster).
"""

import argparse
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


def best_time(fn, repeats):
    fn()  # warm-up: compilation, graph initialisation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if keras.config.backend() != "tensorflow":
        raise SystemExit("run with KERAS_BACKEND=tensorflow (the SavedModel is loaded in this process)")
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    lm = GPTCausalLM(
        GPTBackbone(8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024, max_sequence_length=512)
    )
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        lm.export(Path(directory) / "gpt", format="tf_saved_model")
        print(f"export: {time.perf_counter() - start:.1f} s")
        model = tf.saved_model.load(str(Path(directory) / "gpt"))
        rows = []
        for batch in (1, 8):
            prompts = np.random.default_rng(0).integers(1, 8000, (batch, PROMPT))
            served = {"token_ids": tf.constant(prompts, tf.int32), "padding_mask": tf.ones(prompts.shape, tf.bool)}
            common = {
                "max_new_tokens": tf.constant(NEW_TOKENS),
                "min_new_tokens": tf.constant(NEW_TOKENS),  # no early stop
                "repetition_penalty": tf.constant(1.0),
            }
            sampling = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
            cases = (
                ("greedy", "greedy", lambda: model.generate(**served, **common, **sampling)),
                ("beam-4", BeamSampler(num_beams=4), lambda: model.generate_beam(**served, **common, length_penalty=1.0)),
            )
            for name, keras_sampler, saved in cases:
                keras_time = best_time(
                    lambda: lm.generate(
                        prompts.tolist(), max_new_tokens=NEW_TOKENS, sampler=keras_sampler, stop_token_ids=None
                    ),
                    args.repeats,
                )
                saved_time = best_time(saved, args.repeats)
                rows.append((f"{name} batch {batch}", batch * NEW_TOKENS / keras_time, batch * NEW_TOKENS / saved_time))
    print(f"{'case':16s} {'Keras tok/s':>12s} {'SavedModel':>12s} {'ratio':>7s}")
    for name, keras_speed, saved_speed in rows:
        print(f"{name:16s} {keras_speed:12.1f} {saved_speed:12.1f} {saved_speed / keras_speed:7.2f}")


if __name__ == "__main__":
    main()
