"""Run tiny GPT, BERT and T5 tasks on one device, under DataParallel and under ModelParallel; print JSON.

Run by tests/distribution/test_distribution.py in its own process, because JAX reads
XLA_FLAGS once, when it is imported:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax python tests/distribution/distributed_run.py

For each family: one `fit` step (default AdamW) from the same initial weights on one device,
on a DataParallel mesh (8,) and on a ModelParallel mesh (2, 4); the losses and updated
weights, the sharding spec of every variable of the model-parallel copy, and greedy
`generate` outputs (causal and seq2seq) on one device and under ModelParallel. Then the
errors of bad layouts. The test file compares; this script only measures.
"""

import json
import os
import random
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
# Eight virtual CPU devices; the unoptimised XLA backend compiles these tiny graphs twice as fast.
FLAGS = (
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true"
)
os.environ.setdefault("XLA_FLAGS", FLAGS)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer.models import (  # noqa: E402
    BertBackbone,
    BertMaskedLM,
    GPTBackbone,
    GPTCausalLM,
    T5Backbone,
    T5Seq2SeqLM,
    TransformerBackbone,
)

BATCH, LENGTH, VOCABULARY = 8, 8, 64
TINY = dict(vocabulary_size=VOCABULARY, num_layers=1, num_heads=4, hidden_dim=16, intermediate_dim=32, dropout=0.0)


def build(family, **overrides):
    """A fresh tiny task of `family` (random weights)."""
    config = {**TINY, **overrides}
    if family == "gpt":
        return GPTCausalLM(GPTBackbone(max_sequence_length=32, **config))
    if family == "bert":
        # 62 tokens do not divide by a model axis of 4: the embedding is split along D instead.
        return BertMaskedLM(BertBackbone(max_sequence_length=32, **{**config, "vocabulary_size": VOCABULARY - 2}))
    # T5 v1.1 shape: gated feed-forward (gate kernels) and an untied lm_head.
    return T5Seq2SeqLM(
        T5Backbone(activation="gated-gelu", tie_embedding_weights=False, max_sequence_length=32, **config)
    )


def batch(family, rng):
    """(x, y, sample_weight) numpy arrays for one step, with some padding."""
    ids = rng.integers(1, VOCABULARY, (BATCH, LENGTH)).astype("int32")
    mask = np.arange(LENGTH)[None, :] < rng.integers(LENGTH // 2, LENGTH + 1, (BATCH, 1))
    ids = np.where(mask, ids, 0).astype("int32")
    if family == "gpt":
        return {"token_ids": ids, "padding_mask": mask}, np.roll(ids, -1, axis=1), mask.astype("float32")
    if family == "bert":
        positions = np.stack([rng.choice(LENGTH // 2, 3, replace=False) for _ in range(BATCH)]).astype("int32")
        labels = np.take_along_axis(ids, positions, axis=1)
        x = {
            "token_ids": np.where(np.isin(np.arange(LENGTH)[None], positions), 3, ids).astype("int32"),
            "segment_ids": np.zeros_like(ids),
            "padding_mask": mask,
            "mask_positions": positions,
        }
        return x, labels, np.ones(labels.shape, "float32")
    targets = rng.integers(1, VOCABULARY, (BATCH, LENGTH)).astype("int32")
    x = {
        "encoder_token_ids": ids,
        "encoder_padding_mask": mask,
        "decoder_token_ids": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_padding_mask": np.ones_like(mask),
    }
    return x, targets, np.ones(targets.shape, "float32")


def fit_step(task, initial_weights, data):
    """Set the weights, compile with the task's defaults, fit one batch: (loss, weights after the step)."""
    task.set_weights(initial_weights)
    task.compile()
    x, y, sample_weight = data
    history = task.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return float(history.history["loss"][0]), task.get_weights()


def max_abs_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x, "float64") - np.asarray(y, "float64")))) for x, y in zip(a, b))


def spec(variable):
    """The variable's PartitionSpec as a list of axis names / None, without trailing Nones."""
    axes = [axis if axis is None or isinstance(axis, str) else list(axis) for axis in variable.value.sharding.spec]
    while axes and axes[-1] is None:
        axes.pop()
    return axes


