"""Generate the example notebooks from the example scripts, so the two never drift.

    python examples/make_notebooks.py           # rewrite every examples/NN_*.ipynb from its .py
    python examples/make_notebooks.py --check   # exit 1 if a notebook is not what its script gives

Each script is split into cells at its `# %%` lines (the "percent" format of Jupytext, VS Code and
Spyder). A `# %% [markdown]` cell holds comment lines, written to the notebook without their
leading "# ". Notebooks are written without outputs: the tests execute them (tests/examples/).
"""

import argparse
import re
import sys
from pathlib import Path

import nbformat

EXAMPLES = Path(__file__).resolve().parent
CELL_MARKER = re.compile(r"^# %%(?P<markdown> \[markdown\])?\s*$")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def scripts():
    """The example scripts: examples/NN_name.py, in order."""
    return sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))


def build(script):
    """The notebook (a `nbformat.NotebookNode`) for `script`."""
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


def render(notebook):
    return nbformat.writes(notebook) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the notebooks are up to date")
    args = parser.parse_args(argv)
    stale = []
    for script in scripts():
        target = script.with_suffix(".ipynb")
        text = render(build(script))
        if target.is_file() and target.read_text() == text:
            continue
        stale.append(target.name)
        if not args.check:
            target.write_text(text)
            print("wrote", target.relative_to(EXAMPLES.parent))
    if args.check and stale:
        print("out of date (run python examples/make_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
