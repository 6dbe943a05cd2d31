"""Gemma family: config round trips, the preset, bad arguments, `fit`, and the (1 + w) RMS norm against numpy.

Numerical parity with Hugging Face Gemma 3 / Gemma 2 (logits, greedy and beam tokens, the ONNX bundle, the export back)
is in tests/convert/test_hf_llama.py and tests/convert/test_hf_export.py; the kernels in tests/kernels/ and
tests/export/test_decode_kernels.py; the cached step under every runtime and sampler (Keras, SavedModel, ONNX bundle;
greedy, beam, random) against the full forward pass in tests/export/test_runtime_parity.py.
"""

import inspect

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import presets
from keras_transformer.convert import hf_gemma
from keras_transformer.layers.rms_normalization import RMSNormalization
from tests import reference
from tests.conftest import to_numpy

LAYER_TYPES = ["sliding_attention", "full_attention"]


def _tiny(vocabulary_size=40, **kwargs):
    config = dict(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        max_sequence_length=64,
        query_pre_attn_scalar=12.0,
        local_rope_max_wavelength=100.0,
        sliding_window=3,
        layer_types=LAYER_TYPES,
        query_key_norm="head",
        attention_logit_soft_cap=4.0,
        final_logit_soft_cap=6.0,
    )
    return kt.models.GemmaBackbone(**{**config, **kwargs})


def _ids(batch=3, length=10, vocabulary_size=40, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), bool)
    mask[1, 7:] = False
    return {"token_ids": rng.integers(0, vocabulary_size, (batch, length)).astype("int32"), "padding_mask": mask}


def _randomize(model, seed=0, std=0.3):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign((std * rng.standard_normal(tuple(variable.shape))).astype("float32"))


def test_config_round_trip_gives_the_same_logits():
    lm = kt.models.GemmaCausalLM(_tiny())
    _randomize(lm)
    again = kt.models.GemmaCausalLM.from_config(lm.get_config())
    again.set_weights(lm.get_weights())
    x = _ids()
    np.testing.assert_array_equal(to_numpy(again(x)), to_numpy(lm(x)))
    assert again.backbone.get_config() == lm.backbone.get_config()
    block = again.backbone.transformer_layers[0]
    assert (block.post_norm, block.norm_type, block.self_attention.logit_soft_cap) == (True, "rms_norm_plus_one", 4.0)


def test_preset_is_registered_with_gemma_3_1b_shape():
    row = {row["name"]: row for row in kt.list_presets()}["gemma3_1b"]
    assert row["family"] == "gemma"
    assert row["parameter_count"] == 999_885_952  # google/gemma-3-1b-it's own count
    config = presets.load_config("gemma3_1b")[1]["backbone"]["config"]
    assert config["layer_types"].count("full_attention") == 4 and config["sliding_window"] == 512


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="layer_types"):
        _tiny(layer_types=["sliding_attention"])
    with pytest.raises(ValueError, match="query_key_norm"):
        _tiny(query_key_norm="full")
    with pytest.raises(ValueError, match="query_pre_attn_scalar"):
        _tiny(query_pre_attn_scalar=0.0)
    with pytest.raises(ValueError, match="logit_soft_cap"):
        _tiny(attention_logit_soft_cap=-1.0)


def test_fit_lowers_the_loss():
    tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("llama_tiny"))
    lm = kt.models.GemmaCausalLM(
        _tiny(vocabulary_size=tokenizer.vocabulary_size),
        kt.models.GemmaCausalLMPreprocessor(tokenizer, sequence_length=16, truncate=True),
    )
    # TensorFlow's XLA compile on a CPU outlasts three eager epochs; JAX's jit is the fast way there.
    lm.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=keras.config.backend() != "tensorflow")
    texts = ["def f(x):\n    return x\n", "import os\n"] * 4
    losses = lm.fit(texts, batch_size=4, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_offset_rms_norm_against_numpy(dtype):
    """x / sqrt(mean(x^2) + eps) * (1 + w), computed in float32 and rounded once to the layer's dtype."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 8)).astype("float32")
    w = rng.normal(size=(8,)).astype("float32")
    norm = RMSNormalization(scale_offset=1.0, epsilon=1e-6, dtype=dtype)
    norm.build(x.shape)
    norm.scale.assign(w)
    expected = reference.rms_norm(keras.ops.cast(keras.ops.cast(x, dtype), "float32"), 1.0 + w.astype("float64"), 1e-6)
    tolerance = 1e-5 if dtype == "float32" else 1e-2 * np.abs(expected).max()
    np.testing.assert_allclose(to_numpy(keras.ops.cast(norm(x), "float32")), expected, atol=tolerance, rtol=0)
    again = RMSNormalization.from_config(norm.get_config())
    assert again.scale_offset == 1.0
    fresh = RMSNormalization(scale_offset=1.0)
    np.testing.assert_allclose(to_numpy(fresh(x)), reference.rms_norm(x, np.ones(8), 1e-6), atol=1e-5)  # starts at 1


# google/gemma-3-1b-it's config.json as published (transformers 4's layout: rope_theta, rope_local_base_freq,
# sliding_window_pattern; no layer_types), without the entries that do not describe the model's shape.
GEMMA3_1B_IT = {
    "architectures": ["Gemma3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "max_position_embeddings": 32768,
    "model_type": "gemma3_text",
    "num_attention_heads": 4,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "vocab_size": 262144,
}


def test_preset_is_what_the_checkpoint_converts_to():
    """The gemma3_1b preset's backbone is the converted config.json of the checkpoint it names (every other
    argument at its default)."""
    converted = hf_gemma.convert_config(GEMMA3_1B_IT)["backbone"]["config"]
    preset = presets.load_config("gemma3_1b")[1]["backbone"]["config"]
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(kt.models.GemmaBackbone).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    assert converted == {name: preset.get(name, defaults.get(name)) for name in converted}
