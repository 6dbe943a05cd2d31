"""UnigramTokenizer: T5's SentencePiece-style unigram tokenizer."""

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from keras_transformer.tokenizers.tokenizer import Tokenizer

# In T5's order: <pad>=0, </s>=1, <unk>=2.
_SPECIAL_TOKENS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
_SPACE = "\u2581"  # "▁", SentencePiece's visible space


class UnigramTokenizer(Tokenizer):
    """T5's unigram language-model tokenizer, SentencePiece style.

    Text is NFKC-normalised, each space becomes `"▁"` (and one is put in front of the text), the
    text is split before each `"▁"`, and each piece is cut into the most probable sequence of
    vocabulary pieces. Special tokens, as in T5: `<pad>` = 0 (also the decoder start token),
    `</s>` = 1 (end of sequence), `<unk>` = 2; there is no beginning-of-sequence token.

    Round trip: `detokenize(tokenize(text)) == text` for NFKC-normal text that does not start
    with whitespace and whose characters all occurred in the training text. Unlike T5's
    SentencePiece normaliser, whitespace is kept as it is (runs of spaces, newlines, tabs), so
    code and formatted text survive; characters never seen in training become `<unk>` and are
    dropped by `detokenize`, and one leading space is dropped as SentencePiece does.

    Args:
        tokenizer: a `tokenizers.Tokenizer` with a Unigram model (see `train`,
            `from_vocabulary`, `from_file` and `load` for the usual ways to get one).
        **special_tokens: overrides of the special token strings above (see `Tokenizer`).

    Example:

    >>> tokenizer = UnigramTokenizer.train(["translate English to German: the house"] * 10,
    ...                                    vocabulary_size=60)
    >>> tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id
    (0, 1, 2)
    >>> tokenizer.decoder_start_token_id == tokenizer.pad_token_id
    True
    >>> tokenizer.detokenize(tokenizer.tokenize("the German house"))
    'the German house'
    """

    default_special_tokens = _SPECIAL_TOKENS
    model_type = models.Unigram

    @property
    def decoder_start_token_id(self):
        """Id the decoder of a T5 model starts from: the padding token, as in T5."""
        return self.pad_token_id

    @classmethod
    def train(cls, texts, vocabulary_size):
        """Trains a new vocabulary of at most `vocabulary_size` pieces on `texts`.

        Args:
            texts: an iterable of strings (a list, or a generator to stream a large corpus).
            vocabulary_size: the largest number of pieces, special tokens included. It must cover
                the special tokens and every distinct character of `texts`.

        Returns:
            A `UnigramTokenizer` with `<pad>`, `</s>`, `<unk>` as ids 0, 1, 2.
        """
        cls._check_vocabulary_size(vocabulary_size, minimum_size=len(_SPECIAL_TOKENS) + 1)
        backend = _pipeline(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocabulary_size,
            special_tokens=list(_SPECIAL_TOKENS.values()),
            unk_token=_SPECIAL_TOKENS["unk_token"],
            show_progress=False,
        )
        return cls(cls._train_backend(backend, trainer, texts, vocabulary_size))

    @classmethod
    def from_vocabulary(cls, vocabulary):
        """Builds the tokenizer from SentencePiece-style pieces and scores.

        Args:
            vocabulary: a list of `(piece, log_probability)` pairs; a piece's id is its position.
                It must hold `<pad>`, `</s>` and `<unk>`.

        Returns:
            A `UnigramTokenizer`.
        """
        if not isinstance(vocabulary, (list, tuple)):
            raise ValueError(
                "`vocabulary` must be a list of (piece, score) pairs. Received: vocabulary of "
                f"type {type(vocabulary).__name__}"
            )
        vocabulary = [(str(piece), float(score)) for piece, score in vocabulary]
        pieces = [piece for piece, _ in vocabulary]
        unk_token = _SPECIAL_TOKENS["unk_token"]
        unk_id = pieces.index(unk_token) if unk_token in pieces else None
        return cls(_pipeline(models.Unigram(vocabulary, unk_id=unk_id, byte_fallback=False)))


def _pipeline(model):
    """Wraps a Unigram `model` in the NFKC normaliser and SentencePiece's metaspace handling."""
    backend = BackendTokenizer(model)
    backend.normalizer = normalizers.NFKC()
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="always", split=True)
    backend.decoder = decoders.Metaspace(replacement=_SPACE, prepend_scheme="always", split=True)
    return backend
