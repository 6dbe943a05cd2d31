"""Keras int8 / int4 weights on every family: outputs near the float model's, generation after
quantizing (one rebuild of the compiled loop) against the quantized model's own full forward pass,
presets that keep the 8- and 4-bit forms, and LoRA trained on top of int8 weights."""

import json

import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.models.quantization import quantization_mode
from tests.export import helpers
from tests.models.test_lora import ALL_FAMILIES, FAMILIES, _inputs, _perturb_lora, fit_moves_only_the_factors
from tests.samplers.helpers import compiled_functions, is_eager_backend

PROMPT = [5, 9, 14, 3]


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


def _greedy_matches_the_forward_pass(task, new_tokens=6):
    """Greedy `generate` on PROMPT equals the argmax of the task's own full forward pass, step by step."""
    eos = task.preprocessor.tokenizer.eos_token_id
    out = task.generate(np.asarray([PROMPT], "int32"), max_new_tokens=new_tokens, stop_token_ids=[eos])
    if hasattr(task.preprocessor, "decoder_start_token_id"):  # seq2seq: PROMPT is the source
        start = task.preprocessor.decoder_start_token_id
        expected = helpers.reference_greedy(helpers.seq2seq_next_logits(task, PROMPT), [start], new_tokens, eos)
        generated = list(np.asarray(out)[0, 1: 1 + len(expected)])
    else:
        expected = helpers.reference_greedy(helpers.causal_next_logits(task), PROMPT, new_tokens, eos)
        generated = list(np.asarray(out)[0, len(PROMPT): len(PROMPT) + len(expected)])
    assert generated == expected


def test_generate_after_quantizing_follows_the_quantized_forward_pass():
    lm = FAMILIES["gpt"]()
    lm.generate(np.asarray([PROMPT], "int32"), max_new_tokens=4)  # a compiled float loop first
    lm.quantize("int8")
    _greedy_matches_the_forward_pass(lm)


def _traces(task):
    return {key: function.traces for key, function in compiled_functions(task).items()}


def test_quantizing_rebuilds_the_compiled_loop_once():
    lm = FAMILIES["gpt"]()
    prompt = np.asarray([PROMPT], "int32")
    float_out = np.asarray(lm.generate(prompt, max_new_tokens=5, stop_token_ids=None))
    float_functions = compiled_functions(lm)
    lm.quantize("int8")
    first = np.asarray(lm.generate(prompt, max_new_tokens=5, stop_token_ids=None))
    functions = compiled_functions(lm)
    # New functions (the old ones hold the float kernels, which quantizing deleted), same keys.
    assert functions.keys() == float_functions.keys()
    assert all(functions[key] is not float_functions[key] for key in functions)
    second = np.asarray(lm.generate(prompt, max_new_tokens=5, stop_token_ids=None))
    assert all(compiled_functions(lm)[key] is functions[key] for key in functions)  # not made again
    if not is_eager_backend():  # PyTorch's loop is eager: its functions run (and "trace") on every call
        assert set(_traces(lm).values()) == {1}, _traces(lm)  # prepare and loop each traced once, in two calls
    np.testing.assert_array_equal(second, first)
    assert first.shape == float_out.shape


# GPT int8 is above; every family's cached step must dequantize as its full forward pass does.
@pytest.mark.parametrize("family, mode", [("gpt", "int4"), ("llama", "int8"), ("llama", "int4"),
                                          ("t5", "int8"), ("t5", "int4")])
def test_greedy_generate_after_quantizing_follows_the_forward_pass(family, mode):
    task = FAMILIES[family]()
    task.quantize(mode)
    assert quantization_mode(task) == mode
    _greedy_matches_the_forward_pass(task)


@pytest.mark.parametrize("family, mode", [("llama", "int8"), ("llama", "int4"), ("gpt", "int4")])
def test_presets_keep_quantized_weights(family, mode, tmp_path):
    lm = FAMILIES[family]()
    x = _inputs(lm)
    lm.save_to_preset(tmp_path / "float")
    lm.quantize(mode)
    lm.save_to_preset(tmp_path / mode)
    assert json.loads((tmp_path / mode / "config.json").read_text())["quantization"] == mode
    restored = type(lm).from_preset(tmp_path / mode)
    assert quantization_mode(restored) == mode
    # The stored integers and scales themselves (int4: two values packed per int8), not a float copy.
    kernels = {v.path: v for v in lm.weights if v.path.endswith("/kernel")}
    assert kernels and all(v.dtype == "int8" for v in kernels.values())
    for variable in restored.weights:
        if variable.path in kernels:
            assert variable.dtype == "int8" and variable.shape == kernels[variable.path].shape, variable.path
            np.testing.assert_array_equal(helpers.to_numpy(variable), helpers.to_numpy(kernels[variable.path]))
    np.testing.assert_array_equal(helpers.to_numpy(restored(x)), helpers.to_numpy(lm(x)))
    backbone = kt.models.Backbone.from_preset(tmp_path / mode)
    np.testing.assert_array_equal(helpers.to_numpy(backbone(x)), helpers.to_numpy(lm.backbone(x)))
    assert "quantization" not in json.loads((tmp_path / "float" / "config.json").read_text())


def test_lora_on_int8_weights_trains_the_factors_alone_and_generates():
    """QLoRA-style: float LoRA factors over frozen int8 kernels; `fit` moves only the factors."""
    lm = FAMILIES["gpt"]()
    lm.quantize("int8")
    lm.backbone.enable_lora(2)
    assert any(v.dtype == "int8" for v in lm.weights if v.path.endswith("query/kernel"))
    x = _inputs(lm)
    before = helpers.to_numpy(lm(x))
    fit_moves_only_the_factors(lm)  # the int8 kernels included
    assert np.abs(helpers.to_numpy(lm(x)) - before).max() > 0  # the trained factors change the outputs
    _perturb_lora(lm.backbone, seed=2)  # large factors: greedy choices far from ties
    _greedy_matches_the_forward_pass(lm)
    with pytest.raises(ValueError, match="merge_lora works on float weights.*int8"):
        lm.backbone.merge_lora()


def test_bad_mode_names_the_argument():
    lm = FAMILIES["gpt"]()
    with pytest.raises(ValueError, match="int3"):
        lm.quantize("int3")
    with pytest.raises(ValueError, match="float8"):
        lm.backbone.quantize("float8")
