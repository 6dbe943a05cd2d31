"""Hugging Face mixture-of-experts checkpoints (`model_type` "qwen3_moe", "mixtral", "olmoe", "qwen2_moe":
Qwen3MoeForCausalLM, MixtralForCausalLM, OlmoeForCausalLM, Qwen2MoeForCausalLM and their bare models) -> LlamaBackbone
/ LlamaCausalLM with `mixture_of_experts` (MixtureOfExperts) on the layers `moe_layers` names.

Axes: D model width, E experts, I one expert's inner width, F a dense layer's inner width.

Their attention is Llama's with each type's options: Qwen3-MoE's RMS norms per head (q_norm / k_norm, our
`query_key_norm="head"`) and its `head_dim`; OLMoE's norms over all heads' queries and keys (`"full"`); Qwen2-MoE's
query/key/value biases (`qkv_bias`); Mixtral's `sliding_window` on every layer, and Qwen3-MoE's with
`use_sliding_window`. Their feed-forwards are routed to k of E SwiGLU experts (`num_experts_per_tok` of
`num_experts` / `num_local_experts`) by a softmax over the E router logits, the k kept weights renormalised to sum to
one by Mixtral always and by the others with `norm_topk_prob`. Qwen3-MoE and Qwen2-MoE keep dense feed-forwards
(`intermediate_size`) on the layers `mlp_only_layers` names and on those that `decoder_sparse_step` skips; their
experts are `moe_intermediate_size` wide. Qwen2-MoE adds a shared expert on every token
(`shared_expert_intermediate_size`), scaled by a sigmoid gate.

Options we do not implement are refused with the option's name: Mixtral's `router_jitter_noise` (training-time
noise on the router's inputs), OLMoE's `clip_qkv`, Qwen2-MoE's sliding window (a per-layer pattern of its own).
`output_router_logits` (transformers then adds `router_aux_loss_coef` times its load-balancing loss to the training
loss) becomes the backbone's `router_aux_loss_coef` (0 without it), and the Hugging Face export writes it back.

The experts' tensors come in two layouts, both read here:
- per expert, as every checkpoint on the Hub and transformers 5's `save_pretrained` (which converts back to it)
  store them: `mlp.experts.{i}.gate_proj` / `up_proj` (I, D) and `down_proj` (D, I), or Mixtral's
  `block_sparse_moe.experts.{i}.w1` (gate) / `w3` (up) / `w2` (down) and `block_sparse_moe.gate`;
- fused, as transformers 5 holds them in memory (its `state_dict()`; the GGUF export fills this layout, the Hugging
  Face export the per-expert one):
  `mlp.experts.gate_up_proj` (E, 2 I, D), the gate's I rows first, and `mlp.experts.down_proj` (E, D, I).
"""

import numpy as np

from keras_transformer.convert import hf_llama
from keras_transformer.convert.options import check_options

MODEL_TYPES = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")
KNOWN_UNUSED = hf_llama.KNOWN_UNUSED
HEAD_TENSORS = hf_llama.HEAD_TENSORS
tokenizer = hf_llama.tokenizer

# Defaults of transformers' config classes (5.x), where config.json may leave them out.
_DEFAULTS = {
    "qwen3_moe": {"max_position_embeddings": 32768, "rope_theta": 10000.0, "sliding_window": 4096, "num_experts": 128},
    "mixtral": {"max_position_embeddings": 131072, "rope_theta": 1000000.0, "sliding_window": None, "num_experts": 8},
    "olmoe": {"max_position_embeddings": 4096, "rope_theta": 10000.0, "num_experts": 64},
    "qwen2_moe": {"max_position_embeddings": 32768, "rope_theta": 10000.0, "num_experts": 60},
}
_TOP_K = {"qwen3_moe": 8, "mixtral": 2, "olmoe": 8, "qwen2_moe": 4}
# Options whose other values change the computation in ways we do not implement.
_COMMON = {"add_cross_attention": False, "is_encoder_decoder": False}
_REQUIRED = {
    "qwen3_moe": _COMMON,
    "mixtral": {**_COMMON, "router_jitter_noise": 0.0},
    "olmoe": {**_COMMON, "clip_qkv": None},
    "qwen2_moe": {**_COMMON, "use_sliding_window": False},
}
# The experts' tensor names (gate, up, down) in the per-expert layout.
_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2")}
_NAMES = ("gate_proj", "up_proj", "down_proj")


