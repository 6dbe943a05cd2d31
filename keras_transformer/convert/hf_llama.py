"""Hugging Face Llama-architecture checkpoints (`model_type` "llama", "mistral", "qwen2", "qwen3", "smollm3":
LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, SmolLM3ForCausalLM and their bare
models) -> LlamaBackbone / LlamaCausalLM.

Axes: D model width, H query heads, Hkv key/value heads, Dh head size, F feed-forward width, V vocabulary.

The five types share one computation: rotary positions, grouped-query attention, RMS norms and
a gated-SiLU feed-forward. They differ only in options, each mapped here: Llama's, Qwen3's and
SmolLM3's `attention_bias` (query, key, value and output) and Llama's and SmolLM3's `mlp_bias`;
Qwen2's query/key/value biases (no output bias); Qwen3's RMS norms of each head's queries and keys
(q_norm / k_norm) and its head size (128 when config.json names none); SmolLM3's layers without
rotary positions (`no_rope_layers`); Mistral's sliding window, and Qwen2's, Qwen3's and SmolLM3's
on the layers `layer_types` names. Options outside these are refused with the option's name.

`torch.nn.Linear` weights are stored (out, in); they are transposed to our (in, out) layouts.
"""

import json

from keras_transformer.convert.checkpoint import HF_TOKENIZER_CONFIG, load_tokenizer
from keras_transformer.convert.options import check_options

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3")
# Special tokens when neither tokenizer_config.json nor the model config names them (Llama 2 / Mistral).
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
# Tensors this converter knows but never assigns: the rotary tables some old checkpoints saved.
KNOWN_UNUSED = (r"\.rotary_emb\.inv_freq$",)
# Task class -> the tensors of its head, left out when the model is a backbone.
HEAD_TENSORS = {"LlamaCausalLM": r"^lm_head\.weight$"}
MAX_PRESET_SEQUENCE_LENGTH = 2048
ROPE_TYPES = ("default", "linear", "llama3")

# Defaults of `transformers`' config classes, where they differ between the types.
_DEFAULTS = {
    "llama": {"max_position_embeddings": 2048, "rope_theta": 10000.0},
    "mistral": {"max_position_embeddings": 131072, "sliding_window": 4096, "rope_theta": 10000.0},
    "qwen2": {"max_position_embeddings": 32768, "sliding_window": 4096, "rope_theta": 10000.0},
    "qwen3": {"max_position_embeddings": 32768, "sliding_window": 4096, "rope_theta": 10000.0, "head_dim": 128},
    "smollm3": {"max_position_embeddings": 32768, "sliding_window": None, "rope_theta": 2000000.0},
}
# The types whose windows apply only with `use_sliding_window`, to the layers `layer_types` names.
_WINDOW_BY_LAYER_TYPE = ("qwen2", "qwen3", "smollm3")
# Options whose other values change the computation in ways LlamaBackbone does not implement.
_REQUIRED = {"add_cross_attention": False, "is_encoder_decoder": False}


def check_activation(hf_config):
    """A ValueError naming `hidden_act` unless it is silu (swish), the one gate LlamaBackbone's feed-forward has."""
    if hf_config.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(
            f"Unsupported {hf_config.get('model_type')} config option hidden_act={hf_config['hidden_act']!r}: "
            "keras_transformer's LlamaBackbone gates its feed-forward with silu only."
        )


