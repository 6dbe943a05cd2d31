"""A draft bundle for speculative decoding in the Keras-free runtime (export/runtime/prompt_lookup.py's `DraftProposer`,
issue 41): `Generator.generate_ids(draft=..., num_draft_tokens=K)`.

Greedy: the trained `llama_stdlib` and its `llama_stdlib_draft` (the same tokenizer; 1 layer of width 64 against 2
of 128), so that some drafts are kept and some not; the tokens equal the target bundle's plain greedy tokens and
Keras's `generate(draft_model=...)`, K = 1 and 3, batch 1 and 2, with a stop token. Random sampling: two GPTs over
5 ids, the tokens counted against the target's own distribution (chi-square), and a rule that keeps every draft
fails the same count. Bad input is a ValueError naming the argument.
"""

import numpy as np
import pytest

from keras_transformer.export.onnx import write_onnx_bundle
from keras_transformer.samplers import GreedySampler
from tests.export.helpers import bundle_generator, tiny_vocabulary_gpt

pytestmark = pytest.mark.slow
NEW = 24
CODE = ["import os\nimport sys\n\n\ndef main(", "class Stack:\n    def __init__(self"]


@pytest.fixture(scope="module")
def target(stdlib_draft_bundles):
    return bundle_generator(stdlib_draft_bundles["target"][1])


@pytest.fixture(scope="module")
def draft(stdlib_draft_bundles):
    return bundle_generator(stdlib_draft_bundles["draft"][1])


@pytest.fixture(scope="module")
def prompts(target):
    return [target.encode(text) for text in CODE]


@pytest.fixture(scope="module")
def stop(target, prompts):
    """A stop token: the first row's 10th plain greedy token, so that it stops inside a pass (or at its end)."""
    return target.generate_ids(prompts[:1], NEW, stop_token_ids=None)[0][9]


@pytest.fixture(scope="module")
def greedy(target, prompts, stop):
    plain = target.generate_ids(prompts, NEW, stop_token_ids=[stop])
    assert len(plain[0]) == 10 and plain[0][-1] == stop  # the stop token ends the first row
    return plain


@pytest.mark.parametrize("num_tokens, rows", [(1, [0]), (3, [0, 1]), (3, [1])])
def test_draft_bundle_gives_the_greedy_tokens(target, draft, prompts, stop, greedy, num_tokens, rows):
    found = target.generate_ids(
        [prompts[r] for r in rows], NEW, stop_token_ids=[stop], draft=draft, num_draft_tokens=num_tokens
    )
    assert found == [greedy[r] for r in rows]
    drafted = sum(d for d, _ in target.draft_counts)
    accepted = sum(a for _, a in target.draft_counts)
    assert 0 < accepted < drafted  # passes that keep drafts and passes that roll the draft's cache back


def test_the_draft_proposes_its_own_greedy_tokens(target, draft, prompts, stop, greedy, monkeypatch):
    """Each pass's drafts are the draft bundle's plain greedy continuation of the sequence so far: its cache, rolled
    back after rejected drafts and fed what it has not seen, stays in step; the target as its own draft keeps all."""
    proposer = type(target).generate_ids.__globals__["prompt_lookup"].DraftProposer
    propose, checked = proposer.propose, []

    def checked_propose(self, history, num_tokens):
        drafts, proposal = propose(self, history, num_tokens)
        if num_tokens:
            checked.append(drafts == self.generator.generate_ids([history], num_tokens, stop_token_ids=None)[0])
        return drafts, proposal

    monkeypatch.setattr(proposer, "propose", checked_propose)
    assert target.generate_ids(prompts, NEW, stop_token_ids=[stop], draft=draft, num_draft_tokens=3) == greedy
    assert len(checked) > 5 and all(checked)
    assert target.generate_ids(prompts, NEW, stop_token_ids=[stop], draft=target, num_draft_tokens=4) == greedy
    assert all(0 < accepted == drafted for drafted, accepted in target.draft_counts)


def test_draft_bundle_agrees_with_keras_draft_model(stdlib_draft_bundles, target, prompts, stop, greedy):
    """Keras's `generate(draft_model=...)` on the same presets, and the draft given as its bundle directory."""
    task, draft_task = stdlib_draft_bundles["target"][0], stdlib_draft_bundles["draft"][0]
    keras_rows = task.generate(
        prompts,
        max_new_tokens=NEW,
        sampler=GreedySampler(),
        stop_token_ids=[stop],
        draft_model=draft_task,
        num_draft_tokens=3,
    )
    assert [list(map(int, row[len(p) :])) for p, row in zip(prompts, keras_rows)] == greedy
    path = str(stdlib_draft_bundles["draft"][1])
    assert target.generate_ids(prompts, NEW, stop_token_ids=[stop], draft=path) == greedy  # K = 5 by default


