"""DistilBERT checkpoints (`DistilBertForMaskedLM`, `DistilBertModel`) -> BertMaskedLM / BertBackbone with
`num_segments=0`, against `transformers`, and back out with `export(format="huggingface")`.

The peer is a random model saved locally (hf_models.distilbert: 2 layers, width 32, a WordPiece tokenizer with
BERT's special tokens). Ours load it with `MaskedLM.from_preset`, which must pick BertMaskedLM.

Axes: B batch, T length, P masked positions, V vocabulary.
"""

import json
import shutil

import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import BertBackbone, BertMaskedLM, MaskedLM
from tests.conftest import to_numpy
from tests.convert import hf_models

TEXTS = ["the quick brown fox", "a cat sat on the mat and looked at the dog", "def add(a, b):"]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    directory = tmp_path_factory.mktemp("distilbert")
    peer = hf_models.distilbert(directory).eval()
    return directory, peer, MaskedLM.from_preset(directory)


def _their_logits(model, x, positions):
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
        ).logits.numpy()  # (B, T, V)
    return np.take_along_axis(logits, positions[:, :, None], axis=1)


def test_logits_match_transformers(case):
    directory, peer, ours = case
    assert type(ours) is BertMaskedLM and ours.backbone.num_segments == 0
    assert ours.backbone.segment_embedding is None
    x, positions = hf_models.masked_lm_inputs(ours, TEXTS)
    assert len(set(x["padding_mask"].sum(1).tolist())) > 1  # padded rows
    expected = _their_logits(peer, x, positions)
    np.testing.assert_allclose(to_numpy(ours({**x, "mask_positions": positions})), expected, atol=1e-4)
    assert np.std(expected) > 0.1
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer = ours.preprocessor.tokenizer
    for text in TEXTS:
        assert [tokenizer.cls_token_id, *tokenizer.tokenize(text), tokenizer.sep_token_id] == theirs(text)["input_ids"]


def test_the_bare_model_matches_transformers(case, tmp_path):
    """DistilBertModel (the same tokenizer: the same random training, as the masked LM's) -> a BertBackbone."""
    peer = hf_models.distilbert(tmp_path, "DistilBertModel").eval()
    backbone = BertBackbone.from_preset(tmp_path)
    assert backbone.num_segments == 0
    x, _ = hf_models.masked_lm_inputs(case[2], TEXTS)
    with torch.no_grad():
        expected = peer(
            input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
        ).last_hidden_state.numpy()
    mine = to_numpy(backbone(x)["sequence_output"])
    np.testing.assert_allclose(mine[x["padding_mask"]], expected[x["padding_mask"]], atol=1e-4)


def test_hugging_face_export_round_trip(case, tmp_path):
    """Exported as DistilBertForMaskedLM: transformers reads it and gives the same logits; every tensor of the
    original comes back bit for bit."""
    _, peer, ours = case
    out = ours.export(tmp_path / "hf", format="huggingface")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DistilBertForMaskedLM"]
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    exported = {name: tensor.numpy() for name, tensor in theirs.state_dict().items()}
    for name, value in peer.state_dict().items():
        np.testing.assert_array_equal(exported[name], value.numpy(), err_msg=name)
    x, positions = hf_models.masked_lm_inputs(ours, TEXTS)
    expected = _their_logits(theirs, x, positions)
    np.testing.assert_allclose(to_numpy(ours({**x, "mask_positions": positions})), expected, atol=1e-4)


def test_what_distilbert_does_not_have_is_refused(case, tmp_path):
    directory, _, ours = case
    for change, match in (
        ({"architectures": ["DistilBertForSequenceClassification"]}, "DistilBertForSequenceClassification"),
        ({"sinusoidal_pos_embds": True}, "sinusoidal_pos_embds=True"),
        ({"dropout": 0.1, "attention_dropout": 0.2}, "attention_dropout=0.2"),
    ):
        copy = tmp_path / str(len(list(tmp_path.iterdir())))
        shutil.copytree(directory, copy)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=match):
            MaskedLM.from_preset(copy)
    x, positions = hf_models.masked_lm_inputs(ours, TEXTS)
    with pytest.raises(ValueError, match="segment_ids. must be zeros: the backbone has num_segments=0"):
        ours({**x, "segment_ids": np.ones_like(x["token_ids"]), "mask_positions": positions})
    with pytest.raises(ValueError, match="num_segments=-1"):
        BertBackbone(100, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=8, num_segments=-1)


@pytest.mark.slow
def test_fit_and_the_onnx_bundle(case, tmp_path):
    """A fit step changes the weights and the loss is finite; the encoder bundle (its graph traced by tf2onnx, with
    a segment_ids input the graph does not read) fills masks as Keras."""
    from keras_transformer.bundle_runtime import load_bundle_runtime

    directory, _, _ = case
    ours = MaskedLM.from_preset(directory)
    bundle = ours.export(tmp_path / "bundle", format="onnx")
    encoder = load_bundle_runtime(bundle).Encoder(bundle)
    texts = ["the quick [MASK] fox", "a cat sat on the [MASK]"]
    feeds = encoder.pack(texts)
    tokenizer = ours.preprocessor.tokenizer
    positions = np.argwhere(feeds["token_ids"] == tokenizer.mask_token_id)[:, 1].reshape(2, 1).astype("int32")
    inputs = {name: feeds[name].astype("bool" if name == "padding_mask" else "int32") for name in feeds}
    np.testing.assert_allclose(
        encoder(texts)["logits"], to_numpy(ours({**inputs, "mask_positions": positions})), atol=1e-4
    )

    before = to_numpy(ours.backbone.token_embedding.embeddings).copy()
    ours.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = ours.fit(TEXTS * 4, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    assert not np.array_equal(to_numpy(ours.backbone.token_embedding.embeddings), before)
