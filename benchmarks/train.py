"""Training throughput with `fit`: ours vs keras-hub on the same backend (and vs transformers on PyTorch).

Shapes (`--shape`):
  cpu   GPT, 4 layers, d 256, 4 heads, d_ff 1024, vocab 8000, sequence 128, batch 16 (the default)
  gpt2  GPT-2 124M: 12 layers, d 768, 12 heads, d_ff 3072, vocab 50257, sequence 1024, batch 8
  bert  BERT-base masked LM: 12 layers, d 768, 12 heads, d_ff 3072, vocab 30522, sequence 512, batch 8,
        15% of the positions predicted
No dropout, random weights and ids, the same compile on every row (AdamW, sparse cross-entropy, no
metrics). Rows:
  ours             the task's default `compile()` (XLA on TensorFlow, jit on JAX, the compiled step
                   on PyTorch: warmed up until it has compiled)
  ours eager       `compile(jit_compile=False)`: Keras's eager `train_step` on PyTorch, a tf.function
                   without XLA on TensorFlow (Keras's own default on a CPU); not on JAX
  keras-hub        its fastest `fit`: XLA on TensorFlow, jit on JAX; eager on PyTorch (Keras's own
                   `jit_compile=True` there recompiles until Dynamo's cache limit)
  ours mixed_bfloat16  with `--rows ...,ours-bf16` under `--dtype float32`: ours built under mixed_bfloat16
  transformers     PyTorch only: GPT2LMHeadModel / BertForMaskedLM, `torch.compile`, AdamW
                   (fused on CUDA), bfloat16 autocast under `--dtype mixed_bfloat16`
Each row first runs until compiled (not timed); then `--rounds` rounds of `--steps` steps, the rows
in turn within a round (this machine's speed drifts), best round per row. `--function evaluate` or
`predict` times those instead of `fit` (the Keras rows only; MFU then counts the forward pass,
2 x parameters + 4 x layers x sequence x width per token). MFU = tokens/s x (6 x
parameters + 12 x layers x sequence x width) / the device's peak (known GPUs, or `--peak-tflops`).

    KERAS_BACKEND=torch python benchmarks/train.py [--shape gpt2] [--dtype mixed_bfloat16] [--steps 20]
        [--function fit|evaluate|predict]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

SHAPES = {
    # a quick check on a CPU that the script runs (every peer), not a measurement
    "tiny": dict(
        family="gpt",
        vocabulary_size=512,
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        sequence=32,
        batch=4,
    ),
    "cpu": dict(
        family="gpt",
        vocabulary_size=8000,
        num_layers=4,
        num_heads=4,
        hidden_dim=256,
        intermediate_dim=1024,
        sequence=128,
        batch=16,
    ),
    "gpt2": dict(
        family="gpt",
        vocabulary_size=50257,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
        sequence=1024,
        batch=8,
    ),
    "bert": dict(
        family="bert",
        vocabulary_size=30522,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
        sequence=512,
        batch=8,
    ),
}
# Dense peak TFLOP/s by device name and compute dtype (vendor data sheets).
PEAKS = {
    "H100": {"bfloat16": 989.0, "float32": 67.0},
    "H200": {"bfloat16": 989.0, "float32": 67.0},
    "A100": {"bfloat16": 312.0, "float32": 19.5},
}
MASKED_FRACTION = 0.15
STEP_FUNCTIONS = {"fit": "train_function", "evaluate": "test_function", "predict": "predict_function"}


def _layers(shape):
    return {k: shape[k] for k in ("vocabulary_size", "num_layers", "num_heads", "hidden_dim", "intermediate_dim")}


def ours(shape):
    import keras_transformer as kt

    if shape["family"] == "gpt":
        backbone = kt.models.GPTBackbone(**_layers(shape), max_sequence_length=shape["sequence"], dropout=0.0)
        return kt.models.GPTCausalLM(backbone)
    backbone = kt.models.BertBackbone(**_layers(shape), max_sequence_length=shape["sequence"], dropout=0.0)
    return kt.models.BertMaskedLM(backbone)


def keras_hub_model(shape):
    import keras_hub

    if shape["family"] == "gpt":
        backbone = keras_hub.models.GPT2Backbone(**_layers(shape), max_sequence_length=shape["sequence"], dropout=0.0)
        return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    backbone = keras_hub.models.BertBackbone(**_layers(shape), max_sequence_length=shape["sequence"], dropout=0.0)
    return keras_hub.models.BertMaskedLM(backbone, preprocessor=None)


def batches(shape, steps, seed=0):
    """(x, y) for `steps` batches: next-token ids for GPT, masked positions and their ids for BERT."""
    rng = np.random.default_rng(seed)
    n, length, vocab = shape["batch"] * steps, shape["sequence"], shape["vocabulary_size"]
    ids = rng.integers(1, vocab, size=(n, length + 1)).astype("int32")
    if shape["family"] == "gpt":
        return {"token_ids": ids[:, :-1], "padding_mask": np.ones((n, length), bool)}, ids[:, 1:]
    predicted = int(length * MASKED_FRACTION)
    positions = np.sort(rng.permuted(np.tile(np.arange(length), (n, 1)), axis=1)[:, :predicted], axis=1)
    x = {
        "token_ids": ids[:, :-1],
        "segment_ids": np.zeros((n, length), "int32"),
        "padding_mask": np.ones((n, length), bool),
        "mask_positions": positions.astype("int32"),
    }
    return x, np.take_along_axis(ids[:, :-1], positions, axis=1)


class KerasRow:
    """One Keras model's `fit`, compiled as the row says; `run(steps)` trains `steps` steps."""

    def __init__(self, name, model, shape, steps, jit_compile, ours_compile, function="fit"):
        self.name, self.model, self.shape, self.function = name, model, shape, function
        self.x, self.y = batches(shape, steps)
        kwargs = dict(
            optimizer=keras.optimizers.AdamW(1e-4), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        if ours_compile:  # the task's compile (its jit_compile default), without its default metrics
            model.compile(metrics=None, weighted_metrics=None, jit_compile=jit_compile, **kwargs)
        else:
            keras.Model.compile(model, jit_compile=jit_compile, **kwargs)

    def run(self, steps=None):
        batch = self.shape["batch"]
        if self.function == "fit":
            keras.Model.fit(
                self.model, self.x, self.y, batch_size=batch, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False
            )
            return
        n = batch * steps if steps else len(self.y)
        x = {name: value[:n] for name, value in self.x.items()}
        if self.function == "evaluate":
            keras.Model.evaluate(self.model, x, self.y[:n], batch_size=batch, verbose=0)
        else:
            keras.Model.predict(self.model, x, batch_size=batch, verbose=0)

    def warm_up(self):
        from keras_transformer.models import compiled_step

        self.run(2)
        for _ in range(200):  # ours on PyTorch: the default compiles after some seconds of eager steps
            step = getattr(self.model, STEP_FUNCTIONS[self.function])
            if not isinstance(step, compiled_step.CompiledStep) or step.compiled_steps or step._eager_reason:
                return
            self.run(2)


class TransformersRow:
    """transformers' model of the same shape, `torch.compile`d, in a plain PyTorch training loop."""

    def __init__(self, shape, steps, dtype):
        import torch
        import transformers

        self.torch, self.shape = torch, shape
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if shape["family"] == "gpt":
            config = transformers.GPT2Config(
                vocab_size=shape["vocabulary_size"],
                n_positions=shape["sequence"],
                n_embd=shape["hidden_dim"],
                n_layer=shape["num_layers"],
                n_head=shape["num_heads"],
                n_inner=shape["intermediate_dim"],
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
            )
            model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.BertConfig(
                vocab_size=shape["vocabulary_size"],
                hidden_size=shape["hidden_dim"],
                num_hidden_layers=shape["num_layers"],
                num_attention_heads=shape["num_heads"],
                intermediate_size=shape["intermediate_dim"],
                max_position_embeddings=shape["sequence"],
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            )
            model = transformers.BertForMaskedLM(config)
        self.model = model.to(self.device).train()
        fused = {"fused": True} if self.device == "cuda" else {"foreach": True}
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, **fused)
        self.autocast = dtype == "mixed_bfloat16"
        x, y = batches(shape, steps)
        b = shape["batch"]
        self.batches = []
        for i in range(steps):
            ids = torch.as_tensor(x["token_ids"][i * b : (i + 1) * b], device=self.device).long()
            if shape["family"] == "gpt":
                labels = ids  # GPT2LMHeadModel shifts them: position t predicts id t + 1
            else:
                labels = torch.full_like(ids, -100)
                labels.scatter_(
                    1,
                    torch.as_tensor(x["mask_positions"][i * b : (i + 1) * b]).long(),
                    torch.as_tensor(y[i * b : (i + 1) * b]).long(),
                )
            self.batches.append((ids, labels.to(self.device)))
        self.step = torch.compile(self._step)

    def _step(self, ids, labels):
        torch = self.torch
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.autocast):
            loss = self.model(input_ids=ids, labels=labels).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def run(self, steps=None):
        for ids, labels in self.batches[:steps]:
            loss = self.step(ids, labels)
        float(loss)  # wait for the device

    def warm_up(self):
        self.run(3)


