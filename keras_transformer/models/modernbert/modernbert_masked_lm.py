"""ModernBertMaskedLM: a ModernBERT backbone with its masked-language-model head (Hugging Face `head` and `decoder`).

Axes: B batch, T sequence length, P masked positions, D model width, V vocabulary.
"""

import keras
from keras import ops

from keras_transformer.models.masked_lm import MaskedLM, OutputBias
from keras_transformer.models.modernbert.modernbert_backbone import ModernBertBackbone
from keras_transformer.models.modernbert.modernbert_masked_lm_preprocessor import ModernBertMaskedLMPreprocessor


@keras.saving.register_keras_serializable(package="keras_transformer")
class ModernBertMaskedLM(MaskedLM):
    """Predict the original tokens at the masked positions of a ModernBERT input.

    The head is ModernBERT's: the hidden states at `mask_positions` go through Dense(D, exact gelu) without a bias
    (`mlm_dense`), a LayerNorm without a bias (`mlm_layer_norm`), then the transposed token embedding (tied weights)
    plus a bias over the vocabulary (`mlm_output_bias`).

    Args:
        backbone: a `ModernBertBackbone`.
        preprocessor: a `ModernBertMaskedLMPreprocessor` or None (then inputs are id arrays).

    Inputs:
        The backbone's inputs plus "mask_positions": (B, P) int32.

    Outputs:
        logits (B, P, V) float32.

    Example:
    >>> from keras_transformer.tokenizers import WordPieceTokenizer
    >>> texts = ["the quick brown fox jumps over the lazy dog"] * 8
    >>> tokenizer = WordPieceTokenizer.train(texts, vocabulary_size=60)
    >>> backbone = ModernBertBackbone(tokenizer.vocabulary_size, num_layers=3, num_heads=2, hidden_dim=16,
    ...                               intermediate_dim=32, max_sequence_length=32, local_attention=4)
    >>> preprocessor = ModernBertMaskedLMPreprocessor(tokenizer, sequence_length=32)
    >>> lm = ModernBertMaskedLM(backbone, preprocessor=preprocessor)
    >>> history = lm.fit(texts, epochs=1, verbose=0)  # masks 15% of the tokens, predicts them
    """

    backbone_cls = ModernBertBackbone
    preprocessor_cls = ModernBertMaskedLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        if preprocessor is not None and preprocessor.sequence_length > backbone.max_sequence_length:
            raise ValueError(
                f"The preprocessor's sequence_length={preprocessor.sequence_length} is longer than the "
                f"backbone's max_sequence_length={backbone.max_sequence_length}."
            )
        dtype = backbone.token_embedding.dtype_policy  # the backbone layers' policy (a functional model keeps none)
        initializer = keras.initializers.TruncatedNormal(stddev=backbone.initializer_range)

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.mlm_dense = keras.layers.Dense(
            backbone.hidden_dim,
            activation="gelu",
            use_bias=False,
            kernel_initializer=initializer,
            dtype=dtype,
            name="mlm_dense",
        )
        self.mlm_layer_norm = keras.layers.LayerNormalization(
            epsilon=backbone.norm_epsilon, center=False, dtype=dtype, name="mlm_layer_norm"
        )
        self.mlm_output_bias = OutputBias(dtype=dtype, name="mlm_output_bias")

        # === Functional model ===
        inputs = {**backbone.input, "mask_positions": keras.Input(shape=(None,), dtype="int32", name="mask_positions")}
        sequence = backbone({k: inputs[k] for k in backbone.input})["sequence_output"]  # (B, T, D)
        positions = ops.expand_dims(inputs["mask_positions"], axis=-1)  # (B, P) -> (B, P, 1)
        x = ops.take_along_axis(sequence, positions, axis=1)  # (B, T, D) -> (B, P, D)
        x = self.mlm_layer_norm(self.mlm_dense(x))
        logits = backbone.token_embedding(x, reverse=True)  # (B, P, D) -> (B, P, V)
        logits = self.mlm_output_bias(logits)
        super().__init__(inputs=inputs, outputs=ops.cast(logits, "float32"), **kwargs)
