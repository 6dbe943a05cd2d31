"""The files this library writes and reads: atomic writes (a directory, a file) and JSON.

An interrupted write keeps what was there before and leaves nothing behind: the new copy is written
next to its target and renamed over it at the end. Presets, bundles, SavedModels, Hugging Face folders
and LoRA files are all written through here.
"""

import json
import os
import shutil
import tempfile
from pathlib import Path


def atomic_dir(target, overwrite, write):
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


def write_json(path, data):
    """`data` as indented, key-sorted JSON: every JSON file this library writes (presets, bundles, SavedModels)."""
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_json(path):
    """A preset's JSON file; a ValueError naming the file when it is missing or not JSON."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"Missing preset file: {path}")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"Corrupt preset file {path}: {error}") from None
