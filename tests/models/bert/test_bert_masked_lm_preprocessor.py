"""BertMaskedLMPreprocessor: packing, the masking statistics of BERT pre-training, determinism, errors.

Axes: B batch, T sequence length, P selections per sequence.
"""

import numpy as np
import pytest

from keras_transformer.models import BertMaskedLMPreprocessor
from tests.models.bert.conftest import generated_corpus


def _plain_ids(tokenizer, texts, length):
    """[CLS] ids [SEP], padded: what the model would see with no masking (independent of the code under test)."""
    rows = []
    for ids in tokenizer.tokenize(texts):
        row = [tokenizer.cls_token_id] + ids + [tokenizer.sep_token_id]
        rows.append(row + [tokenizer.pad_token_id] * (length - len(row)))
    return np.array(rows)


def test_packing_labels_and_weights(tokenizer):
    texts = ["apple river stone cloud green music paper", "house"]
    preprocessor = BertMaskedLMPreprocessor(
        tokenizer, sequence_length=12, mask_token_rate=0.0, random_token_rate=0.0, seed=0
    )  # selected tokens stay unchanged
    x, y, weights = preprocessor(texts)
    expected = _plain_ids(tokenizer, texts, 12)
    np.testing.assert_array_equal(x["token_ids"], expected)
    np.testing.assert_array_equal(x["segment_ids"], np.zeros((2, 12)))
    np.testing.assert_array_equal(x["padding_mask"], expected != tokenizer.pad_token_id)
    assert x["token_ids"].dtype == np.int32 and x["segment_ids"].dtype == np.int32
    assert x["padding_mask"].dtype == bool and x["mask_positions"].dtype == np.int32
    assert y.dtype == np.int32 and weights.dtype == np.float32
    # P = round(0.15 * 12) = 2 slots; 7 words -> round(1.05) = 1 selection, 1 word -> max(1, 0) = 1.
    assert x["mask_positions"].shape == y.shape == weights.shape == (2, 2)
    np.testing.assert_array_equal(weights, [[1.0, 0.0], [1.0, 0.0]])
    assert 1 <= x["mask_positions"][0, 0] <= 7 and x["mask_positions"][1, 0] == 1
    np.testing.assert_array_equal(y[:, 0], expected[[0, 1], x["mask_positions"][:, 0]])
    # Unused slots: position 0, label = padding id.
    np.testing.assert_array_equal(x["mask_positions"][:, 1], [0, 0])
    np.testing.assert_array_equal(y[:, 1], [tokenizer.pad_token_id] * 2)
    x_predict, y_predict, w_predict = preprocessor(texts, predict=True)
    assert y_predict is None and w_predict is None and set(x_predict) == set(x)


def test_masking_statistics_on_a_large_batch(tokenizer):
    length = 64
    texts = generated_corpus(3000, seed=1, min_words=30, max_words=62)
    preprocessor = BertMaskedLMPreprocessor(tokenizer, sequence_length=length, seed=7)
    x, y, weights = preprocessor(texts)
    original = _plain_ids(tokenizer, texts, length)
    special = np.isin(original, [tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id])
    selected = np.zeros_like(original, dtype=bool)
    rows = np.repeat(np.arange(len(texts))[:, None], y.shape[1], axis=1)
    real = weights == 1.0
    selected[rows[real], x["mask_positions"][real]] = True

    # Selection: 15% of the ordinary tokens of each text, never a special token, never twice.
    candidates = (~special).sum(axis=1)
    assert np.array_equal(real.sum(axis=1), np.maximum(1, np.round(0.15 * candidates)))
    assert abs(selected.sum() / (~special).sum() - 0.15) < 0.01
    assert not np.any(selected & special)
    assert np.array_equal(selected.sum(axis=1), real.sum(axis=1))  # distinct positions
    np.testing.assert_array_equal(y[real], original[rows[real], x["mask_positions"][real]])

    # Of the selected tokens: 80% [MASK], 10% a random ordinary token, 10% unchanged.
    shown = x["token_ids"][selected]
    truth = original[selected]
    masked = shown == tokenizer.mask_token_id
    unchanged = shown == truth
    randomised = ~masked & ~unchanged
    assert abs(masked.mean() - 0.8) < 0.015
    assert abs(randomised.mean() - 0.1) < 0.015
    assert abs(unchanged.mean() - 0.1) < 0.015
    special_ids = [
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        tokenizer.mask_token_id,
    ]
    assert not np.any(np.isin(shown[randomised], special_ids))
    assert len(np.unique(shown[randomised])) > 20  # spread over the vocabulary
    # Nothing else changes.
    np.testing.assert_array_equal(x["token_ids"][~selected], original[~selected])


