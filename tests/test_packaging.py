"""The wheel: built from a copy of the source, installed into a folder of its own, it must hold every
package of the source tree, the preset zoo and the bundle runtime (export/runtime/, which every ONNX
export copies), load a preset (with its trained weights) and find that runtime in a fresh
interpreter that imports the installed copy, not the repository."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
PRESET = "gpt_stdlib"  # ships model.weights.h5

# Run in the fresh interpreter: where the package, its zoo and the bundle runtime come from, the
# presets it lists, and a checksum of the preset's weights.
PROBE = """
import json, sys
import numpy as np
import keras_transformer as kt
from keras_transformer import presets
from keras_transformer.export import onnx
lm = kt.models.GPTCausalLM.from_preset(sys.argv[1])
print(json.dumps({
    "package": kt.__file__,
    "zoo": str(presets.zoo_dir()),
    "runtime": str(onnx.runtime_dir()),
    "runtime_files": list(onnx.RUNTIME_FILES),
    "presets": sorted(row["name"] for row in presets.list_presets()),
    "weights": [float(np.asarray(w, "float64").sum()) for w in lm.backbone.get_weights()],
}))
"""
RUNTIME = ROOT / "export" / "runtime"


def _run(args, **kwargs):
    kwargs.setdefault("stderr", subprocess.PIPE)
    result = subprocess.run(args, stdout=subprocess.PIPE, text=True, **kwargs)
    assert result.returncode == 0, result.stdout + (result.stderr or "")
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel path, folder the wheel was installed into, the build's log)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy, so the build leaves nothing in the repository
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("keras_transformer", "models", "export/runtime"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    dist = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    log = _run(
        pip + ["wheel", "--no-deps", "--no-build-isolation", "-v", "-w", str(dist), str(source)],
        stderr=subprocess.STDOUT,
    )
    (wheel,) = dist.glob("keras_transformer-*.whl")
    site = tmp / "site"
    _run(pip + ["install", "--no-deps", "--no-index", "--quiet", "--target", str(site), str(wheel)])
    return wheel, site, log


def test_build_prints_no_setuptools_warnings(installed):
    """The preset zoo is package data: setuptools must not take its folders for packages."""
    _, _, log = installed
    assert "Building wheel" in log or "bdist_wheel" in log  # the verbose build log was captured
    assert "would be ignored" not in log and "Warning" not in log, log


def test_wheel_holds_every_package_and_the_zoo(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "keras_transformer").rglob("__init__.py"))
    assert [p for p in packages if f"{p}/__init__.py" not in names] == []
    zoo = sorted(p.relative_to(ROOT / "models").as_posix() for p in (ROOT / "models").glob("*/*") if p.is_file())
    assert zoo and [f for f in zoo if f"keras_transformer/zoo/{f}" not in names] == []


@pytest.fixture(scope="module")
def probe(installed):
    """What a fresh interpreter importing the installed copy (not the repository) reports."""
    _, site, _ = installed
    env = dict(os.environ, PYTHONPATH=str(site))
    return json.loads(_run([sys.executable, "-c", PROBE, PRESET], env=env, cwd=site).strip().splitlines()[-1])


def test_wheel_ships_the_bundle_runtime(installed, probe):
    """export/runtime/ (generate.py, batching.py, serve.py, requirements.txt) is in the wheel, and the installed
    `runtime_dir()` points at those files, so an export from an installed copy can write a whole bundle."""
    wheel, site, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    files = sorted(p.name for p in RUNTIME.iterdir() if p.is_file())
    assert set(probe["runtime_files"]) <= set(files)
    assert [f for f in files if f"keras_transformer/export/runtime/{f}" not in names] == []
    runtime = Path(probe["runtime"])
    assert runtime == site / "keras_transformer" / "export" / "runtime"
    for name in probe["runtime_files"]:
        assert (runtime / name).read_bytes() == (RUNTIME / name).read_bytes(), name


def test_installed_wheel_loads_a_preset_with_its_weights(installed, probe):
    _, site, _ = installed
    assert Path(probe["package"]).is_relative_to(site) and Path(probe["zoo"]) == site / "keras_transformer" / "zoo"
    assert probe["presets"] == sorted(p.parent.name for p in (ROOT / "models").glob("*/config.json"))

    import keras_transformer as kt

    here = kt.models.GPTCausalLM.from_preset(PRESET)  # from the repository's models/
    expected = [float(np.asarray(w, "float64").sum()) for w in here.backbone.get_weights()]
    np.testing.assert_allclose(probe["weights"], expected, rtol=1e-12)
    assert len(expected) > 2 and np.any(np.abs(expected) > 1e-3)  # trained weights, not an empty list
