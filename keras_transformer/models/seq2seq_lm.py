"""Seq2SeqLM: the task base of encoder-decoder language models (T5, the original Transformer).

Axes: B batch, S_enc encoder length, T decoder (query) length, S_max decoder cache length,
L decoder layers, Hkv key/value heads, Dh head size, D model width, V vocabulary.
"""

import keras
from keras import ops

from keras_transformer.metrics import Perplexity
from keras_transformer.models.backbone import call_layer
from keras_transformer.models.language_model import LanguageModel
from keras_transformer.models.task import transposed_embedding


class Seq2SeqLM(LanguageModel):
    """Encoder-decoder language model: logits (B, T, V) for the target given the source.

    A subclass creates its head layers, if any, then calls this constructor. The head is the
    token embedding (tied) unless the subclass overrides `compute_logits(decoder_hidden, head=None)`
    and `decode_head()`; `scale_before_tied_head` rescales the decoder output before it. The backbone must output
    `{"encoder_sequence_output", "decoder_sequence_output"}` and provide `encode`,
    `compute_cross_cache`, `cache_shape` and `call_with_cache`.

    Trained with plain `fit((sources, targets))` on raw strings when it has a
    preprocessor; compiled by default with AdamW, masked sparse cross-entropy
    (the preprocessor's sample weights drop padded labels), token accuracy and
    perplexity.

    Cached decoding (what a generation loop calls):
        encoder_outputs = task.encode(encoder_token_ids, encoder_padding_mask)   # (B, S_enc, D)
        cross_cache = task.compute_cross_cache(encoder_outputs)                   # (B, L, 2, Hkv, S_enc, Dh)
        self_cache = zeros(task.backbone.cache_shape(B, S_max))                   # (B, L, 2, Hkv, S_max, Dh)
        logits, self_cache = task.call_with_cache(ids, self_cache, index, cross_cache, encoder_padding_mask)

    Args:
        backbone: an encoder-decoder backbone.
        preprocessor: the matching seq2seq preprocessor, or None (inputs are then id arrays).

    Inputs: {"encoder_token_ids": (B, S_enc), "encoder_padding_mask": (B, S_enc),
             "decoder_token_ids": (B, T), "decoder_padding_mask": (B, T)}.
    Outputs: logits (B, T, V) float32.
    """

    def __init__(self, backbone, preprocessor=None, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        if preprocessor is not None:
            for name in ("encoder_sequence_length", "decoder_sequence_length"):
                length = getattr(preprocessor, name)
                if length > backbone.max_sequence_length:
                    raise ValueError(
                        f"The preprocessor's {name}={length} is longer than the backbone's "
                        f"max_sequence_length={backbone.max_sequence_length}."
                    )

        # === Functional model ===
        inputs = backbone.input
        hidden = backbone(inputs)["decoder_sequence_output"]  # (B, T, D)
        logits = self.compute_logits(hidden)  # (B, T, D) -> (B, T, V)
        super().__init__(inputs=inputs, outputs=ops.cast(logits, "float32"), **kwargs)

    def scale_before_tied_head(self, decoder_hidden):
        """The decoder output as the tied head reads it: unchanged here (T5 v1.0 rescales it)."""
        return decoder_hidden

    def compute_logits(self, decoder_hidden, head=None, call_layer=call_layer):
        """Decoder hidden states (B, T, D) -> logits (B, T, V) through the tied token embedding;
        `head`: None or `decode_head()`."""
        hidden = self.scale_before_tied_head(decoder_hidden)
        if head is not None:
            return ops.matmul(hidden, head)  # (B, T, D) x (D, V) -> (B, T, V)
        return call_layer(self.backbone.token_embedding, hidden, reverse=True)  # (B, T, D) x (V, D)^T -> (B, T, V)

    def decode_head(self):
        """The tied head as a (D, V) array, made once per decoding loop (see `Task.decode_head`)."""
        return transposed_embedding(self.backbone)

    def default_weighted_metrics(self):
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy"), Perplexity()]

    # --- cached decoding --------------------------------------------------

    def encode(self, encoder_token_ids, encoder_padding_mask, call_layer=call_layer):
        """Run the encoder once: ids (B, S_enc), mask (B, S_enc) -> encoder outputs (B, S_enc, D).
        `call_layer`: how the layers are called (see `backbone.call_layer`), as in `call_with_cache`."""
        return self.backbone.encode(encoder_token_ids, encoder_padding_mask, call_layer=call_layer)

    def compute_cross_cache(self, encoder_outputs):
        """Cross-attention keys/values of every decoder layer: (B, S_enc, D) -> (B, L, 2, Hkv, S_enc, Dh)."""
        return self.backbone.compute_cross_cache(encoder_outputs)

    def call_with_cache(
        self,
        decoder_token_ids,
        self_cache,
        cache_index,
        cross_cache,
        encoder_padding_mask,
        decoder_padding_mask=None,
        head=None,
        call_layer=call_layer,
    ):
        """Logits for T new decoder tokens at positions [cache_index, cache_index + T).

        Args:
            decoder_token_ids: (B, T) int.
            self_cache: (B, L, 2, Hkv, S_max, Dh) decoder self-attention keys/values.
            cache_index: int or scalar int tensor, position of the first new token.
            cross_cache: (B, L, 2, Hkv, S_enc, Dh) from `compute_cross_cache`.
            encoder_padding_mask: (B, S_enc), True for real source tokens.
            decoder_padding_mask: (B, S_max) key mask over the cache, or None.
            head: None, or `decode_head()` (the tied projection as a (D, V) array made once per loop).
            call_layer: how the layers are called (see `backbone.call_layer`).

        Returns:
            (logits (B, T, V) float32, updated self_cache).
        """
        hidden, self_cache = self.backbone.call_with_cache(
            decoder_token_ids,
            self_cache,
            cache_index,
            cross_cache,
            encoder_padding_mask,
            decoder_padding_mask,
            call_layer,
        )
        return ops.cast(self.compute_logits(hidden, head, call_layer), "float32"), self_cache
