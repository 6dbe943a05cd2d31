"""Converters from other checkpoint formats: Hugging Face BERT, GPT-2 and T5 (see `hugging_face`)."""

from keras_transformer.convert.hugging_face import convert

__all__ = ["convert"]
