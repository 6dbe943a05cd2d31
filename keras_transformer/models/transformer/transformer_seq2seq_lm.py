"""TransformerSeq2SeqLM: the original Transformer with its tied output projection.

Axes: B batch, T decoder length, D model width, V vocabulary.
"""

import keras

from keras_transformer.models.seq2seq_lm import Seq2SeqLM
from keras_transformer.models.transformer.transformer_backbone import TransformerBackbone
from keras_transformer.models.transformer.transformer_seq2seq_lm_preprocessor import TransformerSeq2SeqLMPreprocessor


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSeq2SeqLM(Seq2SeqLM):
    """Sequence-to-sequence generation with the paper's model (e.g. translation).

    The pre-softmax linear transformation shares its weights with the token
    embedding (section 3.4): logits = decoder output times the transposed embedding,
    the tied head `Seq2SeqLM` provides; this class only names its backbone and preprocessor.

    Args:
        backbone: a `TransformerBackbone`.
        preprocessor: a `TransformerSeq2SeqLMPreprocessor` or None (then inputs are id arrays).

    Inputs: {"encoder_token_ids": (B, S_enc), "encoder_padding_mask": (B, S_enc),
             "decoder_token_ids": (B, T), "decoder_padding_mask": (B, T)}.
    Outputs: logits (B, T, V) float32.

    Example:
    >>> from keras_transformer.tokenizers import UnigramTokenizer
    >>> tokenizer = UnigramTokenizer.train(["1 2 3", "3 2 1"] * 50, vocabulary_size=20)
    >>> preprocessor = TransformerSeq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=8,
    ...                                                 decoder_sequence_length=8)
    >>> backbone = TransformerBackbone(tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=16,
    ...                                intermediate_dim=32, max_sequence_length=8)
    >>> lm = TransformerSeq2SeqLM(backbone, preprocessor)
    >>> history = lm.fit((["1 2 3", "3 2 1"], ["3 2 1", "1 2 3"]), epochs=1, verbose=0)
    """

    backbone_cls = TransformerBackbone
    preprocessor_cls = TransformerSeq2SeqLMPreprocessor
