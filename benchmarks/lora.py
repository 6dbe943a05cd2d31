"""`fit` with LoRA against full fine-tuning: time per step and peak memory, gpt_small's shape.

gpt_small (12 layers, d 768, 12 heads, vocab 50257; random weights), batch 8 x 128 random ids,
AdamW. Each mode runs in its own child process, so the peak resident memory (ru_maxrss) is
that mode's own. One warm-up step (compilation on JAX / TensorFlow) is excluded; `--steps` are timed.

    KERAS_BACKEND=torch python benchmarks/lora.py [--steps 3] [--rank 4]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BATCH, SEQUENCE = 8, 128


def run(mode, steps, rank):
    import keras
    import numpy as np

    import keras_transformer as kt

    lm = kt.models.GPTCausalLM.from_preset("gpt_small", preprocessor=None)
    if mode == "lora":
        lm.backbone.enable_lora(rank)
    lm.compile(optimizer=keras.optimizers.AdamW(1e-4))
    ids = np.random.default_rng(0).integers(1, 50257, (BATCH * (steps + 1), SEQUENCE + 1)).astype("int32")
    x = {"token_ids": ids[:, :-1], "padding_mask": np.ones((len(ids), SEQUENCE), bool)}
    y = ids[:, 1:]
    warm = {k: v[:BATCH] for k, v in x.items()}
    lm.fit(warm, y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    start = time.perf_counter()
    lm.fit({k: v[BATCH:] for k, v in x.items()}, y[BATCH:], batch_size=BATCH, epochs=1, verbose=0)
    seconds = (time.perf_counter() - start) / steps
    trainable = int(sum(np.prod(v.shape) for v in lm.trainable_weights))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    return {"mode": mode, "seconds_per_step": seconds, "peak_rss_mib": peak, "trainable_parameters": trainable}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--child", choices=("lora", "full"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.child, args.steps, args.rank)))
        return
    import keras

    rows = []
    for mode in ("full", "lora"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", mode, "--steps", str(args.steps), "--rank", str(args.rank)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"backend {keras.config.backend()}, gpt_small, batch {BATCH} x {SEQUENCE}, {args.steps} timed steps")
    for row in rows:
        print(
            f"{row['mode']:>5}: {row['seconds_per_step']:.2f} s/step, peak RSS {row['peak_rss_mib']:.0f} MiB, "
            f"{row['trainable_parameters']:,} trainable parameters"
        )


if __name__ == "__main__":
    main()
