"""An offline text corpus for demos, tests and trained presets: the Python standard library's own source files.

Read from the running interpreter's installation, so nothing is downloaded.
Files are split deterministically into train / held-out sets by a hash of their path.
"""

import hashlib
import sysconfig
from pathlib import Path


def stdlib_files():
    """Sorted .py files of the standard library, without tests, site-packages and generated tables."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__", "encodings"}
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts[:-1])
        if parts & skip or path.stat().st_size > 400_000:
            continue
        files.append(path)
    return root, files


def is_held_out(relative_path, fraction=0.05):
    digest = hashlib.sha256(str(relative_path).encode()).digest()
    return digest[0] < 256 * fraction


def stdlib_texts(split="train", max_chars=None):
    """Source texts of the split ("train" or "held_out"), at most `max_chars` characters in all."""
    root, files = stdlib_files()
    texts, total = [], 0
    for path in files:
        if is_held_out(path.relative_to(root)) != (split == "held_out"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if max_chars is not None and total >= max_chars:
            break
    return texts
