"""Attention speed: `MultiHeadAttention`'s fused path against its explicit one, on the current device.

    KERAS_BACKEND=jax python benchmarks/attention.py [--batch 8 --length 512]

The layer calls `keras.ops.dot_product_attention` (fused kernels on GPUs: cuDNN / flash
attention where the backend has them) unless attention probabilities are requested; asking for
them (`return_attention_scores=True`) takes the explicit float32 softmax(Q K^T) V path. Both
run the same weights on the same causal self-attention; the script checks that their outputs
agree, then prints milliseconds per call (best of `--repeats`, after a compiling call) and the
explicit / fused ratio (> 1: the fused path is faster). Calls are compiled as a model's would be
(`jax.jit` on JAX, `tf.function(jit_compile=True)` on TensorFlow; PyTorch runs eagerly, as it
trains). `--dtype bfloat16` runs the layer in bfloat16, where GPUs have fused kernels (cuDNN's
flash attention on JAX, PyTorch's scaled_dot_product_attention kernels); in float32 the fused path
is the backend's plain implementation. `make gpu-check` runs both on every backend.

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


def compiled(fn):
    """`fn` (tensors in, a tensor out) compiled for the backend, as a model's call would be. Its
    inputs are arguments, not constants captured by the trace, which XLA could fold away."""
    backend = keras.config.backend()
    if backend == "jax":
        import jax

        return jax.jit(fn)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    import torch

    def eager(*args):
        with torch.no_grad():
            return fn(*args)

    return eager


def best_ms(fn, repeats, *args):
    keras.ops.convert_to_numpy(fn(*args))  # compile / warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        keras.ops.convert_to_numpy(fn(*args))  # waits for the device
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()

    from keras_transformer.layers import MultiHeadAttention

    keras.utils.set_random_seed(0)
    x = keras.ops.convert_to_tensor(
        np.random.default_rng(0).normal(size=(args.batch, args.length, args.width)).astype(args.dtype)
    )  # (B, T, D)
    layer = MultiHeadAttention(num_heads=args.heads, dtype=args.dtype)
    layer.build(x.shape)  # outside the compiled calls: they read its weights

    def fused(x):
        return layer(x, use_causal_mask=True)

    def explicit(x):
        return layer(x, use_causal_mask=True, return_attention_scores=True)[0]

    outputs = [keras.ops.convert_to_numpy(keras.ops.cast(compiled(f)(x), "float32")) for f in (fused, explicit)]
    difference = np.max(np.abs(outputs[0] - outputs[1]))
    tolerance = 1e-3 if args.dtype == "float32" else 5e-2 * max(1.0, float(np.max(np.abs(outputs[1]))))
    if difference > tolerance:
        raise SystemExit(f"fused and explicit attention disagree: max abs difference {difference:.2e}")

    # Timed: the output summed inside the compiled call, so that the wait for the device does not
    # also copy the (B, T, D) output to the host.
    fused_ms = best_ms(compiled(lambda x: keras.ops.sum(keras.ops.cast(fused(x), "float32"))), args.repeats, x)
    explicit_ms = best_ms(compiled(lambda x: keras.ops.sum(keras.ops.cast(explicit(x), "float32"))), args.repeats, x)
    print(
        f"attention backend={keras.config.backend()} device={device()} {args.dtype} B={args.batch} "
        f"T={args.length} H={args.heads} D={args.width}: fused {fused_ms:.2f} ms, explicit {explicit_ms:.2f} ms, "
        f"explicit/fused {explicit_ms / fused_ms:.2f} (max abs difference {difference:.1e})"
    )


if __name__ == "__main__":
    main()
