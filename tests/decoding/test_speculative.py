"""Speculative decoding by prompt lookup (`generate(prompt_lookup_num_tokens=num_tokens)`): greedy, its tokens exactly
plain greedy decoding's, for GPT, Llama and T5, K = 1, 3, 5, batch 1 and 3, with stop tokens, the processors,
`output_logits` and a streamer; the drafts themselves against a numpy copy of transformers' prompt lookup.

Tiny random models fall into loops that prompt lookup predicts: the tests check that drafts were accepted
(fewer verify passes than tokens), so that a loop that never accepts one cannot pass for a fast one.
"""

import importlib

import keras
import numpy as np
import pytest

from keras_transformer.decoding import compile as compile_lib
from keras_transformer.decoding.prompt_lookup import propose
from keras_transformer.decoding.speculation import Speculation
from keras_transformer.samplers import BeamSampler, RandomSampler
from tests.kernels.test_torch_kernels import MODELS, VOCABULARY

FAMILIES = {"gpt": MODELS["gpt"], "llama": MODELS["llama_gqa_tied"], "t5": MODELS["t5_tied_relu"]}
NEW = 14
# the module (the package's `generate` attribute is the function of the same name)
generate_module = importlib.import_module("keras_transformer.decoding.generate")


@pytest.fixture(scope="module")
def tasks():
    keras.utils.set_random_seed(7)
    return {name: build() for name, build in FAMILIES.items()}


@pytest.fixture
def steps(monkeypatch):
    """The verify passes of every speculative call, in order."""
    counts = []
    decode = generate_module.speculative_decode

    def counted(*args, **kwargs):
        outputs = decode(*args, **kwargs)
        counts.append(int(outputs["steps"]))
        return outputs

    monkeypatch.setattr(generate_module, "speculative_decode", counted)
    return counts


def _prompts():
    rng = np.random.default_rng(4)
    motif = rng.integers(1, VOCABULARY, 5).tolist()
    # a row that repeats itself, a random row, a short row: ragged, and drafts that agree differently per row
    return [motif * 3, rng.integers(1, VOCABULARY, 9).tolist(), motif[:2]]


def _ids(results):
    return [np.asarray(r).tolist() for r in results]


# K = 1, 3, 5 on Llama, K = 3 on GPT and T5: every K and every family, each one more compiled loop per backend
@pytest.mark.parametrize("family, num_tokens", [("gpt", 3), ("t5", 3), ("llama", 1), ("llama", 3), ("llama", 5)])
def test_prompt_lookup_gives_plain_greedy_tokens(tasks, family, num_tokens, steps):
    """Batch 3 (ragged) with a stop token that row 0 meets mid-way (the other rows run to max_new_tokens, or
    stop where they meet it); batch 1 for K = 3."""
    task, prompts = tasks[family], _prompts()
    stop = _ids(task.generate(prompts[:1], max_new_tokens=NEW, stop_token_ids=None))[0][-NEW + 4]
    plain = _ids(task.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop]))
    speculative = _ids(
        task.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop], prompt_lookup_num_tokens=num_tokens)
    )
    assert speculative == plain and len(plain[0]) < len(prompts[0]) + NEW
    if num_tokens == 3:
        one = [prompts[1]]
        plain = _ids(task.generate(one, max_new_tokens=NEW, stop_token_ids=None))
        assert _ids(task.generate(one, max_new_tokens=NEW, stop_token_ids=None, prompt_lookup_num_tokens=3)) == plain
        assert steps[-1] < NEW  # drafts were accepted


def test_rows_accept_differently_and_advance_together(tasks, steps):
    """Each row alone needs its own number of verify passes; together they advance by the smallest accepted
    count and still give plain greedy's tokens (T5: the tiny random decoder-only models fall into the same
    one-token loop from every prompt)."""
    task, prompts = tasks["t5"], _prompts()
    alone = []
    for prompt in prompts:
        task.generate([prompt], max_new_tokens=NEW, stop_token_ids=None, prompt_lookup_num_tokens=3)
        alone.append(steps[-1])
    assert len(set(alone)) > 1, alone
    together = _ids(task.generate(prompts, max_new_tokens=NEW, stop_token_ids=None, prompt_lookup_num_tokens=3))
    assert together == _ids(task.generate(prompts, max_new_tokens=NEW, stop_token_ids=None))
    assert steps[-1] >= max(alone)


