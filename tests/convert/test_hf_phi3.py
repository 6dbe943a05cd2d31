"""Phi-3 / Phi-4-mini checkpoints (`model_type` "phi3") in the Hugging Face layout -> LlamaCausalLM, against
`transformers`.

The peer is one random Phi3ForCausalLM (eager attention, 2 query heads of 32 sharing 1 key/value head, fused
qkv_proj and gate_up_proj) with every Phi quirk at once: half of each head rotating (partial_rotary_factor 0.5),
longrope scaling whose original length (32) is shorter than the long test sequences (40 positions, prompts of
34 and 36 tokens that grow by 10, and prompts of 25 and 28 tokens whose generation crosses it, where transformers'
`generate` computes its cache again: see convert/hf_phi3.py), so that both the short and the long factors and the
attention factor are exercised, and a sliding window (16) shorter than those sequences. Ours is loaded from its
directory by `CausalLM.from_preset`, which must pick LlamaCausalLM. The original length is a multiple of the
prefill's bucket (32), as Phi-4-mini's 4096 is.

Axes: B batch, T length, V vocabulary.
"""

import inspect
import json

import keras
import numpy as np
import pytest
import torch
import transformers

import keras_transformer as kt
from keras_transformer import presets
from keras_transformer.convert import hf_phi3
from keras_transformer.models import constrained_generation
from keras_transformer.models import Backbone, CausalLM, LlamaBackbone, LlamaCausalLM, LlamaCausalLMPreprocessor
from keras_transformer.presets import load_config
from keras_transformer.samplers import BeamSampler, RandomSampler
from keras_transformer.tokenizers import BytePairTokenizer
from tests.conftest import to_numpy
from tests.convert import hf_models
from tests.convert.hf_export_cases import tensors
from tests.export.helpers import bundle_generator

ATOL = 1e-4
NEW_TOKENS = 10
ORIGINAL = 32  # original_max_position_embeddings
LENGTHS = {"short": 12, "long": 40}  # sequence lengths of the logits tests, either side of ORIGINAL
# prompt lengths: within ORIGINAL after 10 new tokens, past it, or crossing it (the cache computed again at the step
# whose sequence first passes ORIGINAL, as transformers' generate does)
PROMPTS = {"short": (6, 3), "long": (36, 34), "crossing": (28, 25)}


def build_phi3(directory, seed=0):
    """A random Phi3ForCausalLM saved with a BPE tokenizer (`<s>` start, `<|endoftext|>` end and padding, as
    Phi-3-mini's) -> the peer (eval mode)."""
    tokenizer = BytePairTokenizer.train(hf_models.TEXTS, vocabulary_size=300)
    backend = tokenizer.backend_tokenizer
    backend.add_special_tokens(["<s>", "<|endoftext|>"])
    bos, eos = backend.token_to_id("<s>"), backend.token_to_id("<|endoftext|>")
    rng = np.random.default_rng(seed)
    config = transformers.Phi3Config(
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        original_max_position_embeddings=ORIGINAL,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "short_factor": rng.uniform(1.0, 2.0, 8).round(3).tolist(),
            "long_factor": rng.uniform(2.0, 6.0, 8).round(3).tolist(),
        },
        sliding_window=16,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=eos,
        attn_implementation="eager",
    )
    model = hf_models.randomize(transformers.Phi3ForCausalLM(config), seed)
    model.save_pretrained(directory, safe_serialization=True)
    hf_models.save_hf_tokenizer(tokenizer, directory, bos_token="<s>", eos_token="<|endoftext|>")
    return model


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """(directory, peer, ours), built once for the module."""
    directory = tmp_path_factory.mktemp("phi3")
    peer = build_phi3(directory)
    return directory, peer, CausalLM.from_preset(directory)


