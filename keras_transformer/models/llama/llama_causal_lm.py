"""LlamaCausalLM: a Llama backbone with its language-model head (tied or separate).

Axes: B batch, T sequence length, D model width, V vocabulary.
"""

import keras
from keras import ops

from keras_transformer.models.backbone import call_layer
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
    >>> lm = LlamaCausalLM.from_preset("llama_tiny")
    >>> lm.generate("def f(x):", max_length=32)
    """

    backbone_cls = LlamaBackbone
    preprocessor_cls = LlamaCausalLMPreprocessor

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
        """The head as a (D, V) array in the compute dtype, made once per decoding loop (see `Task.decode_head`)."""
        embedding = self.backbone.token_embedding
        if embedding.tie_weights:
            return ops.cast(ops.transpose(embedding.embeddings), self.backbone.compute_dtype)  # (V, D) -> (D, V)
        return ops.cast(embedding.reverse_embeddings, self.backbone.compute_dtype)  # (D, V)

    def compute_logits(self, hidden, head=None, call_layer=call_layer):
        """Hidden states (B, T, D) -> logits (B, T, V); `head`: None or `decode_head()`."""
        if head is not None:
            return ops.matmul(hidden, head)  # (B, T, D) x (D, V) -> (B, T, V)
        return call_layer(self.backbone.token_embedding, hidden, reverse=True)

    def call_with_cache(self, token_ids, cache, cache_index, padding_mask=None, head=None, call_layer=call_layer):
        """Logits (B, T, V) float32 for T new tokens and the updated cache (see LlamaBackbone.call_with_cache)."""
        hidden, cache = self.backbone.call_with_cache(token_ids, cache, cache_index, padding_mask, call_layer)
        return ops.cast(self.compute_logits(hidden, head, call_layer), "float32"), cache
