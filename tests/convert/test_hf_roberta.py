"""RoBERTa and XLM-R checkpoints (`RobertaForMaskedLM`, `XLMRobertaForMaskedLM`) -> BertMaskedLM, against
`transformers`, and back out with `export(format="huggingface")`.

The peers are random models saved locally (hf_models.roberta: a byte-level BPE tokenizer for RoBERTa, a Unigram one
for XLM-R; `<s> <pad> </s> <unk> <mask>` as ids 0-4, so positions start at 2). Ours load them with
`MaskedLM.from_preset`, which must pick BertMaskedLM with `position_offset=2`.

Axes: B batch, T length, P masked positions, V vocabulary.
"""

import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import BertMaskedLM, BertTextClassifierPreprocessor, MaskedLM
from tests.conftest import to_numpy
from tests.convert import hf_models

TEXTS = ["the quick brown fox", "a cat sat on the mat and looked at the dog", "def add(a, b):"]


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta"])
def case(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    peer = hf_models.roberta(directory, request.param).eval()
    return request.param, directory, peer, MaskedLM.from_preset(directory)


def test_logits_match_transformers(case):
    model_type, _, peer, ours = case
    assert type(ours) is BertMaskedLM and ours.backbone.position_offset == 2
    tokenizer = ours.preprocessor.tokenizer
    assert [tokenizer.special_tokens[role] for role in ("cls_token", "sep_token", "mask_token")] == [
        "<s>",
        "</s>",
        "<mask>",
    ]
    x, positions = hf_models.masked_lm_inputs(ours, TEXTS)
    assert len(set(x["padding_mask"].sum(1).tolist())) > 1  # padded rows
    with torch.no_grad():
        logits = peer(
            input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
        ).logits.numpy()  # (B, T, V)
    expected = np.take_along_axis(logits, positions[:, :, None], axis=1)
    mine = to_numpy(ours({**x, "mask_positions": positions}))
    np.testing.assert_allclose(mine, expected, atol=1e-4)
    assert np.std(expected) > 0.1


def test_tokenizer_matches_transformers(case):
    _, directory, _, ours = case
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer = ours.preprocessor.tokenizer
    for text in TEXTS:
        assert [tokenizer.cls_token_id, *tokenizer.tokenize(text), tokenizer.sep_token_id] == theirs(text)["input_ids"]


@pytest.mark.parametrize("length", [32, 12])
def test_text_pairs_are_packed_as_transformers_packs_them(case, length):
    """<s> a </s></s> b </s> with segment ids 0, from the tokenizer's own pair template (not BERT's [CLS] a [SEP]
    b [SEP] with segment ids 1, which RoBERTa's one token-type row cannot take); cut longest first at 12."""
    _, directory, _, ours = case
    texts, pairs = TEXTS[1:], ["the dog", "def add(a, b):"]
    preprocessor = BertTextClassifierPreprocessor(ours.preprocessor.tokenizer, sequence_length=length, truncate=True)
    x, _, _ = preprocessor((texts, pairs), predict=True)
    reference = transformers.AutoTokenizer.from_pretrained(directory)(
        texts, pairs, padding="max_length", truncation="longest_first", max_length=length
    )
    np.testing.assert_array_equal(x["token_ids"], reference["input_ids"])
    np.testing.assert_array_equal(x["padding_mask"], reference["attention_mask"])
    assert not x["segment_ids"].any()


def test_hugging_face_export_round_trip(case, tmp_path):
    """Exported as RobertaForMaskedLM: transformers reads it and gives the same logits; every tensor of the
    original comes back bit for bit (the position table with its first two rows)."""
    model_type, directory, peer, ours = case
    out = ours.export(tmp_path / "hf", format="huggingface")
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    original = {name: tensor.numpy() for name, tensor in peer.state_dict().items()}
    exported = {name: tensor.numpy() for name, tensor in theirs.state_dict().items()}
    for name, value in original.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    x, positions = hf_models.masked_lm_inputs(ours, TEXTS)
    with torch.no_grad():
        logits = theirs(
            input_ids=torch.tensor(x["token_ids"], dtype=torch.long),
            attention_mask=torch.tensor(x["padding_mask"], dtype=torch.long),
        ).logits.numpy()
    mine = to_numpy(ours({**x, "mask_positions": positions}))
    np.testing.assert_allclose(mine, np.take_along_axis(logits, positions[:, :, None], axis=1), atol=1e-4)


def test_sequence_classification_is_refused(case, tmp_path):
    import json
    import shutil

    _, directory, _, _ = case
    shutil.copytree(directory, tmp_path / "copy")
    config = json.loads((tmp_path / "copy" / "config.json").read_text())
    config["architectures"] = ["RobertaForSequenceClassification"]
    (tmp_path / "copy" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="RobertaForSequenceClassification"):
        MaskedLM.from_preset(tmp_path / "copy")


@pytest.mark.slow
def test_onnx_bundle_fills_masks_as_keras(tmp_path):
    """The encoder bundle packs <s> text </s> once (by the tokenizer's own post-processor), finds the model's own
    mask token (<mask>, not BERT's [MASK]) and gives Keras's logits there; a pair is packed as transformers'
    tokenizer packs it, <s> a </s></s> b </s> with segment ids 0 (the post-processor's, learned from the bundle's
    tokenizer.json), with transformers' logits (RoBERTa: one export; XLM-R differs only in its tokenizer, which the
    other tests cover)."""
    from keras_transformer.bundle_runtime import load_bundle_runtime

    peer = hf_models.roberta(tmp_path / "roberta", "roberta").eval()
    ours = MaskedLM.from_preset(tmp_path / "roberta")
    bundle = ours.export(tmp_path / "bundle", format="onnx")
    encoder = load_bundle_runtime(bundle).Encoder(bundle)
    texts = ["the quick <mask> fox", "a cat sat on the <mask>"]
    feeds = encoder.pack(texts)
    tokenizer = ours.preprocessor.tokenizer
    for row, text in zip(feeds["token_ids"], texts):
        expected = [tokenizer.cls_token_id, *tokenizer.tokenize(text), tokenizer.sep_token_id]
        assert row[: len(expected)].tolist() == expected
    positions = np.argwhere(feeds["token_ids"] == tokenizer.mask_token_id)[:, 1].reshape(2, 1).astype("int32")
    inputs = {name: feeds[name].astype("bool" if name == "padding_mask" else "int32") for name in feeds}
    keras_logits = to_numpy(ours({**inputs, "mask_positions": positions}))
    np.testing.assert_allclose(encoder(texts)["logits"], keras_logits, atol=1e-4)

    pairs = ["the dog", "def add(a, b):"]
    feeds = encoder.pack(texts, pairs)
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "roberta")(texts, pairs, padding=True)
    end = len(tokenizer.tokenize(texts[0])) + 1  # <s> a, then </s></s>
    assert feeds["token_ids"][0, [0, end, end + 1]].tolist() == [tokenizer.cls_token_id] + [tokenizer.sep_token_id] * 2
    np.testing.assert_array_equal(feeds["token_ids"], reference["input_ids"])
    assert "token_type_ids" not in reference and not feeds["segment_ids"].any()  # RoBERTa's are zeros
    np.testing.assert_array_equal(feeds["padding_mask"], reference["attention_mask"])
    with torch.no_grad():
        logits = peer(**{name: torch.tensor(value) for name, value in reference.items()}).logits.numpy()
    positions = np.argwhere(feeds["token_ids"] == tokenizer.mask_token_id)  # (2, 2): rows and their positions
    np.testing.assert_allclose(encoder(texts, pairs)["logits"][:, 0], logits[tuple(positions.T)], atol=1e-4)
