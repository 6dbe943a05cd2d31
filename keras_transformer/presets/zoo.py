"""Where presets are found: the file names of a preset folder, the zoo, and resolving a preset.

The zoo is `models/` at the repository's root, installed as the package data `keras_transformer/zoo`
(see pyproject.toml). A preset is named by a registered name, a directory or a hub handle
(`hf://org/name[@revision]`, downloaded by hub.py).
"""

import difflib
import os
from pathlib import Path

from keras_transformer import hub
from keras_transformer.presets.files import read_json

CONFIG_FILE = "config.json"
BACKBONE_WEIGHTS_FILE = "model.weights.h5"
TASK_WEIGHTS_FILE = "task.weights.h5"
METADATA_FILE = "metadata.json"

_PACKAGE_DIR = Path(__file__).parent.parent  # keras_transformer/


def zoo_dir():
    """The folder of registered presets: package data when installed, the repository's `models/` otherwise."""
    installed = _PACKAGE_DIR / "zoo"
    return installed if installed.is_dir() else _PACKAGE_DIR.parent / "models"


def list_presets():
    """Every registered preset: name, family, parameter count, description, whether it ships weights."""
    rows = []
    for config_path in sorted(zoo_dir().glob(f"*/{CONFIG_FILE}")):
        config = read_json(config_path)
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
    """A preset name, directory, `.gguf` file or hub handle (`hf://org/name[@revision]`,
    `hf://org/name/file.gguf[@revision]`) -> the directory or file (Path).

    Unknown names list close matches; handles are downloaded into the hub's cache (see hub.py).
    """
    preset = os.fspath(preset)
    if hub.handle_scheme(preset) is not None:
        return hub.resolve_handle(preset)  # downloaded into (or found in) the hub's cache
    path = Path(preset).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".gguf"):
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
