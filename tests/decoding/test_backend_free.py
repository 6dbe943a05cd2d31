"""The decoding engine's shared loop and the samplers are written once for every backend: read from the source
with `ast`, they call no backend's own tensor methods and never ask which backend runs. What differs per backend
sits behind the backend switch (`decoding/compile.py`) and in the kernels (`kernels/`)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "keras_transformer"
SWITCH = {ROOT / "decoding" / "compile.py"}
SHARED = sorted(p for p in [*(ROOT / "decoding").glob("*.py"), *(ROOT / "samplers").glob("*.py")] if p not in SWITCH)

# Methods of PyTorch, TensorFlow or JAX tensors (and numpy's) that keras.ops does not offer on every backend.
TENSOR_METHODS = {
    "long",
    "int",
    "float",
    "half",
    "bfloat16",
    "contiguous",
    "is_contiguous",
    "index_select",
    "index_copy_",
    "copy_",
    "cpu",
    "cuda",
    "to",
    "item",
    "numpy",
    "detach",
    "clone",
    "view",
    "masked_fill",
    "scatter_",
}


def _offences(source):
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name in TENSOR_METHODS:
                found.append(f"line {node.lineno}: .{name}()")
            if name == "backend" and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "config":
                found.append(f"line {node.lineno}: keras.config.backend()")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [
                f"line {node.lineno}: imports {n}" for n in names if n.split(".")[0] in ("torch", "jax", "tensorflow")
            ]
    return found


def test_the_check_finds_backend_code():
    source = "import torch\nimport keras\nx = t.long()\nif keras.config.backend() == 'torch':\n    pass\n"
    assert len(_offences(source)) == 3


@pytest.mark.parametrize("path", SHARED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_backend_specific_code(path):
    assert SHARED and not _offences(path.read_text()), _offences(path.read_text())