def convert_config(hf_config, path=None):
    """config.json of a Llama, Mistral or Qwen2 checkpoint -> the preset entries (backbone, task, preprocessor)."""
    check_options(hf_config, _REQUIRED)
    model_type = hf_config["model_type"]
    defaults = _DEFAULTS[model_type]
    check_activation(hf_config)
    hidden_dim = hf_config.get("hidden_size", 4096)
    num_heads = hf_config.get("num_attention_heads", 32)
    max_length = hf_config.get("max_position_embeddings", defaults["max_position_embeddings"])
    theta, scaling = _rope(hf_config)
    attention_bias, output_bias = _attention_biases(hf_config)
    window, layer_types = _sliding_window(hf_config)
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", 32000),
        "num_layers": hf_config.get("num_hidden_layers", 32),
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": hf_config.get("intermediate_size", 11008),
        "num_key_value_heads": hf_config.get("num_key_value_heads") or num_heads,
        "head_dim": hf_config.get("head_dim") or defaults.get("head_dim") or hidden_dim // num_heads,
        "max_sequence_length": max_length,
        "rope_max_wavelength": theta,
        "rope_scaling": scaling,
        "attention_bias": attention_bias,
        "attention_output_bias": output_bias,
        "mlp_bias": bool(hf_config.get("mlp_bias", False)) if model_type in ("llama", "smollm3") else False,
        "sliding_window": window,
        "layer_types": layer_types,
        "rope_layers": _rope_layers(hf_config),
        "query_key_norm": "head" if model_type == "qwen3" else None,
        "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", False)),
        "norm_epsilon": hf_config.get("rms_norm_eps", 1e-6),
        "dropout": float(hf_config.get("attention_dropout", 0.0) or 0.0),
    }
    return preset_entries(backbone, max_length)


def preset_entries(backbone, max_length):
    """The preset entries of a LlamaBackbone config (every Llama-layout converter's: Llama, Phi-3, the mixtures of
    experts): LlamaCausalLM, and a preprocessor whose sequence length is the model's, capped for presets."""
    return {
        "family": "llama",
        "backbone": {"class_name": "LlamaBackbone", "config": backbone},
        "task": {"class_name": "LlamaCausalLM", "config": {}},
        "preprocessor": {
            "class_name": "LlamaCausalLMPreprocessor",
            "config": {"sequence_length": min(max_length, MAX_PRESET_SEQUENCE_LENGTH)},
        },
    }


def _rope(hf_config, defaults=None):
    """(rope_theta, our `rope_scaling` or None) from either config layout.

    transformers 4 writes `rope_theta` and `rope_scaling` at the top level; transformers 5 writes
    one `rope_parameters` dict holding `rope_theta`, `rope_type` and the scaling's own keys.
    `defaults`: the type's `rope_theta` and `max_position_embeddings` (hf_moe.py's types), else `_DEFAULTS`'.
    """
    model_type = hf_config["model_type"]
    defaults = defaults or _DEFAULTS[model_type]
    key = "rope_parameters" if hf_config.get("rope_parameters") is not None else "rope_scaling"
    parameters = dict(hf_config.get(key) or {})
    if parameters and all(isinstance(value, dict) for value in parameters.values()):
        raise ValueError(
            f"Unsupported {model_type} config option {key}={parameters!r}: rotary parameters per layer "
            "type are not implemented by keras_transformer's LlamaBackbone (one rotary embedding for all layers)."
        )
    theta = parameters.get("rope_theta", hf_config.get("rope_theta", defaults["rope_theta"]))
    partial = parameters.get("partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        # transformers' Llama, Mistral and Qwen2 rotate whole heads whatever this says (their default
        # rotary embedding ignores it), so no rotary_dim reproduces them.
        raise ValueError(
            f"Unsupported {model_type} config option partial_rotary_factor={partial!r}: these "
            "architectures rotate whole heads; keras_transformer implements only partial_rotary_factor=1.0."
        )
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"Unsupported {model_type} config option {key} with rope_type={kind!r}: keras_transformer "
            f"implements rope_type in {list(ROPE_TYPES)}."
        )
    if kind == "default":
        return float(theta), None
    scaling = {"rope_type": kind, "factor": parameters.get("factor")}
    if kind == "llama3":
        scaling.update(
            low_freq_factor=parameters.get("low_freq_factor"),
            high_freq_factor=parameters.get("high_freq_factor"),
            # transformers falls back to the model's positions, as here.
            original_max_position_embeddings=parameters.get(
                "original_max_position_embeddings",
                hf_config.get("max_position_embeddings", defaults["max_position_embeddings"]),
            ),
        )
    missing = [name for name, value in scaling.items() if value is None]
    if missing:
        raise ValueError(f"The {model_type} config option {key} of rope_type={kind!r} lacks {missing}.")
    return float(theta), scaling