def _inputs(vocabulary_size, length, padded):
    rng = np.random.default_rng(length)
    token_ids = rng.integers(1, vocabulary_size, (3, length)).astype("int32")
    lengths = np.array([length, length - 5, 3]) if padded else np.full(3, length)
    padding_mask = np.arange(length)[None, :] < lengths[:, None]  # (B, T), right-padded
    return {"token_ids": np.where(padding_mask, token_ids, 0).astype("int32"), "padding_mask": padding_mask}


def _peer_logits(model, x):
    with torch.no_grad():
        return model(
            input_ids=hf_models.to_torch(x["token_ids"]), attention_mask=hf_models.to_torch(x["padding_mask"])
        ).logits.numpy()  # (B, T, V)


def _prompts(vocabulary_size, regime):
    rng = np.random.default_rng(1)
    return [rng.integers(1, vocabulary_size, n).tolist() for n in PROMPTS[regime]]  # ragged: ours pads


def _peer_generate(model, prompt, **kwargs):
    """The peer's ids for one prompt alone (no padding), never stopping early."""
    with torch.no_grad():
        out = model.generate(
            hf_models.to_torch([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
            do_sample=False,
            **kwargs,
        )
    return out[0].tolist()


# --- transformers agrees --------------------------------------------------------


def test_converted_config(phi3):
    """The quirks reach the backbone: the rotated dims, longrope's factors, original length and attention factor
    (transformers' own), the window; the tokenizer has the checkpoint's tokens."""
    directory, peer, lm = phi3
    backbone, tokenizer, config = lm.backbone, lm.preprocessor.tokenizer, peer.config
    assert type(lm) is LlamaCausalLM and isinstance(Backbone.from_preset(directory, load_weights=False), LlamaBackbone)
    assert (backbone.num_key_value_heads, backbone.head_dim, backbone.rotary_dim) == (1, 32, 16)
    assert backbone.sliding_window == 16 and backbone.max_sequence_length == 128
    scaling = backbone.rope_scaling
    assert scaling["short_factor"] == config.rope_parameters["short_factor"]
    assert scaling["long_factor"] == config.rope_parameters["long_factor"]
    assert scaling["original_max_position_embeddings"] == ORIGINAL
    assert scaling["attention_factor"] == pytest.approx(peer.model.rotary_emb.attention_scaling, rel=1e-12)
    assert scaling["attention_factor"] > 1.1  # max_position_embeddings / ORIGINAL = 4: a factor far from 1
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (config.bos_token_id, config.eos_token_id)


@pytest.mark.parametrize("regime", sorted(LENGTHS))
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_logits_match(phi3, regime, padded):
    """A sequence within the original length (short factors) and one past it (long factors), right-padded or not:
    transformers picks the factors by the padded length, as ours does."""
    _, peer, lm = phi3
    x = _inputs(peer.config.vocab_size, LENGTHS[regime], padded)
    expected = _peer_logits(peer, x)
    real = x["padding_mask"]  # padded query positions are not compared
    np.testing.assert_allclose(to_numpy(lm(x))[real], expected[real], atol=ATOL, rtol=0)
    assert np.abs(expected[real]).max() > 1.0  # far from the tolerance: not a vacuous match


def test_long_factors_change_the_logits(phi3):
    """The long sequence's first 12 positions are not the short sequence's logits of the same tokens: the factors
    changed with the length (in transformers and in ours alike, checked above)."""
    _, peer, lm = phi3
    x = _inputs(peer.config.vocab_size, LENGTHS["long"], padded=False)
    head = {key: value[:, : LENGTHS["short"]] for key, value in x.items()}
    assert np.abs(to_numpy(lm(x))[:, : LENGTHS["short"]] - to_numpy(lm(head))).max() > 0.1


@pytest.mark.parametrize("regime", sorted(PROMPTS))
def test_greedy_generation_matches(phi3, regime):
    """Prompts whose generation stays within the original length, and prompts already past it."""
    _, peer, lm = phi3
    prompts = _prompts(peer.config.vocab_size, regime)
    ours = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    for prompt, row in zip(prompts, ours):
        assert row == _peer_generate(peer, prompt)
        assert len(set(row[len(prompt) :])) >= 2  # the continuation is not one repeated token


@pytest.mark.parametrize("regime", ["long", "crossing"])
def test_beam_generation_matches(phi3, regime):
    """Beam-4 past the original length and across it, with our BeamSampler's defaults passed to the peer
    explicitly."""
    _, peer, lm = phi3
    prompts = _prompts(peer.config.vocab_size, regime)
    sampler = BeamSampler(num_beams=4)
    ours = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=sampler)
    for prompt, row in zip(prompts, ours):
        expected = _peer_generate(
            peer,
            prompt,
            num_beams=sampler.num_beams,
            length_penalty=sampler.length_penalty,
            early_stopping=sampler.early_stopping,
        )
        assert row == expected


def test_streamed_and_constrained_generation_cross_the_original_length(phi3, monkeypatch):
    """The host-stepped loops (a streamer; constrained decoding with its mask made to allow every token) compute
    the cache again where the compiled loop does: transformers' tokens across the original length. Speculation
    cannot, and says so."""
    _, peer, lm = phi3
    prompt = _prompts(peer.config.vocab_size, "crossing")[0]
    expected = _peer_generate(peer, prompt)
    streamed = []
    ours = lm.generate([prompt], max_new_tokens=NEW_TOKENS, stop_token_ids=None, streamer=streamed.append)
    assert ours == [expected] and len(streamed) == NEW_TOKENS
    end = peer.config.eos_token_id
    assert end not in expected[len(prompt) :]  # the grammar's stop token never comes: all ten tokens are compared
    monkeypatch.setattr(constrained_generation.llguidance_numpy, "fill_next_token_bitmask", _allow_all)
    free = lm.generate_constrained([prompt], regex="a", max_new_tokens=NEW_TOKENS, stop_token_ids=[end])
    assert free == [expected]
    with pytest.raises(ValueError, match="cannot cross position 32"):
        lm.generate([prompt], max_new_tokens=NEW_TOKENS, stop_token_ids=None, prompt_lookup_num_tokens=3)


def _allow_all(matcher, mask):
    mask.fill(-1)  # every bit set: every token allowed


def test_random_sampler_runs_the_same_step(phi3):
    """Random sampling kept to the top token is transformers' greedy search, past the original length."""
    _, peer, lm = phi3
    prompts = _prompts(peer.config.vocab_size, "long")
    ours = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=RandomSampler(top_k=1, seed=3))
    assert ours == [_peer_generate(peer, prompt) for prompt in prompts]


