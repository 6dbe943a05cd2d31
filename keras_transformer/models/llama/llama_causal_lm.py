"""LlamaCausalLM: a Llama backbone with its language-model head (tied or separate).

Axes: B batch, T sequence length, D model width, V vocabulary.
"""

import keras

from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.llama.llama_backbone import LlamaBackbone
from keras_transformer.models.llama.llama_causal_lm_preprocessor import LlamaCausalLMPreprocessor


@keras.saving.register_keras_serializable(package="keras_transformer")
class LlamaCausalLM(CausalLM):
    """Next-token prediction with a Llama backbone.

    The head is the token embedding's reverse: its transpose when the backbone ties the
    embeddings (SmolLM2, Qwen2.5-0.5B, Llama 3.2 1B), a separate (D, V) matrix otherwise.

    Args:
        backbone: a `LlamaBackbone`.
        preprocessor: a `LlamaCausalLMPreprocessor` or None (then inputs are id arrays).

    Inputs: {"token_ids": (B, T), "padding_mask": (B, T)}. Outputs: logits (B, T, V) float32.

    Example:
    >>> lm = LlamaCausalLM.from_preset("llama_stdlib")  # trained on the Python standard library
    >>> lm.generate("    def __init__(self", max_new_tokens=8)
    '    def __init__(self, name):\\n        self.tk.'
    """

    backbone_cls = LlamaBackbone
    preprocessor_cls = LlamaCausalLMPreprocessor
