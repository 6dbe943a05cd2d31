"""Keras int8 / int4 weights on every family: outputs near the float model's, generation after
quantizing against the quantized model's own full forward pass, and presets that keep the 8-bit form."""

import json

import numpy as np
import pytest

import keras_transformer as kt
from tests.export import helpers
from tests.models.test_lora import ALL_FAMILIES, FAMILIES, _inputs


def _relative_error(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_quantized_outputs_stay_near_float(family):
    task = FAMILIES[family]()
    x = _inputs(task)
    reference = helpers.to_numpy(task(x))
    task.quantize("int8")
    kernels = [v for v in task.weights if v.path.endswith("/kernel")]
    assert kernels and all(v.dtype == "int8" for v in kernels)
    assert all(v.dtype == "float32" for v in task.weights if v.path.endswith("embeddings"))  # tables stay float
    # The tiny test models' weights are large (std 0.3): int8 moves the logits by 2-6% of their range,
    # int4 (per channel) by 35-45% on JAX; weights read as raw integers would move them by far more.
    assert _relative_error(helpers.to_numpy(task(x)), reference) < 0.1
    task = FAMILIES[family]()
    task.quantize("int4")
    assert _relative_error(helpers.to_numpy(task(x)), reference) < 0.6


def test_generate_after_quantizing_follows_the_quantized_forward_pass():
    lm = FAMILIES["gpt"]()
    prompt = [5, 9, 14, 3]
    eos = lm.preprocessor.tokenizer.eos_token_id
    lm.generate(np.asarray([prompt], "int32"), max_new_tokens=4)  # a compiled float loop first
    lm.quantize("int8")
    expected = helpers.reference_greedy(helpers.causal_next_logits(lm), prompt, 6, eos)
    out = lm.generate(np.asarray([prompt], "int32"), max_new_tokens=6, stop_token_ids=[eos])
    assert list(np.asarray(out)[0, len(prompt): len(prompt) + len(expected)]) == expected


def test_presets_keep_quantized_weights(tmp_path):
    lm = FAMILIES["llama"]()
    x = _inputs(lm)
    lm.save_to_preset(tmp_path / "float")
    lm.quantize("int8")
    lm.save_to_preset(tmp_path / "int8")
    assert json.loads((tmp_path / "int8" / "config.json").read_text())["quantization"] == "int8"
    restored = kt.models.LlamaCausalLM.from_preset(tmp_path / "int8")
    assert all(v.dtype == "int8" for v in restored.weights if v.path.endswith("/kernel"))
    np.testing.assert_array_equal(helpers.to_numpy(restored(x)), helpers.to_numpy(lm(x)))
    backbone = kt.models.Backbone.from_preset(tmp_path / "int8")
    np.testing.assert_array_equal(helpers.to_numpy(backbone(x)), helpers.to_numpy(lm.backbone(x)))
    assert "quantization" not in json.loads((tmp_path / "float" / "config.json").read_text())


def test_bad_mode_names_the_argument():
    lm = FAMILIES["gpt"]()
    with pytest.raises(ValueError, match="int3"):
        lm.quantize("int3")
    with pytest.raises(ValueError, match="float8"):
        lm.backbone.quantize("float8")