def test_fit_lowers_the_loss(phi3):
    """A converted Phi-3 trains with `fit` on sequences past the original length (the long factors), its own copy."""
    directory, _, _ = phi3
    loaded = LlamaCausalLM.from_preset(directory)
    preprocessor = LlamaCausalLMPreprocessor(
        loaded.preprocessor.tokenizer, sequence_length=LENGTHS["long"], truncate=True
    )
    lm = LlamaCausalLM(loaded.backbone, preprocessor)
    # XLA (TensorFlow) and torch.compile outlast three eager epochs on a CPU; JAX's jit is the fast way there.
    lm.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=keras.config.backend() == "jax")
    texts = [" ".join(hf_models.TEXTS[:4])] * 4
    losses = lm.fit(texts, batch_size=4, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]


def test_onnx_bundle_generates_our_tokens(tmp_path, phi3):
    """The bundle's Keras-free runner (ONNX Runtime's rotary tables, longrope's picked in the graph) generates
    our tokens, greedy, within, past and across the original length (the cache computed again by the prefill
    graph); prompt lookup across it is refused, as in Keras."""
    _, peer, lm = phi3
    bundle = lm.export(tmp_path / "bundle", format="onnx")
    generator = bundle_generator(bundle)
    for regime in sorted(PROMPTS):
        prompts = _prompts(peer.config.vocab_size, regime)
        ours = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
        theirs = generator.generate_ids(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
        assert [prompt + new for prompt, new in zip(prompts, theirs)] == ours, regime
    crossing = _prompts(peer.config.vocab_size, "crossing")
    with pytest.raises(ValueError, match="cannot cross position 32"):
        generator.generate_ids(crossing, max_new_tokens=NEW_TOKENS, stop_token_ids=None, prompt_lookup_num_tokens=3)


# --- back to the Hugging Face format ---------------------------------------------


@pytest.fixture(scope="module")
def exported(phi3, tmp_path_factory):
    """Ours exported with format="huggingface", and transformers' load of it."""
    _, _, lm = phi3
    out = lm.export(tmp_path_factory.mktemp("phi3_hf") / "out", format="huggingface")
    return out, transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()


@pytest.mark.parametrize("regime", sorted(LENGTHS))
def test_export_gives_transformers_our_logits(phi3, exported, regime):
    _, _, lm = phi3
    out, theirs = exported
    assert type(theirs) is transformers.Phi3ForCausalLM
    x = _inputs(lm.backbone.vocabulary_size, LENGTHS[regime], padded=True)
    real = x["padding_mask"]
    np.testing.assert_allclose(to_numpy(lm(x))[real], _peer_logits(theirs, x)[real], atol=ATOL, rtol=0)


def test_export_is_the_original_checkpoint(phi3, exported):
    """The fused tensors come back fused, bit for bit, and config.json says what the original's says (transformers
    5's entries; transformers 4's spelling beside them)."""
    directory, _, _ = phi3
    out, _ = exported
    original = tensors(directory)
    assert sorted(tensors(out)) == sorted(original)
    for key, tensor in tensors(out).items():
        assert torch.equal(tensor, original[key]), key
    ours, theirs = (json.loads((d / "config.json").read_text()) for d in (out, directory))
    for key in ("rope_parameters", "original_max_position_embeddings", "sliding_window", "max_position_embeddings"):
        assert ours[key] == theirs[key], key
    scaling = {k: v for k, v in theirs["rope_parameters"].items() if k in ("short_factor", "long_factor")}
    assert ours["rope_scaling"] == {"type": "longrope", **scaling}  # transformers 4's three fields
    assert (ours["rope_theta"], ours["partial_rotary_factor"]) == (10000.0, 0.5)


# --- config layouts and refusals (config.json alone) ------------------------------


def _config(**changes):
    """A Phi-3 config.json as transformers 5 writes it, with `changes` (None: null)."""
    config = transformers.Phi3Config(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=16,
        rope_parameters={
            "rope_type": "longrope",
            "partial_rotary_factor": 0.75,
            "short_factor": [1.0] * 12,
            "long_factor": [4.0] * 12,
        },
    ).to_dict()
    config.update(changes)
    return config


def _backbone_config(tmp_path, config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return load_config(tmp_path)[1]["backbone"]["config"]


def test_transformers_4_layout(tmp_path):
    """transformers 4 wrote rope_theta, partial_rotary_factor and rope_scaling (type "longrope", or the old "su") at
    the top level; 5 writes rope_parameters."""
    new = _backbone_config(tmp_path / "new", _config())
    parameters = _config()["rope_parameters"]
    scaling = {"type": "su", "short_factor": parameters["short_factor"], "long_factor": parameters["long_factor"]}
    old = _config(rope_parameters=None, rope_theta=10000.0, partial_rotary_factor=0.75, rope_scaling=scaling)
    assert _backbone_config(tmp_path / "old", old) == new
    assert new["rotary_dim"] == 24 and new["rope_scaling"]["rope_type"] == "longrope"
    # sqrt(1 + ln(64 / 16) / ln(16)): transformers' default attention factor
    assert new["rope_scaling"]["attention_factor"] == pytest.approx(np.sqrt(1 + np.log(4) / np.log(16)))


def test_without_scaling_or_partial_rotary(tmp_path):
    """Phi-3-mini-4k's layout: whole heads, no rope scaling, a window."""
    backbone = _backbone_config(
        tmp_path, _config(rope_parameters={"rope_type": "default", "rope_theta": 500.0}, sliding_window=8)
    )
    assert (backbone["rotary_dim"], backbone["rope_scaling"], backbone["rope_max_wavelength"]) == (None, None, 500.0)
    assert backbone["sliding_window"] == 8


REFUSED = [  # (config changes, what the message must name)
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, r"rope_type='dynamic'"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.3}}, r"partial_rotary_factor=0\.3"),
    (
        {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 16}},
        r"short_factor=\[1\.0, 1\.0, 1\.0\]",
    ),
    ({"hidden_act": "gelu"}, r"hidden_act='gelu'"),
    ({"attention_bias": True}, r"attention_bias=True"),
    ({"resid_pdrop": 0.1}, r"resid_pdrop=0\.1"),
]


