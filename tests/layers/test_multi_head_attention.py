"""MultiHeadAttention against tests/reference.py, plus masking, caching and serialisation properties.

Axes: B batch, T query length, S key length, H heads, Hkv key/value heads, Dh head size, D width.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers.kv_cache import BeamCache, PaddedQueryCache
from tests import reference
from tests.conftest import to_numpy
from tests.layers.helpers import assert_close, attention_weights, randomize_weights, save_and_load, wrap_in_model

# One set of shapes shared by most tests: under JAX every new shape costs a compile per op.
B, T, S, D = 2, 5, 7, 8


def _built_layer(rng, query, value=None, key=None, **kwargs):
    # Weights are randomised after the build; a constant initializer saves JAX compiling the
    # random initializers for every new shape.
    kwargs.setdefault("kernel_initializer", "zeros")
    layer = MultiHeadAttention(**kwargs)
    layer(query, value, key)  # builds
    randomize_weights(layer, rng)
    return layer


def _random(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


# ----------------------------------------------------------------------------- parity


def _case(name, rng):
    """(layer kwargs, call inputs, reference kwargs) for one parity case."""
    x = _random(rng, B, T, D)
    if name == "self_padding_mask":
        mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32")
        return dict(num_heads=2), dict(query=x, attention_mask=mask)
    if name == "cross_full_mask_bias_causal_key_dim":
        # T < S, separate key and value of other widths, key_dim != D / H, full mask, a (B, H, T, S)
        # bias and the bottom-right causal mask (query i sees keys j <= i + S - T).
        value, key = _random(rng, B, S, 6), _random(rng, B, S, 7)
        mask = rng.random((B, T, S)) < 0.6
        mask[:, :, 0] = True  # no fully masked row here
        bias = _random(rng, B, 2, T, S)
        kwargs = dict(query=x, value=value, key=key, attention_mask=mask, attention_bias=bias, use_causal_mask=True)
        return dict(num_heads=2, key_dim=3), kwargs
    if name == "gqa_no_bias_scale":
        # grouped-query, no biases, explicit scale, padding mask and a (1, H, T, T) bias.
        mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0]], "int32")
        kwargs = dict(query=x, attention_mask=mask, attention_bias=_random(rng, 1, 4, T, T))
        return dict(num_heads=4, num_key_value_heads=2, key_dim=3, use_bias=False, scale=0.7), kwargs
    if name == "self_causal_padding":
        mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], "bool")
        return dict(num_heads=2), dict(query=x, attention_mask=mask, use_causal_mask=True)
    if name in ("query_key_norm_head_gqa_rotary", "query_key_norm_full_causal"):
        # Qwen3's per-head norms (with a head size other than D / H, rotary positions after the norm) and
        # OLMoE's norms over all heads; the norms' epsilon large enough to count.
        mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], "bool")
        kwargs = dict(num_heads=4, num_key_value_heads=2, key_dim=4, query_key_norm_epsilon=0.1)
        if name == "query_key_norm_head_gqa_rotary":
            kwargs.update(query_key_norm="head", rotary_embedding={"max_wavelength": 100.0})
            return kwargs, dict(query=x, attention_mask=mask, use_causal_mask=True)
        return {**kwargs, "query_key_norm": "full"}, dict(query=x, attention_mask=mask, use_causal_mask=True)
    raise KeyError(name)


PARITY_CASES = [
    "self_padding_mask",
    "cross_full_mask_bias_causal_key_dim",
    "gqa_no_bias_scale",
    "self_causal_padding",
    "query_key_norm_head_gqa_rotary",
    "query_key_norm_full_causal",
]


@pytest.mark.parametrize("case", PARITY_CASES)
def test_matches_reference(case, rng):
    layer_kwargs, call_kwargs = _case(case, rng)
    layer = _built_layer(rng, call_kwargs["query"], call_kwargs.get("value"), call_kwargs.get("key"), **layer_kwargs)
    weights = attention_weights(layer)
    if not layer_kwargs.get("use_bias", True):
        assert not any(name.endswith("_bias") for name in weights)
    norm = {
        "query_key_norm": layer_kwargs.get("query_key_norm"),
        "norm_epsilon": layer_kwargs.get("query_key_norm_epsilon"),
    }
    rotary = layer_kwargs.get("rotary_embedding")
    expected, expected_probs = reference.multi_head_attention(
        weights,
        **call_kwargs,
        scale=layer_kwargs.get("scale"),
        return_attention_scores=True,
        rotary_kwargs=rotary and {"max_wavelength": rotary["max_wavelength"]},
        **(norm if norm["query_key_norm"] else {}),
    )
    # Two code paths: fused attention (no scores) and explicit softmax (scores).
    assert_close(layer(**call_kwargs), expected)
    output, scores = layer(**call_kwargs, return_attention_scores=True)
    assert_close(output, expected)
    assert_close(scores, expected_probs)
    assert tuple(scores.shape) == expected_probs.shape


def test_reference_self_consistency():
    """The reference's GQA equals plain MHA with the key/value heads copied per group."""
    rng = np.random.default_rng(1)
    w = {
        "query_kernel": rng.standard_normal((D, 4, 2)),
        "key_kernel": rng.standard_normal((D, 2, 2)),
        "value_kernel": rng.standard_normal((D, 2, 2)),
        "output_kernel": rng.standard_normal((4, 2, D)),
    }
    full = dict(
        w, key_kernel=np.repeat(w["key_kernel"], 2, axis=1), value_kernel=np.repeat(w["value_kernel"], 2, axis=1)
    )
    x = rng.standard_normal((B, T, D))
    np.testing.assert_allclose(
        reference.multi_head_attention(w, x, use_causal_mask=True),
        reference.multi_head_attention(full, x, use_causal_mask=True),
        atol=1e-12,
    )


