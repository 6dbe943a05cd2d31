from keras_transformer.models.gemma.gemma_backbone import GemmaBackbone
from keras_transformer.models.gemma.gemma_causal_lm import GemmaCausalLM
from keras_transformer.models.gemma.gemma_causal_lm_preprocessor import GemmaCausalLMPreprocessor

__all__ = ["GemmaBackbone", "GemmaCausalLM", "GemmaCausalLMPreprocessor"]
