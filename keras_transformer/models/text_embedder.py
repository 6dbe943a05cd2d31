"""TextEmbedder: the task base of sentence embedders (one vector per text, for retrieval and semantic search).

Axes: B batch, T sequence length, D model width.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.models.raw_inputs import first_leaf_is_text
from keras_transformer.models.task import Task

POOLINGS = ("mean", "cls", "last_token")


class TextEmbedder(Task):
    """Texts -> embeddings (B, D) float32: the backbone's hidden states pooled, then optionally L2-normalised.

    The poolings are sentence-transformers' own: "mean" (the mean of the real tokens' states; all-MiniLM-L6-v2),
    "cls" (the first token's state; BGE) and "last_token" (the last real token's state; Qwen3-Embedding).
    A sentence-transformers folder (modules.json, 1_Pooling/config.json, a Normalize module) converts to
    these settings.

    `predict(list_of_strings)` returns (N, D) float32. `fit((anchors, positives))` trains on pairs of texts
    with the in-batch contrastive loss of sentence-transformers' MultipleNegativesRankingLoss: each
    anchor's positive against every other positive of its batch (`MultipleNegativesRankingLoss` below).
    Subclasses name their `backbone_cls` and `preprocessor_cls` (a preprocessor that packs single texts).

    Args:
        backbone: a backbone whose outputs are hidden states (B, T, D), or a dict holding them under
            "sequence_output" (BERT).
        preprocessor: the family's text preprocessor, or None (then inputs are id arrays).
        pooling: "mean", "cls" or "last_token".
        normalize: bool, L2-normalise the pooled vectors (cosine similarity is then a dot product).
    """

    output_name = "embeddings"  # what an exported graph calls the output (the bundle server's /v1/embeddings)

    def __init__(self, backbone, preprocessor=None, pooling="mean", normalize=True, **kwargs):
        if pooling not in POOLINGS:
            raise ValueError(f"`pooling` must be one of {POOLINGS}. Received: pooling={pooling!r}")
        if not isinstance(normalize, bool):
            raise ValueError(f"`normalize` must be a bool. Received: normalize={normalize!r}")
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor

        # === Functional model ===
        inputs = backbone.input
        outputs = backbone(inputs)
        hidden = outputs["sequence_output"] if isinstance(outputs, dict) else outputs  # (B, T, D)
        embeddings = pool(ops.cast(hidden, "float32"), inputs["padding_mask"], pooling, normalize)  # (B, D)
        super().__init__(inputs=inputs, outputs=embeddings, **kwargs)

        # === Config ===
        self.pooling = pooling
        self.normalize = normalize

    def get_config(self):
        return {**super().get_config(), "pooling": self.pooling, "normalize": self.normalize}

    def compile(self, optimizer="auto", loss="auto", metrics="auto", **kwargs):
        """As `Task.compile`; the default loss is `MultipleNegativesRankingLoss()` and there is no default metric."""
        loss = MultipleNegativesRankingLoss() if loss == "auto" else loss
        super().compile(optimizer=optimizer, loss=loss, metrics=None if metrics == "auto" else metrics, **kwargs)

    def fit(self, x=None, y=None, batch_size=32, epochs=1, shuffle=True, **kwargs):
        """Train on text pairs: `x = (anchors, positives)`, two lists of strings of the same length (no `y`).

        Each batch holds `batch_size` pairs, as one batch of 2 * batch_size texts (the anchors, then their
        positives), so that the loss sees every pair of its batch. Other inputs go to `keras.Model.fit`.
        """
        if not _is_text_pairs(x):
            return super().fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=shuffle, **kwargs)
        if y is not None:
            raise ValueError("A TextEmbedder trains on (anchors, positives) pairs alone: pass no `y`.")
        return super().fit(_PairBatches(self, x, batch_size, shuffle), epochs=epochs, **kwargs)


def pool(hidden, padding_mask, pooling, normalize):
    """hidden (B, T, D) float32, padding_mask (B, T) -> (B, D), as sentence-transformers' Pooling and Normalize."""
    mask = ops.cast(padding_mask, "float32")  # (B, T)
    if pooling == "mean":
        total = ops.sum(hidden * mask[:, :, None], axis=1)  # (B, D)
        pooled = total / ops.maximum(ops.sum(mask, axis=1, keepdims=True), 1e-9)
    elif pooling == "cls":
        pooled = hidden[:, 0]
    else:  # the last real token of each row, whichever side it is padded on
        positions = ops.cumsum(ops.ones_like(mask), axis=1)  # (B, T): 1, 2, ..., T
        # argmax over ints: TensorFlow's float argmax tells -0.0 from 0.0 with bit operations ONNX lacks
        last = ops.cast(ops.argmax(ops.cast(mask * positions, "int32"), axis=1), "int32")  # (B,)
        pooled = ops.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # (B, 1, D) -> (B, D)
    if normalize:
        pooled = l2_normalize(pooled)
    return pooled


