"""Hugging Face ModernBERT (`model_type` "modernbert": ModernBertForMaskedLM, ModernBertModel) -> ModernBertMaskedLM /
ModernBertBackbone.

Both spellings of its config are read: the Hub's (`global_attn_every_n_layers`, `global_rope_theta`,
`local_rope_theta`) and transformers 5's (`layer_types`, `rope_parameters` per layer type). The checkpoint fuses
the attention's query, key and value projections (`attn.Wqkv`, (3 D, D), heads within each third) and the GeGLU's
two input projections (`mlp.Wi`, (2 F, D): the first half goes through the activation, the second is the gate's
other factor); both are split here. The first layer has no `attn_norm` (an Identity in transformers). The
masked-LM head (`head.dense`, the activation, `head.norm`, then `decoder`, tied to the token embedding, with its
bias) maps onto ModernBertMaskedLM's. `sparse_prediction` only changes which positions transformers' loss reads;
other heads (sequence or token classification, ...) are refused.

Axes: D model width, H heads, Dh head size, F feed-forward width, V vocabulary.
"""

from keras_transformer.convert.checkpoint import load_tokenizer
from keras_transformer.convert.options import check_options, single_dropout
from keras_transformer.models.modernbert import ModernBertMaskedLM
from keras_transformer.models.modernbert.modernbert_backbone import LAYER_TYPES, default_layer_types

MODEL_TYPE = "modernbert"
SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
KNOWN_UNUSED = ()
# Task class -> the tensors of its head.
HEAD_TENSORS = {"ModernBertMaskedLM": r"^(head|decoder)\."}
MAX_PRESET_SEQUENCE_LENGTH = 512
# hidden_activation -> our gated feed-forward activation.
GATED_ACTIVATIONS = {
    "gelu": "gated-gelu_exact",
    "gelu_new": "gated-gelu",
    "gelu_pytorch_tanh": "gated-gelu",
    "relu": "gated-relu",
    "silu": "gated-silu",
    "swish": "gated-silu",
}
_ARCHITECTURES = ("ModernBertForMaskedLM", "ModernBertModel")
_REQUIRED = {
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "classifier_bias": False,
    "decoder_bias": True,
    "classifier_activation": "gelu",
    "tie_word_embeddings": True,
    "rope_scaling": None,
}


