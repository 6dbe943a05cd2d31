"""Saving a preset: a backbone, or a whole task (backbone, head, preprocessor and tokenizer), written atomically.

What `save_to_preset` writes is what the loader reads: config.json (the classes and their configs, the
quantization mode), the weights, and metadata.json (versions, backend, parameter count).
"""

import datetime

import keras

from keras_transformer.presets.files import atomic_dir, write_json
from keras_transformer.presets.weights import save_weights_without_optimizer
from keras_transformer.presets.zoo import BACKBONE_WEIGHTS_FILE, CONFIG_FILE, METADATA_FILE, TASK_WEIGHTS_FILE
from keras_transformer.version import __version__


def _metadata(model):
    return {
        "keras_transformer_version": __version__,
        "keras_version": keras.__version__,
        "backend": keras.config.backend(),
        "parameter_count": int(model.count_params()),
        "saved_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _backbone_spec(backbone):
    config = backbone.get_config()
    for key in ("name", "trainable"):
        config.pop(key, None)
    return {"class_name": type(backbone).__name__, "config": config}


def _quantization_entry(mode, model):
    """{"quantization": mode} for a model with quantized weights ("int8", "int4"), else {}; int4 in blocks (Keras's
    sub-channel int4, e.g. a GGUF file's Q4_0 kept 4-bit) adds {"quantization_block_size": n}, so that the loader
    rebuilds the same layers."""
    if mode is None:
        return {}
    sizes = {getattr(layer, "_int4_block_size", None) for layer in model._flatten_layers()} - {None, -1}
    if len(sizes) > 1:
        raise ValueError(f"The int4 layers of this {type(model).__name__} have several block sizes: {sorted(sizes)}.")
    return {"quantization": mode, **({"quantization_block_size": int(sizes.pop())} if sizes else {})}


def save_backbone(backbone, preset_dir, overwrite=True, extra=None, quantization=None):
    """Write `backbone` as a preset; `quantization`: the mode its weights are quantized in, or None."""

    def write(tmp):
        config = {
            "family": getattr(backbone, "family", None),
            "parameter_count": int(backbone.count_params()),
            "backbone": _backbone_spec(backbone),
            **_quantization_entry(quantization, backbone),
            **(extra or {}),
        }
        write_json(tmp / CONFIG_FILE, config)
        backbone.save_weights(str(tmp / BACKBONE_WEIGHTS_FILE))
        write_json(tmp / METADATA_FILE, _metadata(backbone))

    atomic_dir(preset_dir, overwrite, write)


def save_task(task, preset_dir, overwrite=True, quantization=None, weights=True):
    """Write `task` (backbone, head, preprocessor and tokenizer) as a preset; `quantization` as in
    `save_backbone`. `weights=False` writes no weights files (for a reader that gets the weights another way)."""

    def write(tmp):
        task_config = task.get_config()
        for key in ("backbone", "preprocessor", "name", "trainable"):
            task_config.pop(key, None)
        config = {
            "family": getattr(task.backbone, "family", None),
            "parameter_count": int(task.backbone.count_params()),
            "backbone": _backbone_spec(task.backbone),
            "task": {"class_name": type(task).__name__, "config": task_config},
            **_quantization_entry(quantization, task),
        }
        if task.preprocessor is not None:
            config["preprocessor"] = {
                "class_name": type(task.preprocessor).__name__,
                "config": task.preprocessor.get_config(),
            }
            task.preprocessor.tokenizer.save(tmp)
        write_json(tmp / CONFIG_FILE, config)
        if weights:
            task.backbone.save_weights(str(tmp / BACKBONE_WEIGHTS_FILE))
            save_weights_without_optimizer(task, tmp / TASK_WEIGHTS_FILE)
        write_json(tmp / METADATA_FILE, _metadata(task))

    atomic_dir(preset_dir, overwrite, write)
