"""Llama-architecture checkpoints (Llama, Qwen2, Qwen3, SmolLM3, Mistral) in the Hugging Face layout ->
LlamaCausalLM, against `transformers`.

The peers are random LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM / SmolLM3ForCausalLM /
MistralForCausalLM (eager attention, grouped-query: 4 query heads, 2 key/value heads) saved with
`save_pretrained`; ours are loaded from those directories by `CausalLM.from_preset`, which must pick
LlamaCausalLM.

transformers' Llama, Qwen2 and Mistral rotate whole heads (`partial_rotary_factor` is ignored by
their default rotary embedding and breaks their scaled ones), so partial rotary has no peer to
match: the converter refuses it (tested below) instead of converting it.

Axes: B batch, T length, V vocabulary.
"""

import json
import shutil

import numpy as np
import pytest
import torch

from keras_transformer import cli
from keras_transformer.convert import hf_gemma, hf_llama
from keras_transformer.models import Backbone, CausalLM, GemmaBackbone, GemmaCausalLM, LlamaBackbone, LlamaCausalLM
from keras_transformer.presets import load_config
from keras_transformer.samplers import BeamSampler
from tests.conftest import to_numpy
from tests.convert import hf_models
from tests.convert.hf_export_cases import GEMMA2_OPTIONS, GEMMA3_ROPE
from tests.export.helpers import bundle_generator

