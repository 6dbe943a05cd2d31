"""Hugging Face T5 (`model_type` "t5": T5ForConditionalGeneration, T5Model) -> T5Backbone / T5Seq2SeqLM.

Axes: D model width (d_model), H heads, Dh head size (d_kv), F feed-forward width (d_ff), V vocabulary.

T5 has no biases and does not scale attention logits (our T5Backbone neither). The relative
attention bias lives in the first block of each stack and is shared by all of its blocks, as
our one bias layer per stack. torch `Linear` weights are (out, in): kernels are transposed,
attention ones reshaped to (D, H, Dh) / (H, Dh, D). Gated feed-forwards: `wi_0` goes through
the activation (our gate), `wi_1` is the linear branch (our intermediate).

The LM head: T5 v1.0 ties it to the shared embedding and scales the decoder output by
D**-0.5; T5 v1.1 does not scale and has its own `lm_head` (Hugging Face >= 5 records the
scaling as `scale_decoder_outputs`, older configs as `tie_word_embeddings`).
"""

import json
from pathlib import Path

from keras_transformer.convert.checkpoint import load_tokenizer
from keras_transformer.convert.options import ACTIVATIONS, check_options
from keras_transformer.models.t5 import T5Seq2SeqLM

MODEL_TYPE = "t5"
SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
# Known tensors with no place in our model: tied copies of the shared embedding (checked equal
# below) and a cross-attention relative bias some checkpoints carry but T5 never uses.
KNOWN_UNUSED = (r"^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight$",)
HEAD_TENSORS = {"T5Seq2SeqLM": r"^lm_head\.weight$"}
MAX_PRESET_SEQUENCE_LENGTH = 512
_GATED = {
    "gelu": "gated-gelu",
    "gelu_new": "gated-gelu",
    "gelu_pytorch_tanh": "gated-gelu",
    "relu": "gated-relu",
    "silu": "gated-silu",
    "swish": "gated-silu",
}


def _activation(hf_config):
    """feed_forward_proj ("relu", "gated-gelu", ...) -> our FeedForward activation.

    As in Hugging Face, "gated-gelu" uses the tanh approximation; a plain "gelu" is exact.
    """
    proj = hf_config.get("feed_forward_proj", "relu")
    gated, _, name = proj.rpartition("-")
    table = _GATED if gated == "gated" else ACTIVATIONS if not gated else {}
    if name not in table:
        raise ValueError(
            f"Unsupported t5 config option feed_forward_proj={proj!r}: supported are "
            f"{sorted(ACTIVATIONS)} and {sorted('gated-' + k for k in _GATED)}."
        )
    return table[name]


def scales_decoder_outputs(hf_config):
    """Whether the tied head scales the decoder output by D**-0.5 (T5 v1.0) or not (v1.1)."""
    if "scale_decoder_outputs" in hf_config:
        return bool(hf_config["scale_decoder_outputs"])
    return hf_config.get("tie_word_embeddings", True) is not False


def convert_config(hf_config, path=None):
    """config.json of a T5 checkpoint -> the preset entries (backbone, task, preprocessor)."""
    check_options(hf_config, {"is_encoder_decoder": True, "is_decoder": False})
    architectures = hf_config.get("architectures") or ()
    if "T5EncoderModel" in architectures:
        raise ValueError(
            "Unsupported t5 architectures=['T5EncoderModel']: the checkpoint has no decoder, and "
            "keras_transformer's T5Backbone is an encoder-decoder."
        )
    pad_id = hf_config.get("pad_token_id", 0)
    start_id = hf_config.get("decoder_start_token_id", _generation_config(path).get("decoder_start_token_id", pad_id))
    if start_id != pad_id:
        raise ValueError(
            f"Unsupported t5 config option decoder_start_token_id={start_id!r}: keras_transformer's T5 "
            f"decoder starts from the padding token (pad_token_id={pad_id!r})."
        )
    max_length = hf_config.get("n_positions") or 512  # T5 has no position limit; this bounds the inputs
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", 32128),
        "num_layers": hf_config.get("num_layers", 6),
        "num_heads": hf_config.get("num_heads", 8),
        "hidden_dim": hf_config.get("d_model", 512),
        "intermediate_dim": hf_config.get("d_ff", 2048),
        "key_dim": hf_config.get("d_kv", 64),
        "num_decoder_layers": hf_config.get("num_decoder_layers") or hf_config.get("num_layers", 6),
        "dropout": float(hf_config.get("dropout_rate", 0.1)),
        "activation": _activation(hf_config),
        "norm_epsilon": hf_config.get("layer_norm_epsilon", 1e-6),
        "relative_attention_num_buckets": hf_config.get("relative_attention_num_buckets", 32),
        "relative_attention_max_distance": hf_config.get("relative_attention_max_distance", 128),
        "tie_embedding_weights": scales_decoder_outputs(hf_config),
        "max_sequence_length": max_length,
    }
    length = min(max_length, MAX_PRESET_SEQUENCE_LENGTH)
    return {
        "family": "t5",
        "backbone": {"class_name": "T5Backbone", "config": backbone},
        "task": {"class_name": "T5Seq2SeqLM", "config": {}},
        "preprocessor": {
            "class_name": "T5Seq2SeqLMPreprocessor",
            "config": {"encoder_sequence_length": length, "decoder_sequence_length": length},
        },
    }