def convert_config(hf_config, path=None):
    """config.json of a Qwen3-MoE, Mixtral, OLMoE or Qwen2-MoE checkpoint -> the preset entries."""
    model_type = hf_config["model_type"]
    check_options(hf_config, _REQUIRED[model_type])
    hf_llama.check_activation(hf_config)
    defaults = _DEFAULTS[model_type]
    hidden_dim = hf_config.get("hidden_size", 4096)
    num_heads = hf_config.get("num_attention_heads", 32)
    head_dim = hf_config.get("head_dim") or hidden_dim // num_heads
    if model_type == "olmoe" and head_dim * num_heads != hidden_dim:
        raise ValueError(
            f"Unsupported olmoe config option head_dim={head_dim}: OLMoE's query and key norms span hidden_size "
            f"({hidden_dim}) values, so head_dim must be hidden_size / num_attention_heads = {hidden_dim // num_heads}."
        )
    max_length = hf_config.get("max_position_embeddings", defaults["max_position_embeddings"])
    theta, scaling = hf_llama._rope(hf_config, defaults)
    attention_bias, output_bias = _attention_biases(hf_config)
    mixture, moe_layers = _experts(hf_config)
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", 32000),
        "num_layers": hf_config.get("num_hidden_layers", 32),
        "num_heads": num_heads,
        "hidden_dim": hidden_dim,
        "intermediate_dim": hf_config.get("intermediate_size", 11008),
        "num_key_value_heads": hf_config.get("num_key_value_heads") or num_heads,
        "head_dim": head_dim,
        "max_sequence_length": max_length,
        "rope_max_wavelength": theta,
        "rope_scaling": scaling,
        "attention_bias": attention_bias,
        "attention_output_bias": output_bias,
        "mlp_bias": False,
        "sliding_window": _sliding_window(hf_config),
        "layer_types": None,
        "rope_layers": None,
        "query_key_norm": {"qwen3_moe": "head", "olmoe": "full"}.get(model_type),
        "mixture_of_experts": mixture,
        "moe_layers": moe_layers,
        "router_aux_loss_coef": _aux_loss_coefficient(hf_config) if mixture is not None else 0.0,
        "tie_word_embeddings": bool(hf_config.get("tie_word_embeddings", False)),
        "norm_epsilon": hf_config.get("rms_norm_eps", 1e-6),
        "dropout": float(hf_config.get("attention_dropout", 0.0) or 0.0),
    }
    return hf_llama.preset_entries(backbone, max_length)


def _aux_loss_coefficient(hf_config):
    """The load-balancing loss's weight in training: `router_aux_loss_coef` (transformers' default 0.001, OLMoE's
    0.01) when `output_router_logits` asks transformers to add it, else 0."""
    if not hf_config.get("output_router_logits", False):
        return 0.0
    return float(hf_config.get("router_aux_loss_coef", 0.01 if hf_config["model_type"] == "olmoe" else 0.001))


def _attention_biases(hf_config):
    """(query/key/value bias, output bias): Qwen3-MoE's and OLMoE's `attention_bias` covers all four projections,
    Qwen2-MoE's `qkv_bias` (true by default) the first three, Mixtral has none."""
    model_type = hf_config["model_type"]
    if model_type == "qwen2_moe":
        return bool(hf_config.get("qkv_bias", True)), False
    if model_type == "mixtral":
        return False, False
    bias = bool(hf_config.get("attention_bias", False))
    return bias, bias


def _sliding_window(hf_config):
    """Mixtral windows every layer by `sliding_window` (None: none); Qwen3-MoE every layer when `use_sliding_window`."""
    model_type = hf_config["model_type"]
    if model_type == "mixtral":
        return hf_config.get("sliding_window")
    if model_type == "qwen3_moe" and hf_config.get("use_sliding_window", False):
        return hf_config.get("sliding_window", _DEFAULTS[model_type]["sliding_window"])
    return None


