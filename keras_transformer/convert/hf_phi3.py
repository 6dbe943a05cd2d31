"""Hugging Face Phi-3 / Phi-4-mini checkpoints (`model_type` "phi3": Phi3ForCausalLM, Phi3Model) -> LlamaBackbone /
LlamaCausalLM.

Axes: D model width, H query heads, Hkv key/value heads, Dh head size, R rotated dims, F feed-forward width.

Phi-3 computes what Llama computes (rotary positions, grouped-query attention, RMS pre-norms, a gated-SiLU
feed-forward, no biases); it differs in its checkpoint and its rotary options, each mapped here:
- the fused `qkv_proj` (H Dh + 2 Hkv Dh, D) and `gate_up_proj` (2 F, D) tensors, split into our query, key and
  value projections and our gate and up projections (and fused again by the Hugging Face export);
- `partial_rotary_factor`: the first R = int(Dh * factor) dims of each head rotate (our `rotary_dim`);
- `rope_scaling` of type "longrope" (transformers also reads the old names "su" and "yarn" as it): each frequency
  divided by its short factor, or by its long factor in a call whose sequence is longer than
  `original_max_position_embeddings`, and cos / sin times an attention factor (transformers'
  `_compute_longrope_parameters`: the config's `attention_factor`, else sqrt(1 + ln(s) / ln(N)) for
  s = `factor` or max_position_embeddings / N, when s > 1);
- `sliding_window` (None: none) on every layer.
Other rope types, activations and biases are refused with the option's name.

Cached decoding picks the factors by each call's last position + 1, as transformers' model does with a cache.
transformers' `generate` also drops its cache once, at the step whose sequence first passes N, and recomputes every
position with the long factors; so do our decoding loops (decoding/decode_loop.py's `refresh_after`, read from the
rotary layer, on every backend, compiled or host-stepped, beams included; constrained decoding too). Every cached
generation therefore gives the full forward pass's tokens, within N, past it and across it. Speculative decoding
across N is refused.
"""

import math

from keras_transformer.convert import hf_llama
from keras_transformer.convert.options import check_options, single_dropout

MODEL_TYPE = "phi3"
KNOWN_UNUSED = hf_llama.KNOWN_UNUSED
HEAD_TENSORS = {"LlamaCausalLM": r"^lm_head\.weight$"}
ROPE_TYPES = ("default", "longrope")
# transformers' Phi3Config reads these old rope type names as longrope.
_LONGROPE_ALIASES = ("su", "yarn")
# Phi3Config's defaults (it writes most of them into config.json anyway).
_DEFAULTS = {"max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rope_theta": 10000.0}
# Options whose other values change the computation in ways LlamaBackbone does not implement (Phi-4-mini's
# config.json names the three biases, false).
_REQUIRED = {
    "add_cross_attention": False,
    "is_encoder_decoder": False,
    "attention_bias": False,
    "mlp_bias": False,
    "lm_head_bias": False,
}

tokenizer = hf_llama.tokenizer  # Phi-3's `<s>`, or Phi-4-mini's `<|endoftext|>` and no start token


def convert_config(hf_config, path=None):
    """config.json of a Phi-3 checkpoint -> the preset entries (backbone, task, preprocessor)."""
    check_options(hf_config, _REQUIRED)
    hf_llama.check_activation(hf_config)
    hidden_dim = hf_config.get("hidden_size", 3072)
    num_heads = hf_config.get("num_attention_heads", 32)
    head_dim = hf_config.get("head_dim") or hidden_dim // num_heads
    max_length = hf_config.get("max_position_embeddings", _DEFAULTS["max_position_embeddings"])
    theta, rotary_dim, scaling = rope(hf_config, head_dim)
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", 32064),
        "num_layers": hf_config.get("num_hidden_layers", 32),
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": hf_config.get("intermediate_size", 8192),
        "num_key_value_heads": hf_config.get("num_key_value_heads") or num_heads,
        "head_dim": head_dim,
        "max_sequence_length": max_length,
        "rope_max_wavelength": theta,
        "rope_scaling": scaling,
        "rotary_dim": rotary_dim,
        "sliding_window": hf_config.get("sliding_window"),
        "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", False)),
        "norm_epsilon": hf_config.get("rms_norm_eps", 1e-5),
        "dropout": single_dropout(hf_config, {"attention_dropout": 0.0, "resid_pdrop": 0.0}),
    }
    return hf_llama.preset_entries(backbone, max_length)