def test_processors_logits_and_streamer_as_in_plain_decoding(tasks):
    """min_new_tokens, a repetition penalty and an n-gram ban act on each drafted position as plain decoding's
    step does; output_logits keeps each token's logits; the streamer gets every token in order."""
    task, prompts = tasks["gpt"], _prompts()
    plain_stream, speculative_stream = [], []
    kwargs = dict(
        max_new_tokens=NEW,
        stop_token_ids=[3],
        min_new_tokens=4,
        repetition_penalty=1.3,
        no_repeat_ngram_size=4,
        return_dict=True,
        output_logits=True,
    )
    plain = task.generate(prompts, streamer=plain_stream.append, **kwargs)
    speculative = task.generate(
        prompts, streamer=speculative_stream.append, prompt_lookup_num_tokens=4, max_matching_ngram_size=3, **kwargs
    )
    assert _ids(speculative["outputs"]) == _ids(plain["outputs"])
    for ours, theirs in zip(speculative["logits"], plain["logits"]):
        np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)

    def per_row(stream):
        return [[int(t) for t in column if t >= 0] for column in np.stack(stream, axis=1)]

    assert per_row(speculative_stream) == per_row(plain_stream)
    assert [len(r) for r in per_row(plain_stream)] == [len(o) - len(p) for o, p in zip(_ids(plain["outputs"]), prompts)]


def test_the_compiled_pytorch_step(tasks, monkeypatch, steps):
    """On PyTorch the speculative step compiled as one graph (torch.compile's "eager" backend); elsewhere the
    same check through the backend's compiled loop."""
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_ENV, "1")
    monkeypatch.setenv(compile_lib.TORCH_COMPILE_BACKEND_ENV, "eager")
    keras.utils.set_random_seed(7)
    task, prompts = MODELS["llama_gqa_tied"](), _prompts()  # a model of its own: its kernels compiled anew
    speculative = _ids(task.generate(prompts, max_new_tokens=NEW, stop_token_ids=None, prompt_lookup_num_tokens=3))
    assert speculative == _ids(task.generate(prompts, max_new_tokens=NEW, stop_token_ids=None))
    assert steps[-1] < NEW


@pytest.fixture(scope="module")
def drafts():
    """Per family a one-layer draft of the same vocabulary, other random weights."""
    keras.utils.set_random_seed(8)
    return {name: build(num_layers=1) for name, build in FAMILIES.items()}


