"""GGUF names onto the Hugging Face ones: a GGUF checkpoint's metadata as the config.json its Hugging Face
converter (hf_llama.py, hf_gpt2.py, hf_phi3.py, hf_gemma.py, hf_moe.py) reads, and its tensors under the names and
layouts of that checkpoint. No model is described here; the Hugging Face converters build and fill the model.

Axes: D model width, H query heads, Hkv key/value heads, Dh head size, F feed-forward width, E experts,
I one expert's inner width, V vocabulary.

The names are llama.cpp's (`gguf.constants.MODEL_TENSORS`, `convert_hf_to_gguf.py`):
- `llama` (Llama, Mistral; with `expert_count`, Mixtral), `qwen2`, `qwen3`, `qwen3moe`, `phi3`, `gemma3`, `gpt2`;
- Gemma 3 as llama.cpp runs it: its norms stored as 1 + w (the 1 taken off again, which rounds the smallest
  weights in float32), every 6th layer global (the pattern is not in the file);
- every `{arch}.` metadata key is either mapped (`_KEYS`) or refused with a ValueError naming it, as is any
  tensor no Hugging Face name stands for: nothing is dropped silently;
- weights are (out, in) as torch's Linear; GPT-2's Conv1D tensors were transposed to that by llama.cpp's converter
  and are transposed back;
- llama.cpp permutes the query and key rows of the `llama` architecture (its rotary pairs adjacent dims, Hugging
  Face's pairs each half with the other); `_unpermute` is the exact inverse of its `LlamaModel.permute`.
"""

import functools

import numpy as np

ARCHITECTURES = ("llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gemma3", "gpt2")
# Metadata keys under `{arch}.` that map onto the config (any other is refused by name).
_COMMON_KEYS = (
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "vocab_size",
)
_ROPE_KEYS = ("rope.freq_base", "rope.dimension_count", "rope.scaling.type", "rope.scaling.factor")
_RMS = ("attention.layer_norm_rms_epsilon",)
_EXPERTS = ("expert_count", "expert_used_count", "expert_feed_forward_length")
_KEYS = {
    "llama": _COMMON_KEYS + _ROPE_KEYS + _RMS + _EXPERTS,
    "qwen2": _COMMON_KEYS + _ROPE_KEYS + _RMS,
    "qwen3": _COMMON_KEYS + _ROPE_KEYS + _RMS,
    "qwen3moe": _COMMON_KEYS + _ROPE_KEYS + _RMS + _EXPERTS,
    "phi3": _COMMON_KEYS + _ROPE_KEYS + _RMS + ("attention.sliding_window", "rope.scaling.original_context_length"),
    "gpt2": _COMMON_KEYS + ("attention.layer_norm_epsilon",),
    "gemma3": _COMMON_KEYS
    + _ROPE_KEYS
    + _RMS
    + ("attention.sliding_window", "rope.freq_base_swa", "final_logit_softcapping"),
}
# llama.cpp's Gemma 3: every 6th layer global, the others windowed; the windowed layers' rotary base 10000 where
# the file names none (rope.freq_base_swa).
_GEMMA3_PATTERN, _GEMMA3_LOCAL_BASE = 6, 10000.0
# GGUF block tensor -> the Hugging Face tensor under `model.layers.{i}.` (the Llama layout).
_LLAMA_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_up.bias": "mlp.up_proj.bias",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_down.bias": "mlp.down_proj.bias",
    "ffn_gate_inp.weight": "mlp.gate.weight",  # the router (E, D)
}
_GEMMA3_BLOCK = {
    **{name: hf for name, hf in _LLAMA_BLOCK.items() if name != "ffn_norm.weight"},
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_PHI3_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",  # (2 F, D): the gate's rows first, as Phi-3's own
    "ffn_down.weight": "mlp.down_proj.weight",
}
# GPT-2: GGUF name -> (Hugging Face name under `transformer.h.{i}.`, transposed back to Conv1D's (in, out)).
_GPT2_BLOCK = {
    "attn_norm.weight": ("ln_1.weight", False),
    "attn_norm.bias": ("ln_1.bias", False),
    "ffn_norm.weight": ("ln_2.weight", False),
    "ffn_norm.bias": ("ln_2.bias", False),
    "attn_qkv.weight": ("attn.c_attn.weight", True),
    "attn_qkv.bias": ("attn.c_attn.bias", False),
    "attn_output.weight": ("attn.c_proj.weight", True),
    "attn_output.bias": ("attn.c_proj.bias", False),
    "ffn_up.weight": ("mlp.c_fc.weight", True),
    "ffn_up.bias": ("mlp.c_fc.bias", False),
    "ffn_down.weight": ("mlp.c_proj.weight", True),
    "ffn_down.bias": ("mlp.c_proj.bias", False),
}
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GPT2_GLOBAL = {
    "token_embd.weight": "transformer.wte.weight",
    "position_embd.weight": "transformer.wpe.weight",
    "output_norm.weight": "transformer.ln_f.weight",
    "output_norm.bias": "transformer.ln_f.bias",
    "output.weight": "lm_head.weight",
}


