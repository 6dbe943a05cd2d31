"""Preset registry: the zoo in `models/` (shipped as package data), `from_preset` and `save_to_preset`.

A preset is a directory:
    config.json         {"name", "family", "description", "parameter_count",
                         "backbone": {"class_name", "config"},
                         "task": {"class_name", "config"} (optional),
                         "preprocessor": {"class_name", "config"} (optional)}
    tokenizer.json, tokenizer_config.json
    model.weights.h5    backbone weights (optional: presets without it start from random weights)
    task.weights.h5     the whole task, head included (optional)
    metadata.json       versions, backend saved from, parameter count
    (config.json's optional "quantization": "int8" / "int4": the model is quantized before its
    weights load, so quantized weights keep their 8 / 4-bit form)
    README.md           the model card
Only classes registered by this library can be named in a config (safe loading).

This module is data plus a loader, and imports no model and no converter: the base classes
(`Backbone`, `Task` in models/) register themselves with `register_base_class`, preprocessors with
`register_preprocessor`, and a checkpoint reader (the Hugging Face converter in convert/) with
`register_checkpoint_reader`; the loader looks classes up by name and asks them to build themselves.
"""

import datetime
import difflib
import json
import os
import shutil
import tempfile
from pathlib import Path

import h5py
import keras

from keras_transformer import hub
from keras_transformer.tokenizers import Tokenizer
from keras_transformer.version import __version__

CONFIG_FILE = "config.json"
BACKBONE_WEIGHTS_FILE = "model.weights.h5"
TASK_WEIGHTS_FILE = "task.weights.h5"
METADATA_FILE = "metadata.json"
PACKAGE = "keras_transformer"


def zoo_dir():
    """The folder of registered presets: package data when installed, the repository's `models/` otherwise."""
    installed = Path(__file__).parent / "zoo"
    return installed if installed.is_dir() else Path(__file__).parent.parent / "models"


def _read_json(path):
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Missing preset file: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"Corrupt preset file {path}: {error}") from None


def list_presets():
    """Every registered preset: name, family, parameter count, description, whether it ships weights."""
    rows = []
    for config_path in sorted(zoo_dir().glob(f"*/{CONFIG_FILE}")):
        config = _read_json(config_path)
        rows.append(
            {
                "name": config_path.parent.name,
                "family": config.get("family"),
                "parameter_count": config.get("parameter_count"),
                "description": config.get("description", ""),
                "trained": (config_path.parent / BACKBONE_WEIGHTS_FILE).is_file(),
                "path": str(config_path.parent),
            }
        )
    return rows


def resolve(preset):
    """A preset name, directory or hub handle (`hf://org/name[@revision]`) -> the directory (Path).

    Unknown names list close matches; handles are downloaded into the hub's cache (see hub.py).
    """
    preset = os.fspath(preset)
    if hub.handle_scheme(preset) is not None:
        return hub.resolve_handle(preset)  # downloaded into (or found in) the hub's cache
    path = Path(preset).expanduser()
    if path.is_dir():
        return path
    registered = [row["name"] for row in list_presets()]
    if preset in registered:
        return zoo_dir() / preset
    close = closest_presets(preset, registered)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"Unknown preset {preset!r}: not a registered name, a directory nor an hf://org/name handle.{hint} "
        f"Registered presets: {', '.join(registered)}"
    )


def closest_presets(name, registered, n=3):
    """The registered names closest to a mistyped `name` (case, `-` for `_` and spaces forgiven), best first."""

    def normal(text):
        return text.strip().lower().replace("-", "_").replace(" ", "_")

    by_normal = {normal(candidate): candidate for candidate in registered}
    close = difflib.get_close_matches(normal(name), list(by_normal), n=n, cutoff=0.5)
    return [by_normal[candidate] for candidate in close]


_BASE_CLASSES = {}  # "backbone", "task" -> the base class that registered itself (models/)
_PREPROCESSORS = {}  # class name -> a preprocessor class that registered itself
_CHECKPOINT_READERS = {}  # config.json key that marks a foreign checkpoint -> reader(path, config, allow_pickle)


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


def register_checkpoint_reader(marker, reader):
    """`reader(path, config, allow_pickle=...)` turns a checkpoint whose config.json holds the key
    `marker` (and no "backbone") into a preset config (with its weights loader under "weights")."""
    _CHECKPOINT_READERS[marker] = reader


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


