"""Every `>>>` example in a docstring of keras_transformer/ and export/runtime/ runs, as printed, on the backend
under test.

One test per module with examples in its docstrings: the module is imported (the bundle runtime's modules as a bundle
imports them, export/runtime/ on `sys.path`), `doctest.DocTestFinder` collects its docstrings' examples, and
`doctest.DocTestRunner` runs each docstring in a copy of the module's globals (ELLIPSIS, NORMALIZE_WHITESPACE),
in a temporary working directory that must stay empty (an example that saves writes under `tempfile.mkdtemp()`,
which the test points into pytest's `tmp_path`). A failure shows the runner's report: the example, what it
printed, what the docstring shows. Modules whose examples train, generate or export are marked slow, and run on
one backend per `make test`, in turn (tests/turns.py).

An example that cannot run here (the Hugging Face Hub, several devices, an exported bundle) ends with
`# doctest: +SKIP`, under a comment line that says why:

    >>> # Downloads from the Hugging Face Hub: not run by the tests.
    >>> lm = GPTCausalLM.from_preset("hf://openai-community/gpt2")  # doctest: +SKIP

A module whose examples are all skipped is reported as a skipped test with those reasons.
"""

import ast
import doctest
import importlib
import importlib.util
import io
import re
import sys
import tempfile
from pathlib import Path

import keras
import pytest

from tests import turns

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ROOT / "export" / "runtime"
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
COMMENT = re.compile(r"^\s*>>>\s*#(.*)$")
# Optional dependencies a module may import at its top: without one, the module is skipped, saying which.
OPTIONAL = {"torch", "tensorflow", "jax", "onnx", "onnxruntime", "tf2onnx", "transformers", "starlette", "uvicorn"}


