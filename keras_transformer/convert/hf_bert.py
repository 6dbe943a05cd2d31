"""Hugging Face BERT (`model_type` "bert": BertModel, BertForMaskedLM, BertForPreTraining), RoBERTa ("roberta":
RobertaModel, RobertaForMaskedLM), XLM-R ("xlm-roberta": XLMRobertaModel, XLMRobertaForMaskedLM) and DistilBERT
("distilbert": DistilBertModel, DistilBertForMaskedLM) -> BertBackbone / BertMaskedLM (and a sentence-transformers
folder of any of them -> BertTextEmbedder).

RoBERTa and XLM-R are BERT's computation under other names: their position ids start past the padding
id (`position_offset` = pad_token_id + 1; the table keeps all its rows), one token type, and a masked-LM head
(`lm_head`: dense, gelu, layer norm, the tied decoder and a bias) that maps onto BertMaskedLM's as BERT's
`cls.predictions` does. Their tokenizers bring `<s>`, `</s>`, `<pad>` and `<mask>` as the [CLS], [SEP],
padding and mask tokens. Their sequence-classification head (dense and tanh on `<s>`, then a projection) is
not BERT's pooler: RobertaForSequenceClassification is refused.

DistilBERT is BERT's computation with no token types (`num_segments=0`) and no pooler, under other names
(`transformer.layer.{i}`: q_lin / k_lin / v_lin / out_lin, sa_layer_norm, ffn.lin1 / lin2, output_layer_norm),
LayerNorm epsilon 1e-12; its masked-LM head (vocab_transform, the activation, vocab_layer_norm, the tied
vocab_projector and its bias) is BertMaskedLM's. Its classification head (pre_classifier, ReLU, classifier) is not
BERT's pooler: DistilBertForSequenceClassification is refused, as are sinusoidal position tables.

Axes: D model width, H heads, Dh head size, F feed-forward width, V vocabulary.

torch `Linear` weights are (out, in): every kernel is transposed, and the attention ones are
reshaped to (D, H, Dh) / (H, Dh, D). token_type_embeddings become our segment embedding. The
masked-LM head (`cls.predictions`) maps onto BertMaskedLM's mlm_dense, mlm_layer_norm and
mlm_output_bias; its decoder weight is the tied word embedding.
"""

from keras_transformer.convert.checkpoint import load_tokenizer
from keras_transformer.models.bert import BertClassifier, BertMaskedLM
from keras_transformer.convert.options import activation, check_options, single_dropout

MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "distilbert")
ROBERTA_TYPES = ("roberta", "xlm-roberta")
ROBERTA_SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "cls_token": "<s>",
    "sep_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
}
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
HEAD_TENSORS = {
    "BertMaskedLM": r"^(cls\.predictions|lm_head|vocab_transform|vocab_layer_norm|vocab_projector)\.",
    "BertClassifier": r"^classifier\.",
}
MAX_PRESET_SEQUENCE_LENGTH = 512
_MASKED_LM_ARCHITECTURES = (
    "BertForMaskedLM",
    "BertForPreTraining",
    "RobertaForMaskedLM",
    "XLMRobertaForMaskedLM",
    "DistilBertForMaskedLM",
)
DISTILBERT_NORM_EPSILON = 1e-12  # DistilBERT's LayerNorms (not a config option)

_REQUIRED = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}


def convert_config(hf_config, path=None):
    """config.json of a BERT checkpoint -> the preset entries (backbone, task, preprocessor)."""
    roberta = hf_config["model_type"] in ROBERTA_TYPES
    distil = hf_config["model_type"] == "distilbert"
    architectures = hf_config.get("architectures") or ()
    refused = [name for name in architectures if name.endswith("ForSequenceClassification") and (roberta or distil)]
    if refused:
        head = "pre_classifier, ReLU, classifier" if distil else "dense and tanh on <s>, then a projection"
        raise ValueError(
            f"Unsupported {hf_config['model_type']} architecture {refused[0]}: its classification head ({head}) "
            "is not BertClassifier's pooler head; load the bare model instead."
        )
    if distil:
        backbone = _distilbert_backbone(hf_config)
    else:
        backbone = _bert_backbone(hf_config, roberta)
    config = {"family": "bert", "backbone": {"class_name": "BertBackbone", "config": backbone}}
    length = min(backbone["max_sequence_length"], MAX_PRESET_SEQUENCE_LENGTH)
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


