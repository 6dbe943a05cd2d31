"""ModernBertTextEmbedder: sentence embeddings from a ModernBERT encoder (e.g. modernbert-embed: mean pooling).

Axes: B batch, T sequence length, D model width.
"""

import keras

from keras_transformer.models.modernbert.modernbert_backbone import ModernBertBackbone
from keras_transformer.models.text_embedder import TextEmbedder
from keras_transformer.models.text_embedder_preprocessor import TextEmbedderPreprocessor

__all__ = ["ModernBertTextEmbedder"]


@keras.saving.register_keras_serializable(package="keras_transformer")
class ModernBertTextEmbedder(TextEmbedder):
    """A `TextEmbedder` over a `ModernBertBackbone`: each text with its tokenizer's special tokens (ModernBERT's
    `[CLS] text [SEP]`), the final norm's states pooled.

    Args:
        backbone: a `ModernBertBackbone`.
        preprocessor: a `TextEmbedderPreprocessor` or None.
        pooling: "mean" (sentence-transformers' default), "cls" or "last_token".
        normalize: bool, L2-normalise the embeddings.

    Inputs: {"token_ids", "padding_mask"}, each (B, T).
    Outputs: embeddings (B, D) float32.

    Example:
    >>> import numpy as np
    >>> backbone = ModernBertBackbone(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=16,
    ...                               intermediate_dim=24, local_attention=4)
    >>> embedder = ModernBertTextEmbedder(backbone)
    >>> x = {"token_ids": np.ones((2, 6), "int32"), "padding_mask": np.ones((2, 6), bool)}
    >>> keras.ops.shape(embedder(x))
    (2, 16)
    """

    backbone_cls = ModernBertBackbone
    preprocessor_cls = TextEmbedderPreprocessor
