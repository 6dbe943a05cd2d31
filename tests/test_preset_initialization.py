"""from_preset without random initial values (keras_transformer/presets/initialization.py): the loaded variables
are created from their loaded values, the others from their initializers, and the result is the usual one."""

import keras
import numpy as np
import pytest

from keras_transformer.models import CausalLM, GPTBackbone, GPTCausalLM
from keras_transformer.presets import initialization


class _Counting(keras.initializers.Initializer):
    """Ones, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, shape, dtype=None):
        self.calls += 1
        return keras.ops.ones(shape, dtype=dtype)


def _model(kernel, bias):
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(4, kernel_initializer=kernel, bias_initializer=bias)(inputs)
    return keras.Model(inputs, outputs)


def test_loaded_variables_draw_no_initial_values_and_the_others_do():
    kernel, bias, loaded = _Counting(), _Counting(), np.arange(12, dtype="float32").reshape(3, 4)

    def load(model):
        model.layers[-1].kernel.assign(loaded)

    model = initialization.build_then_load(lambda: _model(kernel, bias), load)
    assert (kernel.calls, bias.calls) == (0, 1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.layers[-1].kernel), loaded)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.layers[-1].bias), np.ones(4, "float32"))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(np.ones((1, 3), "float32"))), [[13, 16, 19, 22]])


def test_variables_given_one_array_stay_apart():
    """Tied weights in a checkpoint: the loader gives two variables one tensor; training one leaves the other."""
    shared = np.full((3, 4), 2.0, "float32")

    def build():
        return [_model("zeros", "zeros"), _model("zeros", "zeros")]

    class Both:  # build_then_load reads `.variables`
        def __init__(self, models):
            self.models, self.variables = models, [v for m in models for v in m.variables]

    def load(both):
        tensor = keras.ops.convert_to_tensor(shared)  # one backend tensor for both
        for model in both.models:
            model.layers[-1].kernel.assign(tensor)

    both = initialization.build_then_load(lambda: Both(build()), load)
    first, second = (m.layers[-1].kernel for m in both.models)
    first.assign(first + 1.0)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(second), shared)
    np.testing.assert_array_equal(shared, np.full((3, 4), 2.0, "float32"))


@pytest.mark.parametrize("kind", ["preset", "huggingface"])
def test_from_preset_gives_the_usual_weights(kind, tmp_path, monkeypatch):
    """From our preset and from a Hugging Face folder: the same weights, bit for bit, as building with random
    values and assigning; on JAX and PyTorch without drawing them."""
    backbone = GPTBackbone(vocabulary_size=97, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32)
    lm = GPTCausalLM(backbone)
    if kind == "preset":
        lm.save_to_preset(tmp_path / "folder")
    else:
        lm.export(tmp_path / "folder", format="huggingface")
    assert initialization.defers_initialization(quantized=False) == (keras.config.backend() != "tensorflow")
    loaded = CausalLM.from_preset(tmp_path / "folder", preprocessor=None)
    monkeypatch.setattr(initialization, "defers_initialization", lambda quantized: False)
    usual = CausalLM.from_preset(tmp_path / "folder", preprocessor=None)
    assert [v.path for v in loaded.weights] == [v.path for v in usual.weights]
    for ours, theirs in zip(loaded.weights, usual.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    ids = {"token_ids": np.array([[1, 2, 3]], "int32"), "padding_mask": np.ones((1, 3), bool)}
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(ids)), keras.ops.convert_to_numpy(lm(ids)))