def flops_per_token(shape, function="fit"):
    d, layers, v, f, t = (
        shape["hidden_dim"],
        shape["num_layers"],
        shape["vocabulary_size"],
        shape["intermediate_dim"],
        shape["sequence"],
    )
    parameters = v * d + t * d + layers * (4 * d * d + 2 * d * f)  # embeddings (tied head) and blocks
    if function != "fit":  # the forward pass only: a third of a training step
        return 2 * parameters + 4 * layers * t * d
    return 6 * parameters + 12 * layers * t * d


def peak_flops(dtype, override):
    if override:
        return override * 1e12
    if keras.config.backend() == "torch":
        import torch

        name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    elif keras.config.backend() == "jax":
        import jax

        name = jax.devices()[0].device_kind
    else:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "") if gpus else ""
    compute = "bfloat16" if dtype == "mixed_bfloat16" else "float32"
    for key, peaks in PEAKS.items():
        if key in name:
            return peaks[compute] * 1e12
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="cpu")
    parser.add_argument("--dtype", choices=["float32", "mixed_bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--rows",
        default="ours,ours-eager,keras-hub,transformers",
        help="comma-separated subset of the rows (also: ours-bf16, ours under mixed_bfloat16 beside a float32 run)",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak, for MFU")
    parser.add_argument(
        "--function",
        choices=["fit", "evaluate", "predict"],
        default="fit",
        help="what the Keras rows time (transformers: fit only)",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.rounds < 1:
        raise ValueError(f"--steps and --rounds must be >= 1. Received: {args.steps}, {args.rounds}")
    shape, backend = SHAPES[args.shape], keras.config.backend()
    keras.config.set_dtype_policy(args.dtype)
    wanted = set(args.rows.split(","))
    xla = backend != "torch"
    rows = []
    if "ours" in wanted:
        rows.append(KerasRow("ours", ours(shape), shape, args.steps, "auto", True, args.function))
    if "ours-bf16" in wanted and args.dtype == "float32":  # does mixed precision pay on this device?
        keras.config.set_dtype_policy("mixed_bfloat16")
        rows.append(KerasRow("ours mixed_bfloat16", ours(shape), shape, args.steps, "auto", True, args.function))
        keras.config.set_dtype_policy(args.dtype)
    if "ours-eager" in wanted and backend != "jax":  # TensorFlow: tf.function without XLA
        name = "ours eager" if backend == "torch" else "ours jit_compile=False"
        rows.append(KerasRow(name, ours(shape), shape, args.steps, False, True, args.function))
    if "keras-hub" in wanted:
        rows.append(KerasRow("keras-hub", keras_hub_model(shape), shape, args.steps, xla, False, args.function))
    if "transformers" in wanted and backend == "torch" and args.function == "fit":
        rows.append(TransformersRow(shape, args.steps, args.dtype))
        rows[-1].name = "transformers+torch.compile"
    for row in rows:
        start = time.perf_counter()
        row.warm_up()
        row.warmup_seconds = time.perf_counter() - start
    best = {row.name: float("inf") for row in rows}
    for _ in range(args.rounds):
        for row in rows:
            start = time.perf_counter()
            row.run()
            best[row.name] = min(best[row.name], time.perf_counter() - start)
    tokens = args.steps * shape["batch"] * shape["sequence"]
    peak = peak_flops(args.dtype, args.peak_tflops)
    flops = flops_per_token(shape, args.function)
    print(
        f"{args.function}  shape={args.shape} dtype={args.dtype} backend={backend} steps={args.steps} "
        f"rounds={args.rounds} flops/token={flops:.3g}"
    )
    for row in rows:
        tps = tokens / best[row.name]
        mfu = f"{100 * tps * flops / peak:5.1f}%" if peak else "  n/a"
        print(
            f"  {row.name:<28} {tps:10.0f} tok/s  {tps * flops / 1e12:7.3f} TFLOP/s  "
            f"MFU {mfu}  (warm-up {row.warmup_seconds:.0f} s)"
        )
    if "ours" in best:
        ours_tps = tokens / best["ours"]
        for name in best:
            if name != "ours":
                print(f"  ours / {name:<21} {ours_tps / (tokens / best[name]):.2f}")


if __name__ == "__main__":
    main()