def load_config(preset, allow_pickle=False):
    """Read a preset's config.json. Hugging Face checkpoint directories are converted on the fly.

    `allow_pickle` (Hugging Face checkpoints only) accepts weights stored only in pytorch_model.bin.
    """
    path = resolve(preset)
    config = _read_json(path / CONFIG_FILE)
    if "backbone" not in config:
        for marker, reader in _CHECKPOINT_READERS.items():
            if marker in config:
                return path, reader(path, config, allow_pickle=allow_pickle)
    if "model_type" in config and "backbone" not in config:
        raise ValueError(
            f"{path} holds a Hugging Face checkpoint, read by keras_transformer.convert, which is not "
            "loaded: `import keras_transformer.convert` (importing keras_transformer's API loads it)."
        )
    if "backbone" not in config:
        raise ValueError(f"{path / CONFIG_FILE} has no 'backbone' entry: not a keras_transformer preset.")
    return path, config


def load_backbone(cls, preset, load_weights=True, **overrides):
    """Build the backbone `preset` names (a `cls`) from its config, quantized if it was saved so, and
    load its weights."""
    Backbone = base_class("backbone")
    path, config = load_config(preset, allow_pickle=overrides.pop("allow_pickle", False))
    spec = config["backbone"]
    backbone_cls = get_class(spec["class_name"], Backbone)
    if cls is not Backbone and not issubclass(backbone_cls, cls):
        fitting = _presets_of(cls)
        hint = f" Presets for a {cls.__name__}: {', '.join(fitting)}." if fitting else ""
        raise ValueError(f"Preset {str(preset)!r} holds a {backbone_cls.__name__}, not a {cls.__name__}.{hint}")
    backbone = backbone_cls(**{**spec["config"], **overrides})
    if config.get("quantization") is not None:  # rebuilt quantized, so the quantized weights fit
        backbone.quantize(config["quantization"])
    if load_weights:
        _load_weights(backbone, path, config, BACKBONE_WEIGHTS_FILE)
    return backbone


def _presets_of(cls):
    """Registered preset names whose backbone is a `cls` (for error messages)."""
    names = []
    for row in list_presets():
        spec = _read_json(Path(row["path"]) / CONFIG_FILE).get("backbone", {})
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


def load_task(cls, preset, load_weights=True, preprocessor="auto", **kwargs):
    """Build the task `cls` on the backbone of `preset`, with the preset's preprocessor when
    `preprocessor` is "auto" (else the one given, or None), and load its weights."""
    Task = base_class("task")
    path, config = load_config(preset, allow_pickle=kwargs.pop("allow_pickle", False))
    backbone_cls = cls.backbone_cls
    backbone = load_backbone(backbone_cls, preset, load_weights=False)
    task_spec = config.get("task") or {}
    # Another task's entries are ignored, but every class a config names must be this library's.
    if task_spec.get("class_name") is not None:
        get_class(task_spec["class_name"], Task)
    pre_name = (config.get("preprocessor") or {}).get("class_name")
    if pre_name is not None and pre_name not in _PREPROCESSORS:
        raise ValueError(f"{pre_name!r} is not a keras_transformer preprocessor.")
    task_kwargs = dict(task_spec.get("config", {})) if task_spec.get("class_name") == cls.__name__ else {}
    if preprocessor == "auto":
        preprocessor = None
        if cls.preprocessor_cls is not None:
            spec = config.get("preprocessor") or {}
            pre_config = spec.get("config", {}) if spec.get("class_name") == cls.preprocessor_cls.__name__ else {}
            preprocessor = cls.preprocessor_cls.from_config(pre_config, tokenizer=load_tokenizer(preset))
    task = cls(backbone=backbone, preprocessor=preprocessor, **{**task_kwargs, **kwargs})
    if config.get("quantization") is not None:
        task.quantize(config["quantization"])  # the head's projections (the backbone's already are)
    if load_weights:
        if task_kwargs == {**task_kwargs, **kwargs} and (path / TASK_WEIGHTS_FILE).is_file():
            _load_weights(task, path, config, TASK_WEIGHTS_FILE)
        elif "weights" in config and not (path / BACKBONE_WEIGHTS_FILE).is_file():
            config["weights"](task)  # a converter: the backbone and whatever head weights it has
        else:  # a new head (e.g. another num_classes): only the backbone is pretrained
            _load_weights(backbone, path, config, BACKBONE_WEIGHTS_FILE)
    return task


def _load_weights(model, path, config, filename):
    weights = path / filename
    if not weights.is_file():
        if "weights" in config:  # a converter supplied them in memory
            config["weights"](model)
        return
    check_weight_shapes(model, weights)
    model.load_weights(str(weights))


