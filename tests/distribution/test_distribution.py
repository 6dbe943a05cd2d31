"""Data and model parallelism (keras.distribution, JAX only in Keras 3.15).

Under JAX the real checks run in a child process (`distributed_run.py`) with 8 virtual CPU
devices: XLA_FLAGS is read once, when JAX is imported, and this pytest process has already
imported it with one device. The child trains one step of tiny GPT, BERT and T5 tasks on one
device, on a DataParallel mesh (8,) and on a ModelParallel mesh (2, 4), and decodes greedily;
the expected values here come from the one-device run and from the layout table below, written
independently of `keras_transformer.distribution`. Under TensorFlow and PyTorch the same
entry points must raise one clear NotImplementedError instead.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from keras_transformer import distribution
from keras_transformer.models import BertBackbone, GPTBackbone, GPTCausalLM, T5Backbone, TransformerBackbone

JAX = keras.config.backend() == "jax"
SCRIPT = Path(__file__).with_name("distributed_run.py")
ROOT = SCRIPT.parents[2]
TOLERANCE = 1e-5
TINY = dict(vocabulary_size=64, num_layers=1, num_heads=4, hidden_dim=16, intermediate_dim=32)

BUILDERS = {
    "gpt": lambda: GPTBackbone(max_sequence_length=16, **TINY),
    "bert": lambda: BertBackbone(max_sequence_length=16, **TINY),
    "t5": lambda: T5Backbone(activation="gated-gelu", **TINY),
    "transformer": lambda: TransformerBackbone(max_sequence_length=16, **TINY),
}
# Under JAX the child process checks every family on 8 devices; here GPT is enough (JAX builds slowly on CPU).
FAMILIES = ["gpt"] if JAX else sorted(BUILDERS)


@pytest.fixture(scope="module")
def backbones():
    """family -> a tiny backbone, built on first use."""

    class Backbones(dict):
        def __missing__(self, family):
            self[family] = BUILDERS[family]()
            return self[family]

    return Backbones()


def expected_axes(path, shape, vocabulary_parallel):
    """The Megatron layout, from the variable's path and shape; None where replicated."""
    parts = path.split("/")
    layer, weight = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", parts[-1])
    in_attention = len(parts) >= 3 and parts[-3].endswith("attention")
    in_feed_forward = len(parts) >= 3 and parts[-3] == "feed_forward"
    if in_attention and layer in ("query", "key", "value"):
        return (None, "model", None) if weight == "kernel" else ("model", None)  # (D, H, Dh) / (H, Dh)
    if in_attention and layer == "attention_output" and weight == "kernel":
        return ("model", None, None)  # (H, Dh, D)
    if in_feed_forward and layer in ("intermediate", "gate"):
        return (None, "model") if weight == "kernel" else ("model",)  # (D, F) / (F,)
    if in_feed_forward and layer == "output" and weight == "kernel":
        return ("model", None)  # (F, D)
    if path == "token_embedding/embeddings":
        return ("model", None) if vocabulary_parallel else (None, "model")  # (V, D)
    return None


def stripped(axes):
    """A PartitionSpec without trailing Nones: (None, "model", None) and (None, "model") shard alike."""
    axes = list(axes or ())
    while axes and axes[-1] is None:
        axes.pop()
    return axes


# --- every backend ---------------------------------------------------------


def test_module_documents_the_layout():
    assert "Megatron" in distribution.__doc__ and "JAX" in distribution.__doc__


@pytest.mark.parametrize("family", FAMILIES)
def test_get_layout_map_on_the_current_backend(backbones, family):
    """JAX: a layout map whose regex keys give the Megatron layout; elsewhere: one clear error."""
    backbone = backbones[family]
    mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"), ["cpu:0"])
    if not JAX:
        with pytest.raises(NotImplementedError) as error:
            backbone.get_layout_map(mesh)
        message = str(error.value)
        assert "only for JAX" in message and repr(keras.config.backend()) in message
        assert f"Keras {keras.__version__}" in message and "KERAS_BACKEND=jax" in message
        return
    layout_map = backbone.get_layout_map(mesh)
    sharded = 0
    for variable in backbone.variables:
        layout = layout_map[variable.path]
        expected = expected_axes(variable.path, variable.shape, vocabulary_parallel=True)
        assert (tuple(layout.axes) if layout is not None else None) == expected, variable.path
        sharded += expected is not None
    # token embedding + per layer 4 attention kernels, 2-3 feed-forward kernels (+ biases).
    assert sharded >= 1 + 4 + 2


