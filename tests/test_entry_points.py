"""What the lower floors look up but may not import: the Hugging Face reader behind `from_preset(hf_dir)` and the
writers behind `Task.export`, declared by the top-level package (keras_transformer/entry_points.py).

The reference is a fresh interpreter that imports only `keras_transformer.models`, as a user may: neither the
converters nor the exporters are loaded until a lookup needs them, and then both paths work."""

import pytest

import keras_transformer.export
from keras_transformer import entry_points
from keras_transformer.convert import gguf_checkpoint, gguf_export, hugging_face
from tests.export.helpers import run_python


def test_the_declared_providers_are_the_ones_that_exist():
    assert entry_points.names(entry_points.EXPORTERS) == (*keras_transformer.export.FORMATS, gguf_export.FORMAT)
    assert {entry_points.load(entry_points.EXPORTERS, name) for name in keras_transformer.export.FORMATS} == {
        keras_transformer.export.export_model
    }
    assert entry_points.load(entry_points.EXPORTERS, gguf_export.FORMAT) is gguf_export.export_gguf
    assert entry_points.names(entry_points.CHECKPOINT_READERS) == ("model_type",)
    assert entry_points.load(entry_points.CHECKPOINT_READERS, "model_type") is hugging_face.convert_config
    assert entry_points.names(entry_points.FILE_READERS) == (gguf_checkpoint.SUFFIX,)
    assert entry_points.load(entry_points.FILE_READERS, gguf_checkpoint.SUFFIX) is gguf_checkpoint.convert_config


def test_a_reference_names_a_module_and_an_attribute():
    with pytest.raises(ValueError, match="'module:attribute'. Received: reference='keras_transformer.export'"):
        entry_points.declare(entry_points.EXPORTERS, "zip", "keras_transformer.export")
    with pytest.raises(KeyError, match="No entry point 'zip' is declared in 'exporters'"):
        entry_points.load(entry_points.EXPORTERS, "zip")


IMPORT_ONLY_THE_MODELS = """
import json, sys
import numpy as np
from keras_transformer.models import GPTCausalLM

def loaded():
    return [name for name in ("keras_transformer.convert", "keras_transformer.export") if name in sys.modules]

before = loaded()
lm = GPTCausalLM.from_preset("gpt_tiny")
lm.export(sys.argv[1], format="huggingface")  # Task.export looks the writer up: export loads now
back = GPTCausalLM.from_preset(sys.argv[1])  # the loader looks the Hugging Face reader up
print(json.dumps({"before": before, "after": loaded(), "same": all(
    np.array_equal(a, b) for a, b in zip(lm.get_weights(), back.get_weights()))}))
"""


@pytest.mark.slow
def test_importing_only_the_models_converts_and_exports(tmp_path):
    result = run_python(IMPORT_ONLY_THE_MODELS, tmp_path / "hf")
    assert result == {"before": [], "after": ["keras_transformer.convert", "keras_transformer.export"], "same": True}
