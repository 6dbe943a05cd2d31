"""GemmaCausalLM: a Gemma backbone with its language-model head (the transposed embedding, or a separate one).

Axes: B batch, T sequence length, D model width, V vocabulary.
"""

import keras

from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.gemma.gemma_backbone import GemmaBackbone
from keras_transformer.models.gemma.gemma_causal_lm_preprocessor import GemmaCausalLMPreprocessor


@keras.saving.register_keras_serializable(package="keras_transformer")
class GemmaCausalLM(CausalLM):
    """Next-token prediction with a Gemma backbone (Gemma 2 and Gemma 3 text checkpoints).

    The head is the token embedding's reverse (tied in every Gemma checkpoint), soft-capped where the
    backbone says (`final_logit_soft_cap`, Gemma 2).

    Args:
        backbone: a `GemmaBackbone`.
        preprocessor: a `GemmaCausalLMPreprocessor` or None (then inputs are id arrays).

    Inputs: {"token_ids": (B, T), "padding_mask": (B, T)}. Outputs: logits (B, T, V) float32.

    Example:
    >>> import numpy as np
    >>> backbone = GemmaBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32)
    >>> lm = GemmaCausalLM(backbone)
    >>> lm.predict({"token_ids": np.ones((1, 4), "int32"), "padding_mask": np.ones((1, 4), bool)}, verbose=0).shape
    (1, 4, 100)
    """

    backbone_cls = GemmaBackbone
    preprocessor_cls = GemmaCausalLMPreprocessor