def check_architecture(checkpoint):
    architecture = checkpoint.architecture
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"Unsupported GGUF general.architecture={architecture!r} in {checkpoint.path}: keras_transformer reads "
            f"{', '.join(ARCHITECTURES)}."
        )
    prefix = architecture + "."
    unknown = sorted(key[len(prefix) :] for key in checkpoint.fields if key.startswith(prefix))
    unknown = [key for key in unknown if key not in _KEYS[architecture]]
    if unknown:
        raise ValueError(
            f"Unsupported GGUF metadata {prefix}{unknown[0]}={checkpoint.value(prefix + unknown[0])!r} in "
            f"{checkpoint.path}: keras_transformer does not implement it (its {architecture} keys: "
            f"{', '.join(_KEYS[architecture])})."
        )
    return architecture


def hf_config(checkpoint):
    """The GGUF metadata as the config.json of the Hugging Face checkpoint it was converted from."""
    architecture = check_architecture(checkpoint)

    def get(key, default=None):
        value = checkpoint.value(f"{architecture}.{key}", default)
        if isinstance(value, list):  # per-layer values: one value for every layer is all we implement
            if len(set(value)) != 1:
                raise ValueError(
                    f"Unsupported GGUF metadata {architecture}.{key}={value!r}: per-layer values are not implemented."
                )
            value = value[0]
        return value

    vocabulary = checkpoint.shape("token_embd.weight")[0]
    if architecture == "gpt2":
        return _gpt2_config(get, vocabulary)
    num_heads = get("attention.head_count")
    head_dim = get("attention.key_length") or get("embedding_length") // num_heads
    if get("attention.value_length", head_dim) != head_dim:
        raise ValueError(
            f"Unsupported GGUF metadata {architecture}.attention.value_length={get('attention.value_length')}: "
            f"keras_transformer implements values as wide as keys ({architecture}.attention.key_length={head_dim})."
        )
    config = {
        "vocab_size": vocabulary,
        "hidden_size": get("embedding_length"),
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": get("attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "max_position_embeddings": get("context_length"),
        "rms_norm_eps": float(np.float32(get("attention.layer_norm_rms_epsilon", 1e-5))),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(checkpoint, get),
        "tie_word_embeddings": "output.weight" not in checkpoint.tensors,
    }
    rotary = get("rope.dimension_count", head_dim)
    if architecture == "gemma3":
        return {**config, **_gemma3_config(get, head_dim, num_heads)}
    if architecture == "phi3":
        config.update(
            model_type="phi3",
            partial_rotary_factor=rotary / head_dim,
            sliding_window=get("attention.sliding_window") or None,  # 0: none (llama.cpp writes Phi-4's so)
        )
        return config
    if rotary != head_dim:
        raise ValueError(
            f"Unsupported GGUF metadata {architecture}.rope.dimension_count={rotary}: this architecture rotates whole "
            f"heads ({architecture}.attention.key_length={head_dim})."
        )
    return _llama_like_config(config, architecture, get, checkpoint.tensors)


def _llama_like_config(config, architecture, get, tensors):
    """`hf_config`'s entries of the llama / qwen2 / qwen3 / qwen3moe architectures (Mixtral-style experts too)."""
    experts = get("expert_count", 0)
    if experts:
        config.update(num_experts=experts, num_local_experts=experts, num_experts_per_tok=get("expert_used_count"))
        config.update(moe_intermediate_size=get("expert_feed_forward_length"), norm_topk_prob=True)
    if architecture == "llama":
        config["model_type"] = "mixtral" if experts else "llama"
        if not experts:
            config["attention_bias"] = "blk.0.attn_q.bias" in tensors
            config["mlp_bias"] = "blk.0.ffn_up.bias" in tensors
    else:
        config["model_type"] = {"qwen2": "qwen2", "qwen3": "qwen3", "qwen3moe": "qwen3_moe"}[architecture]
    return config