HELPERS = {
    "model_parallel": (lambda lm: distribution.model_parallel(lm, (1, 1)), keras.distribution.ModelParallel),
    "data_parallel": (lambda lm: distribution.data_parallel(), keras.distribution.DataParallel),
    "megatron_layout_map": (
        lambda lm: distribution.megatron_layout_map(
            lm, keras.distribution.DeviceMesh((1, 1), ("batch", "model"), ["cpu:0"])
        ),
        keras.distribution.LayoutMap,
    ),
}


@pytest.mark.parametrize("helper", sorted(HELPERS))
def test_helpers_on_the_current_backend(backbones, helper):
    """JAX: the Keras distribution objects; elsewhere: one clear error before Keras is asked."""
    call, expected_type = HELPERS[helper]
    lm = GPTCausalLM(backbones["gpt"])
    if not JAX:
        backend = keras.config.backend()
        with pytest.raises(NotImplementedError, match=f"only for JAX. The current backend is '{backend}'"):
            call(lm)
        return
    result = call(lm)
    assert isinstance(result, expected_type)
    if helper == "model_parallel":
        assert result.batch_dim_name == "batch"
        layout = result.get_tensor_layout("transformer_layer_0/self_attention/query/kernel")
        assert tuple(layout.axes) == (None, "model", None)


# --- JAX: 8 virtual devices, in a child process -----------------------------