def check_weight_shapes(model, weights_path):
    """Compare every saved array shape with the model's variables before touching any variable."""
    try:
        with h5py.File(weights_path, "r") as f:
            saved = []
            f.visititems(
                lambda name, obj: saved.append(tuple(obj.shape))
                if isinstance(obj, h5py.Dataset) and not name.startswith("optimizer/")
                else None
            )
    except (OSError, RuntimeError, KeyError, ValueError) as error:  # h5py's errors for damaged files
        raise ValueError(f"Corrupt or truncated weights file {weights_path}: {error}") from None
    expected = [tuple(v.shape) for v in model.weights]
    if sorted(saved) != sorted(expected):
        missing = sorted(set(expected) - set(saved))
        extra = sorted(set(saved) - set(expected))
        raise ValueError(
            f"The weights in {weights_path} do not match the model built from its config "
            f"({len(saved)} arrays saved, {len(expected)} expected; shapes only in the model: {missing[:5]}, "
            f"only in the file: {extra[:5]}). Nothing was loaded."
        )


# --- saving ---------------------------------------------------------------


def _atomic_dir(target, overwrite, write):
    """Run write(tmp_dir), then move tmp_dir to `target`; on any failure nothing is left behind."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise ValueError(f"{target} already exists. Pass overwrite=True to replace it.")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, old / "x")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_file(target, write):
    """Run write(tmp_file), then rename tmp_file to `target`: an interrupted write keeps the old `target`.

    The temporary file has the target's name (writers check the extension) inside a hidden
    directory next to it, so the final rename stays on one file system.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp / target.name)
        os.replace(tmp / target.name, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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


def write_json(path, data):
    """`data` as indented, key-sorted JSON: every JSON file this library writes (presets, bundles, SavedModels)."""
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _save_weights_without_optimizer(model, path):
    """A preset holds the model, not the training state (checkpoints are for resuming)."""
    from keras.src.saving import saving_lib

    optimizer = getattr(model, "optimizer", None)
    saving_lib.save_weights_only(model, str(path), objects_to_skip=[optimizer] if optimizer is not None else None)


def _quantization_entry(mode):
    """{"quantization": mode} for a model with quantized weights ("int8", "int4"), else {}."""
    return {} if mode is None else {"quantization": mode}


def save_backbone(backbone, preset_dir, overwrite=True, extra=None, quantization=None):
    """Write `backbone` as a preset; `quantization`: the mode its weights are quantized in, or None."""

    def write(tmp):
        config = {
            "family": getattr(backbone, "family", None),
            "parameter_count": int(backbone.count_params()),
            "backbone": _backbone_spec(backbone),
            **_quantization_entry(quantization),
            **(extra or {}),
        }
        write_json(tmp / CONFIG_FILE, config)
        backbone.save_weights(str(tmp / BACKBONE_WEIGHTS_FILE))
        write_json(tmp / METADATA_FILE, _metadata(backbone))

    _atomic_dir(preset_dir, overwrite, write)


def save_task(task, preset_dir, overwrite=True, quantization=None):
    """Write `task` (backbone, head, preprocessor and tokenizer) as a preset; `quantization` as in
    `save_backbone`."""

    def write(tmp):
        task_config = task.get_config()
        for key in ("backbone", "preprocessor", "name", "trainable"):
            task_config.pop(key, None)
        config = {
            "family": getattr(task.backbone, "family", None),
            "parameter_count": int(task.backbone.count_params()),
            "backbone": _backbone_spec(task.backbone),
            "task": {"class_name": type(task).__name__, "config": task_config},
            **_quantization_entry(quantization),
        }
        if task.preprocessor is not None:
            config["preprocessor"] = {
                "class_name": type(task.preprocessor).__name__,
                "config": task.preprocessor.get_config(),
            }
            task.preprocessor.tokenizer.save(tmp)
        write_json(tmp / CONFIG_FILE, config)
        task.backbone.save_weights(str(tmp / BACKBONE_WEIGHTS_FILE))
        _save_weights_without_optimizer(task, tmp / TASK_WEIGHTS_FILE)
        write_json(tmp / METADATA_FILE, _metadata(task))

    _atomic_dir(preset_dir, overwrite, write)


# --- config helpers for .keras saving ----------------------------------------


def serialize_preprocessor(preprocessor):
    if preprocessor is None:
        return None
    return {
        "class_name": type(preprocessor).__name__,
        "config": preprocessor.get_config(),
        "tokenizer": preprocessor.tokenizer.to_config(),
    }


def deserialize_preprocessor(spec):
    if spec is None or not isinstance(spec, dict):
        return spec
    cls = _PREPROCESSORS.get(spec["class_name"])  # only registered preprocessors
    if cls is None:
        raise ValueError(f"{spec['class_name']!r} is not a keras_transformer preprocessor.")
    return cls.from_config(spec["config"], tokenizer=Tokenizer.from_config(spec["tokenizer"]))


def deserialize_backbone(spec):
    Backbone = base_class("backbone")
    if isinstance(spec, Backbone):
        return spec
    cls = get_class(spec["class_name"], Backbone)
    config = spec["config"]
    return cls.from_config(config)

