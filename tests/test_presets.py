"""The preset registry: listing, resolving, loading, saving, failures before partial loads."""

import json
import os
import shutil
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import presets

BACKENDS = ("tensorflow", "jax", "torch")
REQUIRED = {
    "bert_tiny",
    "bert_small",
    "bert_base",
    "gpt_tiny",
    "gpt_small",
    "gpt_medium",
    "t5_tiny",
    "t5_small",
    "t5_base",
    "transformer_base",
}


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _tiny_lm(tmp_path):
    """A small GPT task saved as a preset; returns (dir, task, inputs)."""
    tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("gpt_tiny"))
    backbone = kt.models.GPTBackbone(
        vocabulary_size=tokenizer.vocabulary_size,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=32,
    )
    lm = kt.models.GPTCausalLM(backbone, kt.models.GPTCausalLMPreprocessor(tokenizer, sequence_length=16))
    x, _, _ = lm.preprocessor(["def f(x):", "return x + 1"])
    return lm, x


def test_every_required_preset_is_registered_with_a_description():
    rows = {row["name"]: row for row in kt.list_presets()}
    assert REQUIRED <= set(rows)
    for name in REQUIRED:
        assert rows[name]["family"] in ("bert", "gpt", "t5", "transformer")
        assert rows[name]["description"]


def _count_without_allocating(cls, preset):
    """`cls.from_preset(preset, load_weights=False).count_params()` of the model built for real (every layer,
    every variable with its shape) with no weight allocated: its variables are created in a `StatelessScope`
    that leaves them uninitialised (GPT-2 medium would take 1.4 GB and seconds to initialise). On a thread of its
    own: Keras keeps the uninitialised variables in a per-thread list, which ends with the thread, so no later
    scope of this process allocates them."""
    built = {}

    def build():
        try:
            with keras.StatelessScope(initialize_variables=False):
                built["model"] = cls.from_preset(preset, load_weights=False)
        except BaseException as error:  # noqa: BLE001 - raised again below, in the test's thread
            built["error"] = error

    thread = threading.Thread(target=build)
    thread.start()
    thread.join()
    if "error" in built:
        raise built["error"]
    return built["model"].count_params()


@pytest.mark.parametrize("name, published", [("gpt_small", 124_439_808), ("gpt_medium", 354_823_168)])
def test_parameter_counts_match_the_published_shapes(name, published):
    """GPT-2 small and medium as published by OpenAI: counted from the backbone the preset builds, and the
    count the registry lists (config.json) is that one."""
    assert _count_without_allocating(kt.models.GPTBackbone, name) == published
    rows = {row["name"]: row for row in kt.list_presets()}
    assert rows[name]["parameter_count"] == published


def test_stored_parameter_count_matches_the_built_model():
    backbone = kt.models.GPTBackbone.from_preset("gpt_tiny")
    assert backbone.count_params() == presets.load_config("gpt_tiny")[1]["parameter_count"]


def test_unknown_name_lists_close_matches():
    with pytest.raises(ValueError, match="gpt_tiny"):
        presets.resolve("gpt_tinny")


def test_wrong_class_for_preset_is_refused():
    # The preset loads with its own class, so the refusal below is about the class and nothing else.
    assert isinstance(presets.load_backbone(kt.models.GPTBackbone, "gpt_tiny"), kt.models.GPTBackbone)
    with pytest.raises(ValueError, match="holds a GPTBackbone, not a Other"):
        presets.load_backbone(type("Other", (kt.models.Backbone,), {}), "gpt_tiny")


def test_save_and_load_restores_outputs_exactly(tmp_path):
    lm, x = _tiny_lm(tmp_path)
    lm.save_to_preset(tmp_path / "p")
    files = sorted(os.listdir(tmp_path / "p"))
    assert {"config.json", "model.weights.h5", "task.weights.h5", "metadata.json", "tokenizer.json"} <= set(files)
    metadata = json.loads((tmp_path / "p" / "metadata.json").read_text())
    assert metadata["backend"] == keras.config.backend() and metadata["parameter_count"] == lm.count_params()
    restored = kt.models.GPTCausalLM.from_preset(tmp_path / "p")
    np.testing.assert_array_equal(_numpy(restored(x)), _numpy(lm(x)))
    assert restored.preprocessor.sequence_length == 16
    backbone = kt.models.GPTBackbone.from_preset(tmp_path / "p")
    np.testing.assert_array_equal(_numpy(backbone(x)), _numpy(lm.backbone(x)))