@pytest.mark.parametrize("family, num_tokens", [("gpt", 3), ("t5", 3), ("llama", 1), ("llama", 3), ("llama", 5)])
def test_a_draft_model_gives_plain_greedy_tokens(tasks, drafts, family, num_tokens, steps):
    """A one-layer draft (batch 3, ragged, a stop token) and the model as its own draft (batch 1: every draft
    accepted, so each verify pass writes K + 1 tokens)."""
    task, prompts = tasks[family], _prompts()
    stop = _ids(task.generate(prompts[:1], max_new_tokens=NEW, stop_token_ids=None))[0][-NEW + 4]
    plain = _ids(task.generate(prompts, max_new_tokens=NEW, stop_token_ids=[stop]))
    speculative = task.generate(
        prompts, max_new_tokens=NEW, stop_token_ids=[stop], draft_model=drafts[family], num_draft_tokens=num_tokens
    )
    assert _ids(speculative) == plain
    if num_tokens == 3:
        one = [prompts[1]]
        plain = _ids(task.generate(one, max_new_tokens=NEW, stop_token_ids=None))
        assert _ids(task.generate(one, max_new_tokens=NEW, stop_token_ids=None, draft_model=task)) == plain
        assert steps[-1] == -(-NEW // 6)  # num_draft_tokens=None: 5 drafts, 6 tokens a pass


def test_a_draft_model_of_another_vocabulary_or_kind_is_a_value_error(tasks):
    keras.utils.set_random_seed(9)
    other = MODELS["gpt"](vocabulary_size=VOCABULARY + 1)
    with pytest.raises(ValueError, match=f"vocabulary_size={VOCABULARY}.*vocabulary_size={VOCABULARY + 1}"):
        tasks["gpt"].generate([[1, 2, 3]], max_new_tokens=4, draft_model=other)
    with pytest.raises(ValueError, match="must be a causal LM"):
        tasks["gpt"].generate([[1, 2, 3]], max_new_tokens=4, draft_model=tasks["t5"])
    with pytest.raises(ValueError, match="beam search"):
        tasks["gpt"].generate([[1, 2, 3]], max_new_tokens=4, draft_model=tasks["llama"], sampler="beam")


def _lookup_reference(history, num_tokens, max_ngram):
    """transformers' PromptLookupCandidateGenerator.get_candidates on one row of known tokens (numpy), with
    the latest match instead of the earliest and the continuation repeated past the end."""
    length = len(history)
    for n in range(max_ngram, 0, -1):
        if n >= length:
            continue
        ngram = history[-n:]
        for start in reversed(range(length - n + 1)):
            if list(history[start : start + n]) == list(ngram) and start + n < length:
                continuation = list(history[start + n :])
                return [continuation[t % len(continuation)] for t in range(num_tokens)]
    return []


def test_drafts_are_prompt_lookup_candidates_from_the_latest_match():
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 4, size).tolist() for size in (1, 2, 5, 9, 12, 12, 13)] + [[1, 2, 3, 1, 2], [5, 6, 7, 8]]
    width, num_tokens = 14, 4
    for max_ngram in (1, 2, 3):
        history = np.full((len(rows), width), -1, "int32")
        for r, row in enumerate(rows):
            history[r, : len(row)] = row
        end = np.array([len(r) for r in rows], "int32")
        drafts = propose(keras.ops.convert_to_tensor(history), keras.ops.convert_to_tensor(end), max_ngram, num_tokens)
        drafts = keras.ops.convert_to_numpy(drafts)
        for r, row in enumerate(rows):
            expected = _lookup_reference(np.array(row), num_tokens, max_ngram)
            assert drafts[r, : len(expected)].tolist() == expected, (max_ngram, row)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_lookup_num_tokens=0), "prompt_lookup_num_tokens=0"),
        (dict(prompt_lookup_num_tokens=-2), "prompt_lookup_num_tokens=-2"),
        (dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=0), "max_matching_ngram_size=0"),
        (dict(prompt_lookup_num_tokens=3, sampler=BeamSampler(num_beams=2)), "beam search"),
        (dict(num_draft_tokens=3), "needs a `draft_model`"),
    ],
)
def test_bad_speculation_is_a_value_error(tasks, kwargs, message):
    if "draft_model" in kwargs:
        kwargs = {**kwargs, "draft_model": tasks[kwargs["draft_model"]]}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tasks["gpt"].generate([[1, 2, 3]], max_new_tokens=4, **kwargs)


CHI_SQUARE_999 = {24: 51.18, 15: 37.70}  # the chi-square distribution's 0.999 quantile by degrees of freedom


def _chi_square(counts, expected):
    return float(np.sum((counts - expected) ** 2 / expected))


def _pairs(task, prompt, rows, sampler, draft=None):
    """The first two new tokens of `rows` samples, as counts (V, V): prompt lookup, or a draft model's drafts."""
    speculation = dict(prompt_lookup_num_tokens=2) if draft is None else dict(draft_model=draft, num_draft_tokens=2)
    out = np.asarray(
        task.generate(
            np.array([prompt] * rows, "int32"), max_new_tokens=2, stop_token_ids=None, sampler=sampler, **speculation
        )
    )
    counts = np.zeros((5, 5))
    np.add.at(counts, (out[:, len(prompt)], out[:, len(prompt) + 1]), 1)
    return counts, out


