"""GPT-2 checkpoints in the Hugging Face layout -> GPTBackbone / GPTCausalLM, against `transformers`.

The peer is a random GPT2LMHeadModel (eager attention) saved with `save_pretrained`; ours is
loaded from that directory by `from_preset`. Axes: B batch, T length, D width, V vocabulary.
"""

import numpy as np
import pytest
import torch
import transformers

from keras_transformer.models import Backbone, GPTBackbone, GPTCausalLM
from tests.conftest import to_numpy
from tests.convert import hf_models

ATOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf_gpt2")
    model = hf_models.gpt2(directory)
    return directory, model


@pytest.fixture(scope="module")
def lm(checkpoint):
    return GPTCausalLM.from_preset(checkpoint[0])


def _inputs(vocabulary_size, padded):
    rng = np.random.default_rng(0)
    token_ids = rng.integers(1, vocabulary_size, (3, 12)).astype("int32")
    lengths = np.array([12, 7, 3]) if padded else np.array([12, 12, 12])
    padding_mask = np.arange(12)[None, :] < lengths[:, None]  # (B, T)
    return {"token_ids": np.where(padding_mask, token_ids, 0).astype("int32"), "padding_mask": padding_mask}


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_logits_and_hidden_states_match(checkpoint, lm, padded):
    directory, hf = checkpoint
    x = _inputs(hf.config.vocab_size, padded)
    with torch.no_grad():
        out = hf(
            input_ids=hf_models.to_torch(x["token_ids"]),
            attention_mask=hf_models.to_torch(x["padding_mask"]),
            output_hidden_states=True,
        )
    real = x["padding_mask"]
    logits = to_numpy(lm(x))
    np.testing.assert_allclose(logits[real], out.logits.numpy()[real], atol=ATOL, rtol=0)
    backbone = Backbone.from_preset(directory)
    assert isinstance(backbone, GPTBackbone)
    hidden = to_numpy(backbone(x))
    np.testing.assert_allclose(hidden[real], out.hidden_states[-1].numpy()[real], atol=ATOL, rtol=0)
    assert np.abs(out.logits.numpy()[real]).max() > 1.0  # far from the tolerance: not a vacuous match


def test_gpt2_model_checkpoint_without_prefix(tmp_path, checkpoint):
    """A bare GPT2Model (tensor names without "transformer.") loads as a backbone."""
    directory, hf = checkpoint
    hf.transformer.save_pretrained(tmp_path, safe_serialization=True)
    x = _inputs(hf.config.vocab_size, padded=True)
    with torch.no_grad():
        expected = hf.transformer(
            input_ids=hf_models.to_torch(x["token_ids"]), attention_mask=hf_models.to_torch(x["padding_mask"])
        ).last_hidden_state.numpy()
    hidden = to_numpy(GPTBackbone.from_preset(tmp_path)(x))
    real = x["padding_mask"]
    np.testing.assert_allclose(hidden[real], expected[real], atol=ATOL, rtol=0)


def test_tokenizer_matches_hugging_face(checkpoint, lm):
    directory, _ = checkpoint
    ours = lm.preprocessor.tokenizer
    theirs = transformers.PreTrainedTokenizerFast.from_pretrained(directory)
    texts = ["def sub(a, b):\n    return a - b\n", "the lazy cat<|endoftext|>jumps"]
    assert ours.tokenize(texts) == theirs(texts, add_special_tokens=False)["input_ids"]
    assert type(ours).__name__ == "BytePairTokenizer"
    assert ours.eos_token_id == ours.bos_token_id == ours.pad_token_id == theirs.eos_token_id


def test_greedy_generation_matches_hugging_face(checkpoint, lm):
    """Ragged prompts in one batch for ours; the peer runs each prompt alone (no padding)."""
    _, hf = checkpoint
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, hf.config.vocab_size, n).tolist() for n in (6, 3)]
    ours = lm.generate(prompts, max_new_tokens=12, stop_token_ids=None)
    for prompt, row in zip(prompts, ours):
        with torch.no_grad():
            expected = hf.generate(
                hf_models.to_torch([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=12,
                eos_token_id=None,
                pad_token_id=0,
            )
        assert row == expected[0].tolist()
        assert len(set(row[len(prompt) :])) >= 2  # the continuation is not one repeated token


# The round trip converted -> save_to_preset -> from_preset is tested through `convert` in
# test_hugging_face.py.
