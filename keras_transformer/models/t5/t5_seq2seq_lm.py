"""T5Seq2SeqLM: a T5 backbone with its language-model head.

Axes: B batch, T decoder length, D model width, V vocabulary.
"""

import keras

from keras_transformer.models.backbone import call_layer
from keras_transformer.models.seq2seq_lm import Seq2SeqLM
from keras_transformer.models.t5.t5_backbone import T5Backbone
from keras_transformer.models.t5.t5_seq2seq_lm_preprocessor import T5Seq2SeqLMPreprocessor


@keras.saving.register_keras_serializable(package="keras_transformer")
class T5Seq2SeqLM(Seq2SeqLM):
    """Text-to-text generation with a T5 backbone.

    With `backbone.tie_embedding_weights` (T5 v1.0) the logits are the decoder
    output scaled by D**-0.5 times the transposed token embedding, as in the
    original T5 and Hugging Face; otherwise (T5 v1.1) a separate bias-free
    projection `lm_head` (kernel (D, V)) makes them.

    Args:
        backbone: a `T5Backbone`.
        preprocessor: a `T5Seq2SeqLMPreprocessor` or None (then inputs are id arrays).

    Inputs: {"encoder_token_ids": (B, S_enc), "encoder_padding_mask": (B, S_enc),
             "decoder_token_ids": (B, T), "decoder_padding_mask": (B, T)}.
    Outputs: logits (B, T, V) float32.

    Example:
    >>> from keras_transformer.tokenizers import UnigramTokenizer
    >>> tokenizer = UnigramTokenizer.train(["1 2 3", "3 2 1"] * 50, vocabulary_size=20)
    >>> preprocessor = T5Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=8, decoder_sequence_length=8)
    >>> backbone = T5Backbone(tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=16,
    ...                       intermediate_dim=32)
    >>> lm = T5Seq2SeqLM(backbone, preprocessor)
    >>> history = lm.fit((["1 2 3", "3 2 1"], ["3 2 1", "1 2 3"]), epochs=1, verbose=0)
    """

    backbone_cls = T5Backbone
    preprocessor_cls = T5Seq2SeqLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        # === Layers ===
        self.lm_head = None
        if not backbone.tie_embedding_weights:
            self.lm_head = keras.layers.Dense(
                backbone.vocabulary_size,
                use_bias=False,
                kernel_initializer=keras.initializers.RandomNormal(stddev=backbone.hidden_dim**-0.5),
                dtype=backbone.dtype_policy,
                name="lm_head",
            )

        # === Functional model ===
        super().__init__(backbone, preprocessor, **kwargs)

    def scale_before_tied_head(self, decoder_hidden):
        """T5 v1.0 rescales by D**-0.5 before the tied projection, whose rows have unit scale."""
        return decoder_hidden * (self.backbone.hidden_dim**-0.5)

    def compute_logits(self, decoder_hidden, head=None, call_layer=call_layer):
        """Decoder output (B, T, D) -> logits (B, T, V); `head`: None or `decode_head()`."""
        if self.lm_head is not None:
            return call_layer(self.lm_head, decoder_hidden)  # (B, T, D) x (D, V) -> (B, T, V)
        return super().compute_logits(decoder_hidden, head, call_layer)  # the tied head, rescaled

    def decode_head(self):
        """None with a separate `lm_head` (its kernel is already (D, V)), else the tied (D, V) copy."""
        return None if self.lm_head is not None else super().decode_head()