def test_special_tokens_in_the_text_are_never_selected(tokenizer):
    # "[MASK]" in the text is the mask token; "xyz" has letters the vocabulary lacks: [UNK].
    texts = ["apple [MASK] xyz river"] * 200
    preprocessor = BertMaskedLMPreprocessor(
        tokenizer, sequence_length=8, mask_selection_rate=1.0, mask_token_rate=0.0, random_token_rate=0.0, seed=0
    )
    x, y, weights = preprocessor(texts)
    ids = _plain_ids(tokenizer, texts[:1], 8)[0]
    assert tokenizer.mask_token_id in ids and tokenizer.unk_token_id in ids
    ordinary = {1, 4}  # apple, river
    assert {int(p) for p, w in zip(x["mask_positions"].ravel(), weights.ravel()) if w} == ordinary
    assert weights.sum(axis=1).tolist() == [2.0] * 200


def test_text_of_special_tokens_has_no_selection(tokenizer):
    x, y, weights = BertMaskedLMPreprocessor(tokenizer, sequence_length=8, seed=0)(["[SEP]", "apple"])
    np.testing.assert_array_equal(weights[0], 0.0)
    assert weights[1].sum() == 1.0
    with pytest.raises(ValueError, match="empty string at index 0"):  # see the README's "Bad input"
        BertMaskedLMPreprocessor(tokenizer, sequence_length=8, seed=0)(["", "apple"])


def test_max_selections_caps_the_slots(tokenizer):
    texts = generated_corpus(50, min_words=20, max_words=30)
    x, y, weights = BertMaskedLMPreprocessor(tokenizer, sequence_length=32, max_selections=2, seed=0)(texts)
    assert x["mask_positions"].shape == (50, 2)
    np.testing.assert_array_equal(weights, 1.0)  # round(0.15 * 20) = 3 > 2: every row is capped


def test_determinism_with_a_seed(tokenizer):
    texts = generated_corpus(64)

    def run(seed, calls=1):
        preprocessor = BertMaskedLMPreprocessor(tokenizer, sequence_length=16, seed=seed)
        return [preprocessor(texts) for _ in range(calls)]

    (x1, y1, w1), (x1b, _, _) = run(3, calls=2)
    [(x2, y2, w2)] = run(3)
    [(x3, _, _)] = run(4)
    for key in x1:
        np.testing.assert_array_equal(x1[key], x2[key])
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(w1, w2)
    assert not np.array_equal(x1["mask_positions"], x3["mask_positions"])
    assert not np.array_equal(x1["mask_positions"], x1b["mask_positions"])  # each call draws new masks


def test_too_long_text_is_an_error_unless_truncate(tokenizer):
    text = "apple river stone cloud green music paper light"  # 8 tokens + 2 special > 6
    with pytest.raises(ValueError, match="sequence_length=6"):
        BertMaskedLMPreprocessor(tokenizer, sequence_length=6)([text])
    x, _, _ = BertMaskedLMPreprocessor(
        tokenizer, sequence_length=6, truncate=True, mask_token_rate=0.0, random_token_rate=0.0
    )([text])
    expected = [tokenizer.cls_token_id] + tokenizer.tokenize(text)[:4] + [tokenizer.sep_token_id]
    np.testing.assert_array_equal(x["token_ids"][0], expected)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mask_selection_rate=0.0), "mask_selection_rate"),
        (dict(mask_selection_rate=1.5), "mask_selection_rate"),
        (dict(mask_token_rate=-0.1), "mask_token_rate"),
        (dict(random_token_rate=2.0), "random_token_rate"),
        (dict(mask_token_rate=0.8, random_token_rate=0.3), "at most 1"),
        (dict(max_selections=0), "max_selections"),
        (dict(seed="x"), "seed"),
        (dict(sequence_length=1), "sequence_length"),
    ],
)
def test_invalid_arguments(tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        BertMaskedLMPreprocessor(tokenizer, **kwargs)


def test_labels_are_refused(tokenizer):
    with pytest.raises(ValueError, match="learns from the text itself"):
        BertMaskedLMPreprocessor(tokenizer)(["apple"], [1])
    with pytest.raises(ValueError, match="must contain strings"):
        BertMaskedLMPreprocessor(tokenizer)([1, 2])


def test_config_round_trip(tokenizer):
    preprocessor = BertMaskedLMPreprocessor(
        tokenizer,
        sequence_length=20,
        mask_selection_rate=0.3,
        mask_token_rate=0.5,
        random_token_rate=0.2,
        max_selections=5,
        seed=11,
        truncate=True,
    )
    restored = BertMaskedLMPreprocessor.from_config(preprocessor.get_config(), tokenizer=tokenizer)
    assert restored.get_config() == preprocessor.get_config()
    texts = generated_corpus(8)
    for a, b in zip(preprocessor(texts)[0].values(), restored(texts)[0].values()):
        np.testing.assert_array_equal(a, b)