def _experts(hf_config):
    """(the `mixture_of_experts` dict, `moe_layers`: None where every layer is sparse), or (None, None) for a
    checkpoint without experts (Qwen's num_experts=0)."""
    model_type = hf_config["model_type"]
    default = _DEFAULTS[model_type]["num_experts"]
    num_experts = hf_config.get("num_experts", hf_config.get("num_local_experts", default))
    num_layers = hf_config.get("num_hidden_layers", 32)
    moe_layers = [True] * num_layers
    if model_type in ("qwen3_moe", "qwen2_moe"):
        dense = set(hf_config.get("mlp_only_layers") or [])
        step = hf_config.get("decoder_sparse_step", 1)
        moe_layers = [i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(num_layers)]
    if not any(moe_layers):
        return None, None
    top_k = hf_config.get("num_experts_per_tok", _TOP_K[model_type])
    if top_k > num_experts:
        raise ValueError(
            f"Unsupported {model_type} config option num_experts_per_tok={top_k}: more than its {num_experts} experts."
        )
    intermediate = "moe_intermediate_size" if model_type in ("qwen3_moe", "qwen2_moe") else "intermediate_size"
    mixture = {
        "num_experts": num_experts,
        "top_k": top_k,
        "intermediate_dim": hf_config.get(intermediate, {"qwen3_moe": 768, "qwen2_moe": 1408}.get(model_type, 14336)),
        "normalize_top_k": model_type == "mixtral" or bool(hf_config.get("norm_topk_prob", False)),
    }
    if model_type == "qwen2_moe":
        mixture.update(
            shared_intermediate_dim=hf_config.get("shared_expert_intermediate_size", 5632), shared_expert_gate=True
        )
    return mixture, None if all(moe_layers) else moe_layers


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a LlamaBackbone or a LlamaCausalLM with a mixture of experts: the
    attention, norms, dense layers and head as Llama's (hf_llama.py), the experts here."""
    hf_llama.load_weights(model, weights, hf_config, load_experts=_load_experts)
    backbone = getattr(model, "backbone", model)
    if getattr(backbone, "router_losses", None) is not None:
        weights.skip(backbone.router_losses, "the experts' load of the last training batch: a statistic, no parameter")


def _load_experts(moe, name, weights):
    """A `MixtureOfExperts` from the tensors of the block under `name` ("model.layers.{i}."): its router, its
    stacked experts (per expert or fused) and Qwen2-MoE's shared expert and gate."""
    block = name + ("block_sparse_moe." if weights.has(name + "block_sparse_moe.gate.weight") else "mlp.")
    weights.assign(moe.router.kernel, weights.get(block + "gate.weight").T, block + "gate.weight")  # (E, D) -> (D, E)
    experts = block + "experts."
    if weights.has(experts + "gate_up_proj"):
        gate_up = weights.get(experts + "gate_up_proj")  # (E, 2 I, D), the gate's rows first
        inner = gate_up.shape[1] // 2
        weights.assign(moe.gate_kernel, gate_up[:, :inner].transpose(0, 2, 1), experts + "gate_up_proj")  # (E, D, I)
        weights.assign(moe.up_kernel, gate_up[:, inner:].transpose(0, 2, 1), experts + "gate_up_proj")
        down = weights.get(experts + "down_proj")  # (E, D, I) -> (E, I, D)
        weights.assign(moe.down_kernel, down.transpose(0, 2, 1), experts + "down_proj")
    else:
        names = _EXPERT_NAMES.get("mixtral" if "block_sparse_moe" in block else None, _NAMES)
        for kernel, tensor in zip((moe.gate_kernel, moe.up_kernel, moe.down_kernel), names):
            # E torch Linears, (I, D) or (D, I) each -> one stacked (E, D, I) or (E, I, D) kernel
            stacked = np.stack([weights.get(f"{experts}{i}.{tensor}.weight").T for i in range(moe.num_experts)])
            weights.assign(kernel, stacked, f"{experts}{{0..{moe.num_experts - 1}}}.{tensor}.weight")
    if moe.shared_intermediate_dim is not None:  # Qwen2-MoE
        shared = moe.shared_expert
        for dense, tensor in zip((shared.gate_dense, shared.intermediate_dense, shared.output_dense), _NAMES):
            source = f"{block}shared_expert.{tensor}.weight"
            weights.assign(dense.kernel, weights.get(source).T, source)  # (out, in) -> (in, out)
        source = block + "shared_expert_gate.weight"
        weights.assign(moe.shared_gate.kernel, weights.get(source).T, source)  # (1, D) -> (D, 1)


# --- export -----------------------------------------------------------------


