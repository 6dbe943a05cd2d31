"""Mixture-of-experts checkpoints (`model_type` "qwen3_moe", "mixtral", "olmoe", "qwen2_moe") in the Hugging Face
layout -> LlamaCausalLM with `mixture_of_experts`, against `transformers`, and back; and the MoE shape presets.

The peers are random transformers models (eager attention, 2 layers, width 32, 4 experts of which 2 per token, one
BPE tokenizer of about 300 tokens), each with the quirks of its type:
- Qwen3-MoE: query/key norms per head, head_dim 16 != 32 / 4 heads, layer 0 dense (`mlp_only_layers`), the top-k
  weights renormalised (`norm_topk_prob`);
- Mixtral: a sliding window (5) shorter than the sequences, its own per-expert names (block_sparse_moe, w1 w2 w3);
- OLMoE: query/key norms over all heads, top-k weights not renormalised;
- Qwen2-MoE: a shared expert with its sigmoid gate, query/key/value biases (logits and export only).
Each is saved by transformers' `save_pretrained` (the experts per expert, as on the Hub) and loaded by
`CausalLM.from_preset`, which must pick LlamaCausalLM.

Axes: B batch, T length, V vocabulary.
"""

import importlib.util
import inspect
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import keras_transformer as kt
from keras_transformer import presets
from keras_transformer.convert import hf_moe
from keras_transformer.convert.hugging_face import FAMILIES
from keras_transformer.models import CausalLM, LlamaBackbone, LlamaCausalLM
from keras_transformer.presets import load_config
from keras_transformer.samplers import BeamSampler
from keras_transformer.tokenizers import BytePairTokenizer
from tests.conftest import to_numpy
from tests.convert import hf_models
from tests.convert.hf_export_cases import assert_same_config_files, tensors
from tests.turns import dealt, skip_unless_its_turn

ATOL = 1e-4
NEW_TOKENS = 8
SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
PEERS = {  # model type -> (config class, model class, the type's options)
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(head_dim=16, num_experts=4, moe_intermediate_size=16, mlp_only_layers=[0], norm_topk_prob=True),
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, sliding_window=5)),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4, norm_topk_prob=False)),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(num_experts=4, moe_intermediate_size=16, shared_expert_intermediate_size=24),
    ),
}
GENERATING = ("qwen3_moe", "mixtral", "olmoe")  # Qwen2-MoE's attention and experts are checked by its logits


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = BytePairTokenizer.train(hf_models.TEXTS, vocabulary_size=300)
    tokenizer.backend_tokenizer.add_special_tokens(["<|endoftext|>"])
    return tokenizer