def rope(hf_config, head_dim):
    """(rope_theta, our `rotary_dim` (None: whole heads), our `rope_scaling` (None or longrope's)), from either
    layout: transformers 4's top-level `rope_theta`, `partial_rotary_factor` and `rope_scaling`, or 5's one
    `rope_parameters` dict."""
    key = "rope_parameters" if hf_config.get("rope_parameters") is not None else "rope_scaling"
    parameters = dict(hf_config.get(key) or {})
    if parameters and all(isinstance(value, dict) for value in parameters.values()):
        raise ValueError(
            f"Unsupported phi3 config option {key}={parameters!r}: rotary parameters per layer type are not "
            "implemented by keras_transformer's LlamaBackbone (one rotary embedding for all layers)."
        )
    theta = float(parameters.get("rope_theta", hf_config.get("rope_theta", _DEFAULTS["rope_theta"])))
    partial = parameters.get("partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * partial)
    if not 2 <= rotary_dim <= head_dim or rotary_dim % 2:
        raise ValueError(
            f"Unsupported phi3 config option partial_rotary_factor={partial!r}: it makes {rotary_dim} rotated dims "
            f"of a head of {head_dim}; keras_transformer rotates an even number of dims, from 2 to the head size."
        )
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    kind = "longrope" if kind in _LONGROPE_ALIASES else kind
    if kind not in ROPE_TYPES:
        raise ValueError(
            f"Unsupported phi3 config option {key} with rope_type={kind!r}: keras_transformer implements "
            f"rope_type in {list(ROPE_TYPES)} for Phi-3."
        )
    rotary_dim = None if rotary_dim == head_dim else rotary_dim
    if kind == "default":
        return theta, rotary_dim, None
    return theta, rotary_dim, _longrope(hf_config, parameters, key, int(head_dim * partial))


def _longrope(hf_config, parameters, key, rotary_dim):
    """Our longrope scaling: the factors, the original length N (Phi3Config's top-level entry wins, as
    transformers' `standardize_rope_params` has it) and transformers' attention factor."""
    factors = {name: parameters.get(name) for name in ("short_factor", "long_factor")}
    for name, values in factors.items():
        if not isinstance(values, list) or len(values) != rotary_dim // 2:
            raise ValueError(
                f"The phi3 config option {key} of rope_type='longrope' needs {name} as a list of rotary_dim / 2 = "
                f"{rotary_dim // 2} numbers. Received: {name}={values!r}"
            )
    original = hf_config.get(
        "original_max_position_embeddings",
        parameters.get("original_max_position_embeddings", _DEFAULTS["original_max_position_embeddings"]),
    )
    max_length = hf_config.get("max_position_embeddings", _DEFAULTS["max_position_embeddings"])
    return {
        "rope_type": "longrope",
        "short_factor": [float(f) for f in factors["short_factor"]],
        "long_factor": [float(f) for f in factors["long_factor"]],
        "original_max_position_embeddings": int(original),
        "attention_factor": longrope_attention_factor(parameters, max_length, original),
    }


def longrope_attention_factor(parameters, max_length, original):
    """transformers' longrope attention factor: the parameters' own `attention_factor`, else sqrt(1 + ln(s) / ln(N))
    for the scale s (`factor`, else max_position_embeddings / N) above 1, else 1."""
    if parameters.get("attention_factor") is not None:
        return float(parameters["attention_factor"])
    factor = parameters.get("factor")
    if factor is None:
        factor = max_length / original
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a LlamaBackbone or a LlamaCausalLM: the fused tensors split by rows."""
    backbone = getattr(model, "backbone", model)
    prefix = "model." if weights.has("model.embed_tokens.weight") else ""
    D, H = backbone.hidden_dim, backbone.num_heads
    Hkv = backbone.num_key_value_heads or H
    Dh = backbone.head_dim or D // H
    F = backbone.intermediate_dim

    def put(variable, name, rows=None, shape=None):
        """Rows [start, stop) of a torch Linear (out, in) -> our (in, out) kernel in `shape`; or a whole vector."""
        rows_of = None if rows is None else lambda value: value[rows[0] : rows[1]].T.reshape(shape)
        weights.put(variable, prefix + name, rows_of)

    put(backbone.token_embedding.embeddings, "embed_tokens.weight")  # (V, D)
    q, k = H * Dh, H * Dh + Hkv * Dh  # where the keys and the values start in qkv_proj's rows
    for i, block in enumerate(backbone.transformer_layers):
        p = f"layers.{i}."
        attention, feed_forward = block.self_attention, block.feed_forward
        put(attention.query_dense.kernel, p + "self_attn.qkv_proj.weight", (0, q), (D, H, Dh))  # -> (D, H, Dh)
        put(attention.key_dense.kernel, p + "self_attn.qkv_proj.weight", (q, k), (D, Hkv, Dh))  # -> (D, Hkv, Dh)
        put(attention.value_dense.kernel, p + "self_attn.qkv_proj.weight", (k, k + Hkv * Dh), (D, Hkv, Dh))
        put(attention.output_dense.kernel, p + "self_attn.o_proj.weight", (0, D), (H, Dh, D))  # (D, H Dh) -> (H, Dh, D)
        put(block.self_attention_norm.scale, p + "input_layernorm.weight")
        put(
            feed_forward.gate_dense.kernel, p + "mlp.gate_up_proj.weight", (0, F), (D, F)
        )  # gate first: (F, D) -> (D, F)
        put(feed_forward.intermediate_dense.kernel, p + "mlp.gate_up_proj.weight", (F, 2 * F), (D, F))
        put(feed_forward.output_dense.kernel, p + "mlp.down_proj.weight", (0, D), (F, D))  # (D, F) -> (F, D)
        put(block.feed_forward_norm.scale, p + "post_attention_layernorm.weight")
    put(backbone.layer_norm.scale, "norm.weight")
    hf_llama.load_head(model, weights, prefix)