def _attention_biases(hf_config):
    """(query/key/value bias, output bias) of each type: Llama's, Qwen3's and SmolLM3's `attention_bias` covers
    all four projections, Qwen2 always has query/key/value biases and no output bias, Mistral none."""
    model_type = hf_config["model_type"]
    if model_type in ("llama", "qwen3", "smollm3"):
        bias = bool(hf_config.get("attention_bias", False))
        return bias, bias
    if model_type == "qwen2":
        return True, False
    return False, False


def _sliding_window(hf_config):
    """(the window, None or the per-layer `layer_types`): (None, None) without a window.

    Mistral windows every layer by `sliding_window` (None: no window). Qwen2, Qwen3 and SmolLM3 window
    only with `use_sliding_window`, and then the layers `layer_types` names "sliding_attention" (by
    default, as transformers builds it: Qwen's layers from `max_window_layers` on, SmolLM3's NoPE layers).
    """
    model_type = hf_config["model_type"]
    if model_type == "llama":
        return None, None
    window = hf_config.get("sliding_window", _DEFAULTS[model_type]["sliding_window"])
    if model_type == "mistral" or window is None:
        return window, None
    if not hf_config.get("use_sliding_window", False):
        return None, None
    layer_types = hf_config.get("layer_types")
    num_layers = hf_config.get("num_hidden_layers", 32)
    if layer_types is None and model_type == "smollm3":
        rope_layers = _rope_layers(hf_config) or [True] * num_layers
        layer_types = ["full_attention" if rotates else "sliding_attention" for rotates in rope_layers]
    elif layer_types is None:
        first = hf_config.get("max_window_layers", 28)
        layer_types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    layer_types = list(layer_types)[:num_layers]
    unknown = sorted(set(layer_types) - {"sliding_attention", "full_attention"})
    if unknown:
        raise ValueError(
            f"Unsupported {model_type} config option layer_types with {unknown}: keras_transformer implements "
            "'full_attention' and 'sliding_attention' layers."
        )
    if set(layer_types) == {"sliding_attention"}:
        return window, None
    if set(layer_types) == {"full_attention"}:
        return None, None
    return window, layer_types


def _rope_layers(hf_config):
    """SmolLM3's `no_rope_layers` (1: the layer rotates, 0: a NoPE layer; by default every
    `no_rope_layer_interval`-th layer) as a list of bools, or None where every layer rotates."""
    if hf_config["model_type"] != "smollm3":
        return None
    num_layers = hf_config.get("num_hidden_layers", 36)
    flags = hf_config.get("no_rope_layers")
    if flags is None:
        interval = hf_config.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
    if len(flags) < num_layers:
        raise ValueError(
            f"The smollm3 config option no_rope_layers={flags!r} has fewer entries than num_hidden_layers={num_layers}."
        )
    rope_layers = [bool(flag) for flag in flags[:num_layers]]
    return None if all(rope_layers) else rope_layers


def tokenizer(path, hf_config):
    """The checkpoint's tokenizer. Llama 3 has no padding token: it pads with its end token (padded
    positions are masked). A tokenizer_config.json with `bos_token: null` or `add_bos_token: false`
    (Qwen2) means prompts get no start token, as `transformers`' tokenizer adds none."""
    config_file = path / HF_TOKENIZER_CONFIG
    tokenizer_config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    no_start = tokenizer_config.get("add_bos_token") is False or (
        "bos_token" in tokenizer_config and tokenizer_config["bos_token"] is None
    )
    if no_start:  # the model config's bos_token_id (Qwen2 keeps one) is not used for prompts
        hf_config = {key: value for key, value in hf_config.items() if key != "bos_token_id"}
        defaults = {role: token for role, token in SPECIAL_TOKENS.items() if role != "bos_token"}
        return load_tokenizer(path, hf_config, defaults, pad_with_eos=True)
    return load_tokenizer(path, hf_config, SPECIAL_TOKENS, pad_with_eos=True)


