"""GPTCausalLM: a GPT backbone with the tied language-model head.

Axes: B batch, T sequence length, D model width, V vocabulary.
"""

import keras

from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.gpt.gpt_backbone import GPTBackbone
from keras_transformer.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor


@keras.saving.register_keras_serializable(package="keras_transformer")
class GPTCausalLM(CausalLM):
    """Next-token prediction with a GPT backbone; logits use the transposed token embedding.

    Args:
        backbone: a `GPTBackbone`.
        preprocessor: a `GPTCausalLMPreprocessor` or None (then inputs are id arrays).

    Inputs: {"token_ids": (B, T), "padding_mask": (B, T)}. Outputs: logits (B, T, V) float32.

    Example:
    >>> lm = GPTCausalLM.from_preset("gpt_stdlib")  # trained on the Python standard library
    >>> history = lm.fit(["def f(x):\\n    return x\\n"] * 8, epochs=1, verbose=0)  # fine-tuned on more code
    """

    backbone_cls = GPTBackbone
    preprocessor_cls = GPTCausalLMPreprocessor
