"""BertTextEmbedder: sentence embeddings from a BERT backbone (all-MiniLM-L6-v2, BGE).

Axes: B batch, D model width.
"""

import keras

from keras_transformer.models.bert.bert_backbone import BertBackbone
from keras_transformer.models.bert.bert_text_classifier_preprocessor import BertTextClassifierPreprocessor
from keras_transformer.models.text_embedder import TextEmbedder


@keras.saving.register_keras_serializable(package="keras_transformer")
class BertTextEmbedder(TextEmbedder):
    """A `TextEmbedder` over a `BertBackbone`: texts packed as `[CLS] text [SEP]`, the last layer's states pooled.

    Args:
        backbone: a `BertBackbone`.
        preprocessor: a `BertTextClassifierPreprocessor` (its labels unused) or None.
        pooling: "mean" (sentence-transformers' default), "cls" or "last_token".
        normalize: bool, L2-normalise the embeddings.

    Inputs: {"token_ids", "segment_ids", "padding_mask"}, each (B, T).
    Outputs: embeddings (B, D) float32.

    Example:
    >>> from keras_transformer.tokenizers import WordPieceTokenizer
    >>> texts = ["a good film", "a great movie", "the cat sat", "a cat was sitting"]
    >>> tokenizer = WordPieceTokenizer.train(texts * 10, vocabulary_size=60)
    >>> backbone = BertBackbone(tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=16,
    ...                         intermediate_dim=32, max_sequence_length=16)
    >>> embedder = BertTextEmbedder(backbone, BertTextClassifierPreprocessor(tokenizer, sequence_length=16))
    >>> embedder.predict(texts, verbose=0).shape
    (4, 16)
    >>> history = embedder.fit((texts[::2], texts[1::2]), batch_size=2, epochs=1, verbose=0)
    """

    backbone_cls = BertBackbone
    preprocessor_cls = BertTextClassifierPreprocessor

    def __init__(self, backbone, preprocessor=None, pooling="mean", normalize=True, **kwargs):
        super().__init__(backbone, preprocessor, pooling=pooling, normalize=normalize, **kwargs)
        # The pooler ([CLS] -> dense -> tanh) does not reach the embeddings: frozen, so `fit` has no
        # gradient-less variables to warn about (sentence-transformers leaves it unused too).
        backbone.pooled_dense.trainable = False