def l2_normalize(x):
    """x (B, D) / max(||x||, 1e-12), as torch's `F.normalize` (sentence-transformers' Normalize)."""
    return x / ops.maximum(ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True)), 1e-12)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultipleNegativesRankingLoss(keras.losses.Loss):
    """In-batch contrastive loss of text pairs (sentence-transformers' MultipleNegativesRankingLoss).

    y_pred holds 2b embeddings: b anchors, then their b positives. The logits of anchor i are
    `scale * cos(anchor_i, positive_j)` over the batch's positives j, and the loss is the cross-entropy
    of picking j = i. y_true is ignored.

    Args:
        scale: float, the logits' scale (sentence-transformers' default 20).
    """

    def __init__(self, scale=20.0, name="multiple_negatives_ranking_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.scale = float(scale)

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        half = ops.shape(y_pred)[0] // 2
        unit = l2_normalize(y_pred)
        anchors, positives = unit[:half], unit[half:]  # (b, D) each
        logits = self.scale * ops.matmul(anchors, ops.transpose(positives))  # (b, b)
        labels = ops.arange(half)
        losses = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)  # (b,)
        return ops.concatenate([losses, losses], axis=0)  # one value per row of y_pred: their mean is the loss

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


def _is_text_pairs(x):
    return isinstance(x, tuple) and len(x) == 2 and all(first_leaf_is_text(part) for part in x)


class _PairBatches(keras.utils.PyDataset):
    """(anchors, positives) -> batches of 2b texts (b anchors, then their positives) and a dummy y, which
    `Task.fit` preprocesses as it does any dataset of raw texts."""

    def __init__(self, embedder, pairs, batch_size, shuffle):
        super().__init__()
        anchors, positives = (list(part) for part in pairs)
        if len(anchors) != len(positives) or len(anchors) < 2:
            raise ValueError(
                "`x` must be (anchors, positives): two lists of the same length, at least 2 pairs. "
                f"Received: {len(anchors)} anchors and {len(positives)} positives"
            )
        if embedder.preprocessor is None:
            raise ValueError("Training on text pairs needs a preprocessor; this TextEmbedder has none.")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
            raise ValueError(f"`batch_size` must be an int >= 2 (the in-batch negatives). Received: {batch_size!r}")
        self.anchors, self.positives = anchors, positives
        self.batch_size, self.shuffle = batch_size, shuffle
        self.order = np.arange(len(anchors))
        self.on_epoch_end()

    def __len__(self):
        return int(np.ceil(len(self.anchors) / self.batch_size))

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size : (index + 1) * self.batch_size]
        texts = [self.anchors[i] for i in rows] + [self.positives[i] for i in rows]
        return texts, np.zeros((len(texts),), "int32")

    def on_epoch_end(self):
        if self.shuffle:
            np.random.shuffle(self.order)
