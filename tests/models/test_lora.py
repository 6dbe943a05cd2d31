"""LoRA on every family: only the factors train, save/load of the factors alone, merging, and
generation with LoRA enabled against the full forward pass of the same model."""

import json

import keras
import numpy as np
import pytest
from safetensors import safe_open

from tests.export import helpers

_BUILDERS = {
    "gpt": helpers.tiny_gpt,
    "llama": helpers.tiny_llama,
    "bert": helpers.tiny_bert_classifier,
    "t5": helpers.tiny_t5,
    "transformer": helpers.tiny_transformer,
}
_BUILT = {}


def _copy(family):
    """A fresh copy of the family's tiny task (built once per session: a tokenizer is trained for it)."""
    if family not in _BUILT:
        _BUILT[family] = _BUILDERS[family]()
    task = _BUILT[family]
    copy = type(task).from_config(task.get_config())
    copy.set_weights(task.get_weights())
    return copy


FAMILIES = {family: (lambda family=family: _copy(family)) for family in _BUILDERS}
# GPT always; the other families are marked slow (several seconds each on a shared 2-core machine).
ALL_FAMILIES = [
    family if family == "gpt" else pytest.param(family, marks=pytest.mark.slow) for family in sorted(_BUILDERS)
]


def _inputs(task, seed=0):
    """A batch of every input the task's functional graph takes (ids within the vocabulary)."""
    rng = np.random.default_rng(seed)
    vocabulary = task.backbone.vocabulary_size
    inputs = {}
    for tensor in task.inputs if isinstance(task.inputs, list) else task.inputs.values():
        name = tensor.name.split(":")[0]
        if "mask" in name:
            inputs[name] = np.ones((2, 8), bool)
        elif "segment" in name:
            inputs[name] = np.zeros((2, 8), "int32")
        else:
            inputs[name] = rng.integers(3, vocabulary, (2, 8)).astype("int32")
    return inputs


def _perturb_lora(backbone, seed=1):
    """Non-zero B factors (enable_lora starts them at zero), so LoRA changes the outputs."""
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        if variable.path.endswith("lora_kernel_b"):
            variable.assign(0.3 * rng.standard_normal(tuple(variable.shape)).astype("float32"))


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_lora_changes_outputs_and_merging_keeps_them(family, tmp_path):
    task = FAMILIES[family]()
    x = _inputs(task)
    before = helpers.to_numpy(task(x))
    task.backbone.enable_lora(2)
    np.testing.assert_allclose(helpers.to_numpy(task(x)), before, atol=1e-5)  # B starts at zero
    _perturb_lora(task.backbone)
    with_lora = helpers.to_numpy(task(x))
    assert np.abs(with_lora - before).max() > 1e-2
    task.backbone.save_lora_weights(tmp_path / "adapter.safetensors")

    # The same base weights, LoRA enabled the same way, the factors loaded: identical outputs.
    fresh = FAMILIES[family]()
    fresh.backbone.enable_lora(2)
    fresh.backbone.load_lora_weights(tmp_path / "adapter.safetensors")
    np.testing.assert_array_equal(helpers.to_numpy(fresh(x)), with_lora)

    task.backbone.merge_lora()
    assert not any("lora" in v.path for v in task.weights)
    np.testing.assert_allclose(helpers.to_numpy(task(x)), with_lora, atol=1e-4)
    assert len(task.backbone.trainable_weights) == len(FAMILIES[family]().backbone.trainable_weights)


def test_only_the_lora_factors_train():
    lm = FAMILIES["gpt"]()
    lm.backbone.enable_lora(2)
    names = sorted({v.path.rsplit("/", 2)[-2] for v in lm.trainable_weights})
    assert names == ["query", "value"]
    fit_moves_only_the_factors(lm)


def fit_moves_only_the_factors(lm):
    """`lm` (tiny GPT, LoRA rank 2 on query and value) has only the factors trainable, and two epochs of `fit`
    leave every other weight as it was while the B factors leave zero."""
    assert all(v.path.endswith(("lora_kernel_a", "lora_kernel_b")) for v in lm.trainable_weights)
    assert len(lm.trainable_weights) == 2 * 2 * 2  # layers x (query, value) x (A, B)
    frozen = {v.path: helpers.to_numpy(v) for v in lm.weights if "lora" not in v.path}
    x = _inputs(lm)
    lm.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    lm.fit(x, np.roll(x["token_ids"], -1, axis=1), epochs=2, verbose=0)
    for v in lm.weights:
        if "lora" not in v.path:
            np.testing.assert_array_equal(helpers.to_numpy(v), frozen[v.path], err_msg=v.path)
    assert any(np.abs(helpers.to_numpy(v)).max() > 0 for v in lm.weights if v.path.endswith("lora_kernel_b"))


def test_target_names_choose_layers_and_a_wrong_name_lists_the_available_ones():
    lm = FAMILIES["llama"]()
    lm.backbone.enable_lora(3, target_names=["key", "gate", "attention_output"])
    assert sorted({v.path.rsplit("/", 2)[-2] for v in lm.trainable_weights}) == ["attention_output", "gate", "key"]
    assert {v.shape[-1] for v in lm.trainable_weights if v.path.endswith("lora_kernel_a")} == {3}
    with pytest.raises(ValueError, match="already enabled"):
        lm.backbone.enable_lora(2)
    other = FAMILIES["gpt"]()
    with pytest.raises(ValueError, match=r"'querry'.*Available: \[.*'query'"):
        other.backbone.enable_lora(2, target_names=["querry"])
    with pytest.raises(ValueError, match="rank=0"):
        other.backbone.enable_lora(0)


def test_lora_file_holds_the_factors_alone_and_refuses_another_rank(tmp_path):
    lm = FAMILIES["gpt"]()
    lm.backbone.enable_lora(2)
    path = tmp_path / "adapter.safetensors"
    lm.backbone.save_lora_weights(path)
    with safe_open(str(path), framework="numpy") as f:
        metadata, keys = f.metadata(), list(f.keys())
    assert metadata["rank"] == "2" and json.loads(metadata["target_names"]) == ["query", "value"]
    assert len(keys) == 8
    lora_values = sum(int(np.prod(v.shape)) for v in lm.trainable_weights)
    assert path.stat().st_size < 4 * lora_values + 4096  # the factors, float32, plus a small header

    other = FAMILIES["gpt"]()
    with pytest.raises(ValueError, match="not enabled"):
        other.backbone.load_lora_weights(path)
    other.backbone.enable_lora(4)
    with pytest.raises(ValueError, match=r"rank=2.*rank=4.*Nothing was loaded"):
        other.backbone.load_lora_weights(path)


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_generate_with_lora_follows_the_full_forward_pass(family):
    lm = FAMILIES[family]()
    prompt = [5, 9, 14, 3]
    lm.generate(np.asarray([prompt], "int32"), max_new_tokens=4)  # a compiled loop made before LoRA
    lm.backbone.enable_lora(2)
    _perturb_lora(lm.backbone, seed=2)
    eos = lm.preprocessor.tokenizer.eos_token_id
    expected = helpers.reference_greedy(helpers.causal_next_logits(lm), prompt, 6, eos)
    out = lm.generate(np.asarray([prompt], "int32"), max_new_tokens=6, stop_token_ids=[eos])
    assert list(np.asarray(out)[0, len(prompt) : len(prompt) + len(expected)]) == expected