ATOL = 1e-4
NEW_TOKENS = 10
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
# Each case: the builder's options. Together: every rope form (none, linear, llama3), tied and
# untied heads, Llama's biases on all four attention projections and the feed-forward, a head size
# other than D / H, Qwen2's query/key/value biases, and Mistral's window (4) shorter than the
# sequences (12 positions, prompts + 10 new tokens).
CASES = {
    "llama-llama3-untied-bias": dict(
        model_type="llama", head_dim=16, attention_bias=True, mlp_bias=True, rope_parameters=LLAMA3
    ),
    "llama-linear-tied": dict(
        model_type="llama",
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
    ),
    "qwen2-bias-tied": dict(model_type="qwen2", tie_word_embeddings=True),
    "mistral-window": dict(model_type="mistral", sliding_window=4),
    "qwen3-norms-window-layer": dict(
        model_type="qwen3", head_dim=16, use_sliding_window=True, sliding_window=4, max_window_layers=1
    ),
    "smollm3-nope-bias-tied": dict(
        model_type="smollm3", no_rope_layers=[1, 0], attention_bias=True, mlp_bias=True, tie_word_embeddings=True
    ),
    # Gemma (hf_models.gemma): a local layer (window 4) then a global one, query_pre_attn_scalar 24 (not the head size
    # 16). Gemma 3: two rotary bases, the global one scaled; Gemma 2: tied, soft-capped attention and output logits.
    "gemma3-window-two-ropes": dict(model_type="gemma3_text", rope_parameters=GEMMA3_ROPE, tie_word_embeddings=False),
    "gemma2-soft-caps-tied": dict(model_type="gemma2", **GEMMA2_OPTIONS),
}
GEMMA = ("gemma3-window-two-ropes", "gemma2-soft-caps-tied")


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(name) -> (directory, peer, ours) of one case, built once per module."""
    built = {}

    def get(name):
        if name not in built:
            directory = tmp_path_factory.mktemp(name)
            gemma = name in GEMMA
            hf = (hf_models.gemma if gemma else hf_models.llama_style)(directory, **CASES[name])
            lm = CausalLM.from_preset(directory)
            assert type(lm) is (GemmaCausalLM if gemma else LlamaCausalLM)
            built[name] = directory, hf, lm
        return built[name]

    return get


@pytest.fixture(scope="module", params=list(CASES))
def case(request, build):
    return build(request.param)


def _inputs(vocabulary_size, padded):
    rng = np.random.default_rng(0)
    token_ids = rng.integers(1, vocabulary_size, (3, 12)).astype("int32")
    lengths = np.array([12, 7, 3]) if padded else np.array([12, 12, 12])
    padding_mask = np.arange(12)[None, :] < lengths[:, None]  # (B, T), right-padded
    return {"token_ids": np.where(padding_mask, token_ids, 0).astype("int32"), "padding_mask": padding_mask}


def _peer_logits(hf, x):
    with torch.no_grad():
        return hf(
            input_ids=hf_models.to_torch(x["token_ids"]), attention_mask=hf_models.to_torch(x["padding_mask"])
        ).logits.numpy()  # (B, T, V)


def _prompts(hf):
    rng = np.random.default_rng(1)
    return [rng.integers(1, hf.config.vocab_size, n).tolist() for n in (6, 3)]  # ragged: ours pads


def _peer_generate(hf, prompt, **kwargs):
    """The peer's ids for one prompt alone (no padding), never stopping early."""
    with torch.no_grad():
        out = hf.generate(
            hf_models.to_torch([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
            **kwargs,
        )
    return out[0].tolist()


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_logits_match(case, padded):
    _, hf, lm = case
    x = _inputs(hf.config.vocab_size, padded)
    expected = _peer_logits(hf, x)
    real = x["padding_mask"]  # padded query positions are not compared
    np.testing.assert_allclose(to_numpy(lm(x))[real], expected[real], atol=ATOL, rtol=0)
    assert np.abs(expected[real]).max() > 1.0  # far from the tolerance: not a vacuous match


def test_greedy_generation_matches(case):
    _, hf, lm = case
    prompts = _prompts(hf)
    ours = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    for prompt, row in zip(prompts, ours):
        assert row == _peer_generate(hf, prompt, do_sample=False)
        assert len(set(row[len(prompt) :])) >= 2  # the continuation is not one repeated token


def test_beam_generation_matches(case):
    """Beam-4 with our BeamSampler's defaults (length_penalty=1.0, early_stopping=False), passed
    to the peer explicitly."""
    _, hf, lm = case
    prompts = _prompts(hf)
    sampler = BeamSampler(num_beams=4)
    ours = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=sampler)
    greedy = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    for prompt, row in zip(prompts, ours):
        expected = _peer_generate(
            hf,
            prompt,
            do_sample=False,
            num_beams=sampler.num_beams,
            length_penalty=sampler.length_penalty,
            early_stopping=sampler.early_stopping,
        )
        assert row == expected
    assert ours != greedy  # the search found something greedy did not: beams were compared


@pytest.mark.parametrize("name", [name for name in CASES if name not in GEMMA])
def test_converted_config(build, name):
    """The options each case sets reach the backbone, and the tokenizer has the checkpoint's tokens."""
    case = build(name)
    _, hf, lm = case
    backbone, tokenizer, config = lm.backbone, lm.preprocessor.tokenizer, hf.config
    head_dim = (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )  # Qwen2Config has none
    assert (backbone.num_key_value_heads, backbone.head_dim) == (2, head_dim)
    assert backbone.tie_word_embeddings == config.tie_word_embeddings
    windowed = config.model_type in ("mistral", "qwen3")
    assert backbone.sliding_window == (4 if windowed else None)
    assert backbone.layer_types == (["full_attention", "sliding_attention"] if config.model_type == "qwen3" else None)
    assert backbone.rope_layers == ([True, False] if config.model_type == "smollm3" else None)
    assert backbone.query_key_norm == ("head" if config.model_type == "qwen3" else None)
    assert tokenizer.eos_token_id == config.eos_token_id == tokenizer.pad_token_id  # no pad token: pads with eos
    if config.model_type in ("qwen2", "qwen3"):  # no start token; Qwen2: q/k/v biases, no output bias
        assert tokenizer.bos_token_id is None
        biases = (True, False) if config.model_type == "qwen2" else (False, False)
        assert (backbone.attention_bias, backbone.attention_output_bias) == biases
    else:
        assert tokenizer.bos_token_id == config.bos_token_id
    assert isinstance(Backbone.from_preset(case[0], load_weights=False), LlamaBackbone)


@pytest.mark.parametrize("name", GEMMA)
def test_gemma_converted_config(build, name):
    """Gemma's options reach the backbone: the layer types and window, the attention scale, each layer type's
    rotary base, Gemma 3's query/key norms, Gemma 2's soft caps; its tokenizer's `<bos>`, `<eos>` and `<pad>`."""
    directory, hf, lm = build(name)
    backbone, tokenizer, config = lm.backbone, lm.preprocessor.tokenizer, hf.config
    assert (backbone.layer_types, backbone.sliding_window) == (["sliding_attention", "full_attention"], 4)
    assert (backbone.head_dim, backbone.query_pre_attn_scalar) == (16, 24.0)
    gemma3 = config.model_type == "gemma3_text"
    rope = (1000.0, {"rope_type": "linear", "factor": 2.0}, 10.0) if gemma3 else (100.0, None, 100.0)
    assert (backbone.rope_max_wavelength, backbone.rope_scaling, backbone.local_rope_max_wavelength) == rope
    assert backbone.query_key_norm == ("head" if gemma3 else None)
    caps = (None, None) if gemma3 else (1.5, 3.0)
    assert (backbone.attention_logit_soft_cap, backbone.final_logit_soft_cap) == caps
    assert backbone.tie_word_embeddings == config.tie_word_embeddings == (not gemma3)
    ids = (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert ids == (config.bos_token_id, config.eos_token_id, config.pad_token_id)
    assert lm.preprocessor.generate_preprocess(["the cat"])[0][0] == config.bos_token_id
    assert isinstance(Backbone.from_preset(directory, load_weights=False), GemmaBackbone)


def test_sharded_checkpoint_loads_as_unsharded(tmp_path, build):
    _, _, lm = build("mistral-window")
    hf_models.llama_style(tmp_path, **CASES["mistral-window"], max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    sharded = LlamaCausalLM.from_preset(tmp_path)
    for ours, theirs in zip(lm.weights, sharded.weights, strict=True):
        np.testing.assert_array_equal(to_numpy(ours), to_numpy(theirs), err_msg=ours.path)


def test_cli_convert_round_trip(tmp_path, build, capsys):
    """`keras-transformer convert`, then our preset format; Qwen2's tokenizer keeps having no start token."""
    directory, hf, lm = build("qwen2-bias-tied")
    assert cli.main(["convert", str(directory), str(tmp_path / "preset")]) == 0
    assert "LlamaCausalLM" in capsys.readouterr().out
    converted = CausalLM.from_preset(tmp_path / "preset")
    assert type(converted) is LlamaCausalLM and converted.preprocessor.tokenizer.bos_token_id is None
    x = _inputs(hf.config.vocab_size, padded=True)
    np.testing.assert_array_equal(to_numpy(converted(x)), to_numpy(lm(x)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral-window", "qwen3-norms-window-layer", *GEMMA])
def test_onnx_bundle_greedy_matches_keras(tmp_path, build, name):
    """The exported bundle's Keras-free runner (ONNX Runtime) generates our tokens: a sliding window; query/key
    norms, a window on one layer; Gemma's four (1 + w) norms per block, rotary bases per layer type, soft caps.
    (SmolLM3's NoPE layer is a layer without rotation: tests/export/test_decode_kernels.py holds it in the decode
    graph.)"""
    _, hf, lm = build(name)
    bundle = lm.export(tmp_path / "bundle", format="onnx")
    prompts = _prompts(hf)
    ours = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    theirs = bundle_generator(bundle).generate_ids(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    assert [prompt + new for prompt, new in zip(prompts, theirs)] == ours


# --- config layouts and refusals (config.json alone) ----------------------------


def _config(model_type, **changes):
    """A saved config.json of the type, as transformers 5 writes it, with `changes` (None: null)."""
    config_cls, _ = {**hf_models.LLAMA_STYLE, **hf_models.GEMMA}[model_type]
    config = config_cls(
        vocab_size=100,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    ).to_dict()
    config.update(changes)
    return config


def _backbone_config(tmp_path, config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return load_config(tmp_path)[1]["backbone"]["config"]


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0},
        {"type": "linear", "factor": 2.0},
        {k: v for k, v in LLAMA3.items() if k != "rope_theta"},
    ],
    ids=["linear", "linear-old-key", "llama3"],
)
def test_transformers_4_rope_layout(tmp_path, rope):
    """transformers 4 wrote rope_theta and rope_scaling at the top level; 5 writes rope_parameters."""
    new = _backbone_config(tmp_path / "new", _config("llama", rope_parameters={**rope, "rope_theta": 500.0}))
    old = _backbone_config(
        tmp_path / "old", _config("llama", rope_parameters=None, rope_theta=500.0, rope_scaling=rope)
    )
    assert old == new
    assert new["rope_max_wavelength"] == 500.0 and new["rope_scaling"]["rope_type"] == rope.get("rope_type", "linear")


@pytest.mark.parametrize(
    "model_type, changes, window",
    [
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0, "layer_types": None}, 4),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2, "layer_types": None}, None),
        (
            "qwen2",
            {"use_sliding_window": False, "sliding_window": 4, "max_window_layers": 0, "layer_types": None},
            None,
        ),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4, "layer_types": ["sliding_attention"] * 2}, 4),
        ("mistral", {"sliding_window": None}, None),
        ("mistral", {"sliding_window": 16}, 16),
        ("smollm3", {"use_sliding_window": True, "sliding_window": 4, "no_rope_layers": [1, 1]}, None),
    ],
    ids=[
        "qwen2-all-windowed",
        "qwen2-none-windowed",
        "qwen2-off",
        "qwen2-layer-types",
        "mistral-none",
        "mistral-16",
        "smollm3-no-nope-layer",
    ],
)
def test_sliding_window_options(tmp_path, model_type, changes, window):
    config = _backbone_config(tmp_path, _config(model_type, **changes))
    assert config["sliding_window"] == window and config["layer_types"] is None


