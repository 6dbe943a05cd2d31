"""Helpers for the layer tests: random weights, and reading a layer's weights into the
numpy dicts that tests/reference.py takes."""

import json
import os

import keras
import numpy as np

from tests.conftest import to_numpy

# Tolerance of float32 layers against the float64 reference.
ATOL = 1e-5
RTOL = 1e-5


def assert_close(actual, expected, atol=ATOL, rtol=RTOL, msg=""):
    np.testing.assert_allclose(to_numpy(actual).astype(np.float64), expected, atol=atol, rtol=rtol, err_msg=msg)


def randomize_weights(layer, rng, std=0.3):
    """Replaces every weight of a built layer with random values, so that zero-initialised biases
    and unit norm scales cannot hide a missing term. Norm scales stay around 1."""
    assert layer.built, "build the layer first"
    for variable in layer.weights:
        shape = tuple(variable.shape)
        if variable.name in ("gamma", "scale"):
            values = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            values = std * rng.standard_normal(shape)
        variable.assign(values.astype(variable.dtype))


def _dense_weights(sublayer, prefix):
    weights = {f"{prefix}_kernel": to_numpy(sublayer.kernel)}
    if sublayer.bias is not None:
        weights[f"{prefix}_bias"] = to_numpy(sublayer.bias)
    return weights


def attention_weights(layer):
    """MultiHeadAttention -> {query,key,value,output}_{kernel,bias}."""
    weights = {}
    for prefix in ("query", "key", "value", "output"):
        weights.update(_dense_weights(getattr(layer, f"{prefix}_dense"), prefix))
    if layer.query_key_norm is not None:
        weights.update(query_norm_scale=to_numpy(layer.query_norm.scale), key_norm_scale=to_numpy(layer.key_norm.scale))
    _check_complete(layer, weights)
    return weights


def feed_forward_weights(layer):
    """FeedForward -> {intermediate,gate,output}_{kernel,bias}."""
    weights = {}
    for prefix in ("intermediate", "gate", "output"):
        sublayer = getattr(layer, f"{prefix}_dense", None)
        if sublayer is not None:
            weights.update(_dense_weights(sublayer, prefix))
    _check_complete(layer, weights)
    return weights


def norm_weights(layer):
    """LayerNormalization -> {gamma, beta}; RMS norm -> {scale}."""
    weights = {variable.name: to_numpy(variable) for variable in layer.weights}
    assert set(weights) in ({"gamma", "beta"}, {"scale"}), f"unexpected norm weights {sorted(weights)}"
    return weights


def block_weights(block):
    """Encoder or decoder block -> the nested dict of tests/reference.py."""
    weights = {
        "self_attention": attention_weights(block.self_attention),
        "self_attention_norm": norm_weights(block.self_attention_norm),
        "feed_forward": feed_forward_weights(block.feed_forward),
        "feed_forward_norm": norm_weights(block.feed_forward_norm),
    }
    if getattr(block, "cross_attention", None) is not None:
        weights["cross_attention"] = attention_weights(block.cross_attention)
        weights["cross_attention_norm"] = norm_weights(block.cross_attention_norm)
    _check_complete(block, weights)
    return weights


def _count(weights):
    return sum(_count(v) if isinstance(v, dict) else 1 for v in weights.values())


def _check_complete(layer, weights):
    # A weight the reference never sees would be an untested term.
    assert _count(weights) == len(layer.weights), (
        f"{layer.name}: read {_count(weights)} arrays but the layer has {len(layer.weights)} weights: "
        f"{[v.path for v in layer.weights]}"
    )


def wrap_in_model(layer, input_specs, call_fn):
    """A functional keras.Model around `layer`, for .keras save/load tests.

    input_specs: dict name -> (shape without batch, dtype); call_fn(layer, inputs_dict) -> output.
    """
    inputs = {name: keras.Input(shape=shape, dtype=dtype, name=name) for name, (shape, dtype) in input_specs.items()}
    return keras.Model(inputs, call_fn(layer, inputs))


def save_and_load(model, tmp_path):
    path = str(tmp_path / "model.keras")
    model.save(path)
    return keras.saving.load_model(path)


GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")


def load_golden(name):
    """The arrays written by golden/make_golden.py for `name` ("encoder_block" or "decoder_block").

    Returns dict: config (constructor kwargs), inputs, call_kwargs, expected (from the numpy
    reference), weights ({"sublayer/weight": array}) and weights_path (the .weights.h5 file).
    """
    with np.load(os.path.join(GOLDEN_DIR, f"{name}.npz")) as data:
        arrays = {key: data[key] for key in data.files}
    return {
        "config": json.loads(str(arrays["config"])),
        "inputs": arrays["inputs"],
        "call_kwargs": {k.removeprefix("call/"): v for k, v in arrays.items() if k.startswith("call/")},
        "expected": arrays["expected"],
        "weights": {k.removeprefix("weights/"): v for k, v in arrays.items() if k.startswith("weights/")},
        "weights_path": os.path.join(GOLDEN_DIR, f"{name}.weights.h5"),
    }
