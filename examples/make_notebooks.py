"""Build the example notebooks from the example scripts and run them, so the notebooks show their outputs.

    python examples/make_notebooks.py                 # every examples/NN_*.ipynb: rebuilt from its .py, then run
    python examples/make_notebooks.py 09_lora_quantize  # only the named ones
    python examples/make_notebooks.py --check         # exit 1 if a notebook's cells are not its script's

`make notebooks` runs the first. Each script is split into cells at its `# %%` lines (the
"percent" format of Jupytext, VS Code and Spyder); a `# %% [markdown]` cell holds comment lines,
written to the notebook without their leading "# ". The notebook is then executed top to bottom
with nbclient, in a fresh kernel running this interpreter, under `KERAS_BACKEND=jax`
(`BACKEND`; the first output says so), and written with its outputs, so a reader browsing the
repository sees the printed results and the plots (inline PNGs). Outputs are kept small and
stable: no timestamps or kernel versions in the file, plots at 80 dpi, relative paths in what
the notebooks print. The plots the README shows are copied to docs/images/ (`README_IMAGES`).
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat

EXAMPLES = Path(__file__).resolve().parent
ROOT = EXAMPLES.parent
CELL_MARKER = re.compile(r"^# %%(?P<markdown> \[markdown\])?\s*$")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
BACKEND = "jax"  # compiles the notebooks' models fastest of the three on a CPU
CELL_TIMEOUT_S = 600
# Plots the README shows: docs/images/<name> <- <notebook>/<plot>, as the notebook writes it.
README_IMAGES = {
    "attention_gpt_stdlib.png": "01_transformer_from_layers/gpt_stdlib_attention.png",
    "loss_curve.png": "02_train_gpt/loss_curve.png",
    "speed_vs_keras_hub.png": "06_switch_backends/speed_vs_keras_hub.png",
}
IMAGES = ROOT / "docs" / "images"


def scripts():
    """The example scripts: examples/NN_name.py, in order."""
    return sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))


def build(script):
    """The notebook (a `nbformat.NotebookNode`) for `script`, without outputs."""
    cells, kind, lines = [], None, []

    def flush():
        text = "\n".join(lines).strip("\n")
        if kind == "markdown":
            cells.append(nbformat.v4.new_markdown_cell(_uncomment(text)))
        elif kind == "code" and text:
            cells.append(nbformat.v4.new_code_cell(text))

    for line in Path(script).read_text().splitlines():
        match = CELL_MARKER.match(line)
        if match:
            flush()
            kind, lines = ("markdown" if match["markdown"] else "code"), []
        elif kind is None:
            if line.strip():
                raise ValueError(f"{script}: everything must be inside a cell; the first line must be '# %%'")
        else:
            lines.append(line)
    flush()
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:02d}"  # stable ids: regenerating gives the same file
    nbformat.validate(notebook)
    return notebook


def _uncomment(text):
    out = []
    for line in text.splitlines():
        if line != "#" and not line.startswith("# "):
            raise ValueError(f"A markdown cell line must start with '# '. Received: {line!r}")
        out.append(line[2:])
    return "\n".join(out)


def cells(notebook):
    """What a notebook says, outputs aside: (cell type, source) of each cell, in order."""
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def render(notebook):
    return nbformat.writes(notebook) + "\n"


# --- running a notebook -------------------------------------------------------


def write_kernel_spec(directory):
    """A kernel spec, `kt-examples` in `directory`, that starts this very interpreter.

    Written at run time, so nothing needs installing (no `ipykernel install`) and a user-level
    `python3` kernel of another Python cannot shadow it. Returns `directory`.
    """
    spec = Path(directory) / "kt-examples"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "keras_transformer examples",
                "language": "python",
            }
        )
    )
    return Path(directory)


def execute(notebook, kernel_spec_dir, env, timeout=CELL_TIMEOUT_S):
    """Run `notebook` in place (outputs filled in) in a fresh `kt-examples` kernel with environment `env`,
    its working directory examples/. Raises nbclient's CellExecutionError, with the traceback, if a cell fails."""
    import nbclient
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    manager = AsyncKernelManager(
        kernel_name="kt-examples", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernel_spec_dir)])
    )
    client = nbclient.NotebookClient(
        notebook, km=manager, timeout=timeout, record_timing=False, resources={"metadata": {"path": str(EXAMPLES)}}
    )
    try:
        client.execute(env=env)
    finally:
        # nbclient leaves a kernel it was handed running: stop it, or every notebook's kernel
        # (a Python process with the backends loaded) stays alive until this process exits.
        nbclient.util.run_sync(client.km.shutdown_kernel)(now=True)
    return notebook


