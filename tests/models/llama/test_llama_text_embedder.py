"""LlamaTextEmbedder (Qwen3-Embedding's layout) against transformers' Qwen3Model pooled as sentence-transformers pools.

The peer is a random bare Qwen3Model (head_dim 12, not hidden / heads) saved locally as Qwen3-Embedding is saved: a
tokenizer.json whose post-processor appends `<|endoftext|>`, a tokenizer_config.json asking for left padding, and
modules.json / 1_Pooling/config.json (lasttoken) / 2_Normalize / sentence_bert_config.json. The reference is
transformers' tokenizer and model as sentence-transformers calls them (left-padded), the last real token's state
picked as its Pooling picks it and L2-normalised as its Normalize does; ours pads on the right.

Axes: B batch, T length, D width.
"""

import json

import keras
import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import LlamaTextEmbedder, MultipleNegativesRankingLoss, TextEmbedder
from keras_transformer.models import TextEmbedderPreprocessor
from tests.conftest import to_numpy
from tests.convert import hf_models

TEXTS = ["the quick brown fox", "a cat sat on the mat and looked at the dog", "def add(a, b):", "the house"]
END = "<|endoftext|>"


def qwen3_embedding_folder(directory, seed=0):
    """A random Qwen3Model with Qwen3-Embedding's files (above); returns the peer."""
    from tokenizers import processors

    from keras_transformer.tokenizers import BytePairTokenizer

    backend = BytePairTokenizer.train(hf_models.TEXTS, vocabulary_size=300).backend_tokenizer
    backend.add_special_tokens(["<|im_end|>"])
    end = backend.token_to_id(END)
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {END}:0", pair=f"$A:0 {END}:0 $B:1 {END}:1", special_tokens=[(END, end)]
    )
    config = transformers.Qwen3Config(
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        max_position_embeddings=64,
        bos_token_id=end,
        eos_token_id=backend.token_to_id("<|im_end|>"),
        pad_token_id=end,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    peer = hf_models.randomize(transformers.Qwen3Model(config), seed)
    peer.save_pretrained(directory, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token=END, padding_side="left"
    )
    fast.save_pretrained(directory)
    path = directory / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "bos_token": None}))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    (directory / "2_Normalize").mkdir()
    pooling = {"word_embedding_dimension": 32, "pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24}))
    return peer


def sentence_transformers_reference(directory, peer, texts):
    """(embeddings (B, D) float64, the tokenizer's id rows): transformers' tokenizer and model, last-token pooled."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = peer(**batch).last_hidden_state.double().numpy()  # (B, T, D)
    mask = batch["attention_mask"].numpy()
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)  # the last 1 of each row, either padding side
    pooled = hidden[np.arange(len(texts)), last]
    rows = [ids[m.astype(bool)].tolist() for ids, m in zip(batch["input_ids"].numpy(), mask)]
    return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12), rows


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """(directory, peer, ours)."""
    directory = tmp_path_factory.mktemp("qwen3_embedding")
    peer = qwen3_embedding_folder(directory).eval()
    return directory, peer, TextEmbedder.from_preset(directory)


def test_embeddings_match_sentence_transformers(folder):
    directory, peer, ours = folder
    assert type(ours) is LlamaTextEmbedder and (ours.pooling, ours.normalize) == ("last_token", True)
    assert type(ours.preprocessor) is TextEmbedderPreprocessor and ours.preprocessor.sequence_length == 24
    expected, rows = sentence_transformers_reference(directory, peer, TEXTS)
    x = ours.preprocessor(TEXTS, predict=True)[0]
    ours_rows = [ids[m].tolist() for ids, m in zip(x["token_ids"], x["padding_mask"])]
    end = ours.preprocessor.tokenizer.backend_tokenizer.token_to_id(END)
    assert ours_rows == rows and all(row[-1] == end for row in rows)  # the template's appended end token
    assert len({len(row) for row in rows}) > 1  # padded rows: left there, right here
    predicted = ours.predict(TEXTS, verbose=0)
    assert predicted.shape == (len(TEXTS), 32) and predicted.dtype == np.float32
    np.testing.assert_allclose(predicted, expected, atol=1e-5)


def test_config_round_trip_and_other_poolings(folder):
    _, _, ours = folder
    again = LlamaTextEmbedder.from_config(ours.get_config())
    again.set_weights(ours.get_weights())
    assert type(again.preprocessor) is TextEmbedderPreprocessor and again.preprocessor.get_config() == {
        "sequence_length": 24,
        "truncate": False,
    }
    np.testing.assert_allclose(again.predict(TEXTS, verbose=0), ours.predict(TEXTS, verbose=0), atol=1e-6)
    x = ours.preprocessor(TEXTS, predict=True)[0]
    hidden = to_numpy(ours.backbone(x)).astype("float64")  # (B, T, D)
    mean = LlamaTextEmbedder(ours.backbone, pooling="mean", normalize=False)
    mask = x["padding_mask"][:, :, None]
    np.testing.assert_allclose(to_numpy(mean(x)), (hidden * mask).sum(1) / mask.sum(1), atol=1e-5)


def test_fit_on_pairs_lowers_the_contrastive_loss(folder):
    _, _, ours = folder
    embedder = LlamaTextEmbedder.from_config(ours.get_config())
    embedder.set_weights(ours.get_weights())
    anchors = ["the cat sat", "a dog ran", "def add(a, b):", "the house is small", "a fox jumps", "the mat"]
    positives = ["a cat was sitting", "the dog was running", "return a + b", "a small house", "the fox", "on a mat"]

    def loss_on_all_pairs():
        a, p = (embedder.predict(texts, verbose=0) for texts in (anchors, positives))
        return float(to_numpy(MultipleNegativesRankingLoss()(np.zeros(12, "float32"), np.concatenate([a, p]))))

    before = loss_on_all_pairs()
    jit_compile = False if keras.config.backend() == "tensorflow" else "auto"  # XLA's CPU compile outlasts the steps
    embedder.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=jit_compile)
    history = embedder.fit((anchors, positives), batch_size=6, epochs=8, verbose=0)
    assert len(history.history["loss"]) == 8
    assert loss_on_all_pairs() < 0.8 * before


def test_truncation_keeps_the_appended_token(folder):
    _, _, ours = folder
    tokenizer = ours.preprocessor.tokenizer
    long_text = " ".join(TEXTS * 4)
    with pytest.raises(ValueError, match="sequence_length"):
        ours.preprocessor([long_text])
    x, _, _ = TextEmbedderPreprocessor(tokenizer, sequence_length=8, truncate=True)([long_text], predict=True)
    row = x["token_ids"][0]
    assert x["padding_mask"].all() and row[:-1].tolist() == tokenizer.tokenize(long_text)[:7]
    assert row[-1] == tokenizer.backend_tokenizer.token_to_id(END)
    with pytest.raises(ValueError, match="truncate='yes'"):
        TextEmbedderPreprocessor(tokenizer, truncate="yes")


@pytest.mark.slow
def test_onnx_bundle_serves_the_embeddings(folder, tmp_path):
    """The encoder bundle packs with the tokenizer's template (the appended end token) and returns the embedder's
    own pooled, normalised embeddings; its server's /v1/embeddings serves them."""
    from keras_transformer.bundle_runtime import load_bundle_runtime
    from tests.export.test_serve import Server

    _, _, ours = folder
    bundle = ours.export(tmp_path / "bundle", format="onnx")
    encoder = load_bundle_runtime(bundle).Encoder(bundle)
    expected = ours.predict(TEXTS, verbose=0)
    np.testing.assert_array_equal(
        encoder.pack(TEXTS)["padding_mask"].sum(1), ours.preprocessor(TEXTS)[0]["padding_mask"].sum(1)
    )
    np.testing.assert_allclose(encoder(TEXTS)["embeddings"], expected, atol=1e-5)
    server = Server(bundle)
    try:
        status, body, _ = server.post(
            "/v1/embeddings", {"model": bundle.name, "input": TEXTS, "encoding_format": "float"}
        )
    finally:
        server.stop()
    assert status == 200, body
    np.testing.assert_allclose(np.array([item["embedding"] for item in body["data"]]), expected, atol=1e-5)
