"""BertMaskedLM: a BERT backbone with the masked-language-model head (Hugging Face `cls.predictions`).

Axes: B batch, T sequence length, P masked positions, D model width, V vocabulary.
"""

import keras
from keras import ops

from keras_transformer.models.bert.bert_backbone import BertBackbone
from keras_transformer.models.bert.bert_masked_lm_preprocessor import BertMaskedLMPreprocessor
from keras_transformer.models.masked_lm import MaskedLM, OutputBias


@keras.saving.register_keras_serializable(package="keras_transformer")
class BertMaskedLM(MaskedLM):
    """Predict the original tokens at the masked positions of a BERT input.

    The head is BERT's: the hidden states at `mask_positions` go through
    Dense(D, gelu) (`mlm_dense`), LayerNorm (`mlm_layer_norm`), then the
    transposed token embedding (tied weights) plus a bias over the vocabulary
    (`mlm_output_bias`).

    Args:
        backbone: a `BertBackbone`.
        preprocessor: a `BertMaskedLMPreprocessor` or None (then inputs are id arrays).

    Inputs:
        The backbone's inputs plus "mask_positions": (B, P) int32.

    Outputs:
        logits (B, P, V) float32.

    Example:
    >>> from keras_transformer.tokenizers import WordPieceTokenizer
    >>> texts = ["the quick brown fox jumps over the lazy dog"] * 8
    >>> tokenizer = WordPieceTokenizer.train(texts, vocabulary_size=60)
    >>> backbone = BertBackbone(tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=16,
    ...                         intermediate_dim=32, max_sequence_length=32)
    >>> lm = BertMaskedLM(backbone, preprocessor=BertMaskedLMPreprocessor(tokenizer, sequence_length=32))
    >>> history = lm.fit(texts, epochs=1, verbose=0)  # masks 15% of the tokens, predicts them
    """

    backbone_cls = BertBackbone
    preprocessor_cls = BertMaskedLMPreprocessor

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
            backbone.hidden_dim, activation="gelu", kernel_initializer=initializer, dtype=dtype, name="mlm_dense"
        )
        self.mlm_layer_norm = keras.layers.LayerNormalization(
            epsilon=backbone.norm_epsilon, dtype=dtype, name="mlm_layer_norm"
        )
        self.mlm_output_bias = _OutputBias(dtype=dtype, name="mlm_output_bias")

        # === Functional model ===
        inputs = {**backbone.input, "mask_positions": keras.Input(shape=(None,), dtype="int32", name="mask_positions")}
        sequence = backbone({k: inputs[k] for k in backbone.input})["sequence_output"]  # (B, T, D)
        positions = ops.expand_dims(inputs["mask_positions"], axis=-1)  # (B, P) -> (B, P, 1)
        x = ops.take_along_axis(sequence, positions, axis=1)  # (B, T, D) -> (B, P, D)
        x = self.mlm_layer_norm(self.mlm_dense(x))
        logits = backbone.token_embedding(x, reverse=True)  # (B, P, D) -> (B, P, V)
        logits = self.mlm_output_bias(logits)
        super().__init__(inputs=inputs, outputs=ops.cast(logits, "float32"), **kwargs)


class _OutputBias(OutputBias):
    """The shared `OutputBias` under this file's former class name: Keras files a layer's weights in a saved
    .weights.h5 under its class name, and the shipped presets (bert_stdlib) hold this bias as `_output_bias`."""