def _gemma3_config(get, head_dim, num_heads):
    """Gemma 3 as llama.cpp runs it: its layer pattern is fixed (not in the file); queries
    scaled by 1 / sqrt(key_length), but for its 27B (62 layers) by 1 / sqrt(D / H)."""
    layers = get("block_count")
    window = get("attention.sliding_window")
    pattern = [(i + 1) % _GEMMA3_PATTERN != 0 and window is not None for i in range(layers)]
    scalar = get("embedding_length") // num_heads if layers == 62 else head_dim
    return {
        "model_type": "gemma3_text",
        "query_pre_attn_scalar": scalar,
        "sliding_window": window,
        "layer_types": ["sliding_attention" if sliding else "full_attention" for sliding in pattern],
        "rope_local_base_freq": float(get("rope.freq_base_swa", _GEMMA3_LOCAL_BASE)),
        "final_logit_softcapping": get("final_logit_softcapping"),
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _gpt2_config(get, vocabulary):
    return {
        "model_type": "gpt2",
        "vocab_size": vocabulary,
        "n_embd": get("embedding_length"),
        "n_layer": get("block_count"),
        "n_head": get("attention.head_count"),
        "n_inner": get("feed_forward_length"),
        "n_positions": get("context_length"),
        "layer_norm_epsilon": float(np.float32(get("attention.layer_norm_epsilon", 1e-5))),
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def _rope_scaling(checkpoint, get):
    kind = get("rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(get("rope.scaling.factor"))}
    raise ValueError(
        f"Unsupported GGUF metadata {checkpoint.architecture}.rope.scaling.type={kind!r}: keras_transformer reads "
        "'none' and 'linear'."
    )


def hf_tensors(checkpoint, config):
    """{Hugging Face tensor name: read()} for every tensor of the checkpoint: `read()` dequantizes the GGUF tensor(s)
    to float32 in the Hugging Face layout (a TensorRead, but for the stacked experts read from three tensors). A
    tensor with no Hugging Face name is a ValueError naming it."""
    architecture = checkpoint.architecture
    sources = {}
    experts = {}
    for name in checkpoint.tensors:
        hf_name, read = _source(checkpoint, config, architecture, name)
        if hf_name is None:
            raise ValueError(
                f"The GGUF checkpoint {checkpoint.path} holds the tensor {name!r}, which keras_transformer does not "
                f"map for general.architecture={architecture!r} (e.g. llama.cpp's rope_freqs / rope_factors tensors "
                "of rotary scalings not implemented here)."
            )
        if name.endswith("_exps.weight"):
            experts.setdefault(hf_name, {})[name.split(".")[2]] = name
            continue
        sources[hf_name] = read
    for hf_prefix, names in experts.items():
        sources.update(_experts(checkpoint, hf_prefix, names))
    return sources


class TensorRead:
    """`read()` of one GGUF tensor in the Hugging Face layout: `layout` moves its elements (a transpose, llama's
    query/key rows unpermuted) and `shift` is added to its values (Gemma's norms, stored as 1 + w: -1).

    `layout` works on any array of the tensor's shape, so that gguf_int4.py can move the tensor's element numbers
    the same way (a layout only, `shift` 0) and keep a Q4_0 tensor's blocks."""

    def __init__(self, checkpoint, name, layout=None, shift=0.0):
        self.checkpoint, self.name, self.layout, self.shift = checkpoint, name, layout, shift

    def arrange(self, array):
        """`array` (the GGUF tensor's shape, numpy order) -> the Hugging Face layout."""
        return array if self.layout is None else self.layout(array)

    def __call__(self):
        values = self.arrange(self.checkpoint.tensor(self.name))
        return values + np.float32(self.shift) if self.shift else values


def _source(checkpoint, config, architecture, name):
    """(the Hugging Face name, a TensorRead or None) of the GGUF tensor `name`, or (None, None)."""
    if not name.startswith("blk."):
        table = _GPT2_GLOBAL if architecture == "gpt2" else _GLOBAL
        shift = -1.0 if architecture == "gemma3" and name == "output_norm.weight" else 0.0
        return table.get(name), TensorRead(checkpoint, name, shift=shift)
    _, layer, rest = name.split(".", 2)
    if architecture == "gpt2":
        hf_name, transpose = _GPT2_BLOCK.get(rest, (None, False))
        if hf_name is None:
            return None, None
        return f"transformer.h.{layer}.{hf_name}", TensorRead(checkpoint, name, np.transpose if transpose else None)
    if rest.endswith("_exps.weight"):  # ffn_gate_exps / ffn_up_exps / ffn_down_exps: (E, I, D) / (E, D, I)
        return f"model.layers.{layer}.mlp.experts.", None
    table = {"phi3": _PHI3_BLOCK, "gemma3": _GEMMA3_BLOCK}.get(architecture, _LLAMA_BLOCK)
    hf_name = table.get(rest)
    if hf_name is None:
        return None, None
    hf_name = f"model.layers.{layer}.{hf_name}"
    if architecture == "gemma3" and rest.endswith("norm.weight"):  # llama.cpp stores Gemma's (1 + w) norms as 1 + w
        return hf_name, TensorRead(checkpoint, name, shift=-1.0)
    if architecture == "llama" and rest in ("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"):
        heads = config["num_attention_heads"] if rest.startswith("attn_q") else config["num_key_value_heads"]
        return hf_name, TensorRead(checkpoint, name, functools.partial(_unpermute, heads=heads))
    return hf_name, TensorRead(checkpoint, name)


def _experts(checkpoint, hf_prefix, names):
    """The stacked experts of one block in the fused Hugging Face layout hf_moe.py reads: `gate_up_proj`
    (E, 2 I, D), the gate's rows first, and `down_proj` (E, D, I)."""
    missing = [kind for kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if kind not in names]
    if missing:
        raise ValueError(f"The GGUF checkpoint {checkpoint.path} lacks {hf_prefix}'s {missing} tensors.")

    def gate_up():
        gate, up = checkpoint.tensor(names["ffn_gate_exps"]), checkpoint.tensor(names["ffn_up_exps"])
        return np.concatenate([gate, up], axis=1)  # (E, I, D) x 2 -> (E, 2 I, D)

    return {
        hf_prefix + "gate_up_proj": gate_up,
        hf_prefix + "down_proj": lambda: checkpoint.tensor(names["ffn_down_exps"]),
    }


def gguf_tensors(arrays, architecture, config):
    """{Hugging Face name: array} -> {GGUF name: array}: `hf_tensors` run backwards (the export's), llama's query
    and key rows permuted as llama.cpp's converter does, GPT-2's Conv1D weights transposed to (out, in), Gemma 3's
    norms stored as 1 + w."""
    out = {}
    for hf_name, array in arrays.items():
        if architecture == "gpt2":
            name, transpose = _gpt2_name(hf_name)
            out[name] = array.T if transpose else array
            continue
        if hf_name.endswith("mlp.experts.gate_up_proj"):  # (E, 2 I, D): the gate's rows first
            prefix, inner = f"blk.{hf_name.split('.')[2]}.", array.shape[1] // 2
            out.update(
                {prefix + "ffn_gate_exps.weight": array[:, :inner], prefix + "ffn_up_exps.weight": array[:, inner:]}
            )
            continue
        if hf_name.endswith("mlp.experts.down_proj"):  # (E, D, I)
            out[f"blk.{hf_name.split('.')[2]}.ffn_down_exps.weight"] = array
            continue
        name = _llama_name(hf_name, architecture)
        rest = name.split(".", 2)[-1]
        if architecture == "llama" and rest in ("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias"):
            heads = config["num_attention_heads"] if rest.startswith("attn_q") else config["num_key_value_heads"]
            array = permute(array, heads)
        if architecture == "gemma3" and name.endswith("norm.weight"):  # Gemma's (1 + w) norms, stored as 1 + w
            array = array + np.float32(1.0)
        out[name] = array
    return out


def _gpt2_name(hf_name):
    inverse = {hf: gguf for gguf, hf in _GPT2_GLOBAL.items()}
    if hf_name in inverse:
        return inverse[hf_name], False
    _, _, layer, rest = hf_name.split(".", 3)  # transformer.h.{i}.{rest}
    for name, (hf, transpose) in _GPT2_BLOCK.items():
        if hf == rest:
            return f"blk.{layer}.{name}", transpose
    raise ValueError(f"No GGUF name for the GPT-2 tensor {hf_name!r}.")


def _llama_name(hf_name, architecture):
    inverse = {hf: gguf for gguf, hf in _GLOBAL.items()}
    if hf_name in inverse:
        return inverse[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.{i}.{rest}
    table = {"phi3": _PHI3_BLOCK, "gemma3": _GEMMA3_BLOCK}.get(architecture, _LLAMA_BLOCK)
    for name, hf in table.items():
        if hf == rest:
            return f"blk.{layer}.{name}"
    raise ValueError(f"No GGUF name for the {architecture} tensor {hf_name!r}.")


def _unpermute(weights, heads):
    """llama.cpp's `LlamaModel.permute` undone: (heads * Dh, ...) rows from its rotary layout (pairs of adjacent
    dims) back to Hugging Face's (each dim of the first half with its twin in the second)."""
    shape = weights.shape
    # (heads, Dh/2, 2, ...) -> (heads, 2, Dh/2, ...) -> (heads * Dh, ...)
    return weights.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def permute(weights, heads):
    """llama.cpp's `LlamaModel.permute` (the export's): Hugging Face's rotary layout -> adjacent pairs."""
    shape = weights.shape
    # (heads, 2, Dh/2, ...) -> (heads, Dh/2, 2, ...) -> (heads * Dh, ...)
    return weights.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


__all__ = ["ARCHITECTURES", "TensorRead", "check_architecture", "gguf_tensors", "hf_config", "hf_tensors", "permute"]
