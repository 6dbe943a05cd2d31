"""Loading a preset: its config (a foreign checkpoint converted on the fly), its backbone, task and tokenizer.

The loader imports no model: it looks the classes a config names up in the registry and asks them to build
themselves; the quantization a preset was saved with is applied before its weights load, so quantized
weights keep their 8- or 4-bit form.
"""

from pathlib import Path

import keras

from keras_transformer.presets import initialization, weights
from keras_transformer.presets.files import read_json
from keras_transformer.presets.registry import base_class, checkpoint_reader, file_reader, get_class
from keras_transformer.presets.registry import get_preprocessor_class
from keras_transformer.presets.zoo import BACKBONE_WEIGHTS_FILE, CONFIG_FILE, TASK_WEIGHTS_FILE, list_presets, resolve
from keras_transformer.tokenizers import Tokenizer


def load_config(preset, allow_pickle=False):
    """Read a preset's config.json. Hugging Face checkpoint directories are converted on the fly.

    `allow_pickle` (Hugging Face checkpoints only) accepts weights stored only in pytorch_model.bin. A one-file
    checkpoint (a `.gguf`) is converted on the fly by the reader of its suffix.
    """
    path = resolve(preset)
    if path.is_file():
        reader = file_reader(path)
        if reader is None:
            raise ValueError(f"{path} is a file, not a preset directory; files keras_transformer reads: .gguf.")
        return path, reader(path, allow_pickle=allow_pickle)
    config = read_json(path / CONFIG_FILE)
    if "backbone" not in config:
        reader = checkpoint_reader(config)
        if reader is not None:
            return path, reader(path, config, allow_pickle=allow_pickle)
        raise ValueError(f"{path / CONFIG_FILE} has no 'backbone' entry: not a keras_transformer preset.")
    return path, config


def load_backbone(cls, preset, load_weights=True, **overrides):
    """Build the backbone `preset` names (a `cls`) from its config, quantized if it was saved so, and
    load its weights (`quantize="int4"`: a GGUF file's Q4_0 weights kept 4-bit, as in `load_task`)."""
    Backbone = base_class("backbone")
    path, config = load_config(preset, allow_pickle=overrides.pop("allow_pickle", False))
    quantize = overrides.pop("quantize", None)
    _check_quantize(preset, config, quantize, load_weights)
    spec = config["backbone"]
    backbone_cls = get_class(spec["class_name"], Backbone)
    if cls is not Backbone and not issubclass(backbone_cls, cls):
        fitting = _presets_of(cls)
        hint = f" Presets for a {cls.__name__}: {', '.join(fitting)}." if fitting else ""
        raise ValueError(f"Preset {str(preset)!r} holds a {backbone_cls.__name__}, not a {cls.__name__}.{hint}")

    def build():
        backbone = backbone_cls(**{**spec["config"], **overrides})
        if config.get("quantization") is not None:  # rebuilt quantized, so the quantized weights fit
            backbone.quantize(config["quantization"], config=_quantization_config(config))
        return backbone

    def load(backbone):
        if quantize is not None:  # a converter keeping the checkpoint's quantized weights
            config["weights"](backbone, quantize=quantize)
        else:
            weights.load_weights(backbone, path, config, BACKBONE_WEIGHTS_FILE)

    if not load_weights:
        return build()
    return _build_then_load(build, load, config, quantize)


def _build_then_load(build, load, config, quantize):
    """build() then load(model), where it pays without drawing random initial values first (initialization.py)."""
    if initialization.defers_initialization(quantized=config.get("quantization") is not None or quantize is not None):
        return initialization.build_then_load(build, load)
    model = build()
    load(model)
    return model


