"""Fixtures of the BERT tests: a small WordPiece tokenizer trained on a generated corpus, tiny backbones."""

import numpy as np
import pytest

from keras_transformer.models import BertBackbone
from keras_transformer.tokenizers import WordPieceTokenizer

WORDS = ["apple", "river", "stone", "cloud", "green", "music", "paper", "light", "table", "house", "dance", "smile"]


def generated_corpus(n, seed=0, min_words=3, max_words=12):
    """`n` texts of random words from WORDS (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(min_words, max_words + 1))) for _ in range(n)]


@pytest.fixture(scope="session")
def tokenizer():
    # Every word of WORDS (and "zebra", the classifier's target word) is one token.
    return WordPieceTokenizer.train(generated_corpus(200) + ["zebra"] * 20, vocabulary_size=100)


@pytest.fixture
def tiny_backbone(tokenizer):
    """A BertBackbone factory. The BERT tests share these shapes: JAX compiles each new shape once."""

    def build(**kwargs):
        options = dict(
            vocabulary_size=tokenizer.vocabulary_size,
            num_layers=2,
            num_heads=2,
            hidden_dim=16,
            intermediate_dim=32,
            max_sequence_length=32,
        )
        return BertBackbone(**{**options, **kwargs})

    return build
