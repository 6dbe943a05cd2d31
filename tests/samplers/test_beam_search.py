"""Beam search on a tiny random GPT (vocabulary 8): exhaustive enumeration, scores, compile(sampler=...)."""

import numpy as np

from keras_transformer.samplers import BeamSampler
from tests.samplers.helpers import causal_logits, exhaustive_beam, prefix_log_probs

VOCAB, STOP, STEPS = 8, 2, 3  # 2 is a likely token: the length penalty matters
PROMPTS = [[3, 5, 1, 6, 2], [4]]  # ragged


def test_beam_finds_the_exhaustive_best(gpt, length_penalty=1.0):
    # With num_beams = V**2 every 2-token prefix survives, so the search is exhaustive.
    sampler = BeamSampler(num_beams=VOCAB**2, length_penalty=length_penalty, num_return_sequences=3)
    out = gpt.generate(PROMPTS, max_new_tokens=STEPS, stop_token_ids=[STOP], sampler=sampler, return_dict=True)
    penalty_matters = False
    for prompt, results, scores in zip(PROMPTS, out["outputs"], out["scores"]):
        table = prefix_log_probs(
            lambda continuations: causal_logits(gpt, [prompt + c for c in continuations]), VOCAB, STEPS
        )
        best = exhaustive_beam(table, VOCAB, STOP, length_penalty, STEPS)[:3]
        assert [r[len(prompt) :] for r in results] == [sequence for _, sequence in best]
        assert all(r[: len(prompt)] == prompt for r in results)
        np.testing.assert_allclose(scores, [score for score, _ in best], atol=1e-4)
        assert list(scores) == sorted(scores, reverse=True)
        other = exhaustive_beam(table, VOCAB, STOP, 1.0 - length_penalty, STEPS)[:3]
        penalty_matters |= [s for _, s in other] != [s for _, s in best]
    assert penalty_matters  # otherwise this model could not tell a wrong length penalty apart


def test_compile_sets_the_default_sampler(gpt):
    gpt.compile(sampler="beam")
    try:
        assert isinstance(gpt.sampler, BeamSampler) and gpt.sampler.num_beams == 4
        default = gpt.generate(PROMPTS, max_new_tokens=6, stop_token_ids=[STOP])
        assert default == gpt.generate(PROMPTS, max_new_tokens=6, stop_token_ids=[STOP], sampler=BeamSampler())
    finally:
        gpt.compile(sampler="greedy")
