"""A mixture of experts under `Backbone.get_layout_map` (JAX only in Keras 3.15): the stacked experts are split
inside each expert along the model axis (gate/up (E, D, I) -> (None, None, model), down (E, I, D) -> (None,
model, None)), the shared expert as a feed-forward, the router replicated; one training step on a (2, 4) mesh of
8 virtual CPU devices (a child process, moe_distributed_run.py) matches one device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from keras_transformer.models import LlamaBackbone

JAX = keras.config.backend() == "jax"
SCRIPT = Path(__file__).with_name("moe_distributed_run.py")
TOLERANCE = 1e-5
pytestmark = pytest.mark.skipif(not JAX, reason="keras.distribution is implemented for JAX only (Keras 3.15)")

EXPECTED = {  # the last two parts of a variable's path -> its layout
    "feed_forward/gate_kernel": (None, None, "model"),
    "feed_forward/up_kernel": (None, None, "model"),
    "feed_forward/down_kernel": (None, "model", None),
    "router/kernel": None,
    "intermediate/kernel": (None, "model"),  # the shared expert's (and a dense layer's)
    "gate/kernel": (None, "model"),
    "output/kernel": ("model", None),
}


def _expected(path):
    return EXPECTED.get("/".join(path.split("/")[-2:]))


def test_layout_map_splits_the_experts_inside_each_expert():
    backbone = LlamaBackbone(
        vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=16, intermediate_dim=16, moe_layers=[True, False],
        mixture_of_experts=dict(num_experts=4, top_k=2, intermediate_dim=8, shared_intermediate_dim=8),
    )  # fmt: skip
    layout_map = backbone.get_layout_map(keras.distribution.DeviceMesh((1, 1), ("batch", "model"), ["cpu:0"]))
    checked = 0
    for variable in backbone.weights:
        if "feed_forward/" in variable.path:
            layout = layout_map[variable.path]
            assert (tuple(layout.axes) if layout is not None else None) == _expected(variable.path), variable.path
            checked += 1
    assert checked == 3 + 1 + 3 + 3  # experts, router, shared expert; the dense layer's three


def test_an_expert_width_that_does_not_divide_names_it():
    backbone = LlamaBackbone(
        vocabulary_size=64, num_layers=1, num_heads=4, hidden_dim=16, intermediate_dim=16,
        mixture_of_experts=dict(num_experts=4, top_k=2, intermediate_dim=6),
    )  # fmt: skip
    mesh = keras.distribution.DeviceMesh((1, 4), ("batch", "model"), ["cpu:0"] * 4)
    with pytest.raises(ValueError, match="expert width"):
        backbone.get_layout_map(mesh)


@pytest.fixture(scope="module")
def run():
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
        "--xla_llvm_disable_expensive_passes=true",
        "JAX_PLATFORMS": "cpu",
    }
    completed = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=SCRIPT.parents[2], env=env, capture_output=True, text=True, timeout=900
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULTS ")]
    assert lines, completed.stdout[-2000:] + completed.stderr[-2000:]
    return json.loads(lines[-1][len("RESULTS ") :])


@pytest.mark.slow
def test_model_parallel_step_matches_one_device_and_shards_the_experts(run):
    assert run["devices"] == 8
    assert abs(run["model_parallel_loss"] - run["loss"]) <= TOLERANCE
    assert run["weights_diff"] <= TOLERANCE and run["step_size"] > 100 * TOLERANCE
    for path, spec in run["specs"].items():
        expected = [axis for axis in (_expected(path) or ())]
        while expected and expected[-1] is None:
            expected.pop()
        while spec and spec[-1] is None:
            spec.pop()
        assert spec == expected, path
    assert any(path.endswith("gate_kernel") for path in run["specs"])
