"""The example notebooks run top to bottom on the current backend and write their plots.

Each notebook is executed with nbclient in a fresh kernel that runs this interpreter (the
project's virtual environment) and inherits this process's environment, KERAS_BACKEND included.
Its plots go to a temporary KT_EXAMPLES_OUT; the test checks that each expected PNG exists and
is a readable, non-empty image. The notebooks assert their own results as they go (parity with
numpy formulas, Keras vs ONNX Runtime and SavedModel, identical greedy output across backends,
learning on held-out data), so a wrong number fails the cell and the test.

A fast test checks that every notebook is what `examples/make_notebooks.py` generates from its
script, so the scripts and the notebooks never drift.
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# notebook -> the plots it must write under $KT_EXAMPLES_OUT/<notebook>/
NOTEBOOKS = {
    "01_transformer_from_layers": ["positional_encoding.png", "attention_weights.png", "masked_vs_unmasked.png"],
    "02_train_gpt": ["loss_curve.png"],
    "03_bert_classifier": ["training_and_confusion.png"],
    "04_seq2seq": ["exact_match.png"],
    "05_export": ["logits_parity.png"],
    "06_switch_backends": ["backend_logit_differences.png"],
    "07_scale_out": ["weights_per_device.png"],
    "08_llama_chat": ["logits_vs_transformers.png", "perplexity.png"],
}
CELL_TIMEOUT_S = 600
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


def test_every_script_has_its_notebook_and_a_test():
    scripts = sorted(path.stem for path in EXAMPLES.glob("[0-9][0-9]_*.py"))
    assert scripts == sorted(NOTEBOOKS)
    assert sorted(path.stem for path in EXAMPLES.glob("[0-9][0-9]_*.ipynb")) == scripts


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_is_generated_from_its_script(name):
    make_notebooks = _make_notebooks()
    expected = make_notebooks.render(make_notebooks.build(EXAMPLES / f"{name}.py"))
    assert (EXAMPLES / f"{name}.ipynb").read_text() == expected, (
        f"examples/{name}.ipynb differs from its script: run `python examples/make_notebooks.py`"
    )


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


@pytest.fixture(scope="module")
def kernel_spec_dir(tmp_path_factory):
    """A kernel spec that starts this very interpreter, whatever other `python3` kernels exist.

    Written at run time into a temporary directory, so nothing needs installing (no
    `ipykernel install`) and a user-level `python3` kernel of another Python cannot shadow it.
    """
    pytest.importorskip("ipykernel")
    directory = tmp_path_factory.mktemp("kernels")
    spec = directory / "kt-examples"
    spec.mkdir()
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "keras_transformer examples",
        "language": "python",
    }))
    return directory


def _kernel_manager(kernel_spec_dir):
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    return AsyncKernelManager(
        kernel_name="kt-examples", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_spec_dir)])
    )


def _outputs_text(notebook):
    return "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_and_writes_its_plots(name, kernel_spec_dir, tmp_path):
    notebook = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    env = {**os.environ, "KT_EXAMPLES_OUT": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "3"}
    # One OpenMP thread: on a shared 2-core machine PyTorch's spinning worker threads otherwise
    # burn several times the CPU time of the work itself. Results do not depend on it.
    env.setdefault("OMP_NUM_THREADS", "1")
    # A last cell reports the kernel's CPU time (its own and its finished children's), to keep
    # the notebooks small: the suite runs them on every backend of a shared machine.
    notebook.cells.append(nbformat.v4.new_code_cell(CPU_REPORT))
    client = nbclient.NotebookClient(
        notebook,
        km=_kernel_manager(kernel_spec_dir),
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )
    try:
        client.execute(env=env)  # raises CellExecutionError, with the traceback, if any cell fails
    finally:
        # nbclient leaves a kernel it was handed running: stop it, or every notebook's kernel
        # (a Python process with the backends loaded) stays alive until pytest exits.
        nbclient.util.run_sync(client.km.shutdown_kernel)(now=True)

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