def _generation_config(path):
    file = Path(path) / "generation_config.json" if path is not None else None
    if file is None or not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"Corrupt file {file}: {error}") from None


def tokenizer(path, hf_config):
    return load_tokenizer(path, hf_config, SPECIAL_TOKENS)


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a T5Backbone or a T5Seq2SeqLM (its LM head included)."""
    backbone = getattr(model, "backbone", model)
    D, H = backbone.hidden_dim, backbone.num_heads
    Dh = backbone.key_dim or D // H

    def put(variable, name, transform=None):
        weights.put(variable, name, transform)

    def attention(layer, prefix):
        for dense, name in ((layer.query_dense, "q"), (layer.key_dense, "k"), (layer.value_dense, "v")):
            put(dense.kernel, f"{prefix}.{name}.weight", lambda w: w.T.reshape(D, H, Dh))  # (H*Dh, D) -> (D, H, Dh)
        put(layer.output_dense.kernel, f"{prefix}.o.weight", lambda w: w.T.reshape(H, Dh, D))  # (D, H*Dh) -> (H, Dh, D)

    def feed_forward(layer, prefix):
        if layer.activation.startswith("gated-"):
            put(layer.gate_dense.kernel, f"{prefix}.wi_0.weight", lambda w: w.T)  # (F, D) -> (D, F)
            put(layer.intermediate_dense.kernel, f"{prefix}.wi_1.weight", lambda w: w.T)
        else:
            put(layer.intermediate_dense.kernel, f"{prefix}.wi.weight", lambda w: w.T)
        put(layer.output_dense.kernel, f"{prefix}.wo.weight", lambda w: w.T)  # (D, F) -> (F, D)

    put(backbone.token_embedding.embeddings, "shared.weight")
    for stack, blocks in (("encoder", backbone.encoder_layers), ("decoder", backbone.decoder_layers)):
        weights.check_same(f"{stack}.embed_tokens.weight", "shared.weight")
        put(
            getattr(backbone, f"{stack}_relative_position_bias").embeddings,
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        )  # (buckets, H)
        for i, block in enumerate(blocks):
            p = f"{stack}.block.{i}.layer"
            attention(block.self_attention, f"{p}.0.SelfAttention")
            put(block.self_attention_norm.weights[0], f"{p}.0.layer_norm.weight")
            ffn = 1
            if stack == "decoder":
                attention(block.cross_attention, f"{p}.1.EncDecAttention")
                put(block.cross_attention_norm.weights[0], f"{p}.1.layer_norm.weight")
                ffn = 2
            feed_forward(block.feed_forward, f"{p}.{ffn}.DenseReluDense")
            put(block.feed_forward_norm.weights[0], f"{p}.{ffn}.layer_norm.weight")
        put(getattr(backbone, f"{stack}_layer_norm").weights[0], f"{stack}.final_layer_norm.weight")

    if backbone.tie_embedding_weights:
        # Scaled, tied head: a distinct lm_head would be a model T5 v1.0 never was.
        weights.check_same("lm_head.weight", "shared.weight")
    elif isinstance(model, T5Seq2SeqLM):
        # Unscaled head of its own; Hugging Face >= 5 saves it only when it differs from the
        # shared embedding it is otherwise tied to.
        name = "lm_head.weight" if weights.has("lm_head.weight") else "shared.weight"
        put(model.lm_head.kernel, name, lambda w: w.T)  # (V, D) -> (D, V)