def _bert_backbone(hf_config, roberta):
    check_options(hf_config, _REQUIRED)
    offset = int(hf_config.get("pad_token_id", 1)) + 1 if roberta else 0  # RoBERTa's first position id
    max_length = hf_config.get("max_position_embeddings", 514 if roberta else 512) - offset
    return {
        "vocabulary_size": hf_config.get("vocab_size", 30522),
        "num_layers": hf_config.get("num_hidden_layers", 12),
        "num_heads": hf_config.get("num_attention_heads", 12),
        "hidden_dim": hf_config.get("hidden_size", 768),
        "intermediate_dim": hf_config.get("intermediate_size", 3072),
        "max_sequence_length": max_length,
        "num_segments": hf_config.get("type_vocab_size", 2),
        "dropout": single_dropout(hf_config, {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}),
        "activation": activation(hf_config, "hidden_act", "gelu"),
        "norm_epsilon": hf_config.get("layer_norm_eps", 1e-5 if roberta else 1e-12),
        "position_offset": offset,
    }


def _distilbert_backbone(hf_config):
    check_options(hf_config, {"sinusoidal_pos_embds": False})
    return {
        "vocabulary_size": hf_config.get("vocab_size", 30522),
        "num_layers": hf_config.get("n_layers", 6),
        "num_heads": hf_config.get("n_heads", 12),
        "hidden_dim": hf_config.get("dim", 768),
        "intermediate_dim": hf_config.get("hidden_dim", 3072),
        "max_sequence_length": hf_config.get("max_position_embeddings", 512),
        "num_segments": 0,
        "dropout": single_dropout(hf_config, {"dropout": 0.1, "attention_dropout": 0.1}),
        "activation": activation(hf_config, "activation", "gelu"),
        "norm_epsilon": DISTILBERT_NORM_EPSILON,
    }


def tokenizer(path, hf_config):
    roberta = hf_config.get("model_type") in ROBERTA_TYPES
    return load_tokenizer(path, hf_config, ROBERTA_SPECIAL_TOKENS if roberta else SPECIAL_TOKENS)


