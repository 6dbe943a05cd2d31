from keras_transformer.models.t5.t5_backbone import T5Backbone
from keras_transformer.models.t5.t5_seq2seq_lm import T5Seq2SeqLM
from keras_transformer.models.t5.t5_seq2seq_lm_preprocessor import T5Seq2SeqLMPreprocessor

__all__ = ["T5Backbone", "T5Seq2SeqLM", "T5Seq2SeqLMPreprocessor"]