# ----------------------------------------------------------------------------- properties


def test_causality(rng):
    """Changing tokens after t never changes outputs at or before t."""
    x = _random(rng, B, T, D)
    layer = _built_layer(rng, x, num_heads=2)
    t = 2
    x_changed = x.copy()
    x_changed[:, t + 1 :] = _random(rng, B, T - t - 1, D)
    for scores in (False, True):
        a = to_numpy(layer(x, use_causal_mask=True, return_attention_scores=scores))
        b = to_numpy(layer(x_changed, use_causal_mask=True, return_attention_scores=scores))
        a, b = (a[0], b[0]) if scores else (a, b)
        np.testing.assert_allclose(a[:, : t + 1], b[:, : t + 1], atol=1e-6)
        assert np.abs(a[:, t + 1 :] - b[:, t + 1 :]).max() > 1e-3  # and later outputs do change


def test_padding_invariance(rng):
    """Values at padded key positions never change the outputs."""
    x, value = _random(rng, B, T, D), _random(rng, B, T, D)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 1, 0]], "int32")
    layer = _built_layer(rng, x, value, num_heads=2)
    value_changed = value.copy()
    value_changed[1, [2, 4]] = 100.0 * _random(rng, 2, D)
    for scores in (False, True):
        a = layer(x, value_changed, attention_mask=mask, return_attention_scores=scores)
        b = layer(x, value, attention_mask=mask, return_attention_scores=scores)
        a, b = (a[0], b[0]) if scores else (a, b)
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), atol=1e-6)


def test_fully_masked_row_is_finite(rng):
    x = _random(rng, B, T, D)
    mask = np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], "int32")
    layer = _built_layer(rng, x, num_heads=2)
    expected = reference.multi_head_attention(attention_weights(layer), x, attention_mask=mask)
    output = to_numpy(layer(x, attention_mask=mask))
    output_slow, scores = to_numpy(layer(x, attention_mask=mask, return_attention_scores=True))
    for array in (output, output_slow, scores):
        assert np.all(np.isfinite(array))
    assert_close(output[0], expected[0])
    assert_close(output_slow[0], expected[0])


