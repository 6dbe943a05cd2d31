"""BERT checkpoints in the Hugging Face layout -> BertBackbone / BertMaskedLM / BertClassifier, against `transformers`.

Peers: a random BertForMaskedLM (tensor names under "bert.", MLM head, no pooler) and a random
BertModel (no prefix, pooler), eager attention, saved with `save_pretrained`. Their tokenizer
directory holds tokenizer.json only, so the special tokens are BERT's defaults.
Axes: B batch, T length, P masked positions, D width, V vocabulary.
"""

import numpy as np
import pytest
import transformers
import torch

from keras_transformer.convert import convert
from keras_transformer.models import Backbone, BertBackbone, BertClassifier, BertMaskedLM
from tests.conftest import to_numpy
from tests.convert import hf_models

ATOL = 1e-4


@pytest.fixture(scope="module")
def masked_lm_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf_bert_mlm")
    return directory, hf_models.bert(directory, "BertForMaskedLM")


@pytest.fixture(scope="module")
def model_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf_bert_model")
    return directory, hf_models.bert(directory, "BertModel", seed=1)


@pytest.fixture(scope="module")
def masked_lm(masked_lm_checkpoint):
    return BertMaskedLM.from_preset(masked_lm_checkpoint[0])


def _inputs(vocabulary_size, padded):
    rng = np.random.default_rng(0)
    token_ids = rng.integers(5, vocabulary_size, (3, 11)).astype("int32")
    segment_ids = (np.arange(11)[None, :] >= np.array([[6], [3], [1]])).astype("int32")
    lengths = np.array([11, 7, 3]) if padded else np.full(3, 11)
    padding_mask = np.arange(11)[None, :] < lengths[:, None]  # (B, T)
    return {
        "token_ids": np.where(padding_mask, token_ids, 0).astype("int32"),
        "segment_ids": np.where(padding_mask, segment_ids, 0).astype("int32"),
        "padding_mask": padding_mask,
    }


def _hf_outputs(hf, x, **kwargs):
    with torch.no_grad():
        return hf(
            input_ids=hf_models.to_torch(x["token_ids"]),
            token_type_ids=hf_models.to_torch(x["segment_ids"]),
            attention_mask=hf_models.to_torch(x["padding_mask"]),
            **kwargs,
        )


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_masked_lm_logits_and_hidden_states_match(masked_lm_checkpoint, masked_lm, padded):
    directory, hf = masked_lm_checkpoint
    x = _inputs(hf.config.vocab_size, padded)
    out = _hf_outputs(hf, x, output_hidden_states=True)
    mask_positions = np.array([[0, 5, 10, 2], [1, 6, 3, 0], [2, 1, 0, 0]], "int32")  # (B, P)
    expected = np.take_along_axis(out.logits.numpy(), mask_positions[:, :, None], axis=1)  # (B, T, V) -> (B, P, V)
    logits = to_numpy(masked_lm({**x, "mask_positions": mask_positions}))
    np.testing.assert_allclose(logits, expected, atol=ATOL, rtol=0)
    hidden = to_numpy(masked_lm.backbone(x)["sequence_output"])
    np.testing.assert_allclose(hidden, out.hidden_states[-1].numpy(), atol=ATOL, rtol=0)
    assert np.abs(expected).max() > 1.0


def test_backbone_from_masked_lm_checkpoint_warns_about_the_missing_pooler(masked_lm_checkpoint):
    directory, hf = masked_lm_checkpoint
    with pytest.warns(UserWarning, match="pooled_dense"):
        backbone = Backbone.from_preset(directory)
    assert isinstance(backbone, BertBackbone)
    x = _inputs(hf.config.vocab_size, padded=True)
    expected = _hf_outputs(hf.bert, x).last_hidden_state.numpy()
    np.testing.assert_allclose(to_numpy(backbone(x)["sequence_output"]), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_bert_model_checkpoint_sequence_and_pooled_outputs_match(model_checkpoint, padded):
    directory, hf = model_checkpoint
    x = _inputs(hf.config.vocab_size, padded)
    expected = _hf_outputs(hf, x)
    outputs = BertBackbone.from_preset(directory)(x)
    np.testing.assert_allclose(
        to_numpy(outputs["sequence_output"]), expected.last_hidden_state.numpy(), atol=ATOL, rtol=0
    )
    np.testing.assert_allclose(to_numpy(outputs["pooled_output"]), expected.pooler_output.numpy(), atol=ATOL, rtol=0)


def test_classifier_gets_the_backbone_and_a_new_head(model_checkpoint):
    directory, hf = model_checkpoint
    with pytest.warns(UserWarning, match="output_dense"):  # the new head keeps its initial values
        classifier = BertClassifier.from_preset(directory, num_classes=3)
    x = _inputs(hf.config.vocab_size, padded=True)
    pooled = to_numpy(classifier.backbone(x)["pooled_output"])
    np.testing.assert_allclose(pooled, _hf_outputs(hf, x).pooler_output.numpy(), atol=ATOL, rtol=0)
    texts = ["the quick brown fox", "a cat sat on the mat"]
    assert classifier.predict(texts, verbose=0).shape == (2, 3)


def test_tokenizer_matches_hugging_face(masked_lm_checkpoint, masked_lm):
    directory, _ = masked_lm_checkpoint
    ours = masked_lm.preprocessor.tokenizer
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"))
    texts = ["The quick brown fox!", "a lazy dog sat on the house"]
    assert type(ours).__name__ == "WordPieceTokenizer"
    assert ours.tokenize(texts) == theirs(texts, add_special_tokens=False)["input_ids"]
    for role in ("pad", "unk", "cls", "sep", "mask"):
        assert getattr(ours, f"{role}_token_id") == theirs.convert_tokens_to_ids(f"[{role.upper()}]")


def test_save_to_preset_round_trip(tmp_path, masked_lm):
    masked_lm.save_to_preset(tmp_path / "preset")
    reloaded = BertMaskedLM.from_preset(tmp_path / "preset")
    x = {**_inputs(masked_lm.backbone.vocabulary_size, padded=True), "mask_positions": np.array([[1, 2]] * 3, "int32")}
    np.testing.assert_array_equal(to_numpy(reloaded(x)), to_numpy(masked_lm(x)))


def test_convert_bert_model_checkpoint_to_a_backbone_preset(tmp_path, model_checkpoint):
    """A checkpoint without a task head becomes a backbone preset, with its tokenizer and sequence length."""
    directory, hf = model_checkpoint
    backbone = convert(directory, tmp_path / "preset")
    assert isinstance(backbone, BertBackbone)
    assert {"model.weights.h5", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in (tmp_path / "preset").iterdir()
    }
    classifier = BertClassifier.from_preset(tmp_path / "preset", num_classes=2)
    assert classifier.preprocessor.sequence_length == hf.config.max_position_embeddings
    x = _inputs(hf.config.vocab_size, padded=True)
    pooled = to_numpy(classifier.backbone(x)["pooled_output"])
    np.testing.assert_array_equal(pooled, to_numpy(backbone(x)["pooled_output"]))
    np.testing.assert_allclose(pooled, _hf_outputs(hf, x).pooler_output.numpy(), atol=ATOL, rtol=0)
