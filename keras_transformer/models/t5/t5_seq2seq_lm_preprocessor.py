"""T5Seq2SeqLMPreprocessor: (sources, targets) strings -> encoder/decoder ids, masks, shifted labels."""

import numpy as np

from keras_transformer import presets
from keras_transformer.models.input_checks import weigh
from keras_transformer.models.preprocessor import Preprocessor


@presets.register_preprocessor
class T5Seq2SeqLMPreprocessor(Preprocessor):
    """Tokenize sources and targets for teacher-forced training of an encoder-decoder LM.

    source ids + [</s>] go to the encoder. The decoder reads [start] + target ids
    and learns to predict target ids + [</s>] (its input shifted left by one);
    the sample weight is 1 on real labels and 0 on padding. T5's decoder start
    token is the padding token (id 0), so the decoder padding mask comes from the
    lengths, not from the ids.

    Args:
        tokenizer: a `UnigramTokenizer` (any `Tokenizer` with pad and eos tokens works).
        encoder_sequence_length: int, padded source length S_enc (the </s> included).
        decoder_sequence_length: int, padded target length T (the start token included).
        truncate: bool, cut sources and targets that are too long (keeping the </s>). Off by
            default: a too-long text is a ValueError, never silently cut.

    Call arguments:
        x: `(sources, targets)`, or `sources` with the targets as `y`; each a string or a list
            of strings. With `predict=True`, targets may be left out (the decoder then reads
            the start token only).
        y: the targets, when `x` holds only the sources.
        sample_weight: None, (B,) per-example weights or (B, T) per-token weights, multiplied
            with the label mask.
        predict: bool, return inputs only.

    Returns:
        `({"encoder_token_ids": (B, S_enc) int32, "encoder_padding_mask": (B, S_enc) bool,
           "decoder_token_ids": (B, T) int32, "decoder_padding_mask": (B, T) bool},
          labels (B, T) int32, sample_weight (B, T) float32)`.

    Example:
    >>> from keras_transformer.tokenizers import UnigramTokenizer
    >>> tokenizer = UnigramTokenizer.train(["1 2 3", "3 2 1"] * 50, vocabulary_size=20)
    >>> preprocessor = T5Seq2SeqLMPreprocessor(tokenizer, encoder_sequence_length=8, decoder_sequence_length=8)
    >>> x, labels, weights = preprocessor((["1 2 3"], ["3 2 1"]))
    >>> x["decoder_token_ids"].shape, labels.shape
    ((1, 8), (1, 8))
    """

    def __init__(self, tokenizer, encoder_sequence_length=128, decoder_sequence_length=128, truncate=False):
        super().__init__(tokenizer, encoder_sequence_length)
        if not isinstance(decoder_sequence_length, int) or decoder_sequence_length < 2:
            raise ValueError(
                "`decoder_sequence_length` must be an int >= 2. "
                f"Received: decoder_sequence_length={decoder_sequence_length}"
            )
        for role in ("pad_token", "eos_token"):
            if getattr(tokenizer, f"{role}_id") is None:
                raise ValueError(f"{type(self).__name__} needs a tokenizer with a `{role}`. Received: {role}=None")
        self.encoder_sequence_length = encoder_sequence_length
        self.decoder_sequence_length = decoder_sequence_length
        self.truncate = truncate

    @property
    def decoder_start_token_id(self):
        """The id the decoder starts from: T5 uses the padding token."""
        return self.tokenizer.pad_token_id

    def get_config(self):
        return {
            "encoder_sequence_length": self.encoder_sequence_length,
            "decoder_sequence_length": self.decoder_sequence_length,
            "truncate": self.truncate,
        }

    def __call__(self, x, y=None, sample_weight=None, predict=False):
        if y is None and _is_pair(x):
            x, y = x
        if y is None and not predict:
            raise ValueError(
                "A seq2seq LM learns from (source, target) pairs: pass `x=(sources, targets)` or "
                "`x=sources, y=targets`."
            )
        encoder_token_ids, encoder_padding_mask = self.generate_preprocess(x)
        batch_size = len(encoder_token_ids)
        start = [self.decoder_start_token_id]
        eos = [self.tokenizer.eos_token_id]
        if y is None:
            targets = [[] for _ in range(batch_size)]
        else:
            targets = self.tokenize_texts(y, name="y")
            if len(targets) != batch_size:
                raise ValueError(
                    f"Sources and targets must pair up one to one. Received: {batch_size} sources and "
                    f"{len(targets)} targets"
                )
            if self.truncate:
                targets = [ids[: self.decoder_sequence_length - 1] for ids in targets]
        decoder_inputs = [start + list(t) for t in targets]
        decoder_token_ids, decoder_padding_mask = self.pad(decoder_inputs, self.decoder_sequence_length)
        inputs = {
            "encoder_token_ids": encoder_token_ids,
            "encoder_padding_mask": encoder_padding_mask,
            "decoder_token_ids": decoder_token_ids,
            "decoder_padding_mask": decoder_padding_mask,
        }
        if predict:
            return inputs, None, None
        labels, label_mask = self.pad([list(t) + eos for t in targets], self.decoder_sequence_length)
        return inputs, labels, weigh(label_mask.astype("float32"), sample_weight)

    def generate_preprocess(self, sources):
        """Sources -> (encoder_token_ids (B, S_enc) int32, encoder_padding_mask (B, S_enc) bool), numpy."""
        sequences = self.tokenize_texts(sources, name="x")
        if self.truncate:
            sequences = [ids[: self.encoder_sequence_length - 1] for ids in sequences]
        return self.pad([list(ids) + [self.tokenizer.eos_token_id] for ids in sequences], self.encoder_sequence_length)

    def generate_postprocess(self, ids):
        """Generated id rows -> strings: each row is cut at its first end token, special tokens dropped."""
        eos = self.tokenizer.eos_token_id
        texts = []
        for row in ids:
            row = [int(i) for i in np.asarray(row).reshape(-1)]
            if eos in row:
                row = row[: row.index(eos)]
            texts.append(self.tokenizer.detokenize(np.asarray(row, dtype="int64")))
        return texts


def _is_pair(x):
    """(sources, targets): a pair whose two items are batches of strings (a pair of strings is a batch of two)."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        return False
    return all(isinstance(item, (list, tuple, np.ndarray)) for item in x)
