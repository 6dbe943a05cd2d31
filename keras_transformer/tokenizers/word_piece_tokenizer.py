"""WordPieceTokenizer: BERT's lowercasing WordPiece tokenizer."""

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from keras_transformer.tokenizers.tokenizer import Tokenizer

_SPECIAL_TOKENS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}


class WordPieceTokenizer(Tokenizer):
    """BERT's WordPiece tokenizer.

    Text is normalised as BERT does (`BertNormalizer`: control characters removed, whitespace
    unified, CJK characters spaced out, and, with `lowercase=True`, lowercased with accents
    stripped), split on whitespace and punctuation (`BertPreTokenizer`), and each word is cut into
    the longest vocabulary pieces, continuation pieces carrying the `##` prefix. Special tokens:
    `[PAD]` (id 0 in a trained vocabulary), `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`.

    The round trip is lossy by design: `detokenize(tokenize(text))` is the normalised text with
    words and punctuation marks separated by single spaces (`"Hello, World!"` ->
    `"hello , world !"`), and words with a character the vocabulary lacks come back as nothing
    (they are `[UNK]`, a special token).

    Args:
        tokenizer: a `tokenizers.Tokenizer` with a WordPiece model (see `train`,
            `from_vocabulary`, `from_file` and `load` for the usual ways to get one).
        **special_tokens: overrides of the special token strings above (see `Tokenizer`).

    Example:

    >>> tokenizer = WordPieceTokenizer.train(
    ...     ["The quick brown fox jumps over the lazy dog."] * 10, vocabulary_size=100)
    >>> tokenizer.pad_token_id, tokenizer.bos_token_id
    (0, None)
    >>> tokenizer.detokenize(tokenizer.tokenize("The lazy fox."))
    'the lazy fox .'
    """

    default_special_tokens = _SPECIAL_TOKENS
    model_type = models.WordPiece

    @classmethod
    def train(cls, texts, vocabulary_size, *, lowercase=True):
        """Trains a new vocabulary of at most `vocabulary_size` tokens on `texts`.

        Args:
            texts: an iterable of strings (a list, or a generator to stream a large corpus).
            vocabulary_size: the largest number of tokens, special tokens included. It must cover
                the special tokens and every distinct character of `texts` (twice: as a word start
                and as a `##` continuation).
            lowercase: whether to lowercase and strip accents (BERT "uncased").

        Returns:
            A `WordPieceTokenizer` with `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]` as ids 0 to 4.
        """
        cls._check_vocabulary_size(vocabulary_size, minimum_size=len(_SPECIAL_TOKENS) + 1)
        backend = _pipeline(models.WordPiece(unk_token="[UNK]"), lowercase)
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocabulary_size,
            special_tokens=list(_SPECIAL_TOKENS.values()),
            continuing_subword_prefix="##",
            show_progress=False,
        )
        return cls(cls._train_backend(backend, trainer, texts, vocabulary_size))

    @classmethod
    def from_vocabulary(cls, vocabulary, *, lowercase=True):
        """Builds the tokenizer from a vocabulary, e.g. the lines of a BERT `vocab.txt`.

        Args:
            vocabulary: a list of tokens (a token's id is its position) or a dict token -> id.
                It must hold the special tokens `[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`.
            lowercase: whether to lowercase and strip accents (BERT "uncased").

        Returns:
            A `WordPieceTokenizer`.
        """
        if isinstance(vocabulary, (list, tuple)):
            vocabulary = {token: index for index, token in enumerate(vocabulary)}
        if not isinstance(vocabulary, dict):
            raise ValueError(
                "`vocabulary` must be a list of tokens or a dict token -> id. Received: "
                f"vocabulary of type {type(vocabulary).__name__}"
            )
        model = models.WordPiece(vocabulary, unk_token="[UNK]", continuing_subword_prefix="##")
        return cls(_pipeline(model, lowercase))


def _pipeline(model, lowercase):
    """Wraps a WordPiece `model` in BERT's normaliser, pre-tokenizer and decoder."""
    backend = BackendTokenizer(model)
    backend.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # cleanup=False: the decoder's "cleanup" rewrites text (" do not" -> " don't"), so we keep
    # the plain, predictable form: pieces joined, words separated by one space.
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return backend
