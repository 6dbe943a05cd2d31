"""BytePairTokenizer: GPT-2's byte-level byte-pair-encoding tokenizer."""

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from keras_transformer.tokenizers.tokenizer import Tokenizer

_END_OF_TEXT = "<|endoftext|>"


class BytePairTokenizer(Tokenizer):
    """GPT-2's byte-level BPE tokenizer.

    Text is split GPT-2's way (words with their leading space, numbers, punctuation runs,
    whitespace runs; no space is added in front of the text), each split's UTF-8 bytes are mapped
    to printable characters, and learned merges join them into tokens. As every byte is in the
    vocabulary there is no unknown token, and the round trip is exact:
    `detokenize(tokenize(text)) == text` for any text (whitespace, newlines and emoji included)
    that does not contain the special token string `"<|endoftext|>"`, which, as in GPT-2, is
    read as the special token and so dropped by `detokenize`.

    `"<|endoftext|>"` is the beginning, end and padding token (id 0 in a trained vocabulary).

    Args:
        tokenizer: a `tokenizers.Tokenizer` with a BPE model (see `train`, `from_vocabulary`,
            `from_file` and `load` for the usual ways to get one).
        **special_tokens: overrides of the special token strings (see `Tokenizer`).

    Example:

    >>> tokenizer = BytePairTokenizer.train(["def add(a, b):\\n    return a + b\\n"] * 10,
    ...                                     vocabulary_size=300)
    >>> tokenizer.bos_token_id == tokenizer.eos_token_id == tokenizer.pad_token_id == 0
    True
    >>> tokenizer.detokenize(tokenizer.tokenize("def  sub(a, b):\\n\\treturn a - b 🙂"))
    'def  sub(a, b):\\n\\treturn a - b 🙂'
    """

    default_special_tokens = {"bos_token": _END_OF_TEXT, "eos_token": _END_OF_TEXT, "pad_token": _END_OF_TEXT}
    model_type = models.BPE

    @classmethod
    def train(cls, texts, vocabulary_size):
        """Trains a new vocabulary of at most `vocabulary_size` tokens on `texts`.

        Args:
            texts: an iterable of strings (a list, or a generator to stream a large corpus).
            vocabulary_size: the largest number of tokens: at least 257 (`"<|endoftext|>"` and the
                256 bytes); each token beyond those is one learned merge.

        Returns:
            A `BytePairTokenizer` with `"<|endoftext|>"` as id 0.
        """
        byte_symbols = pre_tokenizers.ByteLevel.alphabet()  # the 256 bytes as printable characters
        cls._check_vocabulary_size(vocabulary_size, minimum_size=1 + len(byte_symbols))
        backend = _pipeline(models.BPE())
        trainer = trainers.BpeTrainer(
            vocab_size=vocabulary_size,
            special_tokens=[_END_OF_TEXT],
            initial_alphabet=byte_symbols,
            show_progress=False,
        )
        return cls(cls._train_backend(backend, trainer, texts, vocabulary_size))

    @classmethod
    def from_vocabulary(cls, vocabulary, merges):
        """Builds the tokenizer from GPT-2 style `vocab.json` and `merges.txt` contents.

        Args:
            vocabulary: a dict token -> id, tokens written in GPT-2's byte-to-character mapping
                (`"Ġ"` is a space). It must hold `"<|endoftext|>"`, and should hold all 256 byte
                symbols (as GPT-2's does): a byte without one is dropped from the ids.
            merges: the merges in priority order, each a string `"Ġ t"` or a pair `("Ġ", "t")`.

        Returns:
            A `BytePairTokenizer`.
        """
        if not isinstance(vocabulary, dict):
            raise ValueError(
                f"`vocabulary` must be a dict token -> id. Received: vocabulary of type {type(vocabulary).__name__}"
            )
        pairs = []
        for merge in merges:
            pair = tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge)
            if len(pair) != 2 or not all(isinstance(part, str) for part in pair):
                raise ValueError(f"Each merge must be a string 'a b' or a pair of strings. Received: merge={merge!r}")
            pairs.append(pair)
        return cls(_pipeline(models.BPE(vocabulary, pairs)))


def _pipeline(model):
    """Wraps a BPE `model` in GPT-2's byte-level pre-tokenizer and decoder."""
    backend = BackendTokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend
