"""The README's preset table is generated from the registry and must stay in sync with it."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_gives_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


def test_readme_preset_table_matches_the_registry():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from readme_tables import preset_table
    finally:
        sys.path.pop(0)
    assert preset_table() in (ROOT / "README.md").read_text()


def test_choosing_a_missing_backend_names_the_extra(tmp_path):
    # A fake backend package location: hide jax by running with a sitecustomize that blocks it.
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'jax' or name.startswith('jax.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    env = {"KERAS_BACKEND": "jax", "PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", "import keras_transformer"], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "keras-transformer[jax]" in result.stderr


def test_readme_is_short_and_written_for_users():
    """At most 220 lines; no issue numbers or dated re-measurements (they belong in benchmarks/RESULTS.md)."""
    import re

    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 220
    assert re.findall(r"(?i)\bissue \d+|#\d{2,}\b", readme) == []
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", readme) == []
    assert "benchmarks/RESULTS.md" in readme


def test_readme_links_point_at_files():
    import re

    readme = (ROOT / "README.md").read_text()
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t}
    assert targets and sorted(t for t in targets if not (ROOT / t).exists()) == []
