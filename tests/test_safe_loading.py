"""Loading is safe: configs name only this library's classes (no lambdas, no imports), weights are
never unpickled, and damaged or mismatched files fail before any variable changes, naming the file.

Each refusal is checked against the same file loading fine when undamaged (or with safe_mode off),
so a test fails if the refusal is lost, and a marker file shows no injected command ever ran.
"""

import json
import os
import pickle
import shutil
import zipfile

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import presets
from tests.conftest import to_numpy


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(directory, task): a tiny GPT task saved as a preset ("preset") and as a .keras file ("lm.keras")."""
    directory = tmp_path_factory.mktemp("saved")
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
    lm.save_to_preset(directory / "preset")
    lm.save(directory / "lm.keras")
    return directory, lm


@pytest.fixture
def marker(tmp_path):
    """A file that an injected command would create: it must never exist."""
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "an injected command ran"


def _weights(model):
    return [to_numpy(v).copy() for v in model.weights]


def _assert_unchanged(model, before):
    for expected, variable in zip(before, model.weights):
        np.testing.assert_array_equal(to_numpy(variable), expected)


def _edited_preset(saved, tmp_path, edit):
    directory, _ = saved
    copy = tmp_path / "preset"
    shutil.copytree(directory / "preset", copy)
    config = json.loads((copy / "config.json").read_text())
    edit(config)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def _edited_keras_file(saved, tmp_path, edit):
    """A copy of lm.keras whose config.json went through `edit`."""
    directory, _ = saved
    target = tmp_path / "edited.keras"
    with zipfile.ZipFile(directory / "lm.keras") as source, zipfile.ZipFile(target, "w") as out:
        for name in source.namelist():
            data = source.read(name)
            if name == "config.json":
                config = json.loads(data)
                edit(config)
                data = json.dumps(config)
            out.writestr(name, data)
    return target


def _system_call(marker):
    """A serialized object naming `os.system`, as an attacker would write it."""
    return {"module": "os", "class_name": "system", "config": {"command": f"touch {marker}"}, "registered_name": None}


def _serialized_lambda():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras warns that lambdas are unsafe: that is the point
        return keras.saving.serialize_keras_object(lambda x: x)


def _set(path, value):
    def edit(config):
        node = config
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _foreign_class(path, module, class_name):
    def edit(config):
        node = config
        for key in path:
            node = node[key]
        node.update(module=module, class_name=class_name, registered_name=f"keras_hub>{class_name}")

    return edit


# --- .keras files: keras.saving.load_model with safe_mode ----------------------


def test_unedited_files_load(saved, tmp_path):
    directory, lm = saved
    x, _, _ = lm.preprocessor(["def f(x):"])
    expected = to_numpy(lm(x))
    np.testing.assert_array_equal(to_numpy(keras.saving.load_model(directory / "lm.keras")(x)), expected)
    np.testing.assert_array_equal(to_numpy(kt.models.GPTCausalLM.from_preset(directory / "preset")(x)), expected)
    unedited = _edited_keras_file(saved, tmp_path, lambda config: None)
    np.testing.assert_array_equal(to_numpy(keras.saving.load_model(unedited)(x)), expected)


def test_keras_file_of_a_task_with_a_lambda_layer_is_refused(saved, tmp_path):
    _, lm = saved
    inputs = {
        name: keras.Input(shape=(None,), dtype=dtype, name=name)
        for name, dtype in (("token_ids", "int32"), ("padding_mask", "bool"))
    }
    wrapped = keras.Model(inputs, keras.layers.Lambda(lambda logits: logits * 2.0)(lm(inputs)))
    wrapped.save(tmp_path / "lambda.keras")
    with pytest.raises(ValueError, match="lambda"):
        keras.saving.load_model(tmp_path / "lambda.keras")
    trusted = keras.saving.load_model(tmp_path / "lambda.keras", safe_mode=False)  # the file itself is sound
    x, _, _ = lm.preprocessor(["def f(x):"])
    np.testing.assert_allclose(to_numpy(trusted(x)), 2.0 * to_numpy(lm(x)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "where",
    [
        ("top-level class", lambda m: lambda c: c.update(_system_call(m))),
        ("backbone class", lambda m: lambda c: c["config"]["backbone"].update(_system_call(m))),
        ("backbone dtype", lambda m: _set(["config", "backbone", "config", "dtype"], _system_call(m))),
        ("activation lambda", lambda m: _set(["config", "backbone", "config", "activation"], _serialized_lambda())),
        ("preprocessor class", lambda m: _set(["config", "preprocessor", "class_name"], "os.system")),
        ("tokenizer class", lambda m: _set(["config", "preprocessor", "tokenizer", "class_name"], "os.system")),
        (
            "backbone of another package",
            lambda m: _foreign_class(["config", "backbone"], "keras_hub.models", "GPT2Backbone"),
        ),
    ],
    ids=lambda where: where[0],
)
def test_keras_file_naming_a_foreign_class_or_lambda_is_refused(saved, tmp_path, marker, where):
    path = _edited_keras_file(saved, tmp_path, where[1](marker))
    with pytest.raises(
        (ValueError, TypeError),
        match="system|lambda|Could not locate|not a keras_transformer|must be one of|Cannot convert",
    ):
        keras.saving.load_model(path)


# --- presets: from_preset ------------------------------------------------------


@pytest.mark.parametrize(
    "edit, match",
    [
        (_set(["backbone", "class_name"], "os.system"), "not a keras_transformer Backbone"),
        (_set(["backbone", "class_name"], "Dense"), "not a keras_transformer Backbone"),  # a Keras class
        (_set(["backbone", "class_name"], "keras_hub>GPT2Backbone"), "not a keras_transformer Backbone"),
        (_set(["backbone", "class_name"], "RandomSampler"), "not a keras_transformer Backbone"),  # ours, not a backbone
        (_set(["task", "class_name"], "os.system"), "not a keras_transformer Task"),
        (_set(["task", "class_name"], "GPTBackbone"), "not a keras_transformer Task"),
        (_set(["preprocessor", "class_name"], "os.system"), "not a keras_transformer preprocessor"),
        (_set(["backbone", "config", "activation"], "os.system"), "activation"),
    ],
)
def test_preset_config_naming_a_foreign_class_is_refused(saved, tmp_path, edit, match):
    with pytest.raises(ValueError, match=match):
        kt.models.GPTCausalLM.from_preset(_edited_preset(saved, tmp_path, edit))


@pytest.mark.parametrize("key", ["dtype", "activation"])
def test_preset_config_carrying_code_is_refused(saved, tmp_path, marker, key):
    value = _system_call(marker) if key == "dtype" else _serialized_lambda()
    with pytest.raises(ValueError, match=key if key == "activation" else "DTypePolicy"):
        kt.models.GPTCausalLM.from_preset(_edited_preset(saved, tmp_path, _set(["backbone", "config", key], value)))


def test_tokenizer_config_naming_a_foreign_class_is_refused(saved, tmp_path):
    copy = _edited_preset(saved, tmp_path, lambda config: None)
    tokenizer_config = json.loads((copy / "tokenizer_config.json").read_text())
    tokenizer_config["class_name"] = "os.system"
    (copy / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    with pytest.raises(ValueError, match="tokenizer_config.json.*not written by a keras_transformer tokenizer"):
        kt.models.GPTCausalLM.from_preset(copy)


class _Payload:
    """Unpickling this creates the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("filename", [presets.BACKBONE_WEIGHTS_FILE, presets.TASK_WEIGHTS_FILE])
