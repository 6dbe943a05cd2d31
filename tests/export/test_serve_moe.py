"""The bundle server serving a mixture of experts: its greedy answers are the Keras model's tokens.

The tiny MoE task (tests/export/helpers.py's `tiny_moe`: a dense layer, then the top 2 of 4 experts) is exported
once per session (conftest.py); its bundle is served as deployed (`python serve.py`, conftest's `server` and
`client` fixtures) and asked for greedy completions of token-id prompts, one at a time and several in one request
(one batch of the server's scheduler, whose rows route to different experts). Keras's `generate` on this backend
gives the expected tokens: the served text is their decoding, and the usage counts them.
"""

import shutil

import pytest

from keras_transformer.samplers import GreedySampler
from tests.export.test_serve import _runtime

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

MODEL = "tiny_moe"
TEXTS = ["def add(a", "for", "the quick brown", "import"]
NEW = 10


@pytest.fixture(scope="module")
def bundle(exported, tmp_path_factory):
    bundle = tmp_path_factory.mktemp("serve_moe") / MODEL
    shutil.copytree(exported("moe")["bundle"], bundle)
    return bundle


@pytest.fixture(scope="module")
def keras_answers(exported):
    """[(prompt ids, Keras's new greedy tokens)] per text: the start token, the text's tokens; up to NEW new tokens,
    the end token included where Keras stopped at it."""
    task = exported("moe")["task"]
    tokenizer = task.preprocessor.tokenizer
    eos = tokenizer.eos_token_id
    prompts = [[tokenizer.bos_token_id] + tokenizer.tokenize(text) for text in TEXTS]
    answers = []
    for prompt, row in zip(prompts, task.generate(prompts, max_new_tokens=NEW, sampler=GreedySampler())):
        new = [int(token) for token in row[len(prompt) :]]
        answers.append((prompt, new[: new.index(eos) + 1] if eos in new else new))
    return answers


@pytest.fixture(scope="module")
def tokenizer(bundle):
    return _runtime(bundle).Generator(bundle).tokenizer


def test_the_bundle_is_a_mixture_of_experts(bundle):
    """The served graphs read stacked experts (what makes this test about the MoE bundle)."""
    import onnx

    graph = onnx.load(str(bundle / "decode.onnx"), load_external_data=False).graph
    assert [t.name for t in graph.initializer if t.name.endswith(".gate_up")], "no stacked experts in the bundle"


def test_greedy_answers_are_the_keras_tokens(client, keras_answers, tokenizer):
    assert any(len(new) == NEW for _, new in keras_answers)  # not every answer stops at once
    for prompt, new in keras_answers:
        answer = client.completions.create(model=MODEL, prompt=prompt, max_tokens=NEW, temperature=0)
        assert answer.choices[0].text == tokenizer.decode(new, skip_special_tokens=True), prompt
        assert answer.usage.completion_tokens == len(new)
    prompts = [prompt for prompt, _ in keras_answers]
    together = client.completions.create(model=MODEL, prompt=prompts, max_tokens=NEW, temperature=0)
    texts = [choice.text for choice in sorted(together.choices, key=lambda choice: choice.index)]
    assert texts == [tokenizer.decode(new, skip_special_tokens=True) for _, new in keras_answers]
