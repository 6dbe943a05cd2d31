"""Keras int8 / int4 weights on every family: outputs near the float model's, generation after
quantizing (one rebuild of the compiled loop) against the quantized model's own full forward pass,
presets that keep the 8- and 4-bit forms, and LoRA trained on top of int8 weights."""

import json

import keras
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


_PROJECTIONS = (keras.layers.Dense, keras.layers.EinsumDense)
INT4_BLOCK = 128  # Keras's default int4 block: rows of the input axis that share a scale and a zero point


def _projections(task):
    return [layer for layer in task._flatten_layers() if isinstance(layer, _PROJECTIONS)]


def _input_axes(layer):
    """The kernel axes a projection sums over (those its input has and its output has not)."""
    if isinstance(layer, keras.layers.EinsumDense):
        inputs, rest = layer.equation.split(",")
        kernel, outputs = rest.split("->")
        return tuple(axis for axis, letter in enumerate(kernel) if letter in inputs and letter not in outputs)
    return (0,)  # Dense: (in, out)


def int4_reference(kernel, input_axes, block=INT4_BLOCK):
    """Keras's int4 weights, dequantized, in numpy: for each output channel and each block of `block` rows along
    the input axes, 16 levels (-8..7) spread evenly over [min, max] (a block padded with zero rows counts the
    padding, so its range holds 0), with an integer zero point; each weight rounded to its nearest level."""
    other = [axis for axis in range(kernel.ndim) if axis not in input_axes]
    moved = np.transpose(kernel, (*input_axes, *other))  # (in..., out...)
    rows = int(np.prod([kernel.shape[axis] for axis in input_axes]))
    flat = moved.reshape(rows, -1)  # (I, O)
    out = np.empty_like(flat)
    for start in range(0, rows, block):
        group = flat[start : start + block]  # (<= block, O)
        low, high = group.min(axis=0), group.max(axis=0)
        if len(group) < block:
            low, high = np.minimum(low, 0), np.maximum(high, 0)
        scale = (high - low + np.float32(keras.config.epsilon())) / np.float32(15)  # (O,)
        zero = np.clip(np.round(-low / scale) - 8, -8, 7)
        levels = np.clip(np.round(group / scale) + zero, -8, 7)
        out[start : start + block] = (levels - zero) * scale
    return np.transpose(out.reshape(moved.shape), np.argsort((*input_axes, *other)))


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_quantized_outputs_stay_near_float(family):
    task = FAMILIES[family]()
    x = _inputs(task)
    reference = helpers.to_numpy(task(x))
    task.quantize("int8")
    kernels = [v for v in task.weights if v.path.endswith("/kernel")]
    assert kernels and all(v.dtype == "int8" for v in kernels)
    assert all(v.dtype == "float32" for v in task.weights if v.path.endswith("embeddings"))  # tables stay float
    # The tiny test models' weights are large (std 0.3): int8 moves the logits by 2-6% of their range;
    # weights read as raw integers would move them by far more.
    assert _relative_error(helpers.to_numpy(task(x)), reference) < 0.1


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_int4_outputs_are_the_float_model_with_int4_rounded_weights(family):
    """int4 is weight-only (activations stay float): the quantized model computes what the float model computes
    with each projection kernel replaced by its int4 rounding, written out in numpy above. So the outputs agree to
    float32 round-off (measured: at most 4e-7 of their range), where one weight rounded one level off already moves
    the tiny GPT's logits by 1e-4 of their range, and int4 itself moves them by 35-45%."""
    quantized, rounded = FAMILIES[family](), FAMILIES[family]()
    x = _inputs(quantized)
    reference = helpers.to_numpy(quantized(x))
    quantized.quantize("int4")
    assert quantization_mode(quantized) == "int4"
    for layer in _projections(rounded):
        layer.kernel.assign(int4_reference(helpers.to_numpy(layer.kernel), _input_axes(layer)))
    expected = helpers.to_numpy(rounded(x))
    assert _relative_error(expected, reference) > 0.05  # the rounding is not a no-op: the check below has teeth
    error = _relative_error(helpers.to_numpy(quantized(x)), expected)
    assert error < 1e-5, error


def _greedy_matches_the_forward_pass(task, new_tokens=6):
    """Greedy `generate` on PROMPT equals the argmax of the task's own full forward pass, step by step."""
    eos = task.preprocessor.tokenizer.eos_token_id
    out = task.generate(np.asarray([PROMPT], "int32"), max_new_tokens=new_tokens, stop_token_ids=[eos])
    if hasattr(task.preprocessor, "decoder_start_token_id"):  # seq2seq: PROMPT is the source
        start = task.preprocessor.decoder_start_token_id
        expected = helpers.reference_greedy(helpers.seq2seq_next_logits(task, PROMPT), [start], new_tokens, eos)
        generated = list(np.asarray(out)[0, 1 : 1 + len(expected)])
    else:
        expected = helpers.reference_greedy(helpers.causal_next_logits(task), PROMPT, new_tokens, eos)
        generated = list(np.asarray(out)[0, len(PROMPT) : len(PROMPT) + len(expected)])
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
@pytest.mark.parametrize(
    "family, mode", [("gpt", "int4"), ("llama", "int8"), ("llama", "int4"), ("t5", "int8"), ("t5", "int4")]
)
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
