"""BERT forward speed: our BertBackbone vs keras-hub's BertBackbone of the same shape, in one run.

    KERAS_BACKEND=jax python benchmarks/bert_forward.py [--repeats 5]

Both models: 4 layers, d 256, 4 heads, d_ff 1024, vocabulary 8000, 512 positions, no dropout,
random weights. Input: batch 8 x 128 random tokens, all real (padding mask all True). Each
model runs `predict_on_batch`-style inference through a compiled call (`jax.jit` / XLA
`tf.function` / eager `torch.no_grad`), after a warm-up call; the calls alternate for
`--repeats` rounds of 10 calls each. The ratio is keras-hub's time over ours (median of rounds).

keras-hub's BertBackbone computes its feed-forward activation with the tanh approximation of gelu
(`gelu_approximate`); ours defaults to BERT's exact (erf) gelu, as Hugging Face's `hidden_act="gelu"`
checkpoints need, which XLA expands into a longer polynomial. So the like-for-like row builds ours
with `activation="gelu_approximate"` (same weights' shapes, same computation as keras-hub's); the
second row is our default exact gelu against the same keras-hub model. All three run in one process,
alternating.
"""

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import paired  # noqa: E402

SHAPE = dict(vocabulary_size=8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)
BATCH, SEQUENCE, CALLS = 8, 128, 10


def ours(activation="gelu"):
    import keras_transformer as kt

    keras.utils.set_random_seed(0)
    return kt.models.BertBackbone(**SHAPE, max_sequence_length=512, dropout=0.0, activation=activation)


def keras_hub_model():
    import keras_hub

    keras.utils.set_random_seed(0)
    return keras_hub.models.BertBackbone(**SHAPE, max_sequence_length=512, dropout=0.0)


def compiled_forward(model, inputs):
    """A function running `model(inputs)` once, compiled for the backend, returning a host array."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        @jax.jit
        def forward(trainable, non_trainable, x):
            outputs, _ = model.stateless_call(trainable, non_trainable, x)
            return outputs

        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        return lambda: jax.block_until_ready(forward(trainable, non_trainable, inputs))
    if backend == "tensorflow":
        import tensorflow as tf

        forward = tf.function(lambda x: model(x, training=False), jit_compile=True)
        return lambda: keras.tree.map_structure(lambda t: t.numpy(), forward(inputs))
    import torch

    def forward():
        with torch.no_grad():
            return keras.tree.map_structure(lambda t: t.cpu().numpy(), model(inputs, training=False))

    return forward


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    inputs = {
        "token_ids": rng.integers(1, SHAPE["vocabulary_size"], (BATCH, SEQUENCE)).astype("int32"),
        "segment_ids": np.zeros((BATCH, SEQUENCE), "int32"),
        "padding_mask": np.ones((BATCH, SEQUENCE), bool),
    }
    if keras.config.backend() != "jax":
        inputs = {k: keras.ops.convert_to_tensor(v) for k, v in inputs.items()}
    forwards = [
        compiled_forward(ours("gelu_approximate"), inputs),  # keras-hub's activation
        compiled_forward(ours("gelu"), inputs),  # our default, exact gelu
        compiled_forward(keras_hub_model(), inputs),
    ]

    def repeat(fn):
        return lambda: [fn() for _ in range(CALLS)]

    firsts, best, per_round = paired([repeat(fn) for fn in forwards], args.repeats)
    print(
        f"BERT forward backend={keras.config.backend()}: batch {BATCH} x {SEQUENCE}, {args.repeats} rounds of "
        f"{CALLS} calls; keras-hub {best[2] / CALLS * 1e3:.2f} ms per call (best)",
        flush=True,
    )
    for i, label in enumerate(("tanh gelu, as keras-hub", "exact gelu (our default)")):
        ratio = np.median([h / o for o, h in zip(per_round[i], per_round[2])])
        print(
            f"  ours, {label:<25} {best[i] / CALLS * 1e3:6.2f} ms per call (best), keras-hub / ours {ratio:.2f} "
            f"(median of rounds)",
            flush=True,
        )


if __name__ == "__main__":
    main()
