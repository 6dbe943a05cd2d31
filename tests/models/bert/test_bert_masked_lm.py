"""BertMaskedLM: the head's gather, saving (.keras and presets), and learning a synthetic pattern.

(Numerical parity with Hugging Face BertForMaskedLM is in test_bert_parity.py.)

Axes: B batch, T sequence length, P masked positions, V vocabulary.
"""

import keras
import numpy as np
import pytest

from keras_transformer.models import BertBackbone, BertMaskedLM, BertMaskedLMPreprocessor
from tests.conftest import to_numpy
from tests.models.bert.conftest import WORDS, generated_corpus


def _inputs(preprocessor, texts):
    x, _, _ = preprocessor(texts)
    return x


def test_logits_shape_and_independent_positions(tiny_backbone, tokenizer):
    lm = BertMaskedLM(tiny_backbone())
    x = _inputs(
        BertMaskedLMPreprocessor(tokenizer, sequence_length=16, max_selections=3, seed=0),
        generated_corpus(2, min_words=8),
    )
    logits = to_numpy(lm(x))
    assert logits.shape == (2, 3, tokenizer.vocabulary_size) and logits.dtype == np.float32
    # A position's logits depend on that position only, not on the other selections.
    reordered = {**x, "mask_positions": x["mask_positions"][:, ::-1][:, :2]}
    np.testing.assert_allclose(to_numpy(lm(reordered)), logits[:, ::-1][:, :2], atol=1e-5)
    assert not np.allclose(logits[0, 0], logits[0, 1])


def test_head_shares_the_token_embedding(tiny_backbone):
    lm = BertMaskedLM(tiny_backbone())
    names = {layer.name for layer in lm.layers}
    assert {"mlm_dense", "mlm_layer_norm", "mlm_output_bias"} <= names
    # One (V, D) embedding matrix in the whole model: the output projection is tied.
    shapes = [tuple(w.shape) for w in lm.weights]
    assert shapes.count((lm.backbone.vocabulary_size, lm.backbone.hidden_dim)) == 1
    assert (lm.backbone.vocabulary_size,) in shapes  # the output bias


def test_sequence_length_longer_than_the_backbone_is_an_error(tiny_backbone, tokenizer):
    with pytest.raises(ValueError, match="max_sequence_length=32"):
        BertMaskedLM(tiny_backbone(), preprocessor=BertMaskedLMPreprocessor(tokenizer, sequence_length=64))


def test_keras_file_round_trip(tiny_backbone, tokenizer, tmp_path):
    preprocessor = BertMaskedLMPreprocessor(tokenizer, sequence_length=16, mask_selection_rate=0.2, seed=3)
    lm = BertMaskedLM(tiny_backbone(), preprocessor=preprocessor)
    lm.mlm_output_bias.bias.assign(np.linspace(-1, 1, tokenizer.vocabulary_size).astype("float32"))
    lm.save(tmp_path / "mlm.keras")
    restored = keras.saving.load_model(tmp_path / "mlm.keras")
    assert isinstance(restored, BertMaskedLM)
    assert restored.preprocessor.get_config() == preprocessor.get_config()
    x = _inputs(preprocessor, generated_corpus(2))
    np.testing.assert_array_equal(to_numpy(restored(x)), to_numpy(lm(x)))


def test_preset_round_trip(tiny_backbone, tokenizer, tmp_path):
    preprocessor = BertMaskedLMPreprocessor(tokenizer, sequence_length=16, seed=3)
    lm = BertMaskedLM(tiny_backbone(), preprocessor=preprocessor)
    lm.mlm_output_bias.bias.assign(np.linspace(-1, 1, tokenizer.vocabulary_size).astype("float32"))
    lm.save_to_preset(tmp_path / "preset")
    restored = BertMaskedLM.from_preset(tmp_path / "preset")
    assert restored.preprocessor.get_config() == preprocessor.get_config()
    texts = generated_corpus(2)
    assert restored.preprocessor.tokenizer.tokenize(texts) == tokenizer.tokenize(texts)
    x = _inputs(preprocessor, texts)
    np.testing.assert_array_equal(to_numpy(restored(x)), to_numpy(lm(x)))
    fresh = BertMaskedLM.from_preset(tmp_path / "preset", load_weights=False)
    assert not np.allclose(to_numpy(fresh(x)), to_numpy(lm(x)))


def _successor_texts(rng, runs, n, words):
    """Runs of consecutive words: word i+1 follows word i (mod len(words)); `runs` = (start, length) pairs."""
    picks = rng.integers(len(runs), size=n)
    return [" ".join(words[(runs[i][0] + j) % len(words)] for j in range(runs[i][1])) for i in picks]


@pytest.mark.slow
def test_learns_to_recover_masked_tokens(tokenizer, rng):
    # Every text is a run of consecutive words (mod 6), so a masked word is its left neighbour's
    # successor. The runs (start, length) seen in training and in testing are disjoint.
    words = WORDS[:6]
    runs = [(start, length) for start in range(len(words)) for length in range(6, 15)]
    rng.shuffle(runs)
    test_runs, train_runs = runs[:12], runs[12:]

    # A tiny model trains much faster from a wider initialisation than BERT's 0.02.
    backbone = BertBackbone(
        tokenizer.vocabulary_size,
        num_layers=1,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=16,
        dropout=0.0,
        initializer_range=0.2,
    )
    # Twice BERT's selection rate: twice the training signal per step.
    lm = BertMaskedLM(
        backbone, preprocessor=BertMaskedLMPreprocessor(tokenizer, sequence_length=16, mask_selection_rate=0.3, seed=0)
    )
    lm.compile(optimizer=keras.optimizers.AdamW(5e-3, weight_decay=0.01))
    # Multiples of the batch size: one compiled step, no second one for a ragged last batch.
    lm.fit(_successor_texts(rng, train_runs, 1024, words), batch_size=32, epochs=6, verbose=0)

    # Held out: new runs, BERT's default masking (15%: 80% [MASK], 10% random, 10% unchanged).
    x, y, weights = BertMaskedLMPreprocessor(tokenizer, sequence_length=16, seed=1)(
        _successor_texts(rng, test_runs, 320, words)
    )
    predicted = np.argmax(to_numpy(lm.predict(x, batch_size=32, verbose=0)), axis=-1)
    accuracy = np.sum((predicted == y) * weights) / np.sum(weights)
    print(f"BertMaskedLM held-out accuracy {accuracy:.3f}")
    assert accuracy >= 0.9, f"held-out accuracy {accuracy:.3f}"
    # Chance level (the most frequent word) is far below.
    assert np.max(np.bincount(y[weights > 0])) / np.sum(weights) < 0.3