def test_prompt_lookup_sampling_draws_from_the_model_distribution(monkeypatch):
    """Vocabulary 5, a prompt whose drafts are certain (1 2 3 1 2 3 1 2: drafts 3, 1): the first two new tokens of
    2000 rows against the model's own joint distribution (temperature 1.5), chi-square at 0.999 over 25 cells; the
    same with a one-layer draft model's drafts. The test fails a rule that keeps every draft; a seed gives the same
    tokens twice, another seed others."""
    keras.utils.set_random_seed(3)
    task = MODELS["gpt"](vocabulary_size=5)
    prompt, rows, temperature = [1, 2, 3, 1, 2, 3, 1, 2], 2000, 1.5

    def next_probabilities(ids):
        logits = keras.ops.convert_to_numpy(
            task({"token_ids": np.array([ids]), "padding_mask": np.ones((1, len(ids)), bool)})
        )
        z = logits[0, -1] / temperature
        return np.exp(z - z.max()) / np.exp(z - z.max()).sum()

    first = next_probabilities(prompt)
    expected = np.stack([first[a] * next_probabilities(prompt + [a]) for a in range(5)]) * rows  # (V, V)
    assert expected.min() > 5  # every cell counts: the chi-square approximation holds
    counts, out = _pairs(task, prompt, rows, RandomSampler(temperature=temperature, seed=11))
    assert _chi_square(counts, expected) < CHI_SQUARE_999[24]
    again = _pairs(task, prompt, 50, RandomSampler(temperature=temperature, seed=11))[1]
    other = _pairs(task, prompt, 50, RandomSampler(temperature=temperature, seed=12))[1]
    assert (again == _pairs(task, prompt, 50, RandomSampler(temperature=temperature, seed=11))[1]).all()
    assert (again != other).any()

    draft = MODELS["gpt"](vocabulary_size=5, num_layers=1)  # other weights: drafts drawn from another distribution
    counts, _ = _pairs(task, prompt, rows, RandomSampler(temperature=temperature, seed=13), draft)
    assert _chi_square(counts, expected) < CHI_SQUARE_999[24]

    rejection = importlib.import_module("keras_transformer.decoding.rejection")
    monkeypatch.setattr(rejection, "uniform_noise", lambda seed, step, rows: keras.ops.full((rows,), 1e-6))
    broken = MODELS["gpt"](vocabulary_size=5)  # its own compiled loop, traced with the broken rule
    broken.set_weights(task.get_weights())
    counts, _ = _pairs(broken, prompt, rows, RandomSampler(temperature=temperature, seed=11))
    assert _chi_square(counts, expected) > CHI_SQUARE_999[24]


def test_a_seq2seq_model_looks_up_its_source_then_its_output():
    """The decoder knows only its start token (0): the drafts are what followed a 0 in the source (padding, -1,
    never matched); once the output has its own earlier match, the latest occurrence wins."""
    loop = importlib.import_module("keras_transformer.decoding.speculative_loop")
    speculation = Speculation(3, 2)
    source = keras.ops.convert_to_tensor(np.array([[5, 0, 7, 8, 9, -1, -1]], "int32"))
    tokens = np.zeros((1, 8), "int32")
    drafts = loop._drafts(keras.ops.convert_to_tensor(tokens), keras.ops.convert_to_tensor([1]), source, speculation, 3)
    assert keras.ops.convert_to_numpy(drafts).tolist() == [[7, 8, 9]]
    tokens[0, :5] = [0, 7, 4, 0, 7]  # the output's own "0 7" came later than the source's: followed by 4
    drafts = loop._drafts(keras.ops.convert_to_tensor(tokens), keras.ops.convert_to_tensor([5]), source, speculation, 3)
    assert keras.ops.convert_to_numpy(drafts).tolist() == [[4, 0, 7]]