def notebook_env(out_dir, backend, matplotlibrc_dir):
    """The kernel's environment: this one, with the backend, the plots' folder and quiet TensorFlow."""
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "KT_EXAMPLES_OUT": str(out_dir),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "MATPLOTLIBRC": str(matplotlibrc_dir),
        "TQDM_DISABLE": "1",
    }  # no progress bars of downloads or shards
    # One OpenMP thread: on a shared 2-core machine PyTorch's spinning worker threads otherwise
    # burn several times the CPU time of the work itself. Results do not depend on it.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run(script, kernel_spec_dir, env):
    """Build the notebook of `script`, execute it, and return it with its outputs, volatile fields removed."""
    notebook = build(script)
    metadata = {**notebook.metadata, "keras_transformer": {"executed_with": f"KERAS_BACKEND={env['KERAS_BACKEND']}"}}
    execute(notebook, kernel_spec_dir, env)
    notebook.metadata = metadata  # not the kernel's versions: they would change the file on every machine
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type == "code":
            cell.outputs = [output for output in map(_without_noise, cell.outputs) if output is not None]
        for output in cell.get("outputs", []):
            output.get("metadata", {}).clear()  # only image sizes, which the PNG already holds
    nbformat.validate(notebook)
    return notebook


# Lines on stderr that say nothing about the example and change from run to run or machine to
# machine: TensorFlow's C++ start-up log (timestamped, printed before its log level applies) and
# tqdm's note that Jupyter widgets are not installed (with the path of the virtual environment).
NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IWE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] .*"
    r"|.*TqdmWarning: IProgress not found.*|  from \.autonotebook import tqdm as notebook_tqdm"
)


def _without_noise(output):
    """`output` without the NOISE lines of a stderr stream; None when nothing else is left."""
    if output.output_type != "stream" or output.name != "stderr":
        return output
    output.text = "".join(
        line for line in output.text.splitlines(keepends=True) if not NOISE.fullmatch(line.rstrip("\n"))
    )
    return output if output.text.strip() else None


def copy_readme_images(out_dir, names):
    """Copy the README's plots written by the notebooks `names` (just run) to docs/images/."""
    IMAGES.mkdir(parents=True, exist_ok=True)
    for name, plot in README_IMAGES.items():
        source = Path(out_dir) / plot
        if plot.split("/")[0] in names:
            shutil.copyfile(source, IMAGES / name)
            print(f"copied {plot} -> {(IMAGES / name).relative_to(ROOT)} ({source.stat().st_size / 1e3:.0f} kB)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebooks to build, e.g. 02_train_gpt (default: all)")
    parser.add_argument("--check", action="store_true", help="only check that each notebook's cells are its script's")
    args = parser.parse_args(argv)
    chosen = [script for script in scripts() if not args.names or script.stem in args.names]
    unknown = sorted(set(args.names) - {script.stem for script in chosen})
    if unknown:
        parser.error(f"no script examples/<name>.py for {unknown}")
    if args.check:
        stale = [
            script.stem
            for script in chosen
            if not script.with_suffix(".ipynb").is_file()
            or cells(nbformat.read(script.with_suffix(".ipynb"), as_version=4)) != cells(build(script))
        ]
        if stale:
            print("out of date (run `make notebooks`):", ", ".join(stale))
            return 1
        return 0
    # Plots go to examples/out/ (git-ignored), named relative to the kernel's working directory
    # examples/, so that what the notebooks print holds no machine-specific path.
    out_dir = Path("out")
    with tempfile.TemporaryDirectory(prefix="kt_notebooks_") as scratch:
        (Path(scratch) / "matplotlibrc").write_text("figure.dpi: 80\nsavefig.dpi: 80\n")  # small inline PNGs
        env = notebook_env(out_dir, BACKEND, scratch)
        kernel_spec_dir = write_kernel_spec(Path(scratch) / "kernels")
        for script in chosen:
            print(f"running {script.name} (KERAS_BACKEND={BACKEND}) ...", flush=True)
            target = script.with_suffix(".ipynb")
            text = render(run(script, kernel_spec_dir, env))
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)} ({len(text.encode()) / 1e3:.0f} kB)", flush=True)
    copy_readme_images(EXAMPLES / out_dir, {script.stem for script in chosen})
    return 0


if __name__ == "__main__":
    sys.exit(main())
