"""TransformerEncoderBlock against tests/reference.py (both norm orders, both norm types),
masking properties, serialisation and the golden weights file.

Axes: B batch, T sequence length, D model width, H heads.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import TransformerEncoderBlock
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import (
    assert_close,
    block_weights,
    load_golden,
    randomize_weights,
    save_and_load,
    wrap_in_model,
)

B, T, D, F = 2, 5, 8, 16
PADDING = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32")


def _inputs(rng):
    return rng.standard_normal((B, T, D)).astype("float32")


def _built(rng, x, **kwargs):
    kwargs.setdefault("num_heads", 2)
    kwargs.setdefault("intermediate_dim", F)
    block = TransformerEncoderBlock(kernel_initializer="zeros", **kwargs)
    block(x)
    randomize_weights(block, rng)
    return block


def _reference_kwargs(layer_kwargs):
    names = {"activation": "activation", "norm_type": "norm_type", "norm_first": "norm_first"}
    kwargs = {ref: layer_kwargs[name] for name, ref in names.items() if name in layer_kwargs}
    kwargs["epsilon"] = layer_kwargs.get("norm_epsilon", 1e-5)
    kwargs["attention_scale"] = layer_kwargs.get("attention_scale")
    return kwargs


def _case(name, rng):
    """(block kwargs, call kwargs) for one parity case."""
    if name == "post_layer_norm":
        return dict(norm_type="layer_norm", norm_first=False), dict(padding_mask=PADDING)
    if name == "pre_rms_norm":
        return dict(norm_type="rms_norm", norm_first=True, activation="gelu"), dict(padding_mask=PADDING)
    if name == "pre_layer_norm_gqa_mask_bias_no_bias":
        mask = rng.random((B, T, T)) < 0.7
        mask[:, np.arange(T), np.arange(T)] = True  # every query sees itself
        block_kwargs = dict(
            norm_type="layer_norm", norm_first=True, num_heads=4, num_key_value_heads=2, key_dim=3,
            use_bias=False, attention_scale=1.0, activation="gated-silu", norm_epsilon=1e-6,
        )  # fmt: skip
        call_kwargs = dict(
            padding_mask=PADDING,
            attention_mask=mask,
            attention_bias=rng.standard_normal((1, 4, T, T)).astype("float32"),
        )
        return block_kwargs, call_kwargs
    if name == "post_rms_norm_no_bias":
        return dict(norm_type="rms_norm", norm_first=False, use_bias=False, activation="silu"), {}
    raise KeyError(name)


@pytest.mark.parametrize(
    "case", ["post_layer_norm", "pre_rms_norm", "pre_layer_norm_gqa_mask_bias_no_bias", "post_rms_norm_no_bias"]
)
def test_matches_reference(case, rng):
    block_kwargs, call_kwargs = _case(case, rng)
    x = _inputs(rng)
    block = _built(rng, x, **block_kwargs)
    expected = reference.encoder_block(block_weights(block), x, **_reference_kwargs(block_kwargs), **call_kwargs)
    assert_close(block(x, **call_kwargs), expected)
    output, scores = block(x, **call_kwargs, return_attention_scores=True)
    assert_close(output, expected)
    assert tuple(scores.shape) == (B, block_kwargs.get("num_heads", 2), T, T)


def test_norm_orders_differ(rng):
    """Post-norm and pre-norm with the same weights must give different outputs (no ignored flag)."""
    x = _inputs(rng)
    post = _built(rng, x, norm_first=False)
    pre = _built(rng, x, norm_first=True)
    pre.set_weights(post.get_weights())
    assert np.abs(to_numpy(post(x)) - to_numpy(pre(x))).max() > 1e-2


# ----------------------------------------------------------------------------- properties


def test_padding_invariance(rng):
    """Values at padded positions never change the outputs at real positions."""
    x = _inputs(rng)
    block = _built(rng, x, norm_first=True)
    x_changed = x.copy()
    x_changed[1, 3:] = 50.0 * rng.standard_normal((2, D))
    a = to_numpy(block(x, padding_mask=PADDING))
    b = to_numpy(block(x_changed, padding_mask=PADDING))
    real = PADDING.astype(bool)
    np.testing.assert_allclose(a[real], b[real], atol=1e-6)
    assert np.abs(a[~real] - b[~real]).max() > 1e-3


def test_fully_padded_row_is_finite(rng):
    x = _inputs(rng)
    block = _built(rng, x)
    padding = np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], "int32")
    expected = reference.encoder_block(block_weights(block), x, padding_mask=padding)
    output = to_numpy(block(x, padding_mask=padding))
    assert np.all(np.isfinite(output))
    assert_close(output[0], expected[0])
    output, scores = to_numpy(block(x, padding_mask=padding, return_attention_scores=True))
    assert np.all(np.isfinite(output)) and np.all(np.isfinite(scores))


def test_attention_scores_are_probabilities(rng):
    x = _inputs(rng)
    block = _built(rng, x)
    mask = np.tril(np.ones((T, T), bool))[None].repeat(B, axis=0)
    _, scores = block(x, padding_mask=PADDING, attention_mask=mask, return_attention_scores=True)
    scores = to_numpy(scores)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)
    allowed = np.broadcast_to((reference.padding_to_attention_mask(PADDING, T) & mask)[:, None], scores.shape)
    assert np.all(scores[~allowed] == 0.0) and np.all(scores[allowed] > 0.0)


# ----------------------------------------------------------------------------- round trips


def test_config_round_trip(rng):
    kwargs = dict(
        num_heads=4, intermediate_dim=F, activation="gated-silu", dropout=0.1, norm_type="rms_norm", norm_first=True,
        norm_epsilon=1e-6, use_bias=False, key_dim=3, num_key_value_heads=2, attention_scale=1.0,
    )  # fmt: skip
    x = _inputs(rng)
    block = _built(rng, x, **kwargs)
    config = block.get_config()
    for name, value in kwargs.items():
        assert config[name] == value, name
    clone = TransformerEncoderBlock.from_config(config)
    clone(x)
    clone.set_weights(block.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x, padding_mask=PADDING)), to_numpy(block(x, padding_mask=PADDING)))


def test_keras_save_and_load(rng, tmp_path):
    x = _inputs(rng)
    block = _built(rng, x, norm_type="rms_norm", norm_first=True)
    model = wrap_in_model(
        block,
        {"x": ((T, D), "float32"), "padding_mask": ((T,), "int32")},
        lambda l, i: l(i["x"], padding_mask=i["padding_mask"]),
    )
    inputs = {"x": x, "padding_mask": PADDING}
    output = to_numpy(model(inputs))
    assert_close(
        output,
        reference.encoder_block(block_weights(block), x, norm_type="rms_norm", norm_first=True, padding_mask=PADDING),
    )
    restored = save_and_load(model, tmp_path)
    assert isinstance(restored.layers[-1], TransformerEncoderBlock)
    np.testing.assert_allclose(to_numpy(restored(inputs)), output, atol=1e-7)


def test_golden_weights():
    """Weights saved once (tests/layers/golden/make_golden.py) load on every backend and give the
    outputs the numpy reference computed from them."""
    golden = load_golden("encoder_block")
    x = golden["inputs"]
    # the initializer is irrelevant (the weights are loaded); zeros spares JAX compiling random ops
    block = TransformerEncoderBlock(**golden["config"], kernel_initializer="zeros")
    block(x)
    keras.saving.load_weights(block, golden["weights_path"])
    loaded = block_weights(block)
    for path, array in golden["weights"].items():
        sublayer, name = path.split("/")
        np.testing.assert_array_equal(loaded[sublayer][name], array, err_msg=path)
    assert_close(block(x, **golden["call_kwargs"]), golden["expected"])


# ----------------------------------------------------------------------------- dtype policy


def test_mixed_bfloat16(rng):
    x = _inputs(rng)
    block32 = _built(rng, x, norm_first=True)
    block16 = TransformerEncoderBlock(2, F, norm_first=True, kernel_initializer="zeros", dtype="mixed_bfloat16")
    block16(x)
    block16.set_weights(block32.get_weights())
    expected = to_numpy(block32(x, padding_mask=PADDING))
    output, scores = block16(x, padding_mask=PADDING, return_attention_scores=True)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(block16(x).dtype) == "bfloat16"
    output, scores = (to_numpy(ops.cast(t, "float32")) for t in (output, scores))
    assert np.all(np.isfinite(output)) and np.all(np.isfinite(scores))
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=2e-2)
    np.testing.assert_allclose(output, expected, atol=0.05 * np.abs(expected).max(), rtol=5e-2)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(norm_type="batch_norm"), r"norm_type='?batch_norm"),
        (dict(activation="swish"), r"activation='?swish"),
        (dict(num_heads=0), r"num_heads=0"),
        (dict(dropout=-0.1), r"dropout=-0\.1"),
    ],
)
def test_bad_arguments(kwargs, pattern):
    kwargs = {"num_heads": 2, "intermediate_dim": F, **kwargs}
    with pytest.raises(ValueError, match=pattern):
        TransformerEncoderBlock(**kwargs)


def test_width_not_divisible_by_heads(rng):
    with pytest.raises(ValueError, match=r"num_heads=3") as info:
        TransformerEncoderBlock(num_heads=3, intermediate_dim=F)(_inputs(rng))
    assert str(D) in str(info.value)


def test_mismatched_padding_mask(rng):
    x = _inputs(rng)
    block = _built(rng, x)
    with pytest.raises(ValueError, match="mask") as info:
        block(x, padding_mask=np.ones((B, T + 2), "int32"))
    assert str(T + 2) in str(info.value)