@pytest.mark.parametrize(
    "changes, match", REFUSED, ids=["dynamic-rope", "odd-rotary-dims", "short-factors", "gelu", "bias", "dropouts"]
)
def test_refused_options(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        _backbone_config(tmp_path, _config(**changes))


def test_registered():
    from keras_transformer.convert.hugging_face import FAMILIES

    assert FAMILIES["phi3"] is hf_phi3


# --- the phi4_mini preset ---------------------------------------------------------

# microsoft/Phi-4-mini-instruct's config.json as published (transformers 4's layout), without the entries that do not
# describe the model (auto_map, transformers_version, torch_dtype, ...). Its long factors are the preset's.
PHI4_MINI_INSTRUCT = {
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 199999,
    "embd_pdrop": 0.0,
    "eos_token_id": 199999,
    "full_attn_mod": 1,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "interpolate_factor": 1,
    "lm_head_bias": False,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "phi3",
    "num_attention_heads": 24,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 199999,
    "partial_rotary_factor": 0.75,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"long_factor": None, "short_factor": [1.0] * 48, "type": "longrope"},
    "rope_theta": 10000.0,
    "sliding_window": 262144,
    "tie_word_embeddings": True,
    "vocab_size": 200064,
}


def _published_config():
    preset = presets.load_config("phi4_mini")[1]["backbone"]["config"]
    config = json.loads(json.dumps(PHI4_MINI_INSTRUCT))
    config["rope_scaling"]["long_factor"] = preset["rope_scaling"]["long_factor"]
    return config, preset


