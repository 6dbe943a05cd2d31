"""GPTCausalLM: a GPT backbone with the tied language-model head.

Axes: B batch, T sequence length, D model width, V vocabulary.
"""

import keras
from keras import ops

from keras_transformer.models.backbone import call_layer
from keras_transformer.models.causal_lm import CausalLM
from keras_transformer.models.gpt.gpt_backbone import GPTBackbone
from keras_transformer.models.gpt.gpt_causal_lm_preprocessor import GPTCausalLMPreprocessor
from keras_transformer.models.task import transposed_embedding


@keras.saving.register_keras_serializable(package="keras_transformer")
class GPTCausalLM(CausalLM):
    """Next-token prediction with a GPT backbone; logits use the transposed token embedding.

    Args:
        backbone: a `GPTBackbone`.
        preprocessor: a `GPTCausalLMPreprocessor` or None (then inputs are id arrays).

    Inputs: {"token_ids": (B, T), "padding_mask": (B, T)}. Outputs: logits (B, T, V) float32.

    Example:
    >>> lm = GPTCausalLM.from_preset("gpt_tiny")
    >>> lm.fit(["def f(x):\\n    return x\\n"] * 8, epochs=1)
    """

    backbone_cls = GPTBackbone
    preprocessor_cls = GPTCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        if preprocessor is not None and preprocessor.sequence_length > backbone.max_sequence_length:
            raise ValueError(
                f"The preprocessor's sequence_length={preprocessor.sequence_length} is longer than the "
                f"backbone's max_sequence_length={backbone.max_sequence_length}."
            )

        # === Functional model ===
        inputs = backbone.input
        hidden = backbone(inputs)  # (B, T, D)
        logits = backbone.token_embedding(hidden, reverse=True)  # (B, T, D) -> (B, T, V)
        super().__init__(inputs=inputs, outputs=ops.cast(logits, "float32"), **kwargs)

    def decode_head(self):
        """The tied head as a (D, V) array (see `Task.decode_head`)."""
        return transposed_embedding(self.backbone)

    def compute_logits(self, hidden, head=None, call_layer=call_layer):
        """Hidden states (B, T, D) -> logits (B, T, V) through the tied embedding; `head`: None or `decode_head()`."""
        if head is not None:
            return ops.matmul(hidden, head)  # (B, T, D) x (D, V) -> (B, T, V)
        return call_layer(self.backbone.token_embedding, hidden, reverse=True)  # (B, T, D) x (V, D)^T -> (B, T, V)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None, head=None, call_layer=call_layer):
        """Logits (B, T, V) float32 for T new tokens and the updated cache (see GPTBackbone.call_with_cache).

        `head`: None, or `decode_head()` (the same projection as a (D, V) array made once per loop).
        `call_layer`: how the layers are called (see `backbone.call_layer`).
        """
        hidden, cache = self.backbone.call_with_cache(token_ids, cache, cache_index, padding_mask, call_layer)
        return ops.cast(self.compute_logits(hidden, head, call_layer), "float32"), cache