def test_attention_scores_are_probabilities(rng):
    x = _random(rng, B, T, D)
    mask = np.array([[1, 1, 1, 1, 1], [1, 0, 1, 1, 0]], "int32")
    layer = _built_layer(rng, x, num_heads=2)
    _, scores = layer(x, attention_mask=mask, use_causal_mask=True, return_attention_scores=True)
    scores = to_numpy(scores)  # (B, H, T, S)
    assert scores.shape == (B, 2, T, T)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)
    allowed = reference.combine_masks(
        reference.padding_to_attention_mask(mask, T)[:, None], reference.causal_mask(T, T)[None, None]
    )
    allowed = np.broadcast_to(allowed, scores.shape)
    assert np.all(scores[~allowed] == 0.0)
    assert np.all(scores[allowed] > 0.0)


@pytest.mark.parametrize("form", ["stacked", "pair"])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_cached_decoding_matches_full_pass(rng, form, kv_heads):
    """Prefill a static cache, then one token per step at cache_index == the full causal pass.

    Both cache forms: one (B, 2, Hkv, S_max, Dh) tensor, or the (keys, values) pair of
    (B, Hkv, S_max, Dh) buffers that `generate` carries; kv_heads=1 is grouped-query attention.
    """
    s_max, prefill, heads = T, 2, 2
    x = _random(rng, B, s_max, D)
    layer = _built_layer(rng, x, num_heads=heads, num_key_value_heads=kv_heads)
    expected = reference.multi_head_attention(attention_weights(layer), x, use_causal_mask=True)
    full = to_numpy(layer(x, use_causal_mask=True))
    assert_close(full, expected)

    if form == "stacked":
        cache = ops.zeros((B, 2, kv_heads, s_max, D // heads))  # heads before positions
    else:
        cache = (ops.zeros((B, kv_heads, s_max, D // heads)), ops.zeros((B, kv_heads, s_max, D // heads)))
    output, cache = layer(x[:, :prefill], cache=cache, cache_index=0, use_causal_mask=True)
    steps = [to_numpy(output)]
    for t in range(prefill, s_max):
        # scalar tensor indices, as a compiled loop passes them (the decoder test uses Python ints)
        index = ops.convert_to_tensor(t, "int32")
        output, cache = layer(x[:, t : t + 1], cache=cache, cache_index=index, use_causal_mask=True)
        steps.append(to_numpy(output))
    assert_close(np.concatenate(steps, axis=1), expected)

    if form == "stacked":
        assert tuple(cache.shape) == (B, 2, kv_heads, s_max, D // heads)
        cache_keys, cache_values = to_numpy(cache)[:, 0], to_numpy(cache)[:, 1]
    else:
        assert isinstance(cache, tuple) and all(tuple(c.shape) == (B, kv_heads, s_max, D // heads) for c in cache)
        cache_keys, cache_values = to_numpy(cache[0]), to_numpy(cache[1])
    keys, values = reference.project_key_value(attention_weights(layer), x)  # (B, S, Hkv, Dh)
    assert_close(cache_keys.transpose(0, 2, 1, 3), keys)
    assert_close(cache_values.transpose(0, 2, 1, 3), values)


def test_cached_step_scores(rng):
    """With a cache, scores cover the whole cache and positions past the index get 0."""
    s_max = T
    x = _random(rng, B, 2, D)
    layer = _built_layer(rng, x, num_heads=2)
    cache = ops.zeros((B, 2, 2, s_max, D // 2))
    output, scores, cache = layer(x, cache=cache, cache_index=1, use_causal_mask=True, return_attention_scores=True)
    scores = to_numpy(scores)
    assert scores.shape == (B, 2, 2, s_max)
    allowed = reference.causal_mask(2, s_max, query_start=1)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-6)
    assert np.all(scores[..., ~allowed] == 0.0)


def test_cross_attention_cache(rng):
    """compute_cache + cache without index == attending to the encoder outputs directly."""
    x, memory = _random(rng, B, T, D), _random(rng, B, S, 6)
    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 1, 0, 0]], "int32")
    layer = _built_layer(rng, x, memory, num_heads=2, key_dim=3)
    weights = attention_weights(layer)
    cache = layer.compute_cache(memory)
    keys, values = reference.project_key_value(weights, memory)  # (B, S, H, Dh)
    assert tuple(cache.shape) == (B, 2, 2, S, 3)  # (B, 2, Hkv, S, Dh)
    assert_close(to_numpy(cache)[:, 0].transpose(0, 2, 1, 3), keys)
    assert_close(to_numpy(cache)[:, 1].transpose(0, 2, 1, 3), values)
    other = _random(rng, B, S, 6)  # ignored when the cache is given
    output, returned_cache = layer(x, other, attention_mask=mask, cache=cache)
    assert_close(output, reference.multi_head_attention(weights, x, memory, attention_mask=mask))
    np.testing.assert_array_equal(to_numpy(returned_cache), to_numpy(cache))


@pytest.mark.parametrize("kv_heads, new_tokens", [(2, 1), (1, 1), (2, 2)])
def test_beam_cache_reads_each_beam_history(rng, kv_heads, new_tokens):
    """A beam cache (K slots + ancestry table) == plain causal attention over each beam's own history.

    Row b * K + k holds, at position s < index, the token of slot ancestry[b, k, s], then its own
    new tokens: the numpy reference attends over that sequence; the layer must give the same
    outputs and write the new keys/values into slot k only. kv_heads=1 is grouped-query attention;
    the ancestry entries at the new positions are random and must be ignored.
    """
    K, s_max, index, heads = 3, T, 3, 2
    Dh = D // heads
    slot_tokens = _random(rng, B, K, s_max, D)  # what each slot's keys were computed from
    ancestry = rng.integers(0, K, (B, K, s_max)).astype("int32")
    new = _random(rng, B * K, new_tokens, D)  # (R, T_new, D)
    layer = _built_layer(rng, new, num_heads=heads, num_key_value_heads=kv_heads)
    weights = attention_weights(layer)

    keys, values = reference.project_key_value(weights, slot_tokens.reshape(B, K * s_max, D))  # (B, K * S, Hkv, Dh)
    keys = keys.reshape(B, K, s_max, kv_heads, Dh)
    values = values.reshape(B, K, s_max, kv_heads, Dh)
    keys_t = keys.transpose(0, 3, 4, 2, 1).reshape(B, kv_heads, Dh, s_max * K)  # position s of slot j at s * K + j
    slot_values = values.transpose(0, 3, 2, 1, 4).reshape(B, kv_heads, s_max * K, Dh)
    cache = BeamCache(
        ops.convert_to_tensor(keys_t.astype("float32")),
        ops.convert_to_tensor(slot_values.astype("float32")),
        ops.convert_to_tensor(ancestry),
    )
    output, cache = layer(new, cache=cache, cache_index=ops.convert_to_tensor(index, "int32"), use_causal_mask=True)

    for b in range(B):
        for k in range(K):
            history = np.stack([slot_tokens[b, ancestry[b, k, s], s] for s in range(index)])  # (index, D)
            sequence = np.concatenate([history, new[b * K + k]])[None]  # (1, index + T_new, D)
            expected = reference.multi_head_attention(weights, sequence, use_causal_mask=True)[:, index:]
            assert_close(to_numpy(output)[b * K + k : b * K + k + 1], expected)

    written_keys, written_values = reference.project_key_value(weights, new)  # (R, T_new, Hkv, Dh)
    expected_keys, expected_values = keys.copy(), values.copy()  # (B, K, S, Hkv, Dh)
    expected_keys[:, :, index : index + new_tokens] = written_keys.reshape(B, K, new_tokens, kv_heads, Dh)
    expected_values[:, :, index : index + new_tokens] = written_values.reshape(B, K, new_tokens, kv_heads, Dh)
    got_keys = to_numpy(cache.keys_t).reshape(B, kv_heads, Dh, s_max, K).transpose(0, 4, 3, 1, 2)
    got_values = to_numpy(cache.values).reshape(B, kv_heads, s_max, K, Dh).transpose(0, 3, 2, 1, 4)
    assert_close(got_keys, expected_keys)
    assert_close(got_values, expected_values)
    np.testing.assert_array_equal(to_numpy(cache.ancestry), ancestry)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_padded_query_cache_runs_only_the_first_token(rng, kv_heads):
    """A `PaddedQueryCache`: of T query tokens only the first is real.

    It must give the plain causal attention of the first token at every row, with a bias row
    for that token only, and write only its keys/values: the pad rows are random and must
    change nothing. kv_heads=1 is grouped-query attention.
    """
    s_max, index, heads, pads = T, 3, 2, 2
    Dh = D // heads
    x = _random(rng, B, s_max, D)
    layer = _built_layer(rng, x, num_heads=heads, num_key_value_heads=kv_heads)
    weights = attention_weights(layer)
    keys, values = reference.project_key_value(weights, x)  # (B, S, Hkv, Dh)
    old = _random(rng, B, kv_heads, s_max, Dh)  # what the cache holds from `index` on: never read
    cache_keys, cache_values = old.copy(), _random(rng, B, kv_heads, s_max, Dh)
    cache_keys[:, :, :index] = keys[:, :index].transpose(0, 2, 1, 3)
    cache_values[:, :, :index] = values[:, :index].transpose(0, 2, 1, 3)
    query = np.concatenate([x[:, index : index + 1], _random(rng, B, pads, D)], axis=1)  # (B, 1 + pads, D)
    bias = _random(rng, 1, heads, 1 + pads, s_max)  # (1, H, T, S): only its first query row counts
    cache = PaddedQueryCache(ops.convert_to_tensor(cache_keys), ops.convert_to_tensor(cache_values))
    output, cache = layer(
        query, attention_bias=bias, cache=cache, cache_index=ops.convert_to_tensor(index, "int32"), use_causal_mask=True
    )

    # The numpy reference over the first index + 1 positions, with the bias row of the real token.
    sequence_bias = np.zeros((1, heads, index + 1, index + 1), "float32")
    sequence_bias[:, :, index] = bias[:, :, 0, : index + 1]
    expected = reference.multi_head_attention(
        weights, x[:, : index + 1], use_causal_mask=True, attention_bias=sequence_bias
    )[:, index:]  # (B, 1, D)
    assert tuple(output.shape) == (B, 1 + pads, D)
    assert_close(to_numpy(output), np.repeat(expected, 1 + pads, axis=1))
    written_keys, written_values = cache_keys.copy(), cache_values.copy()
    written_keys[:, :, index] = keys[:, index]
    written_values[:, :, index] = values[:, index]
    assert_close(to_numpy(cache.keys), written_keys)
    assert_close(to_numpy(cache.values), written_values)


def test_step_caches_refuse_masks_and_scores(rng):
    x = _random(rng, B * 2, 1, D)
    layer = _built_layer(rng, x, num_heads=2)
    cache = BeamCache(ops.zeros((B, 2, D // 2, 2 * T)), ops.zeros((B, 2, 2 * T, D // 2)), ops.zeros((B, 2, T), "int32"))
    with pytest.raises(ValueError, match="beam cache"):
        layer(x, cache=cache, cache_index=1, return_attention_scores=True)
    with pytest.raises(ValueError, match="beam cache"):
        layer(x, cache=cache, cache_index=1, attention_mask=np.ones((B * 2, T), bool))
    padded = PaddedQueryCache(ops.zeros((B * 2, 2, T, D // 2)), ops.zeros((B * 2, 2, T, D // 2)))
    with pytest.raises(ValueError, match="padded-query cache"):
        layer(x, cache=padded, cache_index=1, return_attention_scores=True)
    with pytest.raises(ValueError, match="padded-query cache"):
        layer(x, cache=padded, cache_index=None)


# ----------------------------------------------------------------------------- round trips


def test_config_round_trip(rng):
    kwargs = dict(num_heads=4, key_dim=3, num_key_value_heads=2, use_bias=False, dropout=0.1, scale=0.7)
    x = _random(rng, B, T, D)
    layer = _built_layer(rng, x, **kwargs)
    config = layer.get_config()
    for name, value in kwargs.items():
        assert config[name] == value, name
    clone = MultiHeadAttention.from_config(config)
    clone(x)
    clone.set_weights(layer.get_weights())
    np.testing.assert_array_equal(to_numpy(clone(x, use_causal_mask=True)), to_numpy(layer(x, use_causal_mask=True)))


def test_keras_save_and_load(rng, tmp_path):
    x, memory = _random(rng, B, T, D), _random(rng, B, S, 6)
    mask = np.array([[1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 1, 0]], "int32")
    layer = _built_layer(rng, x, memory, num_heads=2, num_key_value_heads=1)
    model = wrap_in_model(
        layer,
        {"query": ((T, D), "float32"), "memory": ((S, 6), "float32"), "mask": ((S,), "int32")},
        lambda l, i: l(i["query"], i["memory"], attention_mask=i["mask"]),
    )
    inputs = {"query": x, "memory": memory, "mask": mask}
    expected = to_numpy(model(inputs))
    assert_close(expected, reference.multi_head_attention(attention_weights(layer), x, memory, attention_mask=mask))
    restored = save_and_load(model, tmp_path)
    assert isinstance(restored.layers[-1], MultiHeadAttention)
    np.testing.assert_allclose(to_numpy(restored(inputs)), expected, atol=1e-7)


# ----------------------------------------------------------------------------- dtype policy


def test_mixed_bfloat16(rng):
    x = _random(rng, B, T, D)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], "int32")
    layer32 = _built_layer(rng, x, num_heads=2)
    layer16 = MultiHeadAttention(num_heads=2, kernel_initializer="zeros", dtype="mixed_bfloat16")
    layer16(x)
    layer16.set_weights(layer32.get_weights())
    expected = to_numpy(layer32(x, attention_mask=mask, use_causal_mask=True))

    fast = layer16(x, attention_mask=mask, use_causal_mask=True)
    output, scores = layer16(x, attention_mask=mask, use_causal_mask=True, return_attention_scores=True)
    for tensor in (fast, output):
        assert keras.backend.standardize_dtype(tensor.dtype) == "bfloat16"
    fast, output, scores = (to_numpy(ops.cast(t, "float32")) for t in (fast, output, scores))
    for array in (fast, output, scores):
        assert np.all(np.isfinite(array))
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=2e-2)
    np.testing.assert_allclose(fast, expected, atol=5e-2, rtol=5e-2)
    np.testing.assert_allclose(output, expected, atol=5e-2, rtol=5e-2)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(num_heads=0), r"num_heads=0"),
        (dict(num_heads=4, key_dim=0), r"key_dim=0"),
        (dict(num_heads=4, num_key_value_heads=3), r"num_key_value_heads=3"),
        (dict(num_heads=2, dropout=1.0), r"dropout=1\.0"),
        (dict(num_heads=2, query_key_norm="layer"), r"query_key_norm='layer'"),
        (dict(num_heads=2, query_key_norm="head", query_key_norm_epsilon=0.0), r"query_key_norm_epsilon=0\.0"),
    ],
)
def test_bad_constructor_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention(**kwargs)


def test_width_not_divisible_by_heads(rng):
    with pytest.raises(ValueError, match=r"num_heads=3") as info:
        MultiHeadAttention(num_heads=3)(_random(rng, B, T, D))
    assert str(D) in str(info.value)
    # with an explicit key_dim any width works
    layer = MultiHeadAttention(num_heads=3, key_dim=2, kernel_initializer="zeros")
    layer.build((B, T, D))
    assert tuple(layer.query_dense.kernel.shape) == (D, 3, 2)
    assert tuple(layer.output_dense.kernel.shape) == (3, 2, D)


@pytest.mark.parametrize("mask_shape", [(B, T + 1), (B, T, T - 1), (B + 1, T)])
def test_mismatched_mask_shape(mask_shape, rng):
    x = _random(rng, B, T, D)
    layer = MultiHeadAttention(num_heads=2, kernel_initializer="zeros")
    with pytest.raises(ValueError, match="attention_mask") as info:
        layer(x, attention_mask=np.ones(mask_shape, "int32"))
    assert str(mask_shape) in str(info.value)