def test_missing_and_corrupt_files_are_named(tmp_path):
    lm, _ = _tiny_lm(tmp_path)
    lm.save_to_preset(tmp_path / "p")
    broken = tmp_path / "broken"
    shutil.copytree(tmp_path / "p", broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        kt.models.GPTCausalLM.from_preset(broken)
    shutil.rmtree(broken)
    shutil.copytree(tmp_path / "p", broken)
    os.remove(broken / "tokenizer.json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        kt.models.GPTCausalLM.from_preset(broken)
    shutil.rmtree(broken)
    shutil.copytree(tmp_path / "p", broken)
    data = (broken / "model.weights.h5").read_bytes()
    (broken / "model.weights.h5").write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match="model.weights.h5"):
        kt.models.GPTBackbone.from_preset(broken)


def test_shape_mismatch_fails_before_any_variable_changes(tmp_path):
    lm, _ = _tiny_lm(tmp_path)
    lm.backbone.save_to_preset(tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    config["backbone"]["config"]["intermediate_dim"] = 48
    (tmp_path / "p" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not match"):
        kt.models.GPTBackbone.from_preset(tmp_path / "p")


def test_failed_save_leaves_previous_copy_intact(tmp_path, monkeypatch):
    lm, x = _tiny_lm(tmp_path)
    lm.save_to_preset(tmp_path / "p")
    before = sorted(os.listdir(tmp_path / "p"))
    original = lm.backbone.save_weights

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("injected")

    monkeypatch.setattr(lm.backbone, "save_weights", crash)
    with pytest.raises(KeyboardInterrupt):
        lm.save_to_preset(tmp_path / "p")
    monkeypatch.setattr(lm.backbone, "save_weights", original)
    assert sorted(os.listdir(tmp_path / "p")) == before
    assert sorted(os.listdir(tmp_path)) == ["p"]  # no temporary directory left behind
    with pytest.raises(ValueError, match="overwrite"):
        lm.save_to_preset(tmp_path / "p", overwrite=False)


def test_safe_loading_refuses_classes_outside_the_library(tmp_path):
    lm, _ = _tiny_lm(tmp_path)
    lm.save_to_preset(tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    config["backbone"]["class_name"] = "os.system"
    (tmp_path / "p" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a keras_transformer"):
        kt.models.GPTCausalLM.from_preset(tmp_path / "p")


@pytest.mark.slow
def test_preset_saved_here_loads_identically_on_the_other_backends(tmp_path):
    lm, x = _tiny_lm(tmp_path)
    lm.save_to_preset(tmp_path / "p")
    np.save(tmp_path / "ids.npy", x["token_ids"])
    np.save(tmp_path / "mask.npy", x["padding_mask"])
    expected = _numpy(lm(x))
    script = (
        "import sys, numpy as np, keras, keras_transformer as kt\n"
        "d = sys.argv[1]\n"
        "lm = kt.models.GPTCausalLM.from_preset(d + '/p')\n"
        "x = {'token_ids': np.load(d + '/ids.npy'), 'padding_mask': np.load(d + '/mask.npy')}\n"
        "np.save(d + '/out.npy', keras.ops.convert_to_numpy(lm(x)))\n"
    )
    for backend in BACKENDS:
        if backend == keras.config.backend():
            continue
        env = {**os.environ, "KERAS_BACKEND": backend}
        subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, env=env, capture_output=True)
        np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-5, rtol=0)


def test_trained_task_round_trips_without_optimizer_state(tmp_path):
    lm, x = _tiny_lm(tmp_path)
    lm.fit(["def f(x):\n    return x\n"] * 4, batch_size=2, epochs=1, verbose=0)
    lm.save_to_preset(tmp_path / "p")
    restored = kt.models.GPTCausalLM.from_preset(tmp_path / "p")
    np.testing.assert_array_equal(_numpy(restored(x)), _numpy(lm(x)))
