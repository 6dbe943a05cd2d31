"""Exports shared by the export tests: each family's tiny task is exported once per session.

Exports are slow (a TensorFlow conversion, and under JAX or PyTorch a child process), so
every test module asks `exported(family)` for the same task, bundle and SavedModel.
"""

import pytest

from keras_transformer import cli
from tests.export import helpers

_BUILDERS = {
    "gpt": helpers.tiny_gpt,
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
            bundle = task.export(directory / "bundle", format="onnx")
            if family == "gpt":  # the command line's export, from a preset of the same weights
                task.save_to_preset(directory / "preset")
                assert cli.main(["export", str(directory / "preset"), str(directory / "saved_model"),
                                 "--format", "tf_saved_model"]) == 0
                saved_model = directory / "saved_model"
            else:
                saved_model = task.export(directory / "saved_model", format="tf_saved_model")
            cache[family] = {"task": task, "bundle": bundle, "saved_model": saved_model}
        return cache[family]

    return get
