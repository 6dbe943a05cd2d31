"""BertTextClassifierPreprocessor: texts or text pairs -> packed BERT inputs, and checked labels.

Axes: B batch, T sequence length.
"""

import numpy as np

from keras_transformer import presets
from keras_transformer.models.bert.bert_packing import pack_bert_inputs
from keras_transformer.models.preprocessor import Preprocessor, as_string_list
from keras_transformer.models.text_classifier import check_labels


@presets.register_preprocessor
class BertTextClassifierPreprocessor(Preprocessor):
    """Pack `[CLS] a [SEP]` (single texts) or `[CLS] a [SEP] b [SEP]` (pairs), segment ids 0 then 1; a tokenizer
    with its own pair template packs pairs as it says (RoBERTa's `<s> a </s></s> b </s>`, segment ids 0).

    Args:
        tokenizer: a `WordPieceTokenizer` (any `Tokenizer` with `[CLS]`, `[SEP]`
            and padding tokens).
        sequence_length: int, T.
        truncate: bool, cut too-long examples, longest segment first. Off by
            default: a too-long example is a ValueError, never silently cut.

    Call arguments:
        x: a string, a list of strings, or a pair `(texts_a, texts_b)` of two
            lists of the same length.
        y: None, or one integer label per example.
        sample_weight: None, or one weight per example.
        predict: bool, return only the inputs.
        num_classes: int or None. When given, a label outside [0, num_classes)
            is a ValueError (the classifier passes its own).

    Returns:
        `(x, y, sample_weight)`: x = {"token_ids": (B, T) int32, "segment_ids":
        (B, T) int32, "padding_mask": (B, T) bool}; y (B,) int32 or None;
        sample_weight (B,) float32 or None.

    Example:
    >>> from keras_transformer.tokenizers import WordPieceTokenizer
    >>> tokenizer = WordPieceTokenizer.from_vocabulary(
    ...     ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "a", "dog"])
    >>> preprocessor = BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    >>> x, y, _ = preprocessor((["the fox"], ["a dog"]), [1])
    >>> x["token_ids"].tolist(), x["segment_ids"].tolist(), y.tolist()
    ([[2, 5, 8, 3, 9, 10, 3, 0]], [[0, 0, 0, 0, 1, 1, 1, 0]], [1])
    """

    def __init__(self, tokenizer, sequence_length=128, truncate=False):
        super().__init__(tokenizer, sequence_length)
        for name in ("cls_token_id", "sep_token_id", "pad_token_id"):
            if getattr(tokenizer, name) is None:
                raise ValueError(f"The tokenizer has no {name[:-3]}, which BERT inputs need. Received: {name}=None")
        self.truncate = truncate

    def get_config(self):
        return {**super().get_config(), "truncate": self.truncate}

    def __call__(self, x, y=None, sample_weight=None, predict=False, num_classes=None):
        if _is_pair(x):
            texts_a, texts_b = as_string_list(x[0], "x[0]"), as_string_list(x[1], "x[1]")
            if len(texts_a) != len(texts_b):
                raise ValueError(
                    "The two halves of a text pair must have the same length. Received: "
                    f"{len(texts_a)} first texts and {len(texts_b)} second texts"
                )
            segments = [self.tokenizer.tokenize(texts_a), self.tokenizer.tokenize(texts_b)]
        else:
            segments = [self.tokenize_texts(x)]
        token_ids, segment_ids, padding_mask = pack_bert_inputs(
            self.tokenizer, segments, self.sequence_length, self.truncate
        )
        inputs = {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}
        if predict:
            return inputs, None, None
        batch_size = token_ids.shape[0]
        labels = None if y is None else check_labels(y, batch_size, num_classes)
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight, dtype="float32").reshape(-1)
            if sample_weight.shape[0] != batch_size:
                raise ValueError(
                    f"Got {sample_weight.shape[0]} sample weights for {batch_size} examples: pass one per example."
                )
        return inputs, labels, sample_weight


def _is_pair(x):
    return isinstance(x, tuple) and len(x) == 2 and not isinstance(x[0], (str, bytes))
