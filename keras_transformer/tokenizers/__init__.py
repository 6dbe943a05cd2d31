"""Tokenizers: thin wrappers over the Hugging Face `tokenizers` library."""

from keras_transformer.tokenizers.byte_pair_tokenizer import BytePairTokenizer
from keras_transformer.tokenizers.tokenizer import Tokenizer
from keras_transformer.tokenizers.unigram_tokenizer import UnigramTokenizer
from keras_transformer.tokenizers.word_piece_tokenizer import WordPieceTokenizer

__all__ = ["BytePairTokenizer", "Tokenizer", "UnigramTokenizer", "WordPieceTokenizer"]
