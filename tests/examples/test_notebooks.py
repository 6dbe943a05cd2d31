"""The example notebooks: committed as their scripts say, executed, small; and they run (each on one backend of
the three in `make test`, in turn: see RUN_ON).

Fast tests read the committed notebooks: each one's cells (code and markdown, in order) are its
script's (`examples/make_notebooks.py` builds them); each was executed top to bottom (`make
notebooks`), with its plots inline as PNG; its outputs are small enough to browse.

The slow test executes each notebook, as built from its script, with nbclient in a fresh kernel
that runs this interpreter (the project's virtual environment) and inherits this process's
environment, KERAS_BACKEND included. Its plots go to a temporary KT_EXAMPLES_OUT; the test checks
that each expected PNG exists and is a readable, non-empty image. The notebooks assert their own
results as they go (parity with numpy formulas, Keras vs ONNX Runtime and SavedModel, identical
greedy output across backends, learning on held-out data), so a wrong number fails the cell and
the test.
"""

import base64
import importlib.util
import json
import os
import re
from pathlib import Path

import keras
import numpy as np
import pytest

from tests import turns

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# notebook -> the plots it must write under $KT_EXAMPLES_OUT/<notebook>/
NOTEBOOKS = {
    "01_transformer_from_layers": [
        "positional_encoding.png",
        "attention_weights.png",
        "masked_vs_unmasked.png",
        "gpt_stdlib_attention.png",
    ],
    "02_train_gpt": ["loss_curve.png"],
    "03_bert_classifier": ["training_and_confusion.png"],
    "04_seq2seq": ["exact_match.png"],
    "05_export": ["logits_parity.png"],
    "06_switch_backends": ["backend_logit_differences.png", "speed_vs_keras_hub.png"],
    "07_scale_out": ["weights_per_device.png"],
    "08_llama_chat": ["logits_vs_transformers.png", "perplexity.png"],
    "09_lora_quantize": ["size_speed_perplexity.png"],
}
# `make test` executes each notebook on one of the three backends, in turn (tests/turns.py): a minute or more
# each. KT_DOCS_EVERY_BACKEND=1 executes all nine on the backend under test.
RUN_ON = turns.dealt(NOTEBOOKS)
MAX_OUTPUT_BYTES = 200_000  # one output of a cell, as stored (a PNG is base64: 4/3 of its bytes)
MAX_NOTEBOOK_BYTES = 1_000_000
MAX_README_IMAGE_BYTES = 100_000
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CPU_REPORT = """
import json, resource
_usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
print(json.dumps({"cpu_seconds": sum(u.ru_utime + u.ru_stime for u in _usage)}))
"""


def _make_notebooks():
    spec = importlib.util.spec_from_file_location("make_notebooks", EXAMPLES / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _committed(name):
    return nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)


def test_every_script_has_its_notebook_and_a_test():
    scripts = sorted(path.stem for path in EXAMPLES.glob("[0-9][0-9]_*.py"))
    assert scripts == sorted(NOTEBOOKS)
    assert sorted(path.stem for path in EXAMPLES.glob("[0-9][0-9]_*.ipynb")) == scripts


def _cell_differences(notebook, script):
    """Where `notebook`'s cells differ from those `script` gives: [] when they are the same, in order."""
    committed = [(cell.cell_type, cell.source) for cell in notebook.cells]
    expected = [(cell.cell_type, cell.source) for cell in _make_notebooks().build(script).cells]
    differences = [
        f"cell {i}: {theirs[0]} {theirs[1][:60]!r}... != the script's {ours[0]} {ours[1][:60]!r}..."
        for i, (theirs, ours) in enumerate(zip(committed, expected))
        if theirs != ours
    ]
    if len(committed) != len(expected):
        differences.append(f"{len(committed)} cells, the script gives {len(expected)}")
    return differences


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_cells_are_its_script(name):
    differences = _cell_differences(_committed(name), EXAMPLES / f"{name}.py")
    assert not differences, f"examples/{name}.ipynb differs from its script (run `make notebooks`): {differences}"


def test_a_notebook_edited_by_hand_is_caught(tmp_path):
    """The comparison above sees a changed code line, a changed markdown line and a missing cell."""
    script = tmp_path / "01_x.py"
    script.write_text("# %% [markdown]\n# # Title\n\n# %%\nx = 1\n\n# %%\nprint(x)\n")
    notebook = _make_notebooks().build(script)
    assert _cell_differences(notebook, script) == []
    notebook.cells[1].outputs = [nbformat.v4.new_output("stream", text="1\n")]  # outputs do not count
    assert _cell_differences(notebook, script) == []
    for edit in (
        lambda nb: setattr(nb.cells[1], "source", "x = 2"),
        lambda nb: setattr(nb.cells[0], "source", "# Title!"),
        lambda nb: nb.cells.pop(),
    ):
        edited = _make_notebooks().build(script)
        edit(edited)
        assert _cell_differences(edited, script)


def test_make_notebooks_splits_cells(tmp_path):
    script = tmp_path / "01_x.py"
    script.write_text("# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n\n# %%\nprint(x)\n")
    notebook = _make_notebooks().build(script)
    assert [(cell.cell_type, cell.source) for cell in notebook.cells] == [
        ("markdown", "# Title\n\ntext"),
        ("code", "x = 1"),
        ("code", "print(x)"),
    ]
    script.write_text("x = 1\n# %%\n")
    with pytest.raises(ValueError, match="inside a cell"):
        _make_notebooks().build(script)


