from keras_transformer.models.gpt.gpt_backbone import GPTBackbone
from keras_transformer.models.gpt.gpt_causal_lm import GPTCausalLM
from keras_transformer.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor

__all__ = ["GPTBackbone", "GPTCausalLM", "GPTCausalLMPreprocessor"]
