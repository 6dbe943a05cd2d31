"""Hugging Face GPT-2 (`model_type` "gpt2": GPT2Model, GPT2LMHeadModel) -> GPTBackbone / GPTCausalLM.

Axes: D model width, H heads, Dh head size, F feed-forward width.

GPT-2 stores its projections as `Conv1D` weights, already (in, out); the query, key and value
projections are fused in `c_attn` (D, 3D) and split here. The language-model head is the
transposed token embedding, as in our GPTCausalLM.
"""

from keras_transformer.convert.checkpoint import load_tokenizer
from keras_transformer.convert.options import activation, check_options, single_dropout

MODEL_TYPE = "gpt2"
SPECIAL_TOKENS = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
# Tensors this converter knows but never assigns: the causal-mask buffers of old checkpoints.
KNOWN_UNUSED = (r"(^|\.)attn\.(masked_)?bias$",)
# Task class -> the tensors of its head (GPT-2's head is the tied embedding: nothing of its own).
HEAD_TENSORS = {}
MAX_PRESET_SEQUENCE_LENGTH = 512

# Options whose other values change the computation in ways our GPTBackbone does not implement.
_REQUIRED = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
    "tie_word_embeddings": True,
}


def convert_config(hf_config, path=None):
    """config.json of a GPT-2 checkpoint -> the preset entries (backbone, task, preprocessor)."""
    check_options(hf_config, _REQUIRED)
    hidden_dim = hf_config.get("n_embd", 768)
    max_length = hf_config.get("n_positions", 1024)
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", 50257),
        "num_layers": hf_config.get("n_layer", 12),
        "num_heads": hf_config.get("n_head", 12),
        "hidden_dim": hidden_dim,
        "intermediate_dim": hf_config.get("n_inner") or 4 * hidden_dim,
        "max_sequence_length": max_length,
        "dropout": single_dropout(hf_config, {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}),
        "activation": activation(hf_config, "activation_function", "gelu_new"),
        "norm_epsilon": hf_config.get("layer_norm_epsilon", 1e-5),
    }
    return {
        "family": "gpt",
        "backbone": {"class_name": "GPTBackbone", "config": backbone},
        "task": {"class_name": "GPTCausalLM", "config": {}},
        "preprocessor": {
            "class_name": "GPTCausalLMPreprocessor",
            "config": {"sequence_length": min(max_length, MAX_PRESET_SEQUENCE_LENGTH)},
        },
    }


def tokenizer(path, hf_config):
    return load_tokenizer(path, hf_config, SPECIAL_TOKENS, pad_with_eos=True)


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a GPTBackbone or a GPTCausalLM (whose head is tied)."""
    backbone = getattr(model, "backbone", model)
    prefix = "transformer." if weights.has("transformer.wte.weight") else ""
    D, H = backbone.hidden_dim, backbone.num_heads
    Dh = D // H

    def put(variable, name, transform=None):
        weights.put(variable, prefix + name, transform)

    def norm(layer, name):
        put(layer.gamma, f"{name}.weight")
        put(layer.beta, f"{name}.bias")

    put(backbone.token_embedding.embeddings, "wte.weight")
    put(backbone.position_embedding.embeddings, "wpe.weight")
    for i, block in enumerate(backbone.transformer_layers):
        p = f"h.{i}."
        attention = block.self_attention
        kernel = weights.get(f"{prefix}{p}attn.c_attn.weight")  # (D, 3D): [q | k | v] along the outputs
        bias = weights.get(f"{prefix}{p}attn.c_attn.bias")  # (3D,)
        for j, dense in enumerate((attention.query_dense, attention.key_dense, attention.value_dense)):
            source = f"{prefix}{p}attn.c_attn[{j}]"
            weights.assign(
                dense.kernel, kernel[:, j * D : (j + 1) * D].reshape(D, H, Dh), source
            )  # (D, D) -> (D, H, Dh)
            weights.assign(dense.bias, bias[j * D : (j + 1) * D].reshape(H, Dh), source)  # (D,) -> (H, Dh)
        put(
            attention.output_dense.kernel, p + "attn.c_proj.weight", lambda w: w.reshape(H, Dh, D)
        )  # (D, D) -> (H, Dh, D)
        put(attention.output_dense.bias, p + "attn.c_proj.bias")
        norm(block.self_attention_norm, p + "ln_1")
        put(block.feed_forward.intermediate_dense.kernel, p + "mlp.c_fc.weight")  # (D, F)
        put(block.feed_forward.intermediate_dense.bias, p + "mlp.c_fc.bias")
        put(block.feed_forward.output_dense.kernel, p + "mlp.c_proj.weight")  # (F, D)
        put(block.feed_forward.output_dense.bias, p + "mlp.c_proj.bias")
        norm(block.feed_forward_norm, p + "ln_2")
    norm(backbone.layer_norm, "ln_f")
    # GPT2LMHeadModel may store its head next to the embedding it is tied to.
    weights.check_same("lm_head.weight", prefix + "wte.weight")
