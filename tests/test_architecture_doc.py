"""docs/architecture.md's module map stays true: every package and module it names exists, and every package
of the library is named there. (Paths with a folder are checked for every doc by tests/test_comments.py.)"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
LIBRARY = ROOT / "keras_transformer"
MODULE = re.compile(r"(?<![\w/.-])([a-z_][\w]*\.py)\b")  # a bare module name: `compile.py`
PACKAGE = re.compile(r"(?<![\w/.<-])((?:[a-z_]\w*/)+)(?![\w<])")  # a folder: `decoding/`, `export/runtime/`


def _blocks(text):
    """The fenced blocks of the doc: its maps of the tree."""
    return re.findall(r"```\n(.*?)```", text, flags=re.S)


def _packages():
    """Every package of the library, as the doc writes it: `decoding/`, `models/bert/`."""
    return sorted(
        f"{p.parent.relative_to(LIBRARY).as_posix()}/" for p in LIBRARY.rglob("__init__.py") if p.parent != LIBRARY
    )


def _files():
    return {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}


def _folders():
    found = set()
    for base in (ROOT, LIBRARY):
        found |= {
            f"{p.relative_to(base).as_posix()}/" for p in base.rglob("*") if p.is_dir() and ".venv" not in p.parts
        }
    return found


def test_every_module_named_in_the_maps_exists():
    names = {name for block in _blocks(DOC.read_text()) for name in MODULE.findall(block)}
    assert names and sorted(names - _files()) == []


def test_every_folder_named_in_the_maps_exists():
    named = {name for block in _blocks(DOC.read_text()) for name in PACKAGE.findall(block)}
    folders = _folders()  # a folder may be named from its parent's line: `bert/` under `models/`
    assert named and sorted(n for n in named if not any(f == n or f.endswith("/" + n) for f in folders)) == []


def test_every_package_is_named():
    text = DOC.read_text()
    missing = [
        package
        for package in _packages()
        if package not in text and f"{package.rstrip('/').rpartition('/')[2]}/" not in text
    ]
    assert missing == []


def test_the_checks_see_a_missing_name():
    assert "gone.py" in MODULE.findall("decoding/  gone.py   the loop")
    assert "gone/" in PACKAGE.findall("gone/   a package") and "gone/" not in _folders()
