"""In-package entry points: what a lower floor looks up but cannot import, declared by the top-level package.

The preset loader reads Hugging Face checkpoints through the converter in convert/, and `Task.export` writes
through export/; both of those are built on the models, so neither the loader nor the models may import them.
The top-level package (`keras_transformer/__init__.py`, which Python runs before any module of the package)
declares each provider as a `"module:attribute"` reference, as an installed package's entry points are
declared, and the first lookup imports it. Declaring imports nothing, so `import keras_transformer` stays light;
this module imports nothing of ours.

    declare(EXPORTERS, "onnx", "keras_transformer.export:export_model")   # the top-level package
    names(EXPORTERS)           # ("onnx", ...): no import
    load(EXPORTERS, "onnx")    # imports keras_transformer.export on first use
"""

import importlib

# The groups, by what the lower floors look up.
CHECKPOINT_READERS = "checkpoint_readers"  # config.json key marking a foreign checkpoint -> reader(path, config, ...)
EXPORTERS = "exporters"  # `Task.export` format -> writer(task, filepath, format=..., ...)
FILE_READERS = "file_readers"  # a one-file checkpoint's suffix (".gguf") -> reader(path, allow_pickle=...)

_DECLARED = {}  # group -> {name: "module:attribute"}, in declaration order
_LOADED = {}  # group -> {name: the loaded object}


def declare(group, name, reference):
    """Declare `reference` ("module:attribute") as the provider `name` of `group`; nothing is imported."""
    module, _, attribute = reference.partition(":")
    if not module or not attribute:
        raise ValueError(f"An entry point is 'module:attribute'. Received: reference={reference!r}")
    _DECLARED.setdefault(group, {})[name] = reference
    _LOADED.get(group, {}).pop(name, None)


def names(group):
    """The names declared in `group`, in declaration order (nothing is imported)."""
    return tuple(_DECLARED.get(group, ()))


def load(group, name):
    """The object `name` of `group` refers to, imported on the first call."""
    loaded = _LOADED.setdefault(group, {})
    if name not in loaded:
        if name not in _DECLARED.get(group, {}):
            raise KeyError(f"No entry point {name!r} is declared in {group!r}: declared {names(group)}.")
        module, _, attribute = _DECLARED[group][name].partition(":")
        loaded[name] = getattr(importlib.import_module(module), attribute)
    return loaded[name]