def convert_config(hf_config, path=None):
    """config.json of a ModernBERT checkpoint -> the preset entries (backbone, task, preprocessor)."""
    architectures = hf_config.get("architectures") or ()
    refused = [name for name in architectures if name not in _ARCHITECTURES]
    if refused:
        raise ValueError(
            f"Unsupported modernbert architecture {refused[0]}: keras_transformer converts {list(_ARCHITECTURES)}."
        )
    check_options(hf_config, _REQUIRED)
    num_layers = hf_config.get("num_hidden_layers", 22)
    width, heads = hf_config.get("hidden_size", 768), hf_config.get("num_attention_heads", 12)
    # transformers' ModernBERT splits D into heads of D / H, and would rotate `head_dim` dims of each.
    check_options(hf_config, {"head_dim": width // heads})
    global_theta, local_theta = _rope_bases(hf_config)
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", 50368),
        "num_layers": num_layers,
        "num_heads": heads,
        "hidden_dim": width,
        "intermediate_dim": hf_config.get("intermediate_size", 1152),
        "max_sequence_length": hf_config.get("max_position_embeddings", 8192),
        "layer_types": _layer_types(hf_config, num_layers),
        "local_attention": hf_config.get("local_attention", 128),
        "global_rope_max_wavelength": global_theta,
        "local_rope_max_wavelength": local_theta,
        "dropout": single_dropout(hf_config, {"embedding_dropout": 0.0, "attention_dropout": 0.0, "mlp_dropout": 0.0}),
        "activation": _activation(hf_config),
        "norm_epsilon": hf_config.get("norm_eps", 1e-5),
        "initializer_range": hf_config.get("initializer_range", 0.02),
    }
    config = {"family": "modernbert", "backbone": {"class_name": "ModernBertBackbone", "config": backbone}}
    if "ModernBertForMaskedLM" in architectures:
        length = min(backbone["max_sequence_length"], MAX_PRESET_SEQUENCE_LENGTH)
        config["task"] = {"class_name": "ModernBertMaskedLM", "config": {}}
        config["preprocessor"] = {"class_name": "ModernBertMaskedLMPreprocessor", "config": {"sequence_length": length}}
    return config


def _activation(hf_config):
    name = hf_config.get("hidden_activation", "gelu")
    if name not in GATED_ACTIVATIONS:
        raise ValueError(
            f"Unsupported modernbert config option hidden_activation={name!r}: supported activations are "
            f"{sorted(GATED_ACTIVATIONS)}."
        )
    return GATED_ACTIVATIONS[name]


def _layer_types(hf_config, num_layers):
    """transformers 5's `layer_types`, else the Hub's `global_attn_every_n_layers` pattern."""
    layer_types = hf_config.get("layer_types")
    if layer_types is None:
        every = hf_config.get("global_attn_every_n_layers", 3)
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise ValueError(
                f"Unsupported modernbert config option global_attn_every_n_layers={every!r}: it must be an int >= 1."
            )
        return default_layer_types(num_layers, every)
    unknown = [kind for kind in layer_types if kind not in LAYER_TYPES]
    if unknown or len(layer_types) != num_layers:
        raise ValueError(
            f"Unsupported modernbert config option layer_types={layer_types!r}: keras_transformer implements "
            f"{num_layers} entries, each one of {list(LAYER_TYPES)}."
        )
    return list(layer_types)


def _rope_bases(hf_config):
    """(global, local) rotary bases, from `rope_parameters` (transformers 5) or `global_rope_theta` /
    `local_rope_theta` (the Hub's; a null local base is the global one)."""
    parameters = hf_config.get("rope_parameters")
    if parameters is None:
        global_theta = hf_config.get("global_rope_theta", 160000.0)
        local_theta = hf_config.get("local_rope_theta", 10000.0)
        return float(global_theta), float(global_theta if local_theta is None else local_theta)
    bases = []
    for kind, default in (("full_attention", 160000.0), ("sliding_attention", 10000.0)):
        rope = parameters.get(kind) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(
                f"Unsupported modernbert config option rope_parameters[{kind!r}]={rope!r}: keras_transformer "
                "implements only rope_type='default'."
            )
        bases.append(float(rope.get("rope_theta", default)))
    return tuple(bases)


def tokenizer(path, hf_config):
    return load_tokenizer(path, hf_config, SPECIAL_TOKENS)


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a ModernBertBackbone, or to a ModernBertMaskedLM (its backbone and head)."""
    backbone = getattr(model, "backbone", model)
    prefix = "model." if weights.has("model.embeddings.tok_embeddings.weight") else ""
    D, H, F = backbone.hidden_dim, backbone.num_heads, backbone.intermediate_dim
    Dh = D // H

    def put(variable, name, transform=None):
        weights.put(variable, name, transform)

    put(backbone.token_embedding.embeddings, prefix + "embeddings.tok_embeddings.weight")
    put(backbone.embeddings_layer_norm.gamma, prefix + "embeddings.norm.weight")
    for i, block in enumerate(backbone.transformer_layers):
        p = f"{prefix}layers.{i}."
        if block.self_attention_norm is not None:
            put(block.self_attention_norm.gamma, p + "attn_norm.weight")
        attention = block.self_attention
        for third, dense in enumerate((attention.query_dense, attention.key_dense, attention.value_dense)):
            # Wqkv (3 D, D): rows [third * D, (third + 1) * D) -> (D, D) -> (D_in, D_out) -> (D, H, Dh)
            put(dense.kernel, p + "attn.Wqkv.weight", lambda w, t=third: w[t * D : (t + 1) * D].T.reshape(D, H, Dh))
        put(attention.output_dense.kernel, p + "attn.Wo.weight", lambda w: w.T.reshape(H, Dh, D))  # (H, Dh, D)
        put(block.feed_forward_norm.gamma, p + "mlp_norm.weight")
        feed_forward = block.feed_forward
        put(feed_forward.gate_dense.kernel, p + "mlp.Wi.weight", lambda w: w[:F].T)  # activated half: (D, F)
        put(feed_forward.intermediate_dense.kernel, p + "mlp.Wi.weight", lambda w: w[F:].T)  # the other: (D, F)
        put(feed_forward.output_dense.kernel, p + "mlp.Wo.weight", lambda w: w.T)  # (F, D)
    put(backbone.final_norm.gamma, prefix + "final_norm.weight")
    if isinstance(model, ModernBertMaskedLM):
        put(model.mlm_dense.kernel, "head.dense.weight", lambda w: w.T)
        put(model.mlm_layer_norm.gamma, "head.norm.weight")
        put(model.mlm_output_bias.bias, "decoder.bias")
        weights.check_same("decoder.weight", prefix + "embeddings.tok_embeddings.weight")
