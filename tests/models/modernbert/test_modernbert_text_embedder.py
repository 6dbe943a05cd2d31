"""ModernBertTextEmbedder against transformers' ModernBertModel pooled as sentence-transformers pools.

The peer is hf_models.modernbert's random model (a local window of 4, shorter than the texts; two rotary bases)
saved as a sentence-transformers folder (modules.json, 1_Pooling/config.json with mean pooling, 2_Normalize,
sentence_bert_config.json); the reference is its encoder's last hidden state on transformers' tokenizer's ids (the
tokenizer's own [CLS] text [SEP]), mean-pooled over the real tokens and L2-normalised in numpy.

Axes: B batch, T length, D width.
"""

import json

import keras
import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import ModernBertTextEmbedder, TextEmbedder, TextEmbedderPreprocessor
from tests.convert import hf_models

TEXTS = ["the quick brown fox", "a cat sat on the mat and looked at the dog", "def add(a, b):"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """(directory, peer, ours)."""
    directory = tmp_path_factory.mktemp("modernbert_embedder")
    peer = hf_models.modernbert(directory).eval()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    (directory / "2_Normalize").mkdir()
    pooling = {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32}))
    return directory, peer, TextEmbedder.from_preset(directory)


def test_embeddings_match_sentence_transformers(folder):
    directory, peer, ours = folder
    assert type(ours) is ModernBertTextEmbedder and (ours.pooling, ours.normalize) == ("mean", True)
    assert type(ours.preprocessor) is TextEmbedderPreprocessor and ours.preprocessor.sequence_length == 32
    batch = transformers.AutoTokenizer.from_pretrained(directory)(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = peer.model(**batch).last_hidden_state.double().numpy()  # (B, T, D)
    mask = batch["attention_mask"].numpy()[:, :, None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    expected = pooled / np.linalg.norm(pooled, axis=-1, keepdims=True)
    x = ours.preprocessor(TEXTS, predict=True)[0]
    width = batch["input_ids"].shape[1]
    np.testing.assert_array_equal(
        np.where(x["padding_mask"], x["token_ids"], -1)[:, :width], np.where(mask[:, :, 0], batch["input_ids"], -1)
    )
    np.testing.assert_allclose(ours.predict(TEXTS, verbose=0), expected, atol=1e-5)


def test_config_round_trip_and_fit(folder):
    _, _, ours = folder
    embedder = ModernBertTextEmbedder.from_config(ours.get_config())
    embedder.set_weights(ours.get_weights())
    np.testing.assert_allclose(embedder.predict(TEXTS, verbose=0), ours.predict(TEXTS, verbose=0), atol=1e-6)
    anchors, positives = (
        ["the cat sat", "a dog ran", "def add(a, b):", "the house"],
        ["a cat", "the dog", "a + b", "a house"],
    )
    jit_compile = False if keras.config.backend() == "tensorflow" else "auto"
    embedder.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=jit_compile)
    losses = embedder.fit((anchors, positives), batch_size=4, epochs=6, shuffle=False, verbose=0).history["loss"]
    assert losses[-1] < 0.8 * losses[0]
