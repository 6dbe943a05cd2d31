"""The mixture of experts on 8 virtual CPU devices (run by test_moe_distribution.py in a child process):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/distribution/moe_distributed_run.py

A tiny MoE LlamaCausalLM (with a shared expert and the router losses) trains one step on one device, then on a
ModelParallel mesh (2, 4) from the same weights; prints RESULTS {json}: both losses, the largest weight
difference, and each expert variable's sharding.
"""

import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
    "--xla_llvm_disable_expensive_passes=true",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer import distribution  # noqa: E402
from keras_transformer.models import LlamaBackbone, LlamaCausalLM  # noqa: E402

MOE = dict(num_experts=4, top_k=2, intermediate_dim=8, shared_intermediate_dim=8)
TINY = dict(vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=16, intermediate_dim=16, num_key_value_heads=4)


def build():
    keras.utils.set_random_seed(0)
    backbone = LlamaBackbone(**TINY, mixture_of_experts=MOE, moe_layers=[True, False], router_aux_loss_coef=0.1)
    lm = LlamaCausalLM(backbone, None)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    return lm


def fit_step(lm, weights, data):
    lm.set_weights(weights)
    x, y = data
    loss = lm.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history["loss"][0]
    return loss, [keras.ops.convert_to_numpy(w) for w in lm.weights]


def main():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (8, 8)).astype("int32")
    data = ({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}, np.roll(ids, -1, axis=1))
    single = build()
    initial = [keras.ops.convert_to_numpy(w) for w in single.weights]
    loss, after = fit_step(single, initial, data)
    parallel = distribution.model_parallel(single, (2, 4))
    with parallel.scope():
        sharded = build()
    parallel_loss, parallel_after = fit_step(sharded, initial, data)
    specs = {
        v.path: [axis for axis in v.value.sharding.spec] if hasattr(v.value.sharding, "spec") else None
        for v in sharded.backbone.weights
        if "feed_forward" in v.path
    }
    results = {
        "devices": len(keras.distribution.list_devices()),
        "loss": float(loss),
        "model_parallel_loss": float(parallel_loss),
        "weights_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(after, parallel_after)),
        "step_size": max(float(np.max(np.abs(a - b))) for a, b in zip(after, initial)),
        "specs": {path: [axis for axis in spec] if spec else [] for path, spec in specs.items()},
    }
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()
