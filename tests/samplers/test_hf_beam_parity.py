"""Beam search against Hugging Face `generate(num_beams=...)` on the same random GPT-2 checkpoint:
finished-hypothesis store, length penalty, early stopping and num_return_sequences."""

import numpy as np
import pytest
import torch

from keras_transformer.models import GPTCausalLM
from keras_transformer.samplers import BeamSampler
from tests.convert import hf_models

NEW = 8


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf_gpt2_beam")
    hf = hf_models.gpt2(directory)
    return hf, GPTCausalLM.from_preset(directory)


@pytest.fixture(scope="module")
def case(models):
    """Two ragged prompts, and a stop token the beams are likely to reach: the peer's third greedy token."""
    hf, lm = models
    rng = np.random.default_rng(3)
    prompts = [rng.integers(1, lm.backbone.vocabulary_size, n).tolist() for n in (7, 3)]
    with torch.no_grad():
        greedy = hf.generate(
            hf_models.to_torch(prompts[:1]),
            attention_mask=torch.ones(1, 7, dtype=torch.long),
            do_sample=False,
            max_new_tokens=3,
            eos_token_id=None,
            pad_token_id=0,
        )
    continuation = greedy[0, 7:].tolist()
    assert continuation[2] not in continuation[:2]
    return prompts, continuation[2]


@pytest.mark.parametrize("early_stopping, length_penalty", [(False, 0.0), (True, 1.0), ("never", 2.0)])
def test_beam_search_matches_hugging_face(models, case, early_stopping, length_penalty):
    hf, lm = models
    prompts, stop = case
    sampler = BeamSampler(
        num_beams=4, length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=4
    )
    ours = lm.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop], sampler=sampler, return_dict=True)
    stopped = 0
    for prompt, rows, scores in zip(prompts, ours["outputs"], ours["scores"]):
        with torch.no_grad():
            out = hf.generate(
                hf_models.to_torch([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                num_beams=4,
                num_return_sequences=4,
                early_stopping=early_stopping,
                length_penalty=length_penalty,
                max_new_tokens=NEW,
                eos_token_id=stop,
                pad_token_id=stop,
                output_scores=True,
                return_dict_in_generate=True,
            )
        expected = []
        for sequence in out.sequences.tolist():
            generated = sequence[len(prompt) :]
            if stop in generated:  # Hugging Face pads finished hypotheses (here with the stop id)
                generated = generated[: generated.index(stop) + 1]
                stopped += 1
            expected.append(prompt + generated)
        assert rows == expected
        np.testing.assert_allclose(scores, out.sequences_scores.numpy(), atol=1e-4)
    if length_penalty == 0.0:  # sums of log-probs favour short hypotheses: the stop path is exercised
        assert stopped
