"""Seq2SeqBackbone: what every encoder-decoder backbone (T5, the original Transformer) shares.

Axes: B batch, S_enc encoder length, T decoder length, S_max decoder cache length,
L decoder layers, Hkv key/value heads, Dh head size, D model width.
"""

import keras
from keras import ops

from keras_transformer.models.backbone import Backbone


class Seq2SeqBackbone(Backbone):
    """The base of encoder-decoder backbones: the functional wiring of the two stacks and the
    cross-attention cache.

    A subclass creates its layers (`decoder_layers` among them, blocks with cross-attention),
    defines `encode(encoder_token_ids, encoder_padding_mask, training=None)`,
    `decode(decoder_token_ids, decoder_padding_mask, encoder_outputs, encoder_padding_mask, training=None)`
    and `call_with_cache`, then calls `build_encoder_decoder(dtype=dtype, **kwargs)` in place of
    `super().__init__`.

    Inputs: {"encoder_token_ids": (B, S_enc), "encoder_padding_mask": (B, S_enc),
             "decoder_token_ids": (B, T), "decoder_padding_mask": (B, T)}.
    Outputs: {"encoder_sequence_output": (B, S_enc, D), "decoder_sequence_output": (B, T, D)}.
    """

    def build_encoder_decoder(self, dtype=None, **kwargs):
        """The functional model: both stacks over symbolic inputs, then `Backbone.__init__`."""
        encoder_token_ids = keras.Input(shape=(None,), dtype="int32", name="encoder_token_ids")
        encoder_padding_mask = keras.Input(shape=(None,), dtype="bool", name="encoder_padding_mask")
        decoder_token_ids = keras.Input(shape=(None,), dtype="int32", name="decoder_token_ids")
        decoder_padding_mask = keras.Input(shape=(None,), dtype="bool", name="decoder_padding_mask")
        encoder_outputs = self.encode(encoder_token_ids, encoder_padding_mask)
        decoder_outputs = self.decode(decoder_token_ids, decoder_padding_mask, encoder_outputs, encoder_padding_mask)
        super().__init__(
            inputs={
                "encoder_token_ids": encoder_token_ids,
                "encoder_padding_mask": encoder_padding_mask,
                "decoder_token_ids": decoder_token_ids,
                "decoder_padding_mask": decoder_padding_mask,
            },
            outputs={"encoder_sequence_output": encoder_outputs, "decoder_sequence_output": decoder_outputs},
            dtype=dtype,
            **kwargs,
        )

    def cache_head_dim(self):
        """Dh, the size of each attention head's keys and values."""
        return self.hidden_dim // self.num_heads

    # --- cached decoding --------------------------------------------------

    def cache_shape(self, batch_size, max_length):
        """Shape of the decoder self-attention cache: (B, L, 2, Hkv, S_max, Dh)."""
        return (batch_size, len(self.decoder_layers), 2, self.num_heads, max_length, self.cache_head_dim())

    def compute_cross_cache(self, encoder_outputs):
        """Every decoder layer's cross-attention keys/values: (B, S_enc, D) -> (B, L, 2, Hkv, S_enc, Dh)."""
        caches = [block.cross_attention.compute_cache(encoder_outputs) for block in self.decoder_layers]
        return ops.stack(caches, axis=1)  # L x (B, 2, Hkv, S_enc, Dh) -> (B, L, 2, Hkv, S_enc, Dh)
