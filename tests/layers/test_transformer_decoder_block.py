"""TransformerDecoderBlock against tests/reference.py, causality, cached decoding, serialisation
and the golden weights file.

Axes: B batch, T decoder length, S_enc encoder length, D model width, H heads, Hkv key/value heads,
Dh head size.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import TransformerDecoderBlock
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

B, T, S_ENC, D, F = 2, 5, 4, 8, 16
PADDING = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], "int32")
ENCODER_PADDING = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], "int32")


def _inputs(rng, length=T):
    return rng.standard_normal((B, length, D)).astype("float32")


def _built(rng, x, encoder_outputs=None, **kwargs):
    kwargs.setdefault("num_heads", 2)
    kwargs.setdefault("intermediate_dim", F)
    block = TransformerDecoderBlock(kernel_initializer="zeros", **kwargs)
    block(x, encoder_outputs)
    randomize_weights(block, rng)
    return block


def _case(name, rng):
    """(block kwargs, call kwargs, reference kwargs) for one parity case."""
    if name == "decoder_only_post_layer_norm":
        return dict(norm_first=False), dict(padding_mask=PADDING), {}
    if name == "cross_pre_rms_norm_gqa_biases":
        block_kwargs = dict(
            use_cross_attention=True, norm_type="rms_norm", norm_first=True, num_key_value_heads=1,
            activation="gelu_approximate",
        )  # fmt: skip
        call_kwargs = dict(
            encoder_outputs=_inputs(rng, S_ENC),
            padding_mask=PADDING,
            encoder_padding_mask=ENCODER_PADDING,
            self_attention_bias=rng.standard_normal((1, 2, T, T)).astype("float32"),
            cross_attention_bias=rng.standard_normal((1, 2, T, S_ENC)).astype("float32"),
        )
        ref_kwargs = dict(norm_type="rms_norm", norm_first=True, activation="gelu_approximate")
        return block_kwargs, call_kwargs, ref_kwargs
    if name == "cross_post_layer_norm_no_bias_not_causal":
        block_kwargs = dict(use_cross_attention=True, use_bias=False, attention_scale=1.0, norm_epsilon=1e-6)
        call_kwargs = dict(encoder_outputs=_inputs(rng, S_ENC), use_causal_mask=False)
        return block_kwargs, call_kwargs, dict(attention_scale=1.0, epsilon=1e-6)
    raise KeyError(name)


@pytest.mark.parametrize(
    "case",
    ["decoder_only_post_layer_norm", "cross_pre_rms_norm_gqa_biases", "cross_post_layer_norm_no_bias_not_causal"],
)
def test_matches_reference(case, rng):
    block_kwargs, call_kwargs, ref_kwargs = _case(case, rng)
    x = _inputs(rng)
    block = _built(rng, x, call_kwargs.get("encoder_outputs"), **block_kwargs)
    weights = block_weights(block)
    assert ("cross_attention" in weights) == block_kwargs.get("use_cross_attention", False)
    expected = reference.decoder_block(weights, x, **call_kwargs, **ref_kwargs)
    assert_close(block(x, **call_kwargs), expected)


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("use_cross_attention", [False, True])
def test_causality(use_cross_attention, rng):
    """Changing tokens after t never changes outputs at or before t."""
    x, memory = _inputs(rng), _inputs(rng, S_ENC)
    memory = memory if use_cross_attention else None
    block = _built(rng, x, memory, use_cross_attention=use_cross_attention, norm_first=True)
    t = 1
    x_changed = x.copy()
    x_changed[:, t + 1 :] = _inputs(rng, T - t - 1)
    a, b = to_numpy(block(x, memory)), to_numpy(block(x_changed, memory))
    np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-6)
    assert np.abs(a[:, t + 1 :] - b[:, t + 1 :]).max() > 1e-3


def test_encoder_padding_invariance_and_fully_padded_row(rng):
    """Encoder outputs at padded positions never matter; a fully padded encoder row stays finite."""
    x, memory = _inputs(rng), _inputs(rng, S_ENC)
    block = _built(rng, x, memory, use_cross_attention=True)
    memory_changed = memory.copy()
    memory_changed[1, 2:] = 50.0 * rng.standard_normal((2, D))
    a = to_numpy(block(x, memory, encoder_padding_mask=ENCODER_PADDING))
    b = to_numpy(block(x, memory_changed, encoder_padding_mask=ENCODER_PADDING))
    np.testing.assert_allclose(a, b, atol=1e-6)

    empty = np.array([[1, 1, 1, 1], [0, 0, 0, 0]], "int32")
    output = to_numpy(block(x, memory, encoder_padding_mask=empty))
    assert np.all(np.isfinite(output))
    expected = reference.decoder_block(block_weights(block), x, memory, encoder_padding_mask=empty)
    assert_close(output[0], expected[0])


@pytest.mark.parametrize("use_cross_attention", [False, True])
def test_cached_decoding_matches_full_pass(use_cross_attention, rng):
    """Prefill a static self-attention cache, then one token per step at cache_index, reusing the
    cross-attention cache: the same outputs as the full causal pass (and as the reference)."""
    s_max, prefill = T, 2
    x, memory = _inputs(rng), _inputs(rng, S_ENC)
    memory = memory if use_cross_attention else None
    kv_heads, head_dim = 1, D // 2
    block = _built(
        rng, x, memory, use_cross_attention=use_cross_attention, num_key_value_heads=kv_heads,
        norm_first=True, norm_type="rms_norm",
    )  # fmt: skip
    call_kwargs = dict(encoder_padding_mask=ENCODER_PADDING) if use_cross_attention else {}
    expected = reference.decoder_block(
        block_weights(block), x, memory, norm_type="rms_norm", norm_first=True, **call_kwargs
    )
    assert_close(block(x, memory, **call_kwargs), expected)

    cache = ops.zeros((B, 2, kv_heads, s_max, head_dim))
    result = block(x[:, :prefill], memory, self_attention_cache=cache, cache_index=0, **call_kwargs)
    assert len(result) == (3 if use_cross_attention else 2)
    output, cache, cross_cache = result if use_cross_attention else (*result, None)
    assert tuple(cache.shape) == (B, 2, kv_heads, s_max, head_dim)
    if use_cross_attention:
        assert tuple(cross_cache.shape) == (B, 2, kv_heads, S_ENC, head_dim)
    steps = [to_numpy(output)]
    for t in range(prefill, s_max):
        step_kwargs = dict(self_attention_cache=cache, cache_index=t, **call_kwargs)
        if use_cross_attention:
            # later steps pass the cross cache, not the encoder outputs
            output, cache, cross_cache = block(x[:, t : t + 1], cross_attention_cache=cross_cache, **step_kwargs)
        else:
            output, cache = block(x[:, t : t + 1], **step_kwargs)
        steps.append(to_numpy(output))
    assert_close(np.concatenate(steps, axis=1), expected)


def test_missing_encoder_outputs(rng):
    x, memory = _inputs(rng), _inputs(rng, S_ENC)
    block = _built(rng, x, memory, use_cross_attention=True)
    with pytest.raises(ValueError, match="encoder_outputs"):
        block(x)


# ----------------------------------------------------------------------------- round trips


def test_config_round_trip(rng):
    kwargs = dict(
        num_heads=2, intermediate_dim=F, activation="gated-relu", norm_type="rms_norm", norm_first=True,
        use_bias=False, num_key_value_heads=1, use_cross_attention=True,
    )  # fmt: skip
    x, memory = _inputs(rng), _inputs(rng, S_ENC)
    block = _built(rng, x, memory, **kwargs)
    config = block.get_config()
    for name, value in kwargs.items():
        assert config[name] == value, name
    clone = TransformerDecoderBlock.from_config(config)
    clone(x, memory)
    clone.set_weights(block.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x, memory)), to_numpy(block(x, memory)))


def test_keras_save_and_load(rng, tmp_path):
    x, memory = _inputs(rng), _inputs(rng, S_ENC)
    block = _built(rng, x, memory, use_cross_attention=True)
    model = wrap_in_model(
        block,
        {"x": ((T, D), "float32"), "memory": ((S_ENC, D), "float32"), "memory_mask": ((S_ENC,), "int32")},
        lambda l, i: l(i["x"], i["memory"], encoder_padding_mask=i["memory_mask"]),
    )
    inputs = {"x": x, "memory": memory, "memory_mask": ENCODER_PADDING}
    output = to_numpy(model(inputs))
    assert_close(output, reference.decoder_block(block_weights(block), x, memory, encoder_padding_mask=ENCODER_PADDING))
    restored = save_and_load(model, tmp_path)
    assert isinstance(restored.layers[-1], TransformerDecoderBlock)
    np.testing.assert_allclose(to_numpy(restored(inputs)), output, atol=1e-7)


def test_golden_weights():
    """Weights saved once (tests/layers/golden/make_golden.py) load on every backend and give the
    outputs the numpy reference computed from them."""
    golden = load_golden("decoder_block")
    x, call_kwargs = golden["inputs"], golden["call_kwargs"]
    block = TransformerDecoderBlock(**golden["config"], kernel_initializer="zeros")
    block(x, call_kwargs["encoder_outputs"])
    keras.saving.load_weights(block, golden["weights_path"])
    loaded = block_weights(block)
    for path, array in golden["weights"].items():
        sublayer, name = path.split("/")
        np.testing.assert_array_equal(loaded[sublayer][name], array, err_msg=path)
    assert_close(block(x, **call_kwargs), golden["expected"])


# ----------------------------------------------------------------------------- dtype policy


def test_mixed_bfloat16(rng):
    x, memory = _inputs(rng), _inputs(rng, S_ENC)
    kwargs = dict(use_cross_attention=True, norm_first=True)
    block32 = _built(rng, x, memory, **kwargs)
    block16 = TransformerDecoderBlock(2, F, kernel_initializer="zeros", dtype="mixed_bfloat16", **kwargs)
    block16(x, memory)
    block16.set_weights(block32.get_weights())
    expected = to_numpy(block32(x, memory, encoder_padding_mask=ENCODER_PADDING))
    output = block16(x, memory, encoder_padding_mask=ENCODER_PADDING)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    output = to_numpy(ops.cast(output, "float32"))
    assert np.all(np.isfinite(output))
    np.testing.assert_allclose(output, expected, atol=0.05 * np.abs(expected).max(), rtol=5e-2)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, pattern",
    [(dict(norm_type="scale_norm"), r"norm_type='?scale_norm"), (dict(activation="tanh"), r"activation='?tanh")],
)
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        TransformerDecoderBlock(num_heads=2, intermediate_dim=F, **kwargs)


def test_width_not_divisible_by_heads(rng):
    with pytest.raises(ValueError, match=r"num_heads=3"):
        TransformerDecoderBlock(num_heads=3, intermediate_dim=F)(_inputs(rng))
