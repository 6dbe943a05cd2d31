"""TransformerSeq2SeqLMPreprocessor: T5's seq2seq packing, with BOS as the decoder start when there is one."""

from keras_transformer import presets
from keras_transformer.models.t5.t5_seq2seq_lm_preprocessor import T5Seq2SeqLMPreprocessor


@presets.register_preprocessor
class TransformerSeq2SeqLMPreprocessor(T5Seq2SeqLMPreprocessor):
    """Sources -> encoder ids + [eos]; targets -> decoder input [start] + ids, labels ids + [eos].

    The same packing as `T5Seq2SeqLMPreprocessor`; the decoder starts from the
    tokenizer's beginning-of-sequence token when it has one (e.g. a
    `BytePairTokenizer`), else from the padding token as T5 does.

    Args:
        tokenizer: any `Tokenizer` with pad and eos tokens.
        encoder_sequence_length: int, padded source length (eos included).
        decoder_sequence_length: int, padded target length (start token included).
        truncate: bool, cut too-long texts instead of raising a ValueError.

    Call arguments and returns: as `T5Seq2SeqLMPreprocessor`.

    Example:
    >>> from keras_transformer.tokenizers import UnigramTokenizer
    >>> tokenizer = UnigramTokenizer.train(["1 2 3", "3 2 1"] * 50, vocabulary_size=20)
    >>> TransformerSeq2SeqLMPreprocessor(tokenizer).decoder_start_token_id == tokenizer.pad_token_id
    True
    """

    @property
    def decoder_start_token_id(self):
        """The tokenizer's BOS id, or its padding id when it has no BOS token."""
        bos = self.tokenizer.bos_token_id
        return self.tokenizer.pad_token_id if bos is None else bos
