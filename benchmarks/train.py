"""Training throughput: our GPTCausalLM vs keras-hub's GPT2CausalLM of the same shape, with `fit`.

Both models: 4 layers, d 256, 4 heads, d_ff 1024, vocab 8000, sequence 128, batch 16, no dropout,
random weights and random token ids, identical compile (AdamW, masked sparse cross-entropy).
One warm-up epoch (compilation) is excluded; the timed epoch runs `--steps` steps.

    KERAS_BACKEND=jax python benchmarks/train.py [--steps 20]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

SHAPE = dict(vocabulary_size=8000, num_layers=4, num_heads=4, hidden_dim=256, intermediate_dim=1024)
SEQUENCE, BATCH = 128, 16


def ours():
    import keras_transformer as kt

    backbone = kt.models.GPTBackbone(**SHAPE, max_sequence_length=SEQUENCE, dropout=0.0)
    return kt.models.GPTCausalLM(backbone)


def keras_hub_model():
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(**SHAPE, max_sequence_length=SEQUENCE, dropout=0.0)
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def tokens_per_second(model, steps):
    rng = np.random.default_rng(0)
    n = BATCH * steps
    ids = rng.integers(1, SHAPE["vocabulary_size"], size=(n, SEQUENCE + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((n, SEQUENCE), bool)}
    y, w = ids[:, 1:], np.ones((n, SEQUENCE), "float32")
    keras.Model.compile(
        model,
        optimizer=keras.optimizers.AdamW(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    keras.Model.fit(model, x, y, sample_weight=w, batch_size=BATCH, epochs=1, steps_per_epoch=2, verbose=0)
    start = time.perf_counter()
    keras.Model.fit(model, x, y, sample_weight=w, batch_size=BATCH, epochs=1, verbose=0)
    return n * SEQUENCE / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    backend = keras.config.backend()
    ours_tps = tokens_per_second(ours(), args.steps)
    hub_tps = tokens_per_second(keras_hub_model(), args.steps)
    print(f"train  backend={backend:<10} ours={ours_tps:9.0f} tok/s  keras-hub={hub_tps:9.0f} tok/s  "
          f"ratio={ours_tps / hub_tps:.2f}")


if __name__ == "__main__":
    main()
