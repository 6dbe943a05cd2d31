"""Attention speed: `MultiHeadAttention`'s fused path against its explicit one, on the current device.

    KERAS_BACKEND=jax python benchmarks/attention.py [--batch 8 --length 512]

The layer calls `keras.ops.dot_product_attention` (fused kernels on GPUs: cuDNN / flash
attention where the backend has them) unless attention probabilities are requested; asking for
them (`return_attention_scores=True`) takes the explicit float32 softmax(Q K^T) V path. Both
run the same weights on the same causal self-attention; the script checks that their outputs
agree, then prints milliseconds per call (best of `--repeats`, after a compiling call) and the
explicit / fused ratio (> 1: the fused path is faster). `make gpu-check` runs it on every backend.

Axes: B batch, T sequence length, D model width.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402


def device():
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        return str(jax.devices()[0])
    if backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        return gpus[0].name if gpus else "CPU"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"


def best_ms(fn, repeats):
    keras.ops.convert_to_numpy(fn())  # compile / warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(fn())  # waits for the device
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from keras_transformer.layers import MultiHeadAttention

    keras.utils.set_random_seed(0)
    x = keras.ops.convert_to_tensor(
        np.random.default_rng(0).normal(size=(args.batch, args.length, args.width)).astype("float32")
    )  # (B, T, D)
    layer = MultiHeadAttention(num_heads=args.heads)
    fused = layer(x, use_causal_mask=True)
    explicit, _ = layer(x, use_causal_mask=True, return_attention_scores=True)
    difference = np.max(np.abs(keras.ops.convert_to_numpy(fused) - keras.ops.convert_to_numpy(explicit)))
    if difference > 1e-3:
        raise SystemExit(f"fused and explicit attention disagree: max abs difference {difference:.2e}")

    fused_ms = best_ms(lambda: layer(x, use_causal_mask=True), args.repeats)
    explicit_ms = best_ms(lambda: layer(x, use_causal_mask=True, return_attention_scores=True)[0], args.repeats)
    print(f"attention backend={keras.config.backend()} device={device()} B={args.batch} T={args.length} "
          f"H={args.heads} D={args.width}: fused {fused_ms:.2f} ms, explicit {explicit_ms:.2f} ms, "
          f"explicit/fused {explicit_ms / fused_ms:.2f} (max abs difference {difference:.1e})")


if __name__ == "__main__":
    main()
