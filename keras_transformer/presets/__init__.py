"""Presets: the zoo in `models/` (shipped as package data), `from_preset` and `save_to_preset`.

A preset is a directory:
    config.json         {"name", "family", "description", "parameter_count",
                         "backbone": {"class_name", "config"},
                         "task": {"class_name", "config"} (optional),
                         "preprocessor": {"class_name", "config"} (optional)}
    tokenizer.json, tokenizer_config.json
    model.weights.h5    backbone weights (optional: presets without it start from random weights)
    task.weights.h5     the whole task, head included (optional)
    metadata.json       versions, backend saved from, parameter count
    (config.json's optional "quantization": "int8" / "int4", and "quantization_block_size" for int4 in
    blocks: the model is quantized before its weights load, so quantized weights keep their 8 / 4-bit form)
    README.md           the model card
Only classes registered by this library can be named in a config (safe loading).

One job per module, each importing only those above it in this list:
    files.py            atomic writes (a directory, a file) and JSON
    zoo.py              a preset folder's file names, the zoo, `resolve` and `list_presets`
    registry.py         the classes a config may name, and the readers of foreign checkpoints
    weights.py          weights files: shapes checked before loading, saved without the optimizer
    initialization.py   a model built for loading without drawing random initial values (JAX, PyTorch)
    loading.py          `load_config` (Hugging Face checkpoints converted on the fly), `load_backbone`, `load_task`
    saving.py           `save_backbone`, `save_task`
    serialization.py    a task's preprocessor and backbone entries in `.keras` files

The package is data plus a loader and imports no model and no converter: the models register into it,
and the top-level package declares the checkpoint readers (see keras_transformer/entry_points.py).
"""

from keras_transformer.presets.files import atomic_dir, atomic_file, read_json, write_json
from keras_transformer.presets.loading import load_backbone, load_config, load_task, load_tokenizer
from keras_transformer.presets.registry import (
    PACKAGE,
    base_class,
    checkpoint_reader,
    get_class,
    get_preprocessor_class,
    register_base_class,
    register_preprocessor,
)
from keras_transformer.presets.saving import save_backbone, save_task
from keras_transformer.presets.serialization import (
    deserialize_backbone,
    deserialize_preprocessor,
    serialize_preprocessor,
)
from keras_transformer.presets.weights import check_weight_shapes, save_weights_without_optimizer
from keras_transformer.presets.zoo import (
    BACKBONE_WEIGHTS_FILE,
    CONFIG_FILE,
    METADATA_FILE,
    TASK_WEIGHTS_FILE,
    closest_presets,
    list_presets,
    resolve,
    zoo_dir,
)

__all__ = [
    "BACKBONE_WEIGHTS_FILE",
    "CONFIG_FILE",
    "METADATA_FILE",
    "PACKAGE",
    "TASK_WEIGHTS_FILE",
    "atomic_dir",
    "atomic_file",
    "base_class",
    "check_weight_shapes",
    "checkpoint_reader",
    "closest_presets",
    "deserialize_backbone",
    "deserialize_preprocessor",
    "get_class",
    "get_preprocessor_class",
    "list_presets",
    "load_backbone",
    "load_config",
    "load_task",
    "load_tokenizer",
    "read_json",
    "register_base_class",
    "register_preprocessor",
    "resolve",
    "save_backbone",
    "save_task",
    "save_weights_without_optimizer",
    "serialize_preprocessor",
    "write_json",
    "zoo_dir",
]
