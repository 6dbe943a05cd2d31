"""Hugging Face Gemma checkpoints (`model_type` "gemma3_text", "gemma2": Gemma3ForCausalLM, Gemma2ForCausalLM and
their bare models) -> GemmaBackbone / GemmaCausalLM.

Axes: D model width, H query heads, Hkv key/value heads, Dh head size, F feed-forward width, V vocabulary.

Both types share one computation (see `GemmaBackbone`) and differ in options, each mapped here: Gemma 3's
per-head query/key norms, local ("sliding_attention") and global layers by `layer_types` (else
`sliding_window_pattern`), each with its rotary base (`rope_local_base_freq`, `rope_theta` with the global
layers' `rope_scaling`); Gemma 2's attention and final logit soft-capping. A multimodal "gemma3"
(Gemma3ForConditionalGeneration) checkpoint and every option outside these are refused with the option's name.

`torch.nn.Linear` weights are stored (out, in); they are transposed to our (in, out) layouts.
"""

from keras_transformer.convert.checkpoint import load_tokenizer
from keras_transformer.convert.options import check_options

MODEL_TYPES = ("gemma3_text", "gemma2", "gemma3")
SPECIAL_TOKENS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
KNOWN_UNUSED = (r"\.rotary_emb\.",)
HEAD_TENSORS = {"GemmaCausalLM": r"^lm_head\.weight$"}
MAX_PRESET_SEQUENCE_LENGTH = 2048
ROPE_TYPES = ("default", "linear")
# Defaults of `transformers`' config classes, where they differ between the types.
_DEFAULTS = {
    "gemma3_text": {
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
    },
    "gemma2": {
        "vocab_size": 256000,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "sliding_window_pattern": 2,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
}
_REQUIRED = {"add_cross_attention": False, "is_encoder_decoder": False, "use_bidirectional_attention": None}
_TANH_GELUS = ("gelu_pytorch_tanh", "gelu_new")


def convert_config(hf_config, path=None):
    """config.json of a Gemma 3 text or Gemma 2 checkpoint -> the preset entries (backbone, task, preprocessor)."""
    model_type = hf_config["model_type"]
    if model_type == "gemma3":
        raise ValueError(
            "Unsupported model_type='gemma3' (Gemma3ForConditionalGeneration, the multimodal Gemma 3 with its vision "
            "tower): keras_transformer converts the text-only Gemma 3 (model_type='gemma3_text', Gemma3ForCausalLM)."
        )
    if hf_config.get("use_bidirectional_attention") is False:
        hf_config = {key: value for key, value in hf_config.items() if key != "use_bidirectional_attention"}
    check_options(hf_config, _REQUIRED)
    defaults = _DEFAULTS[model_type]
    activation = hf_config.get("hidden_activation") or hf_config.get("hidden_act") or "gelu_pytorch_tanh"
    if activation not in _TANH_GELUS:
        raise ValueError(
            f"Unsupported {model_type} config option hidden_activation={activation!r}: keras_transformer's "
            f"GemmaBackbone gates its feed-forward with the tanh gelu only ({list(_TANH_GELUS)})."
        )
    num_heads = hf_config.get("num_attention_heads", 8)
    max_length = hf_config.get("max_position_embeddings", defaults["max_position_embeddings"])
    window, layer_types = _layer_types(hf_config)
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", defaults["vocab_size"]),
        "num_layers": hf_config.get("num_hidden_layers", 26),
        "num_heads": num_heads,
        "hidden_dim": hf_config.get("hidden_size", 2304),
        "intermediate_dim": hf_config.get("intermediate_size", 9216),
        "num_key_value_heads": hf_config.get("num_key_value_heads") or num_heads,
        "head_dim": hf_config.get("head_dim") or 256,
        "max_sequence_length": max_length,
        "query_pre_attn_scalar": float(hf_config.get("query_pre_attn_scalar", 256)),
        **_rope(hf_config),
        "sliding_window": window,
        "layer_types": layer_types,
        "query_key_norm": "head" if model_type == "gemma3_text" else None,
        "attention_bias": bool(hf_config.get("attention_bias", False)),
        "attention_logit_soft_cap": hf_config.get("attn_logit_softcapping", defaults["attn_logit_softcapping"]),
        "final_logit_soft_cap": hf_config.get("final_logit_softcapping", defaults["final_logit_softcapping"]),
        "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", True)),
        "norm_epsilon": hf_config.get("rms_norm_eps", 1e-6),
        "dropout": float(hf_config.get("attention_dropout", 0.0) or 0.0),
    }
    return {
        "family": "gemma",
        "backbone": {"class_name": "GemmaBackbone", "config": backbone},
        "task": {"class_name": "GemmaCausalLM", "config": {}},
        "preprocessor": {
            "class_name": "GemmaCausalLMPreprocessor",
            "config": {"sequence_length": min(max_length, MAX_PRESET_SEQUENCE_LENGTH)},
        },
    }


def _layer_types(hf_config):
    """(the window, the per-layer `layer_types`): from `layer_types`, else every `sliding_window_pattern`-th
    layer global and the others local, as transformers builds it."""
    model_type = hf_config["model_type"]
    num_layers = hf_config.get("num_hidden_layers", 26)
    layer_types = hf_config.get("layer_types")
    if layer_types is None:
        pattern = hf_config.get("sliding_window_pattern", _DEFAULTS[model_type]["sliding_window_pattern"])
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)]
    layer_types = list(layer_types)
    unknown = sorted(set(layer_types) - {"sliding_attention", "full_attention"})
    if unknown or len(layer_types) != num_layers:
        raise ValueError(
            f"Unsupported {model_type} config option layer_types={layer_types!r}: keras_transformer implements "
            f"num_hidden_layers={num_layers} entries of 'full_attention' and 'sliding_attention'."
        )
    window = hf_config.get("sliding_window", 4096)
    if window is None and "sliding_attention" in layer_types:
        raise ValueError(f"The {model_type} config option sliding_window=None leaves its sliding layers without one.")
    return window, layer_types