# The checkpoint names of each layout: the prefix of the bare model's tensors, a block's tensors (of layer {i}), and
# the masked-LM head's (transform dense and norm, output bias, tied decoder weight; None: no such tensor).
LAYOUT_NAMES = {
    "bert": {
        "prefix": "bert.",
        "layer": "encoder.layer.{i}.",
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "attention_output": "attention.output.dense",
        "attention_norm": "attention.output.LayerNorm",
        "intermediate": "intermediate.dense",
        "output": "output.dense",
        "output_norm": "output.LayerNorm",
        "head_dense": "cls.predictions.transform.dense",
        "head_norm": "cls.predictions.transform.LayerNorm",
        "head_bias": "cls.predictions.bias",
        "head_decoder": "cls.predictions.decoder",
        "head_activation": "hidden_act",  # the config option the head's activation follows (None: always gelu)
    },
    "distilbert": {
        "prefix": "distilbert.",
        "layer": "transformer.layer.{i}.",
        "query": "attention.q_lin",
        "key": "attention.k_lin",
        "value": "attention.v_lin",
        "attention_output": "attention.out_lin",
        "attention_norm": "sa_layer_norm",
        "intermediate": "ffn.lin1",
        "output": "ffn.lin2",
        "output_norm": "output_layer_norm",
        "head_dense": "vocab_transform",
        "head_norm": "vocab_layer_norm",
        "head_bias": "vocab_projector.bias",
        "head_decoder": "vocab_projector",
        "head_activation": "activation",
    },
}
LAYOUT_NAMES["roberta"] = {
    **LAYOUT_NAMES["bert"],
    "prefix": "roberta.",
    "head_dense": "lm_head.dense",
    "head_norm": "lm_head.layer_norm",
    "head_bias": "lm_head.bias",
    "head_decoder": "lm_head.decoder",
    "head_activation": None,  # RoBERTa's lm_head applies gelu whatever hidden_act says
}


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a BertBackbone, or to a BERT task (its backbone and, for
    BertMaskedLM, the masked-LM head)."""
    backbone = getattr(model, "backbone", model)
    model_type = hf_config.get("model_type")
    names = LAYOUT_NAMES["roberta" if model_type in ROBERTA_TYPES else model_type]
    prefix = names["prefix"] if weights.has(names["prefix"] + "embeddings.word_embeddings.weight") else ""
    D, H = backbone.hidden_dim, backbone.num_heads
    Dh = D // H

    def put(variable, name, transform=None):
        weights.put(variable, name, transform)

    def linear(dense, name, kernel=lambda w: w.T, bias=None):  # torch (out, in) -> (in, out)
        put(dense.kernel, f"{name}.weight", kernel)
        put(dense.bias, f"{name}.bias", bias)

    def norm(layer, name):
        old_names = weights.has(f"{name}.gamma")  # checkpoints converted from TensorFlow
        put(layer.gamma, f"{name}.gamma" if old_names else f"{name}.weight")
        put(layer.beta, f"{name}.beta" if old_names else f"{name}.bias")

    e = prefix + "embeddings."
    put(backbone.token_embedding.embeddings, e + "word_embeddings.weight")
    if backbone.segment_embedding is not None:
        put(backbone.segment_embedding.embeddings, e + "token_type_embeddings.weight")
    put(backbone.position_embedding.embeddings, e + "position_embeddings.weight")
    norm(backbone.embeddings_layer_norm, e + "LayerNorm")
    for i, block in enumerate(backbone.transformer_layers):
        p = prefix + names["layer"].format(i=i)
        attention = block.self_attention
        for dense, name in zip(
            (attention.query_dense, attention.key_dense, attention.value_dense), ("query", "key", "value")
        ):
            # (D_out, D) -> (D, D_out) -> (D, H, Dh); (D,) -> (H, Dh)
            linear(dense, p + names[name], lambda w: w.T.reshape(D, H, Dh), lambda b: b.reshape(H, Dh))
        linear(attention.output_dense, p + names["attention_output"], lambda w: w.T.reshape(H, Dh, D))  # (H, Dh, D)
        norm(block.self_attention_norm, p + names["attention_norm"])
        linear(block.feed_forward.intermediate_dense, p + names["intermediate"])  # (D, F)
        linear(block.feed_forward.output_dense, p + names["output"])  # (F, D)
        norm(block.feed_forward_norm, p + names["output_norm"])
    if weights.has(prefix + "pooler.dense.weight"):
        linear(backbone.pooled_dense, prefix + "pooler.dense")
    elif isinstance(model, BertMaskedLM) or model_type == "distilbert":
        weights.skip(backbone.pooled_dense, "the masked-LM logits do not use the pooler (DistilBERT has none)")

    if isinstance(model, BertMaskedLM):
        option = names["head_activation"]
        if option is not None and hf_config.get(option, "gelu") != "gelu":
            raise ValueError(
                f"Unsupported {model_type} config option {option}={hf_config[option]!r} for BertMaskedLM: its head "
                f"({names['head_dense']}) uses {option}, and our BertMaskedLM head uses exact gelu."
            )
        linear(model.mlm_dense, names["head_dense"])
        norm(model.mlm_layer_norm, names["head_norm"])
        put(model.mlm_output_bias.bias, names["head_bias"])
        weights.check_same(names["head_decoder"] + ".weight", e + "word_embeddings.weight")
        if names["head_decoder"] + ".bias" != names["head_bias"]:  # BERT's and RoBERTa's decoder bias is a copy
            weights.check_same(names["head_decoder"] + ".bias", names["head_bias"])
    elif isinstance(model, BertClassifier) and weights.has("classifier.weight"):
        # BertForSequenceClassification's head: dropout, then classifier (C, D) on the pooled output.
        if weights.get("classifier.weight").shape[0] == model.num_classes:
            linear(model.output_dense, "classifier")
