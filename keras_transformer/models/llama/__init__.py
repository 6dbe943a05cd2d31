from keras_transformer.models.llama.llama_backbone import LlamaBackbone
from keras_transformer.models.llama.llama_causal_lm import LlamaCausalLM
from keras_transformer.models.llama.llama_causal_lm_preprocessor import LlamaCausalLMPreprocessor
from keras_transformer.models.llama.llama_text_embedder import LlamaTextEmbedder

__all__ = ["LlamaBackbone", "LlamaCausalLM", "LlamaCausalLMPreprocessor", "LlamaTextEmbedder"]
