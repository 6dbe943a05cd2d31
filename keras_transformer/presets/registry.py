"""The registry: the classes a preset config may name, and the readers of foreign checkpoints.

Data only, filled from above: the base classes (`Backbone`, `Task` in models/) register themselves with
`register_base_class`, each preprocessor with `register_preprocessor`, every Keras class with
`keras.saving.register_keras_serializable`. Only classes registered by this library can be named in a
config (safe loading). The readers of foreign checkpoints (the Hugging Face converter in convert/) are
entry points the top-level package declares (see keras_transformer/entry_points.py). The registry never
imports a model or a converter; the loader asks the classes it finds to build themselves.
"""

import keras

from keras_transformer import entry_points

PACKAGE = "keras_transformer"

_BASE_CLASSES = {}  # "backbone", "task" -> the base class that registered itself (models/)
_PREPROCESSORS = {}  # class name -> a preprocessor class that registered itself


def register_base_class(kind):
    """Class decorator: `cls` is the base every class a config names as `kind` must derive from."""

    def register(cls):
        _BASE_CLASSES[kind] = cls
        return cls

    return register


def register_preprocessor(cls):
    """Class decorator: make a preprocessor loadable by name from configs."""
    _PREPROCESSORS[cls.__name__] = cls
    return cls


def base_class(kind):
    """The base class registered as `kind` ("backbone" or "task")."""
    if kind not in _BASE_CLASSES:
        raise ValueError(f"No {kind} base class is registered: import keras_transformer.models first.")
    return _BASE_CLASSES[kind]


def get_class(class_name, base=None):
    """A class registered by this library (never an arbitrary import path)."""
    cls = keras.saving.get_registered_object(f"{PACKAGE}>{class_name}")
    if cls is None or (base is not None and not issubclass(cls, base)):
        kind = base.__name__ if base is not None else "class"
        raise ValueError(f"{class_name!r} is not a keras_transformer {kind}.")
    return cls


def get_preprocessor_class(class_name):
    """A preprocessor class registered by this library."""
    if class_name not in _PREPROCESSORS:
        raise ValueError(f"{class_name!r} is not a keras_transformer preprocessor.")
    return _PREPROCESSORS[class_name]


def checkpoint_reader(config):
    """The reader of the foreign checkpoint whose config.json is `config`, or None.

    A reader, `reader(path, config, allow_pickle=...)`, turns a checkpoint whose config.json holds its
    marker key (and no "backbone") into a preset config (with its weights loader under "weights").
    """
    for marker in entry_points.names(entry_points.CHECKPOINT_READERS):
        if marker in config:
            return entry_points.load(entry_points.CHECKPOINT_READERS, marker)
    return None


def file_reader(path):
    """The reader of a one-file checkpoint (a `.gguf`), by its suffix, or None.

    A reader, `reader(path, allow_pickle=...)`, returns a preset config (with its weights loader under "weights").
    """
    suffix = path.suffix.lower()
    if suffix in entry_points.names(entry_points.FILE_READERS):
        return entry_points.load(entry_points.FILE_READERS, suffix)
    return None
