"""BertClassifier: learning from raw strings, label checks, text pairs, saving (.keras and presets).

Axes: B batch, C classes.
"""

import keras
import numpy as np
import pytest

from keras_transformer.models import BertClassifier, BertTextClassifierPreprocessor
from tests.conftest import to_numpy
from tests.models.bert.conftest import WORDS


def _contains_zebra(rng, n):
    """Texts of random words; label 1 iff "zebra" is one of them (half the texts)."""
    texts, labels = [], []
    for i in range(n):
        words = list(rng.choice(WORDS, rng.integers(4, 11)))
        if i % 2:
            words[rng.integers(len(words))] = "zebra"
        texts.append(" ".join(words))
        labels.append(i % 2)
    return texts, np.array(labels)


def _classifier(tiny_backbone, tokenizer, num_classes=3, **kwargs):
    preprocessor = BertTextClassifierPreprocessor(tokenizer, sequence_length=16)
    return BertClassifier(tiny_backbone(), num_classes, preprocessor=preprocessor, **kwargs)


@pytest.mark.slow
def test_learns_from_raw_strings(tiny_backbone, tokenizer, rng):
    classifier = _classifier(tiny_backbone, tokenizer, num_classes=2, dropout=0.0)
    # Multiples of the batch size: one compiled step, no second one for a ragged last batch.
    texts, labels = _contains_zebra(rng, 640)
    held_out, held_out_labels = _contains_zebra(rng, 320)
    history = classifier.fit(
        texts,
        labels,
        batch_size=32,
        epochs=8,
        verbose=0,  # the default compile
        validation_data=(held_out, held_out_labels),
    )
    accuracy = classifier.evaluate(held_out, held_out_labels, batch_size=32, verbose=0, return_dict=True)["accuracy"]
    print(f"BertClassifier held-out accuracy {accuracy:.3f}")
    assert accuracy >= 0.95, f"held-out accuracy {accuracy:.3f}"
    assert history.history["val_accuracy"][-1] == pytest.approx(accuracy)


def test_labels_are_checked_in_fit(tiny_backbone, tokenizer):
    classifier = _classifier(tiny_backbone, tokenizer, num_classes=3)
    texts = ["apple river", "stone", "cloud green"]
    with pytest.raises(ValueError, match=r"num_classes=3\. Received: label 3"):
        classifier.fit(texts, [0, 3, 1], epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"2 labels for 3 texts"):
        classifier.fit(texts, [0, 1], epochs=1, verbose=0)
    with pytest.raises(ValueError, match=r"num_classes=3\. Received: label -1"):
        classifier.evaluate(texts, [0, -1, 1], verbose=0)
    # Already tokenized inputs: the labels are checked too.
    x, _, _ = classifier.preprocessor(texts)
    with pytest.raises(ValueError, match=r"num_classes=3\. Received: label 7"):
        classifier.fit(x, np.array([7, 0, 1]), epochs=1, verbose=0)


def test_text_pairs_and_logits(tiny_backbone, tokenizer):
    classifier = _classifier(tiny_backbone, tokenizer, num_classes=3)
    pairs = (["apple river", "house"], ["stone", "cloud green"])
    logits = to_numpy(classifier.predict(pairs, verbose=0))
    assert logits.shape == (2, 3) and logits.dtype == np.float32
    swapped = to_numpy(classifier.predict((pairs[1], pairs[0]), verbose=0))
    assert not np.allclose(logits, swapped)  # segment order matters
    x, _, _ = classifier.preprocessor(pairs)
    pooled = to_numpy(classifier.backbone(x)["pooled_output"])
    kernel, bias = (to_numpy(w) for w in classifier.output_dense.weights)
    np.testing.assert_allclose(logits, pooled @ kernel + bias, atol=1e-5)  # dropout is off in predict


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_classes=1), "num_classes=1"),
        (dict(num_classes=2.0), "num_classes=2.0"),
        (dict(num_classes=2, dropout=1.5), "dropout=1.5"),
    ],
)
def test_invalid_arguments(tiny_backbone, kwargs, match):
    with pytest.raises(ValueError, match=match):
        BertClassifier(tiny_backbone(), **kwargs)


def test_config_and_keras_file_round_trip(tiny_backbone, tokenizer, tmp_path):
    classifier = _classifier(tiny_backbone, tokenizer, num_classes=3, dropout=0.25)
    config = classifier.get_config()
    assert config["num_classes"] == 3 and config["dropout"] == 0.25
    classifier.save(tmp_path / "classifier.keras")
    restored = keras.saving.load_model(tmp_path / "classifier.keras")
    assert isinstance(restored, BertClassifier)
    assert restored.num_classes == 3 and restored.dropout == 0.25
    texts = ["apple river", "stone zebra"]
    np.testing.assert_array_equal(
        to_numpy(restored.predict(texts, verbose=0)), to_numpy(classifier.predict(texts, verbose=0))
    )


def test_preset_round_trip_and_new_head(tiny_backbone, tokenizer, tmp_path):
    classifier = _classifier(tiny_backbone, tokenizer, num_classes=3)
    classifier.save_to_preset(tmp_path / "preset")
    texts = ["apple river", "stone zebra"]
    expected = to_numpy(classifier.predict(texts, verbose=0))
    restored = BertClassifier.from_preset(tmp_path / "preset")
    assert restored.num_classes == 3
    np.testing.assert_array_equal(to_numpy(restored.predict(texts, verbose=0)), expected)
    # Another number of classes: a new head on the saved backbone.
    five = BertClassifier.from_preset(tmp_path / "preset", num_classes=5)
    assert to_numpy(five.predict(texts, verbose=0)).shape == (2, 5)
    x, _, _ = classifier.preprocessor(texts)
    np.testing.assert_array_equal(
        to_numpy(five.backbone(x)["pooled_output"]), to_numpy(classifier.backbone(x)["pooled_output"])
    )
