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
TEXT_EMBEDDER = "BertTextEmbedder"  # the task of a sentence-transformers folder (convert/sentence_transformers.py)
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


def load_weights(model, weights, hf_config):
    """Assign the checkpoint's weights to a BertBackbone, or to a BERT task (its backbone and, for
    BertMaskedLM, the masked-LM head)."""
    if hf_config.get("model_type") == "distilbert":
        return _load_distilbert(model, weights, hf_config)
    backbone = getattr(model, "backbone", model)
    roberta = hf_config.get("model_type") in ROBERTA_TYPES
    base = "roberta." if roberta else "bert."
    prefix = base if weights.has(base + "embeddings.word_embeddings.weight") else ""
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
        if act != "gelu" and not roberta:  # RoBERTa's lm_head applies gelu whatever hidden_act says
            raise ValueError(
                f"Unsupported bert config option hidden_act={act!r} for BertMaskedLM: its head "
                "(cls.predictions.transform) uses hidden_act, and our BertMaskedLM head uses exact gelu."
            )
        head, transform = ("lm_head.", "lm_head.") if roberta else ("cls.predictions.", "cls.predictions.transform.")
        linear(model.mlm_dense, transform + "dense")
        norm(model.mlm_layer_norm, transform + ("layer_norm" if roberta else "LayerNorm"))
        put(model.mlm_output_bias.bias, head + "bias")
        weights.check_same(head + "decoder.weight", e + "word_embeddings.weight")
        weights.check_same(head + "decoder.bias", head + "bias")
    elif isinstance(model, BertClassifier) and weights.has("classifier.weight"):
        # BertForSequenceClassification's head: dropout, then classifier (C, D) on the pooled output.
        if weights.get("classifier.weight").shape[0] == model.num_classes:
            linear(model.output_dense, "classifier")


def _load_distilbert(model, weights, hf_config):
    """DistilBERT's names onto a BertBackbone with num_segments=0 (and a BertMaskedLM's head)."""
    backbone = getattr(model, "backbone", model)
    prefix = "distilbert." if weights.has("distilbert.embeddings.word_embeddings.weight") else ""
    D, H = backbone.hidden_dim, backbone.num_heads
    Dh = D // H

    def put(variable, name, transform=None):
        value = weights.get(name)
        weights.assign(variable, transform(value) if transform else value, name)

    def linear(dense, name, kernel=lambda w: w.T, bias=None):  # torch (out, in) -> (in, out)
        put(dense.kernel, f"{name}.weight", kernel)
        put(dense.bias, f"{name}.bias", bias)

    def norm(layer, name):
        put(layer.gamma, f"{name}.weight")
        put(layer.beta, f"{name}.bias")

    e = prefix + "embeddings."
    put(backbone.token_embedding.embeddings, e + "word_embeddings.weight")
    put(backbone.position_embedding.embeddings, e + "position_embeddings.weight")
    norm(backbone.embeddings_layer_norm, e + "LayerNorm")
    for i, block in enumerate(backbone.transformer_layers):
        p = f"{prefix}transformer.layer.{i}."
        attention = block.self_attention
        for dense, name in (
            (attention.query_dense, "q_lin"),
            (attention.key_dense, "k_lin"),
            (attention.value_dense, "v_lin"),
        ):
            # (D_out, D) -> (D, D_out) -> (D, H, Dh); (D,) -> (H, Dh)
            linear(dense, f"{p}attention.{name}", lambda w: w.T.reshape(D, H, Dh), lambda b: b.reshape(H, Dh))
        linear(attention.output_dense, f"{p}attention.out_lin", lambda w: w.T.reshape(H, Dh, D))  # -> (H, Dh, D)
        norm(block.self_attention_norm, f"{p}sa_layer_norm")
        linear(block.feed_forward.intermediate_dense, f"{p}ffn.lin1")  # (D, F)
        linear(block.feed_forward.output_dense, f"{p}ffn.lin2")  # (F, D)
        norm(block.feed_forward_norm, f"{p}output_layer_norm")
    weights.skip(backbone.pooled_dense, "DistilBERT has no pooler")
    if isinstance(model, BertMaskedLM):
        if hf_config.get("activation", "gelu") != "gelu":
            raise ValueError(
                f"Unsupported distilbert config option activation={hf_config['activation']!r} for BertMaskedLM: its "
                "head (vocab_transform) uses that activation, and our BertMaskedLM head uses exact gelu."
            )
        linear(model.mlm_dense, "vocab_transform")
        norm(model.mlm_layer_norm, "vocab_layer_norm")
        put(model.mlm_output_bias.bias, "vocab_projector.bias")
        weights.check_same("vocab_projector.weight", e + "word_embeddings.weight")
