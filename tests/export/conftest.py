"""Exports shared by the export tests: each family's tiny task is exported once per session.

Exports are slow (a TensorFlow conversion, and under JAX or PyTorch a child process), so
every test module asks `exported(family)` for the same task, bundle and SavedModel. GPT is
exported through `task.export` and the command line; the other families through
`export_models` (both formats, one child process).
"""

import pytest

from keras_transformer import cli
from keras_transformer.export import export_models
from tests.export import helpers

_BUILDERS = {
    "gpt": helpers.tiny_gpt,
    "llama": helpers.tiny_llama,
    "bert": helpers.tiny_bert_classifier,
    "t5": helpers.tiny_t5,
    "transformer": helpers.tiny_transformer,
}


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """exported(family) -> {"task", "bundle", "saved_model"}, built and exported on first use."""
    cache = {}

    def get(family):
        if family not in cache:
            task = _BUILDERS[family]()
            directory = tmp_path_factory.mktemp(family)
            bundle, saved_model = directory / "bundle", directory / "saved_model"
            if family == "gpt":  # `task.export`, and the command line's export of a preset of the same weights
                assert task.export(bundle, format="onnx") == bundle
                task.save_to_preset(directory / "preset")
                assert cli.main(["export", str(directory / "preset"), str(saved_model), "--format", "tf_saved_model"]) == 0
            else:  # both formats in one call (one TensorFlow child process under JAX or PyTorch)
                export_models(task, {bundle: "onnx", saved_model: "tf_saved_model"})
            cache[family] = {"task": task, "bundle": bundle, "saved_model": saved_model}
        return cache[family]

    return get
