"""BertTextEmbedder (models/text_embedder.py) against transformers' BertModel pooled as sentence-transformers pools.

The peers are random BertModel checkpoints saved locally as sentence-transformers folders (hf_models.py:
modules.json, 1_Pooling/config.json, 2_Normalize); ours load them with `TextEmbedder.from_preset`. The reference
embedding is transformers' last hidden state, pooled and normalised in numpy with sentence-transformers' formulas
(Pooling: the masked mean, the first token, the last real token; Normalize: x / max(|x|, 1e-12)).

Axes: B batch, T length, D width.
"""

import json

import numpy as np
import pytest
import torch

from keras_transformer.models import BertTextEmbedder, MultipleNegativesRankingLoss, TextEmbedder
from tests.conftest import to_numpy
from tests.convert import hf_models

TEXTS = ["the quick brown fox", "a cat sat on the mat and looked at the dog", "def add(a, b):", "the house"]


def _reference(peer, x, pooling, normalize):
    """sentence-transformers' pooling of transformers' hidden states, in float64 numpy."""
    with torch.no_grad():
        hidden = (
            peer(
                input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
                token_type_ids=torch.tensor(x["segment_ids"], dtype=torch.long),
                attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
            )
            .last_hidden_state.double()
            .numpy()
        )  # (B, T, D)
    mask = np.asarray(x["padding_mask"], "float64")
    if pooling == "mean":
        pooled = (hidden * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    elif pooling == "cls":
        pooled = hidden[:, 0]
    else:
        last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1], axis=1)  # the last real token
        pooled = hidden[np.arange(len(hidden)), last]
    if normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """pooling -> (directory, peer, ours); "mean" normalised, the others not (both settings are read)."""
    built = {}
    for seed, pooling in enumerate(("mean", "cls", "last_token")):
        directory = tmp_path_factory.mktemp(pooling)
        peer = hf_models.sentence_transformers_folder(directory, pooling, normalize=pooling == "mean", seed=seed)
        built[pooling] = directory, peer.eval(), TextEmbedder.from_preset(directory)
    return built


@pytest.mark.parametrize("pooling", ["mean", "cls", "last_token"])
def test_embeddings_match_sentence_transformers_pooling(folders, pooling):
    _, peer, ours = folders[pooling]
    assert type(ours) is BertTextEmbedder and (ours.pooling, ours.normalize) == (pooling, pooling == "mean")
    assert ours.preprocessor.sequence_length == 32  # sentence_bert_config.json's max_seq_length
    x = ours.preprocessor(TEXTS, predict=True)[0]
    assert len(set(x["padding_mask"].sum(1).tolist())) > 1  # padded rows: the pooling must skip the padding
    expected = _reference(peer, x, pooling, normalize=pooling == "mean")
    np.testing.assert_allclose(to_numpy(ours(x)), expected, atol=1e-5)
    predicted = ours.predict(TEXTS, verbose=0)
    assert predicted.shape == (len(TEXTS), peer.config.hidden_size) and predicted.dtype == np.float32
    np.testing.assert_allclose(predicted, expected, atol=1e-5)
    if pooling == "mean":
        np.testing.assert_allclose(np.linalg.norm(predicted, axis=-1), 1.0, atol=1e-5)


def test_fit_on_pairs_lowers_the_contrastive_loss(folders):
    _, _, ours = folders["mean"]
    embedder = BertTextEmbedder.from_config(ours.get_config())
    embedder.set_weights(ours.get_weights())
    anchors = ["the cat sat", "a dog ran", "def add(a, b):", "the house is small", "a fox jumps", "the mat"]
    positives = ["a cat was sitting", "the dog was running", "return a + b", "a small house", "the fox", "on a mat"]
    import keras

    def loss_on_all_pairs():  # the formula over the 6 pairs at once, without dropout
        a, p = (embedder.predict(texts, verbose=0) for texts in (anchors, positives))
        return float(to_numpy(MultipleNegativesRankingLoss()(np.zeros(12, "float32"), np.concatenate([a, p]))))

    before = loss_on_all_pairs()
    embedder.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = embedder.fit((anchors, positives), batch_size=6, epochs=12, verbose=0)
    assert len(history.history["loss"]) == 12
    assert loss_on_all_pairs() < 0.8 * before  # 0.66 measured on every backend (dropout 0.1, 12 steps)


def test_loss_is_sentence_transformers_formula():
    """MultipleNegativesRankingLoss against numpy: cross-entropy of scale * cos(anchor_i, positive_j) at j = i."""
    rng = np.random.default_rng(0)
    anchors, positives = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    logits = 20.0 * unit(anchors) @ unit(positives).T
    expected = np.mean(np.log(np.exp(logits).sum(1)) - np.diag(logits))
    y_pred = np.concatenate([anchors, positives]).astype("float32")
    got = MultipleNegativesRankingLoss()(np.zeros(6, "float32"), y_pred)
    np.testing.assert_allclose(float(to_numpy(got)), expected, rtol=1e-5)


def test_save_and_load_keep_the_pooling(folders, tmp_path):
    _, _, ours = folders["cls"]
    ours.save_to_preset(tmp_path / "preset")
    again = TextEmbedder.from_preset(tmp_path / "preset")
    assert (type(again), again.pooling, again.normalize) == (BertTextEmbedder, "cls", False)
    np.testing.assert_array_equal(again.predict(TEXTS, verbose=0), ours.predict(TEXTS, verbose=0))


@pytest.mark.slow
def test_onnx_bundle_embeds_as_keras(folders, tmp_path):
    """The encoder bundle's runtime returns the embedder's own embeddings (what /v1/embeddings serves)."""
    from keras_transformer.bundle_runtime import load_bundle_runtime

    _, _, ours = folders["mean"]
    bundle = ours.export(tmp_path / "bundle", format="onnx")
    encoder = load_bundle_runtime(bundle).Encoder(bundle)
    np.testing.assert_allclose(encoder(TEXTS)["embeddings"], ours.predict(TEXTS, verbose=0), atol=1e-4)


@pytest.mark.parametrize(
    "change, match",
    [("max", r"pooling \['pooling_mode_max_tokens'\]"), ("dense", r"sentence_transformers\.models\.Dense")],
)
def test_refused_sentence_transformers_modules(folders, tmp_path, change, match):
    import shutil

    directory = tmp_path / "copy"
    shutil.copytree(folders["mean"][0], directory)
    if change == "max":
        config = json.loads((directory / "1_Pooling" / "config.json").read_text())
        config.update(pooling_mode_mean_tokens=False, pooling_mode_max_tokens=True)
        (directory / "1_Pooling" / "config.json").write_text(json.dumps(config))
    else:
        modules = json.loads((directory / "modules.json").read_text())
        modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
        (directory / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=match):
        TextEmbedder.from_preset(directory)


def test_bad_arguments(folders):
    backbone = folders["mean"][2].backbone
    with pytest.raises(ValueError, match=r"pooling='max'"):
        BertTextEmbedder(backbone, pooling="max")
    with pytest.raises(ValueError, match=r"normalize='yes'"):
        BertTextEmbedder(backbone, normalize="yes")
    embedder = folders["mean"][2]
    with pytest.raises(ValueError, match=r"2 anchors and 3 positives"):
        embedder.fit((["a", "b"], ["c", "d", "e"]))
    with pytest.raises(ValueError, match=r"batch_size"):
        embedder.fit((["a", "b"], ["c", "d"]), batch_size=1)
