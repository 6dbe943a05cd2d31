"""Model families: backbones, task models and their preprocessors."""

from keras_transformer.models.backbone import Backbone
from keras_transformer.models.bert import (
    BertBackbone,
    BertClassifier,
    BertMaskedLM,
    BertMaskedLMPreprocessor,
    BertTextClassifierPreprocessor,
    BertTextEmbedder,
)
from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.expert_load import ExpertLoad
from keras_transformer.models.gemma import GemmaBackbone, GemmaCausalLM, GemmaCausalLMPreprocessor
from keras_transformer.models.gpt import GPTBackbone, GPTCausalLM, GPTCausalLMPreprocessor
from keras_transformer.models.llama import LlamaBackbone, LlamaCausalLM, LlamaCausalLMPreprocessor, LlamaTextEmbedder
from keras_transformer.models.masked_lm import MaskedLM
from keras_transformer.models.modernbert import (
    ModernBertBackbone,
    ModernBertMaskedLM,
    ModernBertMaskedLMPreprocessor,
    ModernBertTextEmbedder,
)
from keras_transformer.models.packing import pack_documents
from keras_transformer.models.preprocessor import Preprocessor
from keras_transformer.models.seq2seq_lm import Seq2SeqLM
from keras_transformer.models.t5 import T5Backbone, T5Seq2SeqLM, T5Seq2SeqLMPreprocessor
from keras_transformer.models.task import Task
from keras_transformer.models.text_classifier import TextClassifier
from keras_transformer.models.text_embedder import MultipleNegativesRankingLoss, TextEmbedder
from keras_transformer.models.text_embedder_preprocessor import TextEmbedderPreprocessor
from keras_transformer.models.transformer import (
    TransformerBackbone,
    TransformerSeq2SeqLM,
    TransformerSeq2SeqLMPreprocessor,
)

__all__ = [
    "Backbone",
    "BertBackbone",
    "BertClassifier",
    "BertMaskedLM",
    "BertMaskedLMPreprocessor",
    "BertTextClassifierPreprocessor",
    "BertTextEmbedder",
    "CausalLM",
    "ExpertLoad",
    "GemmaBackbone",
    "GemmaCausalLM",
    "GemmaCausalLMPreprocessor",
    "GPTBackbone",
    "GPTCausalLM",
    "GPTCausalLMPreprocessor",
    "LlamaBackbone",
    "LlamaCausalLM",
    "LlamaCausalLMPreprocessor",
    "LlamaTextEmbedder",
    "MaskedLM",
    "ModernBertBackbone",
    "ModernBertMaskedLM",
    "ModernBertMaskedLMPreprocessor",
    "ModernBertTextEmbedder",
    "MultipleNegativesRankingLoss",
    "Preprocessor",
    "Seq2SeqLM",
    "T5Backbone",
    "T5Seq2SeqLM",
    "T5Seq2SeqLMPreprocessor",
    "Task",
    "TextClassifier",
    "TextEmbedder",
    "TextEmbedderPreprocessor",
    "TransformerBackbone",
    "TransformerSeq2SeqLM",
    "TransformerSeq2SeqLMPreprocessor",
    "pack_documents",
]
