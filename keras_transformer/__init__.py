"""keras_transformer: a Keras 3 Transformer model zoo for TensorFlow, JAX and PyTorch.

The public API loads Keras (and with it the backend), so each part loads on first use: `import
keras_transformer` alone stays light, and the `keras-transformer` command answers `--help` (and
runs ONNX bundles) without Keras. `kt.models`, `kt.layers`, ... import their package when first read.
"""

import importlib

from keras_transformer.backend_check import check_backend_installed
from keras_transformer.version import __version__

check_backend_installed()

__all__ = ["layers", "list_presets", "metrics", "models", "samplers", "tokenizers", "__version__"]
_SUBPACKAGES = ("convert", "distribution", "export", "layers", "metrics", "models", "presets", "samplers",
                "tokenizers")


def __getattr__(name):
    if name == "list_presets":
        return __getattr__("presets").list_presets
    if name not in _SUBPACKAGES:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")  # also binds it here: later reads skip this hook


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))
