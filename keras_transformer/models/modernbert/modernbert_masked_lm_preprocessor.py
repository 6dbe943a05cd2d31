"""ModernBertMaskedLMPreprocessor: strings -> `[CLS] text [SEP]` with hidden tokens, without segment ids.

Axes: B batch, T sequence length, P selections per sequence.
"""

from keras_transformer import presets
from keras_transformer.models.bert.bert_masked_lm_preprocessor import BertMaskedLMPreprocessor


@presets.register_preprocessor
class ModernBertMaskedLMPreprocessor(BertMaskedLMPreprocessor):
    """`BertMaskedLMPreprocessor`'s packing and masking, for a backbone that reads no segment ids (ModernBERT).

    Args: as `BertMaskedLMPreprocessor` (a tokenizer with `[CLS]`, `[SEP]`, `[MASK]` and padding tokens).

    Returns:
        `(x, y, sample_weight)`: x = {"token_ids": (B, T) int32, "padding_mask": (B, T) bool,
        "mask_positions": (B, P) int32}; y (B, P) int32 the original ids; sample_weight (B, P) float32.

    Example:
    >>> from keras_transformer.tokenizers import WordPieceTokenizer
    >>> tokenizer = WordPieceTokenizer.from_vocabulary(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "a", "dog"])
    >>> x, y, w = ModernBertMaskedLMPreprocessor(tokenizer, sequence_length=16, seed=0)(["the quick brown fox"])
    >>> sorted(x), y.shape
    (['mask_positions', 'padding_mask', 'token_ids'], (1, 2))
    """

    def __call__(self, x, y=None, sample_weight=None, predict=False):
        inputs, labels, weights = super().__call__(x, y, sample_weight, predict)
        del inputs["segment_ids"]  # one segment, and the backbone has no segment embedding
        return inputs, labels, weights
