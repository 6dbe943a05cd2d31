"""T5 checkpoints in the Hugging Face layout -> T5Backbone / T5Seq2SeqLM, against `transformers`.

Peers: a random T5ForConditionalGeneration as T5 v1.0 (relu, head tied to the shared embedding,
decoder output scaled by d_model**-0.5), saved by transformers 5, and as T5 v1.1 (gated-gelu,
its own lm_head, no scaling), written as transformers 4 wrote it (tie_word_embeddings=False,
every tensor in the file). Axes: B batch, S encoder length, T decoder length, V vocabulary.
"""

import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import Backbone, T5Backbone, T5Seq2SeqLM
from tests.conftest import to_numpy
from tests.convert import hf_models

ATOL = 1e-4
VERSIONS = {
    "v1_0": dict(feed_forward_proj="relu"),
    # Few buckets and a short max distance: the logarithmic buckets are used by short inputs.
    "v1_1": dict(
        feed_forward_proj="gated-gelu",
        untied_head=True,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=12,
    ),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """version -> (directory, peer, our converted T5Seq2SeqLM), each built once, when first asked for."""
    built = {}

    def get(version):
        if version not in built:
            directory = tmp_path_factory.mktemp(f"hf_t5_{version}")
            hf = hf_models.t5(directory, **VERSIONS[version])
            built[version] = directory, hf, T5Seq2SeqLM.from_preset(directory)
        return built[version]

    return get


@pytest.fixture(params=sorted(VERSIONS))
def checkpoint(request, checkpoints):
    return checkpoints(request.param)


def _inputs(vocabulary_size, padded):
    rng = np.random.default_rng(0)
    B, S, T = 3, 13, 9
    encoder_lengths = np.array([13, 7, 10]) if padded else np.full(B, S)
    decoder_lengths = np.array([9, 4, 6]) if padded else np.full(B, T)
    encoder_mask = np.arange(S)[None, :] < encoder_lengths[:, None]
    decoder_mask = np.arange(T)[None, :] < decoder_lengths[:, None]
    encoder_ids = np.where(encoder_mask, rng.integers(3, vocabulary_size, (B, S)), 0).astype("int32")
    decoder_ids = np.where(decoder_mask, rng.integers(3, vocabulary_size, (B, T)), 0).astype("int32")
    decoder_ids[:, 0] = 0  # the decoder start token (= pad), a real position
    return {
        "encoder_token_ids": encoder_ids,
        "encoder_padding_mask": encoder_mask,
        "decoder_token_ids": decoder_ids,
        "decoder_padding_mask": decoder_mask,
    }


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_logits_and_hidden_states_match(checkpoint, padded):
    directory, hf, lm = checkpoint
    x = _inputs(hf.config.vocab_size, padded)
    with torch.no_grad():
        out = hf(
            input_ids=hf_models.to_torch(x["encoder_token_ids"]),
            attention_mask=hf_models.to_torch(x["encoder_padding_mask"]),
            decoder_input_ids=hf_models.to_torch(x["decoder_token_ids"]),
            decoder_attention_mask=hf_models.to_torch(x["decoder_padding_mask"]),
            output_hidden_states=True,
        )
    enc, dec = x["encoder_padding_mask"], x["decoder_padding_mask"]
    logits = to_numpy(lm(x))
    np.testing.assert_allclose(logits[dec], out.logits.numpy()[dec], atol=ATOL, rtol=0)
    hidden = lm.backbone(x)
    np.testing.assert_allclose(
        to_numpy(hidden["encoder_sequence_output"])[enc], out.encoder_last_hidden_state.numpy()[enc], atol=ATOL, rtol=0
    )
    np.testing.assert_allclose(
        to_numpy(hidden["decoder_sequence_output"])[dec], out.decoder_hidden_states[-1].numpy()[dec], atol=ATOL, rtol=0
    )
    assert np.std(out.logits.numpy()[dec]) > 0.1  # far from the tolerance: not a vacuous match


def test_backbone_from_preset(checkpoint):
    directory, hf, lm = checkpoint
    backbone = Backbone.from_preset(directory)
    assert isinstance(backbone, T5Backbone)
    x = _inputs(hf.config.vocab_size, padded=True)
    expected = to_numpy(lm.backbone(x)["decoder_sequence_output"])
    np.testing.assert_array_equal(to_numpy(backbone(x)["decoder_sequence_output"]), expected)


def test_greedy_generation_matches_hugging_face(checkpoints):
    """Sources of different lengths in one batch, no early stop; the peer gets them left-aligned with a mask.

    T5 v1.1 (gated, untied head); v1.0 differs only in what the logits test covers.
    """
    directory, hf, lm = checkpoints("v1_1")
    rng = np.random.default_rng(2)
    sources = [rng.integers(3, hf.config.vocab_size, n).tolist() + [1] for n in (9, 4)]
    ours = lm.generate(sources, max_new_tokens=10, stop_token_ids=None)
    width = max(len(s) for s in sources)
    ids = np.array([s + [0] * (width - len(s)) for s in sources])
    mask = np.array([[1] * len(s) + [0] * (width - len(s)) for s in sources])
    with torch.no_grad():
        expected = hf.generate(
            hf_models.to_torch(ids),
            attention_mask=hf_models.to_torch(mask),
            do_sample=False,
            max_new_tokens=10,
            eos_token_id=None,
        )
    assert ours == expected.tolist()
    assert ours[0] != ours[1], ours  # the output depends on the source


def test_tokenizer_matches_hugging_face(checkpoint):
    directory, _, lm = checkpoint
    ours = lm.preprocessor.tokenizer
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(directory)
    texts = ["translate English to German: the cat", "the lazy dog sat"]
    assert type(ours).__name__ == "UnigramTokenizer"
    assert ours.tokenize(texts) == theirs(texts, add_special_tokens=False)["input_ids"]
    assert (ours.pad_token_id, ours.eos_token_id, ours.unk_token_id) == (0, 1, 2)


def test_save_to_preset_round_trip(tmp_path, checkpoints):
    """T5 v1.1: the untied lm_head must survive the round trip too."""
    _, hf, lm = checkpoints("v1_1")
    lm.save_to_preset(tmp_path / "preset")
    reloaded = T5Seq2SeqLM.from_preset(tmp_path / "preset")
    x = _inputs(hf.config.vocab_size, padded=True)
    np.testing.assert_array_equal(to_numpy(reloaded(x)), to_numpy(lm(x)))