def _execution_problems(notebook, plots):
    """What shows that `notebook` was not run top to bottom, with `plots` (a count) inline as PNG, or is too big."""
    problems = []
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.get("execution_count") for cell in code]
    if counts != list(range(1, len(code) + 1)):
        problems.append(f"execution counts {counts}: not every cell ran, in order, in one kernel")
    outputs = [output for cell in code for output in cell.get("outputs", [])]
    if not any("backend: " in output.get("text", "") for output in outputs[:1]):
        problems.append("the first output does not name the backend")
    problems += [f"an error output: {output.get('ename')}" for output in outputs if output.output_type == "error"]
    pngs = 0
    for output in outputs:
        size = len(json.dumps(output))
        if size > MAX_OUTPUT_BYTES:
            problems.append(f"an output of {size:,} bytes (at most {MAX_OUTPUT_BYTES:,})")
        for mime, data in output.get("data", {}).items():
            if mime == "image/png":
                pngs += base64.b64decode(data)[:8] == PNG_SIGNATURE
            elif mime.startswith("image/") or mime == "application/pdf":
                problems.append(f"an output of type {mime}: images go in as PNG")
    if pngs < plots:
        problems.append(f"{pngs} inline PNG plots, expected at least {plots}")
    return problems


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_committed_notebook_was_executed_and_is_small(name):
    path = EXAMPLES / f"{name}.ipynb"
    assert path.stat().st_size <= MAX_NOTEBOOK_BYTES, f"{path.name}: {path.stat().st_size:,} bytes"
    problems = _execution_problems(_committed(name), len(NOTEBOOKS[name]))
    assert not problems, f"examples/{name}.ipynb (run `make notebooks`): {problems}"


def test_execution_check_can_fail():
    """The check above fails a notebook whose outputs were cleared, or that holds a large or non-PNG output."""
    notebook = _committed("02_train_gpt")
    assert _execution_problems(notebook, 1) == []
    cleared = _committed("02_train_gpt")
    for cell in cleared.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    assert _execution_problems(cleared, 1)
    large = _committed("02_train_gpt")
    large.cells[-1].outputs.append(nbformat.v4.new_output("stream", text="x" * MAX_OUTPUT_BYTES))
    assert any("bytes" in problem for problem in _execution_problems(large, 1))
    svg = _committed("02_train_gpt")
    svg.cells[-1].outputs.append(nbformat.v4.new_output("display_data", data={"image/svg+xml": "<svg/>"}))
    assert any("image/svg+xml" in problem for problem in _execution_problems(svg, 1))


def test_readme_pictures_are_the_notebooks_plots():
    """Every picture the README shows is a small PNG that `make notebooks` copies from a notebook's plot."""
    images = _make_notebooks().README_IMAGES
    shown = re.findall(r"\]\((docs/images/[^)]+)\)", (ROOT / "README.md").read_text())
    assert shown, "the README shows no picture from docs/images/"
    for link in shown:
        name = Path(link).name
        assert name in images, f"README shows {link}, which `make notebooks` does not write"
        notebook, plot = images[name].split("/")
        assert plot in NOTEBOOKS[notebook]  # so the slow test checks that the notebook writes it
        path = ROOT / link
        assert path.is_file() and path.read_bytes()[:8] == PNG_SIGNATURE, link
        assert path.stat().st_size <= MAX_README_IMAGE_BYTES, f"{link}: {path.stat().st_size:,} bytes"


@pytest.fixture(scope="module")
def kernel_spec_dir(tmp_path_factory):
    """A kernel spec that starts this very interpreter, whatever other `python3` kernels exist."""
    pytest.importorskip("ipykernel")
    return _make_notebooks().write_kernel_spec(tmp_path_factory.mktemp("kernels"))


def _outputs_text(notebook):
    return "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_and_writes_its_plots(name, kernel_spec_dir, tmp_path):
    turns.skip_unless_its_turn(name, RUN_ON, "The notebook")
    notebook = _make_notebooks().build(EXAMPLES / f"{name}.py")
    env = {**os.environ, "KT_EXAMPLES_OUT": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3"}
    # One OpenMP thread: on a shared 2-core machine PyTorch's spinning worker threads otherwise
    # burn several times the CPU time of the work itself. Results do not depend on it.
    env.setdefault("OMP_NUM_THREADS", "1")
    # A last cell reports the kernel's CPU time (its own and its finished children's), to keep
    # the notebooks small: the suite runs them on every backend of a shared machine.
    notebook.cells.append(nbformat.v4.new_code_cell(CPU_REPORT))
    _make_notebooks().execute(notebook, kernel_spec_dir, env)  # raises CellExecutionError if any cell fails

    assert f"backend: {keras.config.backend()}" in _outputs_text(notebook)  # the kernel inherited KERAS_BACKEND
    cpu_seconds = json.loads(notebook.cells[-1].outputs[0]["text"])["cpu_seconds"]
    print(f"{name} ({keras.config.backend()}): {cpu_seconds:.1f} s of CPU")
    import matplotlib.image

    for plot in NOTEBOOKS[name]:
        path = tmp_path / name / plot
        assert path.is_file(), f"{name} did not write {plot}; it wrote {sorted(p.name for p in tmp_path.rglob('*'))}"
        assert path.stat().st_size > 1000 and path.read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and min(image.shape[:2]) >= 100
        assert np.ptp(image[..., :3]) > 0  # not a blank canvas