def _module_name(path):
    """keras_transformer/models/gpt/gpt_backbone.py -> keras_transformer.models.gpt.gpt_backbone; export/runtime
    files keep their bare name (the runtime's modules import one another by it)."""
    if path.parent == RUNTIME:
        return path.stem
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_examples(path):
    """The doctest examples of every docstring in a file (module, classes, functions), read with `ast`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [tree] + [
        node for node in ast.walk(tree) if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    parser = doctest.DocTestParser()
    return [example for node in nodes for example in parser.get_examples(ast.get_docstring(node, clean=False) or "")]


FILES = {
    _module_name(path): path
    for path in sorted((ROOT / "keras_transformer").rglob("*.py")) + sorted(RUNTIME.glob("*.py"))
}
EXAMPLES = {name: examples for name, path in FILES.items() if (examples := source_examples(path))}
SOURCES = {name: FILES[name] for name in EXAMPLES}  # the modules with examples: one test each
# An example that trains, generates or exports compiles a training step, a decoding loop or a graph: seconds
# each under JAX and TensorFlow. Those modules' tests are marked slow (`make test-fast` leaves them out).
_COMPILES = re.compile(r"\.(?:fit|generate|export)\(")
SLOW = {
    name
    for name, examples in EXAMPLES.items()
    if any(_COMPILES.search(example.source) for example in examples if not example.options.get(doctest.SKIP))
}


# The slow modules' examples run on one backend per `make test`, in turn (tests/turns.py); the others on every one.
TURNS = turns.dealt(SLOW)


def _import(name):
    """The module named `name`; a bundle runtime module imported from export/runtime/ as the bundle does."""
    path = SOURCES[name]
    if path.parent != RUNTIME:
        return importlib.import_module(name)
    # The runtime's own modules (decode_loop, sampling, ...) are imported by bare name: forgotten afterwards, so
    # that a bundle's copy of them, imported later in this process, is not shadowed by the source tree's.
    bare = {path.stem for path in RUNTIME.glob("*.py")}
    before = {key: sys.modules.pop(key) for key in bare if key in sys.modules}
    sys.path.insert(0, str(RUNTIME))
    try:
        spec = importlib.util.spec_from_file_location(f"_doctest_runtime_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(RUNTIME))
        for key in bare:
            sys.modules.pop(key, None)
        sys.modules.update(before)
    return module


def skip_reasons(tests):
    """{reason: count} of the examples marked +SKIP, each reason the last `>>> # comment` line above it in its
    docstring (doctest itself drops comment-only examples).

    An example marked +SKIP with no such comment above it is a ValueError.
    """
    reasons = {}
    for test in tests:
        lines = test.docstring.splitlines()
        for example in test.examples:
            if not example.options.get(doctest.SKIP):
                continue
            above = [COMMENT.match(line) for line in lines[: example.lineno]]
            reason = next((match.group(1).strip() for match in reversed(above) if match), None)
            if reason is None:
                raise ValueError(
                    f"{test.name}, line {test.lineno + example.lineno + 1}: an example marked +SKIP needs a "
                    f"comment line above it that says why (`>>> # why`)."
                )
            reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


def run_examples(tests):
    """Run doctest `tests` -> (failed, run, report): examples failed and run (those marked +SKIP left out)."""
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    failed = run = 0
    for test in tests:
        result = runner.run(test, out=report.write, clear_globs=True)
        failed += result.failed
        run += sum(1 for example in test.examples if not example.options.get(doctest.SKIP))
    return failed, run, report.getvalue()


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in sorted(SOURCES)]
)
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    if name in TURNS:
        turns.skip_unless_its_turn(name, TURNS, "The docstring examples of")
    try:
        module = _import(name)
    except ModuleNotFoundError as error:
        if error.name not in OPTIONAL:
            raise
        pytest.skip(f"{name} imports {error.name}, which is not installed (KERAS_BACKEND={keras.config.backend()})")
    tests = [test for test in doctest.DocTestFinder().find(module, name) if test.examples]
    # Every example in the file's docstrings is one the finder sees (none in a nested function, say).
    found, written = sum(len(test.examples) for test in tests), len(EXAMPLES[name])
    assert found == written, f"{name}: the doctest finder sees {found} of the {written} examples in its docstrings"
    reasons = skip_reasons(tests)
    work, temp = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    monkeypatch.chdir(work)  # an example that writes a file writes it here, never into the repository
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # and `tempfile.mkdtemp()` folders go where pytest cleans
    failed, run, report = run_examples(tests)
    assert not failed, f"{failed} docstring example(s) of {name} failed on {keras.config.backend()}:\n{report}"
    left = sorted(path.name for path in work.iterdir())
    assert not left, f"{name}'s examples wrote {left} into the working directory: write under tempfile.mkdtemp()"
    if not run:
        pytest.skip(f"{name}: every example is marked +SKIP: " + "; ".join(reasons))


def test_a_wrong_example_fails():
    """The runner is not a rubber stamp: a docstring that shows the wrong output, or raises, fails."""

    def shape_of_ones():
        """
        >>> import numpy as np
        >>> np.ones((2, 3)).shape
        (3, 2)
        >>> undefined_name
        """

    tests = doctest.DocTestFinder().find(shape_of_ones, "shape_of_ones", globs={})
    failed, run, report = run_examples(tests)
    assert (failed, run) == (2, 3)
    assert "Expected:\n    (3, 2)\nGot:\n    (2, 3)" in report and "NameError" in report


def test_a_skip_without_a_reason_is_refused():
    def no_reason():
        """
        >>> 1 + 1  # doctest: +SKIP
        3
        """

    def with_reason():
        """
        >>> # Needs two hosts.
        >>> 1 + 1  # doctest: +SKIP
        3
        """

    with pytest.raises(ValueError, match="needs a comment line above it"):
        skip_reasons(doctest.DocTestFinder().find(no_reason, "no_reason", globs={}))
    tests = doctest.DocTestFinder().find(with_reason, "with_reason", globs={})
    assert skip_reasons(tests) == {"Needs two hosts.": 1}
    assert run_examples(tests)[:2] == (0, 0)