def _check_quantize(preset, config, quantize, load_weights):
    """`from_preset(quantize=...)` keeps a checkpoint's own quantized weights where its converter offers the mode."""
    offered = getattr(config.get("weights"), "quantize_modes", ())
    if quantize is not None and (quantize not in offered or not load_weights):
        raise ValueError(
            f"from_preset(quantize=...) keeps a checkpoint's own quantized weights; {str(preset)!r} offers "
            f"{list(offered) if load_weights else []} (GGUF files: 'int4' for Q4_0 tensors). Otherwise load the "
            f"float model and call quantize(mode). Received: quantize={quantize!r}"
        )


def _quantization_config(config):
    """Keras's int4 config with the block size a preset records ("quantization_block_size"), else None."""
    block = config.get("quantization_block_size")
    return None if block is None else keras.quantizers.Int4QuantizationConfig(block_size=int(block))


def _presets_of(cls):
    """Registered preset names whose backbone is a `cls` (for error messages)."""
    names = []
    for row in list_presets():
        spec = read_json(Path(row["path"]) / CONFIG_FILE).get("backbone", {})
        try:
            get_class(spec.get("class_name", ""), cls)  # a ValueError unless a `cls`
        except ValueError:
            continue
        names.append(row["name"])
    return names


def load_tokenizer(preset):
    path, config = load_config(preset)
    if "tokenizer" in config:
        return config["tokenizer"]  # already built by a converter
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"Missing preset file: {path / 'tokenizer.json'}")
    return Tokenizer.load(path)


def load_task(cls, preset, load_weights=True, preprocessor="auto", quantize=None, **kwargs):
    """Build the task `cls` on the backbone of `preset`, with the preset's preprocessor when
    `preprocessor` is "auto" (else the one given, or None), and load its weights. `quantize` ("int4"): keep a
    checkpoint's own 4-bit weights 4-bit (a GGUF file's Q4_0 tensors), where its converter offers it."""
    Task = base_class("task")
    path, config = load_config(preset, allow_pickle=kwargs.pop("allow_pickle", False))
    _check_quantize(preset, config, quantize, load_weights)
    backbone_cls = cls.backbone_cls
    # `dtype` builds the backbone's layers in it (the task itself keeps float32 outputs).
    dtype = {"dtype": kwargs["dtype"]} if kwargs.get("dtype") is not None else {}
    task_spec = config.get("task") or {}
    # Another task's entries are ignored, but every class a config names must be this library's.
    if task_spec.get("class_name") is not None:
        get_class(task_spec["class_name"], Task)
    pre_name = (config.get("preprocessor") or {}).get("class_name")
    if pre_name is not None:
        get_preprocessor_class(pre_name)  # a ValueError unless registered
    task_kwargs = dict(task_spec.get("config", {})) if task_spec.get("class_name") == cls.__name__ else {}
    if preprocessor == "auto":
        preprocessor = None
        if cls.preprocessor_cls is not None:
            spec = config.get("preprocessor") or {}
            pre_config = spec.get("config", {}) if spec.get("class_name") == cls.preprocessor_cls.__name__ else {}
            preprocessor = cls.preprocessor_cls.from_config(pre_config, tokenizer=load_tokenizer(preset))

    def build():
        backbone = load_backbone(backbone_cls, preset, load_weights=False, **dtype)
        task = cls(backbone=backbone, preprocessor=preprocessor, **{**task_kwargs, **kwargs})
        if config.get("quantization") is not None:
            task.quantize(config["quantization"], config=_quantization_config(config))  # the head's (the backbone's)
        return task

    def load(task):
        if task_kwargs == {**task_kwargs, **kwargs} and (path / TASK_WEIGHTS_FILE).is_file():
            weights.load_weights(task, path, config, TASK_WEIGHTS_FILE)
        elif "weights" in config and not (path / BACKBONE_WEIGHTS_FILE).is_file():
            # a converter: the backbone and whatever head weights it has
            config["weights"](task, **({"quantize": quantize} if quantize else {}))
        else:  # a new head (e.g. another num_classes): only the backbone is pretrained
            weights.load_weights(task.backbone, path, config, BACKBONE_WEIGHTS_FILE)

    if not load_weights:
        return build()
    return _build_then_load(build, load, config, quantize)
