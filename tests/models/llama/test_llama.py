"""Llama family: the backbone against a numpy forward pass, round trips, presets, the task base's
preset dispatch, fit, and generation (every sampler) against a full-forward reference.

Numerical parity with Hugging Face Llama / Qwen2 / Mistral (same weights) is in
tests/convert/test_hf_llama.py; the PyTorch kernels in tests/kernels/test_torch_kernels.py.
"""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import presets
from tests import reference
from tests.layers.helpers import attention_weights, feed_forward_weights

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def _tiny(vocabulary_size=40, **kwargs):
    config = dict(
        vocabulary_size=vocabulary_size,
        num_layers=2,
        num_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=48,
        max_sequence_length=64,
    )
    return kt.models.LlamaBackbone(**{**config, **kwargs})


def _ids(batch=3, length=10, vocabulary_size=40, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, length), bool)
    mask[1, 7:] = False
    return {"token_ids": rng.integers(0, vocabulary_size, (batch, length)).astype("int32"), "padding_mask": mask}


def _randomize(model, seed=0, std=0.2):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        base = 1.0 if variable.path.endswith("scale") else 0.0
        variable.assign((base + std * rng.standard_normal(tuple(variable.shape))).astype("float32"))


def _reference_forward(backbone, x, rope, window):
    """The backbone in numpy: embedding, pre-norm blocks (RMS norm, rotary GQA, SwiGLU), final RMS norm."""
    h = _numpy(backbone.token_embedding.embeddings)[x["token_ids"]].astype("float64")
    mask = x["padding_mask"]
    eps = backbone.norm_epsilon
    for block in backbone.transformer_layers:
        normed = reference.rms_norm(h, _numpy(block.self_attention_norm.scale), eps)
        h = h + reference.multi_head_attention(
            attention_weights(block.self_attention),
            normed,
            attention_mask=mask,
            use_causal_mask=True,
            rotary_kwargs=rope,
            sliding_window=window,
        )
        normed = reference.rms_norm(h, _numpy(block.feed_forward_norm.scale), eps)
        h = h + reference.feed_forward(feed_forward_weights(block.feed_forward), normed, "gated-silu")
    return reference.rms_norm(h, _numpy(backbone.layer_norm.scale), eps)


@pytest.mark.parametrize("variant", ["plain", "qwen2_llama3_window_partial"])
def test_backbone_matches_numpy_forward(variant):
    kwargs = {}
    rope = {"max_wavelength": 10000.0}
    window = None
    if variant != "plain":
        kwargs = dict(
            attention_bias=True,
            attention_output_bias=False,
            rope_scaling=LLAMA3,
            rotary_dim=4,
            sliding_window=3,
            rope_max_wavelength=500.0,
        )
        rope, window = {"max_wavelength": 500.0, "rotary_dim": 4, "scaling": LLAMA3}, 3
    backbone = _tiny(**kwargs)
    _randomize(backbone)
    x = _ids()
    expected = _reference_forward(backbone, x, rope, window)
    got = _numpy(backbone(x))
    real = x["padding_mask"]
    np.testing.assert_allclose(got[real], expected[real], atol=1e-4)


def test_backbone_config_round_trip_and_keras_file(tmp_path):
    backbone = _tiny(tie_word_embeddings=False, rope_scaling={"rope_type": "linear", "factor": 2.0}, sliding_window=4)
    x = _ids()
    clone = kt.models.LlamaBackbone.from_config(backbone.get_config())
    clone.set_weights(backbone.get_weights())
    np.testing.assert_array_equal(_numpy(clone(x)), _numpy(backbone(x)))
    lm = kt.models.LlamaCausalLM(backbone)
    lm.save(tmp_path / "lm.keras")
    restored = keras.saving.load_model(tmp_path / "lm.keras")
    np.testing.assert_allclose(_numpy(restored(x)), _numpy(lm(x)), atol=1e-6)


@pytest.mark.parametrize("tie", [True, False])
def test_head_is_tied_or_separate(tie):
    lm = kt.models.LlamaCausalLM(_tiny(tie_word_embeddings=tie))
    _randomize(lm)
    x = _ids()
    hidden = _numpy(lm.backbone(x))
    embedding = lm.backbone.token_embedding
    head = _numpy(embedding.embeddings).T if tie else _numpy(embedding.reverse_embeddings)
    np.testing.assert_allclose(_numpy(lm(x)), hidden @ head, atol=1e-4)
    np.testing.assert_allclose(_numpy(lm.decode_head()), head, atol=0)
    assert len(lm.weights) == len(lm.backbone.weights)  # a separate head lives in the embedding layer


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="num_layers"):
        _tiny(num_layers=0)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        _tiny(num_key_value_heads=3)
    with pytest.raises(ValueError, match="sliding_window"):
        _tiny(sliding_window=-1)
    with pytest.raises(ValueError, match="rope_type"):
        _tiny(rope_scaling={"rope_type": "yarn", "factor": 4.0})


