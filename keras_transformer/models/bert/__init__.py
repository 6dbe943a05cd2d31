from keras_transformer.models.bert.bert_backbone import BertBackbone
from keras_transformer.models.bert.bert_classifier import BertClassifier
from keras_transformer.models.bert.bert_masked_lm import BertMaskedLM
from keras_transformer.models.bert.bert_masked_lm_preprocessor import BertMaskedLMPreprocessor
from keras_transformer.models.bert.bert_text_classifier_preprocessor import BertTextClassifierPreprocessor
from keras_transformer.models.bert.bert_text_embedder import BertTextEmbedder

__all__ = [
    "BertBackbone",
    "BertClassifier",
    "BertMaskedLM",
    "BertMaskedLMPreprocessor",
    "BertTextClassifierPreprocessor",
    "BertTextEmbedder",
]