def _rope(hf_config):
    """Our rotary options from either layout: transformers 4's `rope_theta`, `rope_local_base_freq` and
    `rope_scaling` (the global layers'), or 5's `rope_parameters` (per layer type for Gemma 3, one dict for Gemma 2)."""
    model_type = hf_config["model_type"]
    defaults = _DEFAULTS[model_type]
    parameters = hf_config.get("rope_parameters")
    if parameters is not None and "full_attention" in parameters:
        full, local = dict(parameters["full_attention"]), dict(parameters.get("sliding_attention") or {})
        key = "rope_parameters"
    else:
        full = dict(parameters or hf_config.get("rope_scaling") or {})
        key = "rope_parameters" if parameters is not None else "rope_scaling"
        full.setdefault("rope_theta", hf_config.get("rope_theta", defaults["rope_theta"]))
        local = {"rope_theta": hf_config.get("rope_local_base_freq", defaults.get("rope_local_base_freq"))}
    local_theta = local.get("rope_theta") or full["rope_theta"]
    if _rope_type(local) != "default":
        raise ValueError(
            f"Unsupported {model_type} config option {key} with sliding_attention rope_type={_rope_type(local)!r}: "
            "keras_transformer's GemmaBackbone scales the global layers' rotary positions only."
        )
    kind = _rope_type(full)
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"Unsupported {model_type} config option {key} with rope_type={kind!r}: keras_transformer implements "
            f"rope_type in {list(ROPE_TYPES)}."
        )
    scaling = None if kind == "default" else {"rope_type": kind, "factor": float(full["factor"])}
    return {
        "rope_max_wavelength": float(full["rope_theta"]),
        "rope_scaling": scaling,
        "local_rope_max_wavelength": float(local_theta),
    }


def _rope_type(parameters):
    return parameters.get("rope_type", parameters.get("type", "default"))


def tokenizer(path, hf_config):
    """The checkpoint's tokenizer: `<bos>` starts prompts, `<eos>` ends texts, `<pad>` pads."""
    return load_tokenizer(path, hf_config, SPECIAL_TOKENS)


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a GemmaBackbone or a GemmaCausalLM."""
    backbone = getattr(model, "backbone", model)
    prefix = "model." if weights.has("model.embed_tokens.weight") else ""

    def put(variable, name, transform=None):
        weights.put(variable, prefix + name, transform)

    put(backbone.token_embedding.embeddings, "embed_tokens.weight")  # (V, D)
    for i, block in enumerate(backbone.transformer_layers):
        _load_block(backbone, block, put, f"layers.{i}.")
    put(backbone.layer_norm.scale, "norm.weight")
    embedding = backbone.token_embedding
    if embedding.tie_weights:
        weights.check_same("lm_head.weight", prefix + "embed_tokens.weight")
    elif model is not backbone:
        weights.assign(embedding.reverse_embeddings, weights.get("lm_head.weight").T, "lm_head.weight")  # -> (D, V)
    else:
        weights.skip(embedding, "a backbone's outputs do not depend on the output head")


def _load_block(backbone, block, put, p):
    """One decoder layer: attention, its query/key norms (Gemma 3), GeGLU, the four norms."""
    D, H = backbone.hidden_dim, backbone.num_heads
    Hkv, Dh, F = backbone.num_key_value_heads or H, backbone.head_dim or D // H, backbone.intermediate_dim

    def linear(dense, name, kernel_shape, bias_shape):
        """A torch Linear (out, in) -> an (in, out) kernel reshaped to `kernel_shape`, and its bias."""
        put(dense.kernel, f"{name}.weight", lambda w: w.T.reshape(kernel_shape))
        if dense.bias is not None:
            put(dense.bias, f"{name}.bias", lambda b: b.reshape(bias_shape))

    attention = block.self_attention
    linear(attention.query_dense, p + "self_attn.q_proj", (D, H, Dh), (H, Dh))  # (H*Dh, D) -> (D, H, Dh)
    linear(attention.key_dense, p + "self_attn.k_proj", (D, Hkv, Dh), (Hkv, Dh))  # (Hkv*Dh, D) -> (D, Hkv, Dh)
    linear(attention.value_dense, p + "self_attn.v_proj", (D, Hkv, Dh), (Hkv, Dh))
    linear(attention.output_dense, p + "self_attn.o_proj", (H, Dh, D), (D,))  # (D, H*Dh) -> (H, Dh, D)
    if attention.query_key_norm is not None:  # (Dh,) each
        put(attention.query_norm.scale, p + "self_attn.q_norm.weight")
        put(attention.key_norm.scale, p + "self_attn.k_norm.weight")
    linear(block.feed_forward.gate_dense, p + "mlp.gate_proj", (D, F), (F,))  # (F, D) -> (D, F)
    linear(block.feed_forward.intermediate_dense, p + "mlp.up_proj", (D, F), (F,))
    linear(block.feed_forward.output_dense, p + "mlp.down_proj", (F, D), (D,))  # (D, F) -> (F, D)
    put(block.self_attention_norm.scale, p + "input_layernorm.weight")
    put(block.self_attention_post_norm.scale, p + "post_attention_layernorm.weight")
    put(block.feed_forward_norm.scale, p + "pre_feedforward_layernorm.weight")
    put(block.feed_forward_post_norm.scale, p + "post_feedforward_layernorm.weight")