if JAX:

    @pytest.fixture(scope="module")
    def run():
        """Run distributed_run.py once with 8 CPU devices and return its JSON results."""
        env = {
            **os.environ,
            "KERAS_BACKEND": "jax",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
            "--xla_llvm_disable_expensive_passes=true",
            "JAX_PLATFORMS": "cpu",
        }
        completed = subprocess.run(
            [sys.executable, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
        )
        assert completed.returncode == 0, completed.stderr[-4000:]
        lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULTS ")]
        assert lines, completed.stdout[-2000:] + completed.stderr[-2000:]
        return json.loads(lines[-1][len("RESULTS ") :])

    def test_layout_arguments_are_checked(backbones):
        mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"), ["cpu:0"])
        with pytest.raises(ValueError, match="Received: model_axis='heads'"):
            backbones["gpt"].get_layout_map(mesh, model_axis="heads")
        with pytest.raises(ValueError, match="Received: batch_axis='model'"):
            backbones["gpt"].get_layout_map(mesh, batch_axis="model")
        with pytest.raises(ValueError, match="Received: device_mesh=\\(1, 1\\)"):
            backbones["gpt"].get_layout_map((1, 1))
        # One device in this process: a (2, 4) mesh cannot be made, and says so.
        with pytest.raises(ValueError, match="Received: device_mesh=\\(2, 4\\)"):
            distribution.model_parallel(backbones["gpt"], (2, 4))

    @pytest.mark.slow
    def test_child_process_has_eight_devices(run):
        assert run["devices"] == 8

    @pytest.mark.slow
    @pytest.mark.parametrize("family", ["gpt", "bert", "t5"])
    @pytest.mark.parametrize("mode", ["data_parallel", "model_parallel"])
    def test_fit_step_matches_one_device(run, family, mode):
        result = run["families"][family]
        assert abs(result[f"{mode}_loss"] - result["loss"]) <= TOLERANCE
        assert result[f"{mode}_weights_diff"] <= TOLERANCE
        assert result["step_size"] > 100 * TOLERANCE  # the step did move the weights

    @pytest.mark.slow
    @pytest.mark.parametrize("family", ["gpt", "bert", "t5"])
    def test_data_parallel_replicates_every_variable(run, family):
        assert run["families"][family]["data_parallel_specs"] == ["[]"]

    @pytest.mark.slow
    @pytest.mark.parametrize("family", ["gpt", "bert", "t5"])
    def test_model_parallel_shards_as_the_layout_says(run, family):
        variables = run["families"][family]["variables"]
        vocabulary_size = variables["token_embedding/embeddings"]["shape"][0]
        sharded = set()
        for path, variable in variables.items():
            expected = expected_axes(path, variable["shape"], vocabulary_parallel=vocabulary_size % 4 == 0)
            assert variable["spec"] == stripped(expected), path
            if expected is not None:
                sharded.add(path.split("/")[-2])
        # The BERT vocabulary (62) does not divide by 4: its embedding is split along D.
        embedding = variables["token_embedding/embeddings"]["spec"]
        assert embedding == ([None, "model"] if family == "bert" else ["model"])
        expected_layers = {"query", "key", "value", "attention_output", "intermediate", "output", "token_embedding"}
        assert sharded == expected_layers | ({"gate"} if family == "t5" else set())

    @pytest.mark.slow
    @pytest.mark.parametrize("family", ["gpt", "bert", "t5"])
    def test_optimizer_state_is_sharded_like_its_variable(run, family):
        result = run["families"][family]
        by_name = {path.replace("/", "_"): variable["spec"] for path, variable in result["variables"].items()}
        checked = 0
        for path, spec in result["optimizer_variables"].items():
            name = path.split("/", 1)[1].rsplit("_", 1)[0]  # "adam_w/<variable>_momentum" -> "<variable>"
            assert spec == by_name[name], path
            checked += spec != []
        assert checked >= 2 * 7  # momentum and velocity of every sharded kernel

    @pytest.mark.slow
    @pytest.mark.parametrize("family", ["gpt", "t5"])
    def test_generate_under_model_parallel_matches_one_device(run, family):
        result = run["families"][family]
        assert result["generate_model_parallel"] == result["generate_one_device"]
        # The logits of every generated token agree too, far closer than any near-tie of the greedy choice.
        assert result["generate_logits_diff"] <= 1e-4
        assert result["generate_top2_margin"] > 10 * result["generate_logits_diff"]
        prompt_length = 4 if family == "gpt" else 1
        generated = result["generate_one_device"][0][prompt_length:]
        assert len(generated) == 6 and len(set(generated)) >= 2  # a real continuation, not one repeated token

    @pytest.mark.slow
    def test_transformer_layout_map(run):
        layouts = run["transformer_layouts"]
        # token embedding; 3 attentions x (q, k, v kernels and biases, output kernel);
        # 2 feed-forwards x (intermediate kernel and bias, output kernel)
        assert sum(layout["axes"] is not None for layout in layouts.values()) == 1 + 3 * 7 + 2 * 3
        for path, layout in layouts.items():
            expected = expected_axes(path, layout["shape"], vocabulary_parallel=True)
            assert layout["axes"] == (list(expected) if expected is not None else None), path

    @pytest.mark.slow
    @pytest.mark.parametrize(
        "case, variable, size",
        [
            ("gpt_heads", "transformer_layer_0/self_attention/query/kernel", 8),
            ("transformer_heads", "encoder_layer_0/self_attention/query/kernel", 8),
            ("bert_intermediate", "transformer_layer_0/feed_forward/intermediate/kernel", 4),
        ],
    )
    def test_bad_layout_names_the_variable_and_the_axis(run, case, variable, size):
        error = run["errors"][case]
        assert error["type"] == "ValueError"
        assert f"'{variable}'" in error["message"]
        assert f"mesh axis 'model' of size {size}" in error["message"]

    @pytest.mark.slow
    def test_unknown_model_axis(run):
        error = run["errors"]["t5_axis"]
        assert error["type"] == "ValueError" and "Received: model_axis='tensor'" in error["message"]
