"""Hugging Face BERT (`model_type` "bert": BertModel, BertForMaskedLM, BertForPreTraining) -> BertBackbone /
BertMaskedLM.

Axes: D model width, H heads, Dh head size, F feed-forward width, V vocabulary.

torch `Linear` weights are (out, in): every kernel is transposed, and the attention ones are
reshaped to (D, H, Dh) / (H, Dh, D). token_type_embeddings become our segment embedding. The
masked-LM head (`cls.predictions`) maps onto BertMaskedLM's mlm_dense, mlm_layer_norm and
mlm_output_bias; its decoder weight is the tied word embedding.
"""

from keras_transformer.convert.checkpoint import load_tokenizer
from keras_transformer.models.bert import BertClassifier, BertMaskedLM
from keras_transformer.convert.options import activation, check_options, single_dropout

MODEL_TYPE = "bert"
SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
# Tensors this converter knows but never assigns: the position-id buffer of old checkpoints.
KNOWN_UNUSED = (r"(^|\.)embeddings\.position_ids$",)
# Task class -> the tensors of its head.
HEAD_TENSORS = {"BertMaskedLM": r"^cls\.predictions\.", "BertClassifier": r"^classifier\."}
MAX_PRESET_SEQUENCE_LENGTH = 512
_MASKED_LM_ARCHITECTURES = ("BertForMaskedLM", "BertForPreTraining")

_REQUIRED = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}


def convert_config(hf_config, path=None):
    """config.json of a BERT checkpoint -> the preset entries (backbone, task, preprocessor)."""
    check_options(hf_config, _REQUIRED)
    max_length = hf_config.get("max_position_embeddings", 512)
    backbone = {
        "vocabulary_size": hf_config.get("vocab_size", 30522),
        "num_layers": hf_config.get("num_hidden_layers", 12),
        "num_heads": hf_config.get("num_attention_heads", 12),
        "hidden_dim": hf_config.get("hidden_size", 768),
        "intermediate_dim": hf_config.get("intermediate_size", 3072),
        "max_sequence_length": max_length,
        "num_segments": hf_config.get("type_vocab_size", 2),
        "dropout": single_dropout(hf_config, {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}),
        "activation": activation(hf_config, "hidden_act", "gelu"),
        "norm_epsilon": hf_config.get("layer_norm_eps", 1e-12),
    }
    config = {"family": "bert", "backbone": {"class_name": "BertBackbone", "config": backbone}}
    length = min(max_length, MAX_PRESET_SEQUENCE_LENGTH)
    architectures = hf_config.get("architectures") or ()
    if "BertForSequenceClassification" in architectures:
        num_classes = hf_config.get("num_labels") or len(hf_config.get("id2label") or {}) or 2
        dropout = hf_config.get("classifier_dropout")
        dropout = backbone["dropout"] if dropout is None else float(dropout)
        config["task"] = {"class_name": "BertClassifier", "config": {"num_classes": num_classes, "dropout": dropout}}
        config["preprocessor"] = {"class_name": "BertTextClassifierPreprocessor", "config": {"sequence_length": length}}
    elif any(name in _MASKED_LM_ARCHITECTURES for name in architectures):
        config["task"] = {"class_name": "BertMaskedLM", "config": {}}
        config["preprocessor"] = {"class_name": "BertMaskedLMPreprocessor", "config": {"sequence_length": length}}
    else:  # a bare encoder is mostly fine-tuned as a classifier (its head is new)
        config["preprocessor"] = {"class_name": "BertTextClassifierPreprocessor", "config": {"sequence_length": length}}
    return config


def tokenizer(path, hf_config):
    return load_tokenizer(path, hf_config, SPECIAL_TOKENS)


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a BertBackbone, or to a BERT task (its backbone and, for
    BertMaskedLM, the masked-LM head)."""
    backbone = getattr(model, "backbone", model)
    prefix = "bert." if weights.has("bert.embeddings.word_embeddings.weight") else ""
    D, H = backbone.hidden_dim, backbone.num_heads
    Dh = D // H

    def put(variable, name, transform=None):
        value = weights.get(name)
        weights.assign(variable, transform(value) if transform else value, name)

    def linear(dense, name):
        put(dense.kernel, f"{name}.weight", lambda w: w.T)  # torch (out, in) -> (in, out)
        put(dense.bias, f"{name}.bias")

    def norm(layer, name):
        old_names = weights.has(f"{name}.gamma")  # checkpoints converted from TensorFlow
        put(layer.gamma, f"{name}.gamma" if old_names else f"{name}.weight")
        put(layer.beta, f"{name}.beta" if old_names else f"{name}.bias")

    e = prefix + "embeddings."
    put(backbone.token_embedding.embeddings, e + "word_embeddings.weight")
    put(backbone.segment_embedding.embeddings, e + "token_type_embeddings.weight")
    put(backbone.position_embedding.embeddings, e + "position_embeddings.weight")
    norm(backbone.embeddings_layer_norm, e + "LayerNorm")
    for i, block in enumerate(backbone.transformer_layers):
        p = f"{prefix}encoder.layer.{i}."
        attention = block.self_attention
        for dense, name in (
            (attention.query_dense, "query"),
            (attention.key_dense, "key"),
            (attention.value_dense, "value"),
        ):
            s = f"{p}attention.self.{name}"
            put(dense.kernel, f"{s}.weight", lambda w: w.T.reshape(D, H, Dh))  # (D_out, D) -> (D, D_out) -> (D, H, Dh)
            put(dense.bias, f"{s}.bias", lambda b: b.reshape(H, Dh))  # (D,) -> (H, Dh)
        s = f"{p}attention.output.dense"
        put(attention.output_dense.kernel, f"{s}.weight", lambda w: w.T.reshape(H, Dh, D))  # (D, D_in) -> (H, Dh, D)
        put(attention.output_dense.bias, f"{s}.bias")
        norm(block.self_attention_norm, f"{p}attention.output.LayerNorm")
        linear(block.feed_forward.intermediate_dense, f"{p}intermediate.dense")  # (D, F)
        linear(block.feed_forward.output_dense, f"{p}output.dense")  # (F, D)
        norm(block.feed_forward_norm, f"{p}output.LayerNorm")
    if weights.has(prefix + "pooler.dense.weight"):
        linear(backbone.pooled_dense, prefix + "pooler.dense")
    elif isinstance(model, BertMaskedLM):
        weights.skip(backbone.pooled_dense, "the masked-LM logits do not use the pooler")

    if isinstance(model, BertMaskedLM):
        act = hf_config.get("hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(
                f"Unsupported bert config option hidden_act={act!r} for BertMaskedLM: its head "
                "(cls.predictions.transform) uses hidden_act, and our BertMaskedLM head uses exact gelu."
            )
        head = "cls.predictions."
        linear(model.mlm_dense, head + "transform.dense")
        norm(model.mlm_layer_norm, head + "transform.LayerNorm")
        put(model.mlm_output_bias.bias, head + "bias")
        weights.check_same(head + "decoder.weight", e + "word_embeddings.weight")
        weights.check_same(head + "decoder.bias", head + "bias")
    elif isinstance(model, BertClassifier) and weights.has("classifier.weight"):
        # BertForSequenceClassification's head: dropout, then classifier (C, D) on the pooled output.
        if weights.get("classifier.weight").shape[0] == model.num_classes:
            linear(model.output_dense, "classifier")