@pytest.mark.parametrize(
    "name, count",
    [
        ("llama_tiny", None),
        ("smollm2_135m", 134_515_008),
        ("qwen2_0_5b", 494_032_768),
        ("qwen3_0_6b", 596_049_920),
        ("smollm3_3b", 3_075_098_624),
        ("phi4_mini", 3_836_021_760),
        ("qwen3_30b_a3b", 30_532_122_624),
        ("mixtral_8x7b", 46_702_792_704),
        ("olmoe_1b_7b", 6_919_161_856),
    ],
)
def test_presets_are_registered_with_the_published_shapes(name, count):
    row = {row["name"]: row for row in kt.list_presets()}[name]
    assert row["family"] == "llama"
    if count is not None:  # the Hugging Face models' own parameter counts
        assert row["parameter_count"] == count


def test_task_base_picks_the_family_from_the_preset():
    lm = kt.models.CausalLM.from_preset("llama_tiny")
    assert type(lm) is kt.models.LlamaCausalLM
    assert type(kt.models.Backbone.from_preset("llama_tiny")) is kt.models.LlamaBackbone
    text = lm.generate("def f(x):", max_new_tokens=4, sampler="greedy")
    assert text.startswith("def f(x):")


def test_preset_save_and_load(tmp_path):
    lm = kt.models.LlamaCausalLM.from_preset("llama_tiny")
    lm.save_to_preset(tmp_path / "preset")
    again = kt.models.CausalLM.from_preset(str(tmp_path / "preset"))
    x = _ids(vocabulary_size=8000)
    np.testing.assert_allclose(_numpy(again(x)), _numpy(lm(x)), atol=1e-6)


def test_preprocessor_without_a_start_token():
    """Qwen2's tokenizer has no BOS: prompts and texts get none rather than a None id."""
    loaded = kt.tokenizers.Tokenizer.load(presets.resolve("llama_tiny"))
    tokenizer = type(loaded)(loaded.backend_tokenizer, **{**loaded.special_tokens, "bos_token": None})
    assert tokenizer.bos_token_id is None
    preprocessor = kt.models.LlamaCausalLMPreprocessor(tokenizer, sequence_length=16)
    ids = tokenizer.tokenize("x = 1")
    assert preprocessor.generate_preprocess(["x = 1"]) == [ids]
    x, y, _ = preprocessor(["x = 1"])
    assert x["token_ids"][0, : len(ids)].tolist() == ids and y[0, len(ids) - 1] == tokenizer.eos_token_id


def test_fit_lowers_the_loss():
    tokenizer = kt.tokenizers.Tokenizer.load(presets.resolve("llama_tiny"))
    lm = kt.models.LlamaCausalLM(
        _tiny(vocabulary_size=tokenizer.vocabulary_size),
        kt.models.LlamaCausalLMPreprocessor(tokenizer, sequence_length=16, truncate=True),
    )
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    texts = ["def f(x):\n    return x\n", "import os\n"] * 4
    losses = [lm.fit(texts, batch_size=4, epochs=1, verbose=0).history["loss"][0] for _ in range(3)]
    assert losses[-1] < losses[0]


def _greedy_reference(lm, prompt, steps, width=16):
    """A full causal pass per new token, right-padded to one width (one compiled shape)."""
    ids = list(prompt)
    for _ in range(steps):
        x = {"token_ids": np.zeros((1, width), "int32"), "padding_mask": np.arange(width)[None] < len(ids)}
        x["token_ids"][0, : len(ids)] = ids
        ids.append(int(_numpy(lm(x))[0, len(ids) - 1].argmax()))
    return ids


@pytest.mark.parametrize("window", [None, 3])
def test_generate_equals_full_forward_greedy(window):
    """Ragged prompts, prefill plus cached steps (PyTorch: the layer kernels), against a full pass per token."""
    keras.utils.set_random_seed(1)
    lm = kt.models.LlamaCausalLM(_tiny(sliding_window=window, attention_bias=True, attention_output_bias=False))
    _randomize(lm, std=0.5)
    prompts = [[3, 5, 7, 9, 11], [2, 4]]
    out = lm.generate(prompts, max_new_tokens=8, sampler="greedy", stop_token_ids=None)
    for prompt, row in zip(prompts, out):
        assert list(row) == _greedy_reference(lm, prompt, 8)


def test_every_sampler_runs():
    lm = kt.models.CausalLM.from_preset("llama_tiny")
    for sampler in (
        "greedy",
        kt.samplers.BeamSampler(num_beams=3),
        kt.samplers.RandomSampler(temperature=0.8, top_k=20, top_p=0.9, seed=3),
    ):
        texts = lm.generate(["import", "def"], max_new_tokens=3, sampler=sampler)
        assert len(texts) == 2 and texts[0].startswith("import")