def test_preset_is_what_the_checkpoint_converts_to():
    """The phi4_mini preset's backbone is the converted config.json of the checkpoint it names (every other
    argument at its default), its attention factor transformers' own."""
    config, preset = _published_config()
    converted = hf_phi3.convert_config(config)["backbone"]["config"]
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(LlamaBackbone).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    assert converted == {name: preset.get(name, defaults.get(name)) for name in converted}
    assert len(preset["rope_scaling"]["long_factor"]) == 48 and preset["rotary_dim"] == 96
    rotary = transformers.models.phi3.modeling_phi3.Phi3RotaryEmbedding(transformers.Phi3Config(**config))
    assert preset["rope_scaling"]["attention_factor"] == pytest.approx(rotary.attention_scaling, rel=1e-12)


def test_preset_parameter_count_is_the_checkpoints():
    """3,836,021,760: transformers' Phi3ForCausalLM of the published config, built on the meta device (no memory),
    counts what our registry says."""
    config, _ = _published_config()
    with torch.device("meta"):
        model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**config))
    count = sum(parameter.numel() for parameter in model.parameters())  # the tied head counted once
    row = {row["name"]: row for row in kt.list_presets()}["phi4_mini"]
    assert row["parameter_count"] == count == 3_836_021_760
    assert row["family"] == "llama"