def load_weights(model, weights, hf_config, load_experts=None):
    """Assign the checkpoint's weights to a LlamaBackbone or a LlamaCausalLM. `load_experts(moe, name, weights)`
    assigns a block's `MixtureOfExperts` from the tensors under `name` (hf_moe.py's checkpoints)."""
    backbone = getattr(model, "backbone", model)
    prefix = "model." if weights.has("model.embed_tokens.weight") else ""
    D, H = backbone.hidden_dim, backbone.num_heads
    Hkv = backbone.num_key_value_heads or H
    Dh = backbone.head_dim or D // H

    def put(variable, name, transform=None):
        weights.put(variable, prefix + name, transform)

    def linear(dense, name, kernel_shape, bias_shape):
        """A torch Linear (out, in) -> an (in, out) kernel reshaped to `kernel_shape`, and its bias."""
        put(dense.kernel, f"{name}.weight", lambda w: w.T.reshape(kernel_shape))
        if dense.bias is not None:
            put(dense.bias, f"{name}.bias", lambda b: b.reshape(bias_shape))

    put(backbone.token_embedding.embeddings, "embed_tokens.weight")  # (V, D)
    for i, block in enumerate(backbone.transformer_layers):
        p = f"layers.{i}."
        attention = block.self_attention
        linear(attention.query_dense, p + "self_attn.q_proj", (D, H, Dh), (H, Dh))  # (H*Dh, D) -> (D, H, Dh)
        linear(attention.key_dense, p + "self_attn.k_proj", (D, Hkv, Dh), (Hkv, Dh))  # (Hkv*Dh, D) -> (D, Hkv, Dh)
        linear(attention.value_dense, p + "self_attn.v_proj", (D, Hkv, Dh), (Hkv, Dh))
        linear(attention.output_dense, p + "self_attn.o_proj", (H, Dh, D), (D,))  # (D, H*Dh) -> (H, Dh, D)
        if attention.query_key_norm is not None:  # Qwen3: (Dh,) each
            put(attention.query_norm.scale, p + "self_attn.q_norm.weight")
            put(attention.key_norm.scale, p + "self_attn.k_norm.weight")
        put(block.self_attention_norm.scale, p + "input_layernorm.weight")
        put(block.feed_forward_norm.scale, p + "post_attention_layernorm.weight")
        feed_forward = block.feed_forward
        if block.mixture_of_experts is not None:
            load_experts(feed_forward, prefix + p, weights)
            continue
        F = backbone.intermediate_dim
        linear(feed_forward.gate_dense, p + "mlp.gate_proj", (D, F), (F,))  # (F, D) -> (D, F)
        linear(feed_forward.intermediate_dense, p + "mlp.up_proj", (D, F), (F,))
        linear(feed_forward.output_dense, p + "mlp.down_proj", (F, D), (D,))  # (D, F) -> (F, D)
    put(backbone.layer_norm.scale, "norm.weight")
    load_head(model, weights, prefix)


def load_head(model, weights, prefix):
    """The output head of a LlamaCausalLM (`lm_head.weight`, (V, D)), or its check against the embedding when
    tied; a backbone's untied head variable is skipped. (Phi-3's converter shares it.)"""
    backbone = getattr(model, "backbone", model)
    embedding = backbone.token_embedding
    if embedding.tie_weights:
        # A tied checkpoint may still store its head next to the embedding it is tied to.
        weights.check_same("lm_head.weight", prefix + "embed_tokens.weight")
    elif model is not backbone:
        value = weights.get("lm_head.weight")  # (V, D)
        weights.assign(embedding.reverse_embeddings, value.T, "lm_head.weight")  # -> (D, V)
    else:
        # A backbone has no head, but its untied embedding owns the (D, V) head variable.
        weights.skip(embedding, "a backbone's outputs do not depend on the output head")
