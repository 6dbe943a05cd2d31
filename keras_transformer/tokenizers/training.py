"""Training: the checks and the `tokenizers` call shared by the subclasses' `train` class methods.

Each subclass (`WordPieceTokenizer`, `BytePairTokenizer`, `UnigramTokenizer`) builds an empty
`tokenizers.Tokenizer` and a trainer of its kind; the code here checks the arguments, runs the
trainer and turns the Rust side's bare exceptions into `ValueError`s that name the argument.
"""

import tokenizers

__all__ = ["check_vocabulary_size", "train_backend"]


def check_vocabulary_size(vocabulary_size, minimum_size):
    """Raises a `ValueError` unless `vocabulary_size` is an int of at least `minimum_size`."""
    if isinstance(vocabulary_size, bool) or not isinstance(vocabulary_size, int):
        raise ValueError(
            "`vocabulary_size` must be an integer. Received: "
            f"vocabulary_size={vocabulary_size!r} of type {type(vocabulary_size).__name__}"
        )
    if vocabulary_size < minimum_size:
        raise ValueError(
            f"`vocabulary_size` must be at least {minimum_size} for this tokenizer (its "
            f"special tokens and base symbols). Received: vocabulary_size={vocabulary_size}"
        )


def train_backend(backend, trainer, texts, vocabulary_size):
    """Trains `backend` in place with `trainer` on `texts`; checks the inputs and the result."""
    if isinstance(texts, (str, bytes)) or not hasattr(texts, "__iter__"):
        raise ValueError(
            "`texts` must be an iterable of strings (e.g. a list, or a generator). Received: "
            f"texts of type {type(texts).__name__}"
        )

    def checked_texts():
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(
                    f"`texts` must yield strings. Received: an element {index} of type {type(text).__name__}"
                )
            yield text

    try:
        backend.train_from_iterator(checked_texts(), trainer)
    except ValueError:
        raise
    except Exception as error:  # the Rust trainers raise a bare Exception
        if "not large enough" not in str(error):
            raise
        raise ValueError(
            "`vocabulary_size` is too small for the characters of the training text. "
            f"Received: vocabulary_size={vocabulary_size}"
        ) from error
    # Trainers keep every character they saw, even past the requested size.
    if backend.get_vocab_size(with_added_tokens=True) > vocabulary_size:
        raise ValueError(
            "`vocabulary_size` is too small for the training text: its special tokens and "
            f"distinct characters alone need {backend.get_vocab_size(with_added_tokens=True)} "
            f"entries. Received: vocabulary_size={vocabulary_size}"
        )
    # Rebuild from the serialised form: a freshly trained model can keep training-time state
    # (seen with Unigram: ties between equal-score segmentations broke differently before
    # and after a save), and the tokenizer used must be the one that is saved.
    return tokenizers.Tokenizer.from_str(backend.to_str())