def test_pickled_weights_are_never_unpickled(saved, tmp_path, marker, filename):
    copy = _edited_preset(saved, tmp_path, lambda config: None)
    (copy / filename).write_bytes(pickle.dumps(_Payload(marker)))
    loader = kt.models.GPTBackbone if filename == presets.BACKBONE_WEIGHTS_FILE else kt.models.GPTCausalLM
    with pytest.raises(ValueError, match=f"Corrupt or truncated weights file .*{filename}"):
        loader.from_preset(copy)
    _, lm = saved
    before = _weights(lm)
    with pytest.raises(ValueError, match=f"Corrupt or truncated weights file .*{filename}"):
        lm.load_weights(copy / filename)
    _assert_unchanged(lm, before)


# --- damaged files: named, and nothing half-loaded -------------------------------


@pytest.mark.parametrize("damage", ["truncated", "bad signature", "empty"])
def test_damaged_weights_name_the_file_and_leave_the_loaded_model_unchanged(saved, tmp_path, damage):
    directory, lm = saved
    copy = _edited_preset(saved, tmp_path, lambda config: None)
    loaded = kt.models.GPTCausalLM.from_preset(copy, preprocessor=None)  # loaded before the damage
    before = _weights(loaded)
    for filename in (presets.TASK_WEIGHTS_FILE, presets.BACKBONE_WEIGHTS_FILE):
        data = (copy / filename).read_bytes()
        damaged = {"truncated": data[: len(data) // 2], "bad signature": b"\0" * 8 + data[8:], "empty": b""}[damage]
        (copy / filename).write_bytes(damaged)
    with pytest.raises(ValueError, match=f"Corrupt or truncated weights file .*{presets.TASK_WEIGHTS_FILE}"):
        kt.models.GPTCausalLM.from_preset(copy, preprocessor=None)
    with pytest.raises(ValueError, match=f"Corrupt or truncated weights file .*{presets.BACKBONE_WEIGHTS_FILE}"):
        kt.models.GPTBackbone.from_preset(copy)
    with pytest.raises(ValueError, match=f"Corrupt or truncated weights file .*{presets.TASK_WEIGHTS_FILE}"):
        loaded.load_weights(copy / presets.TASK_WEIGHTS_FILE)
    _assert_unchanged(loaded, before)


def test_truncated_keras_file_is_named(saved, tmp_path):
    directory, _ = saved
    data = (directory / "lm.keras").read_bytes()
    (tmp_path / "cut.keras").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.keras"):
        keras.saving.load_model(tmp_path / "cut.keras")


def test_weights_of_another_shape_change_no_variable(saved, tmp_path):
    _, lm = saved
    other = kt.models.GPTCausalLM(
        kt.models.GPTBackbone(
            vocabulary_size=lm.backbone.vocabulary_size,
            num_layers=2,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=48,
            max_sequence_length=32,
        )
    )
    other.save_weights(tmp_path / "other.weights.h5")
    before = _weights(lm)
    # Keras alone assigns the layers before the first mismatch, then raises: a half-loaded model.
    with pytest.raises(ValueError, match="other.weights.h5 do not match"):
        lm.load_weights(tmp_path / "other.weights.h5")
    _assert_unchanged(lm, before)
    copy = _edited_preset(saved, tmp_path, _set(["backbone", "config", "intermediate_dim"], 48))
    with pytest.raises(ValueError, match="model.weights.h5 do not match"):
        kt.models.GPTBackbone.from_preset(copy)


@pytest.mark.parametrize("filename", ["tokenizer.json", "tokenizer_config.json"])
def test_missing_tokenizer_file_is_named(saved, tmp_path, filename):
    copy = _edited_preset(saved, tmp_path, lambda config: None)
    os.remove(copy / filename)
    with pytest.raises(ValueError, match=filename):
        kt.models.GPTCausalLM.from_preset(copy)
    assert kt.models.GPTCausalLM.from_preset(copy, preprocessor=None).preprocessor is None  # weights alone load