def generate_ids(task, family):
    """Greedy continuations of two ragged prompts (token ids, no stop tokens) and their logits."""
    prompts = [[5, 9, 17, 33], [7, 2]] if family == "gpt" else [[5, 9, 17, 33, 40], [7, 2, 11]]
    result = task.generate(prompts, max_new_tokens=6, stop_token_ids=None, return_dict=True, output_logits=True)
    return [list(map(int, row)) for row in result["outputs"]], [np.asarray(x) for x in result["logits"]]


def top2_margin(logits):
    """The smallest gap between the best and second-best logit over the generated tokens."""
    top = np.sort(np.concatenate(logits), axis=-1)
    return float(np.min(top[:, -1] - top[:, -2]))


def error_of(fn):
    try:
        fn()
    except Exception as error:  # the test checks the type and the message
        return {"type": type(error).__name__, "message": str(error)}
    return None


def main():
    started = time.time()
    random.seed(0)  # Keras draws its initializers' seeds from Python's generator
    devices = keras.distribution.list_devices()
    results = {"devices": len(devices), "families": {}}
    reference_models = {}
    data_mesh = keras.distribution.DeviceMesh((8,), ("batch",), devices)
    model_mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)

    for family in ("gpt", "bert", "t5"):
        rng = np.random.default_rng(0)
        reference = reference_models[family] = build(family)
        initial = reference.get_weights()
        data = batch(family, rng)
        loss, weights = fit_step(reference, initial, data)
        out = {"loss": loss, "step_size": max_abs_diff(initial, weights)}

        with keras.distribution.DataParallel(device_mesh=data_mesh).scope():
            task = build(family)
            out["data_parallel_loss"], data_weights = fit_step(task, initial, data)
            out["data_parallel_weights_diff"] = max_abs_diff(weights, data_weights)
            out["data_parallel_specs"] = sorted({str(spec(v)) for v in task.variables})

        layout_map = reference.backbone.get_layout_map(model_mesh)
        with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
            task = build(family)
            out["model_parallel_loss"], model_weights = fit_step(task, initial, data)
            out["model_parallel_weights_diff"] = max_abs_diff(weights, model_weights)
            out["variables"] = {v.path: {"shape": list(v.shape), "spec": spec(v)} for v in task.variables}
            out["optimizer_variables"] = {v.path: spec(v) for v in task.optimizer.variables if len(v.shape) > 1}
            if family in ("gpt", "t5"):
                # Larger random weights than the initialisation, so greedy decoding does not just repeat a token.
                decode_weights = [
                    w + rng.normal(0.0, 0.5, w.shape).astype(w.dtype) if w.dtype.kind == "f" else w
                    for w in task.get_weights()
                ]
                task.set_weights(decode_weights)
                reference.set_weights(decode_weights)
                out["generate_model_parallel"], logits = generate_ids(task, family)
                out["generate_one_device"], reference_logits = generate_ids(reference, family)
                out["generate_logits_diff"] = max_abs_diff(logits, reference_logits)
                out["generate_top2_margin"] = top2_margin(reference_logits)
        results["families"][family] = out

    # The original Transformer: its layout map (no training run: it shares its layers with T5).
    transformer = TransformerBackbone(VOCABULARY, num_layers=1, num_heads=4, hidden_dim=16, intermediate_dim=32)
    transformer_map = transformer.get_layout_map(model_mesh)
    results["transformer_layouts"] = {}
    for v in transformer.variables:
        layout = transformer_map[v.path]
        results["transformer_layouts"][v.path] = {"shape": list(v.shape), "axes": layout and list(layout.axes)}

    wide_mesh = keras.distribution.DeviceMesh((1, 8), ("batch", "model"), devices)
    results["errors"] = {
        # 4 heads on a model axis of 8.
        "gpt_heads": error_of(lambda: reference_models["gpt"].backbone.get_layout_map(wide_mesh)),
        "transformer_heads": error_of(lambda: transformer.get_layout_map(wide_mesh)),
        # 4 heads on a model axis of 4, but a feed-forward width of 30.
        "bert_intermediate": error_of(lambda: build("bert", intermediate_dim=30).backbone.get_layout_map(model_mesh)),
        "t5_axis": error_of(lambda: reference_models["t5"].backbone.get_layout_map(model_mesh, model_axis="tensor")),
    }
    results["seconds"] = time.time() - started
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
