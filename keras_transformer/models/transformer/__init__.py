from keras_transformer.models.transformer.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer.transformer_seq2seq_lm import TransformerSeq2SeqLM
from keras_transformer.models.transformer.transformer_seq2seq_lm_preprocessor import TransformerSeq2SeqLMPreprocessor

__all__ = [
    "TransformerBackbone", "TransformerSeq2SeqLM", "TransformerSeq2SeqLMPreprocessor",
]