def test_bad_draft_arguments_are_value_errors(target, draft, prompts, kernel_gpt):
    other = bundle_generator(kernel_gpt[1])  # another vocabulary
    cases = [
        (dict(draft=other), "vocabulary_size"),
        (dict(draft=draft, num_draft_tokens=0), "num_draft_tokens=0"),
        (dict(draft=draft, num_draft_tokens=2.5), "num_draft_tokens=2.5"),
        (dict(draft=draft, sampler="beam"), "sampler='beam'"),
        (dict(num_draft_tokens=3), "num_draft_tokens=3, draft=None"),
        (dict(draft=draft, prompt_lookup_num_tokens=3), "not both"),
        (dict(draft=object()), "draft=<object"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
            target.generate_ids(prompts, 4, **kwargs)
    single = bundle_generator(target.bundle_dir)
    single.multi_token = False  # as a traced bundle's decode graph, or one exported before multi-token steps
    with pytest.raises(ValueError, match="takes one token per step"):
        single.generate_ids(prompts, 4, draft=draft)
    longrope = bundle_generator(draft.bundle_dir)
    longrope.refresh_after = len(prompts[0]) + 1  # a cache computed again on the way: refused, as in prompt lookup
    with pytest.raises(ValueError, match=f"cannot cross position {len(prompts[0]) + 1}, where the draft"):
        target.generate_ids(prompts[:1], 4, draft=longrope)


CHI_SQUARE_999 = 51.18  # the chi-square distribution's 0.999 quantile, 24 degrees of freedom


@pytest.fixture(scope="module")
def five_ids(tmp_path_factory):
    """(target, draft) `Generator`s: GPTs over 5 ids, of different weights and depths."""
    found = []
    for name, task in (("target", tiny_vocabulary_gpt(3)), ("draft", tiny_vocabulary_gpt(5, 1))):
        directory = tmp_path_factory.mktemp("five_ids") / name
        directory.mkdir()
        write_onnx_bundle(task, directory, traced=False)
        found.append(bundle_generator(directory))
    return found


def _counts(target, draft, prompt, rows, seed, temperature):
    """The second and third new tokens of `rows` draws, counted (V, V): the first comes from the prefill, then
    one pass checks 2 drafts, each kept or redrawn by the rejection rule."""
    out = target.generate_ids(
        [prompt] * rows,
        4,
        sampler="random",
        temperature=temperature,
        seed=seed,
        stop_token_ids=None,
        draft=draft,
        num_draft_tokens=2,
    )
    counts = np.zeros((5, 5))
    np.add.at(counts, tuple(np.asarray(out)[:, 1:3].T), 1)
    return counts, out


def test_draft_sampling_draws_from_the_target_distribution(five_ids, monkeypatch):
    """1200 rows against the target's own joint distribution of (token 2, token 3) (temperature 1.5, the first
    token summed over), from its prefill graph fed each continuation whole; chi-square at 0.999 over 25 cells. A
    seed gives the same tokens twice, another seed others; keeping every draft fails the count (of 300 rows)."""
    target, draft = five_ids
    prompt, rows, temperature = [1, 2, 3, 1], 1200, 1.5

    def probabilities(logits):
        z = logits / temperature
        return np.exp(z - z.max(-1, keepdims=True)) / np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)

    expected = np.zeros((5, 5))
    for a in range(5):
        for b in range(5):
            p = probabilities(target.teacher_logits(prompt + [a, b]))  # (T, V): the next token after each position
            expected[b] += p[len(prompt) - 1, a] * p[len(prompt), b] * p[len(prompt) + 1]
    expected *= rows
    assert expected.min() > 5  # every cell counts: the chi-square approximation holds
    counts, out = _counts(target, draft, prompt, rows, 11, temperature)
    assert ((counts - expected) ** 2 / expected).sum() < CHI_SQUARE_999
    assert 0 < sum(a for _, a in target.draft_counts) < sum(d for d, _ in target.draft_counts)
    again, other = (_counts(target, draft, prompt, 50, seed, temperature)[1] for seed in (11, 12))
    assert again == out[:50] and again != other

    speculation = type(target).generate_ids.__globals__["prompt_lookup"]  # the bundle's runtime module
    draw = speculation.draw
    monkeypatch.setattr(
        speculation, "speculative_accept", lambda p, drafts, q, u: (len(drafts), draw(p[len(drafts)], u[-1]))
    )
    counts, _ = _counts(target, draft, prompt, rows // 4, 11, temperature)
    assert ((counts - expected / 4) ** 2 / (expected / 4)).sum() > CHI_SQUARE_999
