"""keras_transformer: a Keras 3 Transformer model zoo for TensorFlow, JAX and PyTorch.

The public API loads Keras (and with it the backend), so each part loads on first use: `import
keras_transformer` alone stays light, and the `keras-transformer` command answers `--help` (and
runs ONNX bundles) without Keras. `kt.models`, `kt.layers`, ... import their package when first read.

This door also declares what the lower floors look up but cannot import, since it is built on them: the
Hugging Face checkpoint reader behind `from_preset(hf_dir)` and the writers behind `Task.export`. Python
runs this file before any module of the package, so they are declared whatever a user imports, and each
loads on first use (see entry_points.py).
"""

import importlib

from keras_transformer import entry_points
from keras_transformer.backend_check import check_backend_installed
from keras_transformer.version import __version__

check_backend_installed()

# A config.json with a `model_type` (and no "backbone") is a Hugging Face checkpoint, converted on the fly.
entry_points.declare(
    entry_points.CHECKPOINT_READERS, "model_type", "keras_transformer.convert.hugging_face:convert_config"
)
for _format in ("onnx", "tf_saved_model", "huggingface"):  # keras_transformer.export.FORMATS
    entry_points.declare(entry_points.EXPORTERS, _format, "keras_transformer.export:export_model")
del _format
# A `.gguf` file (llama.cpp's format) is converted on the fly, and written by `Task.export(format="gguf")`.
entry_points.declare(entry_points.FILE_READERS, ".gguf", "keras_transformer.convert.gguf_checkpoint:convert_config")
entry_points.declare(entry_points.EXPORTERS, "gguf", "keras_transformer.convert.gguf_export:export_gguf")

__all__ = ["layers", "list_presets", "metrics", "models", "samplers", "tokenizers", "__version__"]
_SUBPACKAGES = ("convert", "distribution", "export", "layers", "metrics", "models", "presets", "samplers", "tokenizers")


def __getattr__(name):
    if name == "list_presets":
        return __getattr__("presets").list_presets
    if name not in _SUBPACKAGES:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")  # also binds it here: later reads skip this hook


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))