@pytest.fixture(scope="module")
def built(tokenizer, tmp_path_factory):
    """build(model type) -> (directory, peer, ours), each built once for the module."""
    cache = {}

    def build(model_type):
        if model_type not in cache:
            config_cls, model_cls, options = PEERS[model_type]
            eos = tokenizer.backend_tokenizer.token_to_id("<|endoftext|>")
            config = getattr(transformers, config_cls)(
                **SMALL,
                **options,
                vocab_size=tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True),
                num_experts_per_tok=2,
                max_position_embeddings=64,
                bos_token_id=None,
                eos_token_id=eos,
                pad_token_id=eos,
                attn_implementation="eager",
            )
            peer = hf_models.randomize(getattr(transformers, model_cls)(config), seed=len(cache))
            directory = tmp_path_factory.mktemp(model_type)
            peer.save_pretrained(directory, safe_serialization=True)
            hf_models.save_hf_tokenizer(tokenizer, directory, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # a weight left out on either side is a failure
                ours = CausalLM.from_preset(directory)
            cache[model_type] = directory, peer, ours
        return cache[model_type]

    return build


def _inputs(vocabulary_size, length=12):
    rng = np.random.default_rng(length)
    token_ids = rng.integers(1, vocabulary_size, (3, length)).astype("int32")
    padding_mask = np.arange(length)[None, :] < np.array([length, length - 4, 3])[:, None]  # (B, T), right-padded
    return {"token_ids": np.where(padding_mask, token_ids, 0).astype("int32"), "padding_mask": padding_mask}


def _peer_logits(model, x):
    with torch.no_grad():
        return model(
            input_ids=hf_models.to_torch(x["token_ids"]), attention_mask=hf_models.to_torch(x["padding_mask"])
        ).logits.numpy()  # (B, T, V)


def _prompts(vocabulary_size):
    rng = np.random.default_rng(1)
    return [rng.integers(1, vocabulary_size, n).tolist() for n in (7, 4)]  # ragged: ours pads


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


def test_converted_config(built):
    """Each type's quirks reach the backbone."""
    expected = {
        "qwen3_moe": dict(query_key_norm="head", head_dim=16, moe_layers=[False, True], normalize_top_k=True, inner=16),
        "mixtral": dict(query_key_norm=None, head_dim=8, moe_layers=None, normalize_top_k=True, inner=48),
        "olmoe": dict(query_key_norm="full", head_dim=8, moe_layers=None, normalize_top_k=False, inner=48),
        "qwen2_moe": dict(query_key_norm=None, head_dim=8, moe_layers=None, normalize_top_k=False, inner=16),
    }
    for model_type, want in expected.items():
        _, _, lm = built(model_type)
        b = lm.backbone
        assert type(lm) is LlamaCausalLM and isinstance(b, LlamaBackbone)
        moe = b.mixture_of_experts
        got = dict(
            query_key_norm=b.query_key_norm,
            head_dim=b.head_dim,
            moe_layers=b.moe_layers,
            normalize_top_k=moe["normalize_top_k"],
            inner=moe["intermediate_dim"],
        )
        assert got == want, model_type
        assert (moe["num_experts"], moe["top_k"]) == (4, 2)
    assert built("mixtral")[2].backbone.sliding_window == 5
    assert built("qwen2_moe")[2].backbone.mixture_of_experts["shared_intermediate_dim"] == 24
    assert built("qwen2_moe")[2].backbone.attention_bias and not built("qwen2_moe")[2].backbone.attention_output_bias


@pytest.mark.parametrize("model_type", list(PEERS))
def test_logits_match(built, model_type):
    _, peer, lm = built(model_type)
    x = _inputs(peer.config.vocab_size)
    expected = _peer_logits(peer, x)
    real = x["padding_mask"]  # padded query positions are not compared
    np.testing.assert_allclose(to_numpy(lm(x))[real], expected[real], atol=ATOL, rtol=0)
    assert np.abs(expected[real]).max() > 1.0  # far from the tolerance: not a vacuous match


@pytest.mark.parametrize("model_type", GENERATING)
def test_greedy_and_beam_generation_match(built, model_type):
    """Greedy, and beam-4 with our BeamSampler's defaults passed to the peer explicitly. Each family on one backend
    per `make test`, dealt in turn (tests/turns.py): compiling its generate loops costs 25-35 s on TensorFlow; the
    families' logits are held to transformers' on every backend (test_logits_match), and the MoE step's generation to
    Keras's on every backend and runtime by tests/export/test_runtime_parity.py."""
    skip_unless_its_turn(model_type, dealt(GENERATING), "MoE generation against transformers:")
    _, peer, lm = built(model_type)
    prompts = _prompts(peer.config.vocab_size)
    greedy = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None)
    for prompt, row in zip(prompts, greedy):
        assert row == _peer_generate(peer, prompt)
        assert len(set(row[len(prompt) :])) >= 2  # the continuation is not one repeated token
    sampler = BeamSampler(num_beams=4)
    beams = lm.generate(prompts, max_new_tokens=NEW_TOKENS, stop_token_ids=None, sampler=sampler)
    for prompt, row in zip(prompts, beams):
        kwargs = dict(num_beams=4, length_penalty=sampler.length_penalty, early_stopping=sampler.early_stopping)
        assert row == _peer_generate(peer, prompt, **kwargs)