def test_gemma3_transformers_4_layout(tmp_path):
    """transformers 4 wrote Gemma 3's bases as rope_theta (global, with rope_scaling) and rope_local_base_freq, and
    its layer types as sliding_window_pattern; 5 writes rope_parameters per layer type and layer_types."""
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 8.0},
    }
    new = _backbone_config(
        tmp_path / "new",
        _config("gemma3_text", rope_parameters=rope, layer_types=["sliding_attention", "full_attention"]),
    )
    old = _config(
        "gemma3_text",
        rope_theta=1000.0,
        rope_local_base_freq=10.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window_pattern=2,
    )
    for key in ("rope_parameters", "layer_types"):
        del old[key]
    assert _backbone_config(tmp_path / "old", old) == new
    assert (new["rope_max_wavelength"], new["local_rope_max_wavelength"]) == (1000.0, 10.0)
    assert new["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    del old["sliding_window_pattern"]  # Gemma3TextConfig's default: every 6th layer global
    assert _backbone_config(tmp_path / "default", old)["layer_types"] == ["sliding_attention"] * 2


WINDOW_SECOND_LAYER = {"use_sliding_window": True, "sliding_window": 4, "layer_types": None}


@pytest.mark.parametrize(
    "model_type, changes",
    [
        ("qwen2", {**WINDOW_SECOND_LAYER, "max_window_layers": 1}),
        ("qwen3", {**WINDOW_SECOND_LAYER, "layer_types": ["full_attention", "sliding_attention"]}),
        ("smollm3", {**WINDOW_SECOND_LAYER, "no_rope_layers": [1, 0]}),
    ],
    ids=["qwen2-max-window-layers", "qwen3-layer-types", "smollm3-window-on-nope-layer"],
)
def test_window_on_some_layers(tmp_path, model_type, changes):
    """A window on the second layer only: from Qwen's `max_window_layers` or `layer_types`, and on SmolLM3's
    NoPE layers when `layer_types` is absent (as SmolLM3Config builds it)."""
    backbone = _backbone_config(tmp_path, _config(model_type, **changes))
    assert (backbone["sliding_window"], backbone["layer_types"]) == (4, ["full_attention", "sliding_attention"])


REFUSED = [  # (model_type, config changes, what the message must name)
    (
        "llama",
        {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
        r"rope_parameters.*rope_type='yarn'",
    ),
    (
        "llama",
        {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
        r"rope_scaling.*rope_type='dynamic'",
    ),
    ("llama", {"partial_rotary_factor": 0.5}, r"partial_rotary_factor=0\.5"),
    (
        "llama",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
        r"partial_rotary_factor=0\.5",
    ),
    (
        "llama",
        {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
        r"rope_parameters=",
    ),
    ("llama", {"hidden_act": "gelu"}, r"hidden_act='gelu'"),
    ("mistral", {"hidden_act": "relu"}, r"hidden_act='relu'"),
    (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "layer_types": ["full_attention", "chunked_attention"]},
        r"layer_types with \['chunked_attention'\]",
    ),
    ("smollm3", {"no_rope_layers": [1]}, r"no_rope_layers=\[1\]"),
    ("gemma3", {}, r"model_type='gemma3'.*multimodal"),
    ("gemma3_text", {"hidden_activation": "gelu"}, r"hidden_activation='gelu'"),
    (
        "gemma3_text",
        {"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0}}},
        r"rope_parameters with rope_type='yarn'",
    ),
    ("gemma3_text", {"use_bidirectional_attention": True}, r"use_bidirectional_attention=True"),
    ("gemma2", {"layer_types": ["sliding_attention", "chunked_attention"]}, r"layer_types=.*chunked_attention"),
]


@pytest.mark.parametrize(
    "model_type, changes, match",
    REFUSED,
    ids=[
        "yarn",
        "dynamic-old-key",
        "partial-rotary",
        "partial-rotary-in-rope-parameters",
        "rope-per-layer-type",
        "gelu",
        "relu",
        "qwen2-unknown-layer-type",
        "smollm3-short-no-rope-layers",
        "gemma3-multimodal",
        "gemma3-exact-gelu",
        "gemma3-yarn",
        "gemma3-bidirectional",
        "gemma2-unknown-layer-type",
    ],
)
def test_refused_options(tmp_path, model_type, changes, match):
    config = _config({"gemma3": "gemma3_text"}.get(model_type, model_type), **changes)
    config["model_type"] = model_type
    with pytest.raises(ValueError, match=match):
        _backbone_config(tmp_path, config)


def test_known_types_are_registered():
    from keras_transformer.convert.hugging_face import FAMILIES

    assert all(FAMILIES[model_type] is hf_llama for model_type in ("llama", "mistral", "qwen2", "qwen3", "smollm3"))
    assert all(FAMILIES[model_type] is hf_gemma for model_type in ("gemma3_text", "gemma2", "gemma3"))


def test_untied_head_missing_from_checkpoint(tmp_path, build):
    """An untied config whose checkpoint lacks lm_head.weight is an error naming the tensor."""
    directory, _, _ = build("mistral-window")
    from safetensors.numpy import load_file, save_file

    shutil.copytree(directory, tmp_path / "copy")
    tensors = load_file(str(tmp_path / "copy" / "model.safetensors"))
    del tensors["lm_head.weight"]
    save_file(tensors, str(tmp_path / "copy" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lm_head.weight"):
        LlamaCausalLM.from_preset(tmp_path / "copy")
