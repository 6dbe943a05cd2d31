"""BertTextClassifierPreprocessor: single texts and pairs, truncation, label checks.

Axes: B batch, T sequence length.
"""

import numpy as np
import pytest

from keras_transformer.models import BertTextClassifierPreprocessor


def test_single_texts(tokenizer):
    x, y, weights = BertTextClassifierPreprocessor(tokenizer, sequence_length=6)(["apple river", "house"], [1, 0])
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    apple, river, house = (tokenizer.token_to_id(w) for w in ("apple", "river", "house"))
    np.testing.assert_array_equal(
        x["token_ids"], [[cls, apple, river, sep, pad, pad], [cls, house, sep, pad, pad, pad]]
    )
    np.testing.assert_array_equal(x["segment_ids"], np.zeros((2, 6)))
    np.testing.assert_array_equal(x["padding_mask"], [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    assert x["token_ids"].dtype == np.int32 and x["padding_mask"].dtype == bool
    assert y.dtype == np.int32 and y.tolist() == [1, 0] and weights is None


def test_pairs(tokenizer):
    preprocessor = BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    x, y, _ = preprocessor((["apple river", "house"], ["stone", "cloud green"]), np.array([0, 1]))
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    ids = {w: tokenizer.token_to_id(w) for w in ("apple", "river", "house", "stone", "cloud", "green")}
    np.testing.assert_array_equal(
        x["token_ids"],
        [
            [cls, ids["apple"], ids["river"], sep, ids["stone"], sep, pad, pad],
            [cls, ids["house"], sep, ids["cloud"], ids["green"], sep, pad, pad],
        ],
    )
    np.testing.assert_array_equal(x["segment_ids"], [[0, 0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(x["padding_mask"].sum(axis=1), [6, 6])
    with pytest.raises(ValueError, match="same length"):
        preprocessor((["apple", "river"], ["stone"]))


def test_truncation_longest_first(tokenizer):
    a = "apple river stone cloud green"  # 5 tokens
    b = "house dance"  # 2 tokens
    with pytest.raises(ValueError, match="5 \\+ 2 tokens"):
        BertTextClassifierPreprocessor(tokenizer, sequence_length=8)(([a], [b]))
    x, _, _ = BertTextClassifierPreprocessor(tokenizer, sequence_length=8, truncate=True)(([a], [b]))
    # 8 - 3 special tokens = 5 left: the longer first text is cut to 3, the pair keeps its 2.
    expected = (
        [tokenizer.cls_token_id]
        + tokenizer.tokenize(a)[:3]
        + [tokenizer.sep_token_id]
        + tokenizer.tokenize(b)
        + [tokenizer.sep_token_id]
    )
    np.testing.assert_array_equal(x["token_ids"][0], expected)
    np.testing.assert_array_equal(x["segment_ids"][0], [0, 0, 0, 0, 0, 1, 1, 1])


def test_label_checks(tokenizer):
    preprocessor = BertTextClassifierPreprocessor(tokenizer, sequence_length=8)
    texts = ["apple", "river", "stone"]
    with pytest.raises(ValueError, match=r"num_classes=3\. Received: label 3"):
        preprocessor(texts, [0, 1, 3], num_classes=3)
    with pytest.raises(ValueError, match="Received: label -1"):
        preprocessor(texts, [0, -1, 1])
    with pytest.raises(ValueError, match="2 labels for 3 texts"):
        preprocessor(texts, [0, 1])
    with pytest.raises(ValueError, match="integers"):
        preprocessor(texts, [0.5, 1, 0])
    with pytest.raises(ValueError, match="one per example"):
        preprocessor(texts, [0, 1, 1], sample_weight=[1.0])
    _, y, weights = preprocessor(texts, [[0.0], [2.0], [1.0]], sample_weight=[1, 2, 3], num_classes=3)
    assert y.tolist() == [0, 2, 1] and y.dtype == np.int32
    assert weights.tolist() == [1.0, 2.0, 3.0] and weights.dtype == np.float32
    _, y, weights = preprocessor(texts, [0, 1, 9], predict=True)  # labels are ignored when predicting
    assert y is None and weights is None


def test_invalid_arguments_and_config(tokenizer):
    with pytest.raises(ValueError, match="sequence_length"):
        BertTextClassifierPreprocessor(tokenizer, sequence_length=0)
    with pytest.raises(ValueError, match="special tokens"):
        BertTextClassifierPreprocessor(tokenizer, sequence_length=2)((["apple"], ["river"]))
    preprocessor = BertTextClassifierPreprocessor(tokenizer, sequence_length=20, truncate=True)
    restored = BertTextClassifierPreprocessor.from_config(preprocessor.get_config(), tokenizer=tokenizer)
    assert restored.get_config() == {"sequence_length": 20, "truncate": True}