def test_fused_experts_load(built, tmp_path):
    """The experts as transformers 5 holds them in memory (`experts.gate_up_proj`, `experts.down_proj`), saved as
    they are by safetensors, load as the per-expert checkpoint does."""
    directory, peer, lm = built("olmoe")
    from safetensors.torch import save_file

    save_file({name: tensor.contiguous() for name, tensor in peer.state_dict().items()}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((directory / "config.json").read_text())
    assert any(name.endswith("experts.gate_up_proj") for name in tensors(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused = CausalLM.from_preset(tmp_path, preprocessor=None)
    x = _inputs(peer.config.vocab_size)
    np.testing.assert_array_equal(to_numpy(fused(x)), to_numpy(lm(x)))


# --- back to the Hugging Face format ---------------------------------------------


@pytest.mark.parametrize("model_type", list(PEERS))
def test_export_round_trip(built, model_type, tmp_path):
    """transformers reads our export back as the same class with our logits, and the tensors are the original's,
    bit for bit, under the original's names (per expert)."""
    directory, peer, lm = built(model_type)
    out = lm.export(tmp_path / "out", format="huggingface")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(theirs) is type(peer)
    x = _inputs(peer.config.vocab_size)
    real = x["padding_mask"]
    np.testing.assert_allclose(to_numpy(lm(x))[real], _peer_logits(theirs, x)[real], atol=ATOL, rtol=0)
    original, written = tensors(directory), tensors(out)
    assert sorted(written) == sorted(original)
    for key, tensor in written.items():
        assert torch.equal(tensor, original[key]), key
    config = json.loads((out / "config.json").read_text())
    assert config["num_experts_per_tok"] == 2 and config["rope_theta"] == peer.config.rope_parameters["rope_theta"]
    assert_same_config_files(model_type, out, directory)


def test_export_refuses_a_mixture_no_class_has(built, monkeypatch, tmp_path):
    """Mixtral's layout (no norms, no shared expert) without renormalised top-k weights is no Hugging Face class:
    refused before anything is written, naming the option."""
    _, _, lm = built("mixtral")
    moe = {**lm.backbone.mixture_of_experts, "normalize_top_k": False}
    monkeypatch.setattr(lm.backbone, "mixture_of_experts", moe)  # the option the export reads
    with pytest.raises(ValueError, match="normalize_top_k"):
        lm.export(tmp_path / "out", format="huggingface")
    assert not (tmp_path / "out").exists()


# --- config layouts and refusals (config.json alone) ------------------------------


def _config(model_type, **changes):
    config_cls, _, options = PEERS[model_type]
    config = getattr(transformers, config_cls)(**SMALL, **options, vocab_size=100, num_experts_per_tok=2).to_dict()
    config.update(changes)
    return config


def _backbone_config(tmp_path, config):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return load_config(tmp_path)[1]["backbone"]["config"]


def test_hub_layout(tmp_path):
    """The Hub's config.json (transformers 4): Qwen3-MoE's `num_experts` (5 writes `num_local_experts`), the top-level
    rope_theta; decoder_sparse_step."""
    new = _backbone_config(tmp_path / "new", _config("qwen3_moe"))
    old = _config("qwen3_moe", num_experts=4, rope_parameters=None, rope_theta=10000.0)
    old.pop("num_local_experts")
    assert _backbone_config(tmp_path / "old", old) == new
    stepped = _backbone_config(tmp_path / "step", _config("qwen3_moe", mlp_only_layers=[], decoder_sparse_step=2))
    assert stepped["moe_layers"] == [False, True]


REFUSED = [  # (model type, config changes, what the message must name)
    ("mixtral", {"router_jitter_noise": 0.1}, r"router_jitter_noise=0\.1"),
    ("olmoe", {"clip_qkv": 8.0}, r"clip_qkv=8\.0"),
    ("qwen3_moe", {"hidden_act": "gelu"}, r"hidden_act='gelu'"),
    ("qwen2_moe", {"use_sliding_window": True}, r"use_sliding_window=True"),
    ("olmoe", {"head_dim": 16}, r"head_dim=16"),
    ("mixtral", {"num_experts_per_tok": 5}, r"num_experts_per_tok=5"),
]


@pytest.mark.parametrize("model_type, changes, match", REFUSED, ids=[f"{r[0]}-{next(iter(r[1]))}" for r in REFUSED])
def test_refused_options(tmp_path, model_type, changes, match):
    with pytest.raises(ValueError, match=match):
        _backbone_config(tmp_path, _config(model_type, **changes))


def test_router_aux_loss_coefficient_both_ways(built, tmp_path):
    """transformers adds `router_aux_loss_coef` times its load-balancing loss in training only with
    `output_router_logits`: the backbone's coefficient is that (else 0), and the export writes it back."""
    base = {"model_type": "olmoe", "num_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02}
    assert hf_moe.convert_config(base)["backbone"]["config"]["router_aux_loss_coef"] == 0.0
    config = hf_moe.convert_config({**base, "output_router_logits": True})["backbone"]["config"]
    assert config["router_aux_loss_coef"] == 0.02
    _, _, lm = built("olmoe")
    trained = LlamaCausalLM(
        backbone=LlamaBackbone.from_config({**lm.backbone.get_config(), "router_aux_loss_coef": 0.05})
    )
    trained.set_weights(lm.get_weights())
    out = trained.export(tmp_path / "hf", format="huggingface")
    written = json.loads((Path(out) / "config.json").read_text())
    assert written["output_router_logits"] is True and written["router_aux_loss_coef"] == 0.05


def test_registered():
    assert all(FAMILIES[model_type] is hf_moe for model_type in hf_moe.MODEL_TYPES)


# --- the shape presets -----------------------------------------------------------

# The published config.json of each preset's checkpoint (transformers 4's layout), without the entries that do not
# describe the model (transformers_version, torch_dtype, use_cache, initializer_range, ...). Written from the public
# files as we know them; not downloaded here.
PUBLISHED = {
    "qwen3_30b_a3b": {  # Qwen/Qwen3-30B-A3B
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "mixtral_8x7b": {  # mistralai/Mixtral-8x7B-v0.1
        "architectures": ["MixtralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "model_type": "mixtral",
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "vocab_size": 32000,
    },
    "olmoe_1b_7b": {  # allenai/OLMoE-1B-7B-0924
        "architectures": ["OlmoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "clip_qkv": None,
        "eos_token_id": 50279,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "max_position_embeddings": 4096,
        "model_type": "olmoe",
        "norm_topk_prob": False,
        "num_attention_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 16,
        "num_key_value_heads": 16,
        "output_router_logits": False,
        "pad_token_id": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "router_aux_loss_coef": 0.01,
        "tie_word_embeddings": False,
        "vocab_size": 50304,
    },
}
# transformers' parameter counts of the published configs (built on the meta device: no memory), total and per
# token (the k of E experts a token runs; the embeddings and the head counted).
COUNTS = {
    "qwen3_30b_a3b": (30_532_122_624, 3_353_032_704),
    "mixtral_8x7b": (46_702_792_704, 12_879_925_248),
    "olmoe_1b_7b": (6_919_161_856, 1_282_017_280),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_is_what_the_checkpoint_converts_to(name):
    """The preset's backbone is the converted config.json of the checkpoint it names (every other argument at its
    default)."""
    preset = presets.load_config(name)[1]["backbone"]["config"]
    converted = hf_moe.convert_config(PUBLISHED[name])["backbone"]["config"]
    defaults = {
        key: parameter.default
        for key, parameter in inspect.signature(LlamaBackbone).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    assert converted == {key: preset.get(key, defaults.get(key)) for key in converted}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_parameter_counts_are_the_checkpoints(name):
    """The registry's total and active counts (config.json, counted from the config by tools/build_presets.py) are
    transformers' count of the published config on the meta device, and that count less the experts a token skips."""
    config = PUBLISHED[name]
    model_cls = getattr(transformers, config["architectures"][0])
    with torch.device("meta"):
        model = model_cls(transformers.AutoConfig.for_model(**config))
    total = sum(parameter.numel() for parameter in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    num_experts = config.get("num_experts", config.get("num_local_experts"))
    active = total - experts * (num_experts - config["num_experts_per_tok"]) // num_experts
    assert (total, active) == COUNTS[name]
    row = {row["name"]: row for row in kt.list_presets()}[name]
    stored = presets.load_config(name)[1]
    assert row["family"] == "llama"
    assert row["parameter_count"] == stored["parameter_count"] == total
    assert stored["active_parameter_count"] == active


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe"])
def test_counting_from_the_config_is_keras_count(built, model_type):
    """tools/build_presets.py's count from the config alone (the presets' numbers) is the built model's, with dense
    layers, query/key norms, biases and a gated shared expert."""
    spec = importlib.util.spec_from_file_location("build_presets", Path(__file__).parents[2] / "tools/build_presets.py")
    build_presets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_presets)
    backbone = built(model_type)[2].backbone
    total, active = build_presets.llama_parameter_counts(backbone.get_config())
    # Keras's count holds the router losses' expert load too (a training statistic: layers x experts, no parameter)
    statistics = sum(int(np.prod(v.shape)) for v in backbone.router_losses.weights)
    assert (
        statistics
        == sum(backbone.moe_layers or [True] * backbone.num_layers) * backbone.mixture_of_experts["num_experts"]
    )
    assert total == backbone.count_params() - statistics
    moe = backbone.mixture_of_experts
    skipped = (moe["num_experts"] - moe["top_k"]) * 3 * backbone.hidden_dim * moe["intermediate_dim"]
    assert active == total - skipped * sum(backbone.moe_layers or [True] * backbone.num_layers)
