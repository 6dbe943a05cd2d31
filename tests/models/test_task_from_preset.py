"""`from_preset` on the task base classes `Seq2SeqLM`, `MaskedLM` and `TextClassifier`: the preset picks the
family's class (the task class its config names, else the one subclass built on its backbone), loaded with its
weights; a preset of another task is refused with a ValueError that names both.

(`CausalLM.from_preset` is tested with the Llama presets, tests/models/llama/test_llama.py.)"""

import numpy as np
import pytest

import keras_transformer as kt
from tests.export import helpers


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Presets written here: a Transformer seq2seq task, a BERT classifier, and a T5 and a BERT backbone alone.
    -> {name: (directory, the model saved)}."""
    root = tmp_path_factory.mktemp("task_presets")
    transformer, classifier, t5 = helpers.tiny_transformer(), helpers.tiny_bert_classifier(), helpers.tiny_t5()
    presets = {
        "transformer": transformer,
        "classifier": classifier,
        "t5_backbone": t5.backbone,
        "bert_backbone": classifier.backbone,
    }
    for name, model in presets.items():
        model.save_to_preset(root / name)
    return {name: (root / name, model) for name, model in presets.items()}


def _inputs(model, batch=2, length=8):
    """A batch of every input a task's or backbone's functional graph takes (ids within the vocabulary)."""
    rng = np.random.default_rng(0)
    vocabulary = getattr(model, "backbone", model).vocabulary_size
    inputs = {}
    for tensor in model.inputs if isinstance(model.inputs, list) else model.inputs.values():
        name = tensor.name.split(":")[0]
        if name == "mask_positions":
            inputs[name] = np.tile(np.arange(1, 4, dtype="int32"), (batch, 1))
        elif "mask" in name:
            inputs[name] = np.ones((batch, length), bool)
        elif "segment" in name:
            inputs[name] = np.zeros((batch, length), "int32")
        else:
            inputs[name] = rng.integers(3, vocabulary, (batch, length)).astype("int32")
    return inputs


def _same_outputs(loaded, original):
    """The same outputs (a tensor, or a backbone's dict of them) for the same inputs: the same weights."""
    x = _inputs(original)
    actual, expected = loaded(x), original(x)
    if isinstance(expected, dict):
        assert sorted(actual) == sorted(expected)
        actual, expected = [actual[k] for k in sorted(actual)], [expected[k] for k in sorted(expected)]
    else:
        actual, expected = [actual], [expected]
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(helpers.to_numpy(a), helpers.to_numpy(e))


@pytest.mark.parametrize(
    "base, preset, expected",
    [("Seq2SeqLM", "t5_reverse", "T5Seq2SeqLM"), ("MaskedLM", "bert_stdlib", "BertMaskedLM")],
    ids=["seq2seq", "masked"],
)
def test_a_shipped_preset_gives_the_task_class_it_names(base, preset, expected):
    task = getattr(kt.models, base).from_preset(preset)
    assert type(task) is getattr(kt.models, expected)
    assert type(task.preprocessor) is type(task).preprocessor_cls
    _same_outputs(task, getattr(kt.models, expected).from_preset(preset))  # the trained weights, loaded


def test_a_saved_task_comes_back_as_its_own_class(saved):
    directory, transformer = saved["transformer"]
    task = kt.models.Seq2SeqLM.from_preset(directory)  # Seq2SeqLM's other family: not always the first one
    assert type(task) is kt.models.TransformerSeq2SeqLM
    _same_outputs(task, transformer)
    directory, classifier = saved["classifier"]
    task = kt.models.TextClassifier.from_preset(directory)
    assert type(task) is kt.models.BertClassifier and task.num_classes == classifier.num_classes == 3
    _same_outputs(task, classifier)


def test_a_backbone_alone_gives_the_one_task_of_the_base_built_on_it(saved):
    directory, backbone = saved["t5_backbone"]
    task = kt.models.Seq2SeqLM.from_preset(directory, preprocessor=None)
    assert type(task) is kt.models.T5Seq2SeqLM and task.preprocessor is None
    _same_outputs(task.backbone, backbone)
    directory, backbone = saved["bert_backbone"]
    assert type(kt.models.MaskedLM.from_preset(directory, preprocessor=None)) is kt.models.BertMaskedLM
    task = kt.models.TextClassifier.from_preset(directory, preprocessor=None, num_classes=5)
    assert type(task) is kt.models.BertClassifier and task.num_classes == 5
    _same_outputs(task.backbone, backbone)


@pytest.mark.parametrize(
    "base, preset, message",
    [
        ("Seq2SeqLM", "gpt_stdlib", "'GPTCausalLM' is not a keras_transformer Seq2SeqLM"),
        ("MaskedLM", "classifier", "'BertClassifier' is not a keras_transformer MaskedLM"),
        ("TextClassifier", "bert_stdlib", "'BertMaskedLM' is not a keras_transformer TextClassifier"),
        ("MaskedLM", "t5_reverse", "'T5Seq2SeqLM' is not a keras_transformer MaskedLM"),
        (
            "Seq2SeqLM",
            "bert_backbone",
            "holds a BertBackbone and names no task: no Seq2SeqLM subclasses are built on it",
        ),
    ],
)
def test_a_preset_of_another_task_is_refused(saved, base, preset, message):
    preset = saved[preset][0] if preset in saved else preset
    with pytest.raises(ValueError, match=message):
        getattr(kt.models, base).from_preset(preset)