def export_config(task, decoder_settings, unsupported):
    """A LlamaBackbone with `mixture_of_experts`: Qwen2MoeForCausalLM with a (gated) shared expert, Qwen3MoeForCausalLM
    with query/key norms per head, OlmoeForCausalLM with norms over all heads, MixtralForCausalLM without norms (its
    top-k weights always renormalised); dense layers (`moe_layers`) as Qwen's `mlp_only_layers`. For
    hf_export_families.py: (config class name, model class name, config arguments). `decoder_settings`: the
    entries every rotary decoder's config spells alike; `unsupported(option, why)`: the ValueError to raise."""
    b = task.backbone
    moe = dict(b.mixture_of_experts)
    kind, qkv_bias, dense = _export_kind(task, unsupported)
    theta = float(b.rope_max_wavelength)
    rope = {"rope_type": "default", "rope_theta": theta}
    if b.rope_scaling:
        rope = {**b.rope_scaling, "rope_theta": theta}
    settings = {**decoder_settings, "head_dim": b.head_dim or b.hidden_dim // b.num_heads, "hidden_act": "silu"}
    settings.update(rope_parameters=rope, num_experts_per_tok=moe["top_k"], num_experts=moe["num_experts"])
    settings["norm_topk_prob"] = bool(moe.get("normalize_top_k", True))
    if b.router_aux_loss_coef:  # transformers adds the load-balancing loss in training only when asked
        settings.update(output_router_logits=True, router_aux_loss_coef=float(b.router_aux_loss_coef))
    qwen = dict(moe_intermediate_size=moe["intermediate_dim"], mlp_only_layers=dense, decoder_sparse_step=1)
    if kind == "qwen2_moe":
        settings.update(qwen, shared_expert_intermediate_size=moe["shared_intermediate_dim"], qkv_bias=qkv_bias)
        return "Qwen2MoeConfig", "Qwen2MoeForCausalLM", {**settings, "use_sliding_window": False}
    window = b.sliding_window
    if kind == "qwen3_moe":
        settings.update(qwen, attention_bias=qkv_bias, use_sliding_window=window is not None, sliding_window=window)
        return "Qwen3MoeConfig", "Qwen3MoeForCausalLM", settings
    settings["intermediate_size"] = moe["intermediate_dim"]  # every layer sparse: the experts' width
    if kind == "olmoe":
        return "OlmoeConfig", "OlmoeForCausalLM", {**settings, "attention_bias": qkv_bias, "clip_qkv": None}
    settings.pop("norm_topk_prob")  # Mixtral always renormalises
    settings.update(num_local_experts=settings.pop("num_experts"), sliding_window=window)
    return "MixtralConfig", "MixtralForCausalLM", settings


def _export_kind(task, unsupported):
    """(the Hugging Face model type of this mixture of experts, its query/key/value bias, its dense layers), or
    the ValueError naming the options no Hugging Face mixture of experts has together."""
    b = task.backbone
    moe = dict(b.mixture_of_experts)
    qkv_bias = bool(b.attention_bias)
    output_bias = qkv_bias if b.attention_output_bias is None else bool(b.attention_output_bias)
    dense = [i for i, sparse in enumerate(b.moe_layers or [True] * b.num_layers) if not sparse]
    whole_heads = (b.head_dim or b.hidden_dim // b.num_heads) * b.num_heads == b.hidden_dim
    window, norm = b.sliding_window, b.query_key_norm
    if moe.get("shared_intermediate_dim") is not None:
        kind, fits = "qwen2_moe", not (norm or window or output_bias) and moe.get("shared_expert_gate", False)
    elif norm == "head":
        kind, fits = "qwen3_moe", qkv_bias == output_bias
    elif norm == "full":
        kind, fits = "olmoe", qkv_bias == output_bias and not dense and window is None and whole_heads
    else:
        kind, fits = "mixtral", not (qkv_bias or output_bias or dense) and moe.get("normalize_top_k", True)
    common = not (b.mlp_bias or b.layer_types or b.rope_layers) and moe.get("activation", "silu") == "silu"
    if not (fits and common):
        raise unsupported(
            f"mixture_of_experts={moe}, moe_layers={b.moe_layers}, query_key_norm={norm!r}, attention_bias="
            f"{b.attention_bias}, attention_output_bias={b.attention_output_bias}, mlp_bias={b.mlp_bias}, "
            f"sliding_window={window}, layer_types={b.layer_types}, rope_layers={b.rope_layers}",
            "the Hugging Face mixtures of experts have SwiGLU experts and rotate every layer; Qwen2-MoE has a gated "
            "shared expert, query/key/value biases or none, no norms, no window; Qwen3-MoE query/key norms per "
            "head, biases on all four projections or none; OLMoE norms over all heads, every layer sparse, no "
            "window; Mixtral no norms, no biases, every layer sparse, renormalised top-k weights",
        )
    return kind, qkv_bias, dense
