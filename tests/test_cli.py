"""`keras-transformer generate PRESET` (the Keras path) with its sampling flags, run in-process through `cli.main`:
what it prints against `generate` with the sampler those flags describe.

(The bundle path of the same command is tested in tests/export/test_decoder_export.py; `presets` and the
errors in tests/export/test_export_api.py.)"""

import numpy as np
import pytest

import keras_transformer.export
from keras_transformer import cli
from keras_transformer.samplers import BeamSampler, GreedySampler, RandomSampler
from tests.export import helpers

PROMPTS = ["def add(", "for i in"]
NEW_TOKENS = 6
RANDOM_FLAGS = ["--sampler", "random", "--temperature", "1.5", "--top-k", "20", "--top-p", "0.9"]
RANDOM = dict(temperature=1.5, top_k=20, top_p=0.9)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tiny GPT (large random weights: no ties between tokens) and the preset directory it was saved to."""
    lm = helpers.tiny_gpt()
    directory = tmp_path_factory.mktemp("cli") / "tiny_gpt"
    lm.save_to_preset(directory)
    return lm, directory


def _cli_generate(capsys, directory, *flags):
    capsys.readouterr()  # drop what came before
    assert (
        cli.main(
            [
                "generate",
                str(directory),
                *(f for p in PROMPTS for f in ("--prompt", p)),
                "--max-new-tokens",
                str(NEW_TOKENS),
                *flags,
            ]
        )
        == 0
    )
    return capsys.readouterr().out


def _printed(texts):
    return "".join(text + "\n" for text in texts)


def test_generate_with_a_preset_prints_what_the_saved_task_generates(saved, capsys, monkeypatch):
    """The whole command: the preset loaded from its directory (the task it loads is kept, to compare with),
    greedy by default, one line per prompt."""
    lm, directory = saved
    load, loaded = keras_transformer.export.load_preset_task, []
    monkeypatch.setattr(
        keras_transformer.export,
        "load_preset_task",
        lambda preset, **kwargs: loaded.append(load(preset, **kwargs)) or loaded[-1],
    )
    printed = _cli_generate(capsys, directory)
    (task,) = loaded
    x, _, _ = lm.preprocessor(PROMPTS)
    assert type(task) is type(lm)
    np.testing.assert_array_equal(helpers.to_numpy(task(x)), helpers.to_numpy(lm(x)))  # the saved weights
    # (the loaded task's own generate, whose loop the command compiled: not a second compile on JAX, TensorFlow)
    assert printed == _printed(task.generate(PROMPTS, max_new_tokens=NEW_TOKENS, sampler=GreedySampler()))


@pytest.fixture
def calls(saved, monkeypatch):
    """The command run on the saved task itself, its `generate` calls recorded: each load of the preset would
    compile its generation loops again (seconds on JAX and TensorFlow); the test above runs the load."""
    lm, directory = saved
    recorded = []

    def load_preset_task(preset, **kwargs):
        assert str(preset) == str(directory) and not kwargs, (preset, kwargs)
        return lm

    def generate(prompts, **kwargs):
        recorded.append(kwargs)
        return type(lm).generate(lm, prompts, **kwargs)

    monkeypatch.setattr(keras_transformer.export, "load_preset_task", load_preset_task)
    monkeypatch.setitem(lm.__dict__, "generate", generate)  # this object only; removed afterwards
    return recorded


@pytest.mark.parametrize(
    "flags, sampler",
    [
        ([*RANDOM_FLAGS, "--seed", "3"], RandomSampler(**RANDOM, seed=3)),
        ([*RANDOM_FLAGS, "--seed", "4"], RandomSampler(**RANDOM, seed=4)),
        (["--sampler", "beam", "--num-beams", "3"], BeamSampler(num_beams=3)),
        (["--sampler", "greedy", "--max-new-tokens", "2"], GreedySampler()),  # the last --max-new-tokens counts
    ],
    ids=["random", "random_seed_4", "beam", "greedy_2_tokens"],
)
def test_sampling_flags_make_the_sampler(saved, calls, capsys, flags, sampler):
    lm, directory = saved
    printed = _cli_generate(capsys, directory, *flags)
    (call,) = calls
    max_new_tokens = int(flags[flags.index("--max-new-tokens") + 1]) if "--max-new-tokens" in flags else NEW_TOKENS
    assert call["max_new_tokens"] == max_new_tokens
    assert type(call["sampler"]) is type(sampler) and call["sampler"].get_config() == sampler.get_config()
    assert printed == _printed(type(lm).generate(lm, PROMPTS, max_new_tokens=max_new_tokens, sampler=sampler))


def test_the_settings_change_the_answer(saved):
    """The settings above give different answers (a seed, the sampler, the length), so a flag that reached the
    sampler but not the generation would show in the printed text too."""
    lm, _ = saved
    answers = [
        tuple(lm.generate(PROMPTS, max_new_tokens=n, sampler=s))
        for n, s in [
            (NEW_TOKENS, RandomSampler(**RANDOM, seed=3)),
            (NEW_TOKENS, RandomSampler(**RANDOM, seed=4)),
            (NEW_TOKENS, GreedySampler()),
            (2, GreedySampler()),
        ]
    ]
    assert len(set(answers)) == len(answers), answers
