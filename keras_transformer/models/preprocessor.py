"""Preprocessor: strings -> padded id arrays and masks, in numpy, outside the compiled graph."""

import numpy as np

from keras_transformer.models.input_checks import check_not_empty_strings
from keras_transformer.tokenizers import Tokenizer


class Preprocessor:
    """Base of the task preprocessors: owns a tokenizer and a sequence length.

    Preprocessors are plain Python (numpy arrays out), so they behave the same
    on every backend and never enter a compiled graph.

    Args:
        tokenizer: a `keras_transformer.tokenizers.Tokenizer`.
        sequence_length: int, the padded length of every example.
    """

    def __init__(self, tokenizer, sequence_length=128):
        if not isinstance(tokenizer, Tokenizer):
            raise ValueError(f"`tokenizer` must be a keras_transformer Tokenizer. Received: {type(tokenizer).__name__}")
        if not isinstance(sequence_length, int) or sequence_length < 2:
            raise ValueError(f"`sequence_length` must be an int >= 2. Received: sequence_length={sequence_length}")
        self.tokenizer = tokenizer
        self.sequence_length = sequence_length

    def get_config(self):
        return {"sequence_length": self.sequence_length}

    @classmethod
    def from_config(cls, config, tokenizer):
        return cls(tokenizer=tokenizer, **config)

    def tokenize_texts(self, texts, name="x"):
        """Validate a batch of strings and tokenize it -> list of id lists."""
        texts = as_string_list(texts, name)
        return self.tokenizer.tokenize(texts)

    def check_length(self, sequence, length):
        """A ValueError for an id list longer than `length`, with the fix (a subclass may name another)."""
        if len(sequence) > length:
            raise ValueError(
                f"A sequence of {len(sequence)} tokens is longer than `sequence_length`={length}. Pass "
                "truncate=True to the preprocessor to cut it, or build it with a larger sequence_length."
            )

    def pad(self, sequences, length=None, pad_id=None):
        """Right-pad id lists -> (ids (B, L) int32, mask (B, L) bool). Too-long sequences are an error."""
        length = length or self.sequence_length
        pad_id = self.tokenizer.pad_token_id if pad_id is None else pad_id
        ids = np.full((len(sequences), length), pad_id, dtype="int32")
        mask = np.zeros((len(sequences), length), dtype=bool)
        for row, sequence in enumerate(sequences):
            self.check_length(sequence, length)
            ids[row, : len(sequence)] = sequence
            mask[row, : len(sequence)] = True
        return ids, mask


def as_string_list(texts, name="x"):
    """A str, a list/tuple/array of str -> list[str]; anything else is a ValueError naming `name`."""
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, np.ndarray):
        texts = texts.reshape(-1).tolist()
    if not isinstance(texts, (list, tuple)):
        raise ValueError(f"`{name}` must be a string or a list of strings. Received: {type(texts).__name__}")
    out = []
    for text in texts:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        if not isinstance(text, str):
            raise ValueError(f"`{name}` must contain strings. Received an element of type {type(text).__name__}")
        out.append(text)
    if not out:
        raise ValueError(f"`{name}` is an empty batch: pass at least one string.")
    check_not_empty_strings(out, name)
    return out
