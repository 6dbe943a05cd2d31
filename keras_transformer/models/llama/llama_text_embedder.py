"""LlamaTextEmbedder: sentence embeddings from a Llama-style decoder (Qwen3-Embedding: the last token's state).

Axes: B batch, T sequence length, D model width.
"""

import keras

from keras_transformer.models.llama.llama_backbone import LlamaBackbone
from keras_transformer.models.text_embedder import TextEmbedder
from keras_transformer.models.text_embedder_preprocessor import TextEmbedderPreprocessor

__all__ = ["LlamaTextEmbedder"]


@keras.saving.register_keras_serializable(package="keras_transformer")
class LlamaTextEmbedder(TextEmbedder):
    """A `TextEmbedder` over a `LlamaBackbone`: each text with its tokenizer's special tokens, the final norm's
    states pooled.

    A decoder's last real token has attended to the whole text, so "last_token" is the pooling of decoder
    embedders (Qwen3-Embedding, whose tokenizer appends `<|endoftext|>` for it to read); "mean" and "cls" work too.

    Args:
        backbone: a `LlamaBackbone`.
        preprocessor: a `TextEmbedderPreprocessor` or None.
        pooling: "last_token" (the default here), "mean" or "cls".
        normalize: bool, L2-normalise the embeddings.

    Inputs: {"token_ids", "padding_mask"}, each (B, T).
    Outputs: embeddings (B, D) float32.

    Example:
    >>> from keras_transformer.tokenizers import BytePairTokenizer
    >>> texts = ["a good film", "a great movie", "the cat sat", "a cat was sitting"]
    >>> tokenizer = BytePairTokenizer.train(texts * 10, vocabulary_size=300)
    >>> backbone = LlamaBackbone(tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=16,
    ...                          intermediate_dim=32, tie_word_embeddings=True)
    >>> embedder = LlamaTextEmbedder(backbone, TextEmbedderPreprocessor(tokenizer, sequence_length=16))
    >>> embedder.predict(texts, verbose=0).shape
    (4, 16)
    >>> history = embedder.fit((texts[::2], texts[1::2]), batch_size=2, epochs=1, verbose=0)
    """

    backbone_cls = LlamaBackbone
    preprocessor_cls = TextEmbedderPreprocessor

    def __init__(self, backbone, preprocessor=None, pooling="last_token", normalize=True, **kwargs):
        super().__init__(backbone, preprocessor, pooling=pooling, normalize=normalize, **kwargs)
        if not backbone.tie_word_embeddings:
            # An untied output head does not reach the embeddings: frozen, so `fit` has no gradient-less variable.
            backbone.token_embedding.reverse_embeddings.trainable = False
