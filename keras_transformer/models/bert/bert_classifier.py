"""BertClassifier: a BERT backbone with a classification head on the pooled [CLS] output.

Axes: B batch, D model width, C classes.
"""

import keras
from keras import ops

from keras_transformer.models.bert.bert_backbone import BertBackbone
from keras_transformer.models.bert.bert_text_classifier_preprocessor import BertTextClassifierPreprocessor
from keras_transformer.models.text_classifier import TextClassifier


@keras.saving.register_keras_serializable(package="keras_transformer")
class BertClassifier(TextClassifier):
    """Classify texts or text pairs: pooled output -> dropout -> Dense(num_classes) logits.

    Trained with plain `fit(texts, labels)` on raw strings when it has a
    preprocessor; labels outside [0, num_classes) are a ValueError. The
    default `compile` uses AdamW with learning rate 1e-3 (suited to the small
    models of this zoo trained from scratch; fine-tuning a large pretrained
    BERT wants about 2e-5 to 5e-5: `compile(optimizer=keras.optimizers.AdamW(5e-5))`),
    sparse categorical cross-entropy from logits, and accuracy.

    Args:
        backbone: a `BertBackbone`.
        num_classes: int, C.
        preprocessor: a `BertTextClassifierPreprocessor` or None (then inputs are id arrays).
        dropout: float in [0, 1), dropout on the pooled output.

    Inputs:
        The backbone's inputs: {"token_ids", "segment_ids", "padding_mask"}, each (B, T).

    Outputs:
        logits (B, C) float32.

    Example:
    >>> from keras_transformer.tokenizers import WordPieceTokenizer
    >>> texts, labels = ["a good film", "a bad film"], [1, 0]
    >>> tokenizer = WordPieceTokenizer.train(texts * 10, vocabulary_size=50)
    >>> backbone = BertBackbone(tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=16,
    ...                         intermediate_dim=32, max_sequence_length=16)
    >>> preprocessor = BertTextClassifierPreprocessor(tokenizer, sequence_length=16)
    >>> classifier = BertClassifier(backbone, num_classes=2, preprocessor=preprocessor)
    >>> history = classifier.fit(texts, labels, epochs=1, verbose=0)
    """

    backbone_cls = BertBackbone
    preprocessor_cls = BertTextClassifierPreprocessor

    def __init__(self, backbone, num_classes, preprocessor=None, dropout=0.1, **kwargs):
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
            raise ValueError(f"`num_classes` must be an int >= 2. Received: num_classes={num_classes!r}")
        if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
            raise ValueError(f"`dropout` must be in [0, 1). Received: dropout={dropout!r}")
        if preprocessor is not None and preprocessor.sequence_length > backbone.max_sequence_length:
            raise ValueError(
                f"The preprocessor's sequence_length={preprocessor.sequence_length} is longer than the "
                f"backbone's max_sequence_length={backbone.max_sequence_length}."
            )
        dtype = backbone.token_embedding.dtype_policy  # the backbone layers' policy (a functional model keeps none)

        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        self.output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")
        self.output_dense = keras.layers.Dense(
            num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=backbone.initializer_range),
            dtype=dtype,
            name="output_dense",
        )

        # === Functional model ===
        inputs = backbone.input
        pooled = backbone(inputs)["pooled_output"]  # (B, D)
        logits = self.output_dense(self.output_dropout(pooled))  # (B, D) -> (B, C)
        super().__init__(inputs=inputs, outputs=ops.cast(logits, "float32"), **kwargs)

        # === Config ===
        self.num_classes = num_classes
        self.dropout = dropout

    def get_config(self):
        return {**super().get_config(), "num_classes": self.num_classes, "dropout": self.dropout}
