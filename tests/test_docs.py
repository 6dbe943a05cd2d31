"""Every ```python block of README.md, export/README.md and docs/*.md runs, as printed, on the backend under test.

Each document runs in its own Python process (the backend under test in `KERAS_BACKEND`), in a
temporary directory, its blocks in order in one namespace, as a reader would paste them. A
traceback points at the document's own line (each block is compiled with its place in the file).

Conventions, written as HTML comments (GitHub does not show them):

    <!-- docs-test setup
    lm = kt.models.GPTCausalLM.from_preset("gpt_stdlib")
    -->                                  hidden code run just before the next ```python block:
                                         the context a block shows only in words (`lm`, `texts`)
    <!-- docs-test skip: why -->         the next ```python block is not run; it is listed as a
                                         skipped test of its own, with the reason as message
    <!-- docs-test backends: jax -->     the backends the document claims (default: all three);
                                         on the others its test is skipped with that reason
    <!-- docs-test env: NAME=value -->   an environment variable for the document's process

Blocks marked ```bash (commands) or unmarked (output, trees) are not run.
This file is also the runner: `python tests/test_docs.py DOC.md` runs one document in the current
directory.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Documents without Python blocks that another test runs: docs/bad_input.md is a table of bad inputs and
# their errors, every cell of which tests/test_bad_input.py runs on every backend.
RUN_ELSEWHERE = {"docs/bad_input.md": "tests/test_bad_input.py"}
DOCS = ["README.md", "export/README.md"] + sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "docs").glob("*.md")
    if str(path.relative_to(ROOT)) not in RUN_ELSEWHERE
)
BACKENDS = ("tensorflow", "jax", "torch")
# Every document's run is slow (the tour trains and exports; export/README.md exports three times;
# docs/distribution.md trains on a simulated mesh): `make test-fast` keeps only the compile check.
SLOW = set(DOCS)
# README.md runs on every backend (the tour a new user pastes, on the backend they chose); the other documents
# each on one backend per `make test`, in turn, among those they claim (tests/turns.py).
EVERY_BACKEND = {"README.md"}

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_COMMENT = re.compile(r"<!--\s*docs-test\s+(setup|skip|backends|env)\s*:?\s*(.*?)-->", re.S)


def blocks(text):
    """A markdown text -> (python blocks, settings).

    Each block is a dict {line (1-based, its first code line), code, setup (list of (line, code)),
    skip (reason or None)}. Settings: {"backends": [...], "env": {...}}.
    """
    settings = {"backends": list(BACKENDS), "env": {}}
    pending_setup, pending_skip, found = [], None, []
    events = [(m.start(), "comment", m) for m in _COMMENT.finditer(text)]
    events += [(m.start(), "fence", m) for m in _FENCE.finditer(text)]
    for start, kind, match in sorted(events, key=lambda event: event[0]):
        if kind == "comment":
            what, body = match.group(1), match.group(2)
            if what == "setup":
                body_start = match.start(2)
                pending_setup.append((text.count("\n", 0, body_start) + 1, body))
            elif what == "skip":
                pending_skip = body.strip() or "no reason given"
            elif what == "backends":
                settings["backends"] = body.replace(",", " ").split()
            else:
                name, _, value = body.strip().partition("=")
                settings["env"][name.strip()] = value.strip()
            continue
        if match.group(1) != "python":
            continue
        code_line = text.count("\n", 0, match.start(2)) + 1
        found.append({"line": code_line, "code": match.group(2), "setup": pending_setup, "skip": pending_skip})
        pending_setup, pending_skip = [], None
    return found, settings


def run_document(path):
    """Run a document's blocks in order, in one namespace, in the current directory."""
    text = Path(path).read_text(encoding="utf-8")
    found, _ = blocks(text)
    namespace = {"__name__": "__main__"}
    for block in found:
        if block["skip"]:
            print(f"skipped block at line {block['line']}: {block['skip']}", flush=True)
            continue
        for line, code in block["setup"] + [(block["line"], block["code"])]:
            # Leading newlines put the code at its own line of the document in tracebacks.
            exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)
        print(f"ran block at line {block['line']}", flush=True)


# --- the tests ------------------------------------------------------------------------------

if __name__ != "__main__":  # the runner's process imports nothing a document did not ask for
    import keras
    import pytest

    from tests import turns

    @pytest.mark.parametrize("doc", [pytest.param(doc, marks=pytest.mark.slow) if doc in SLOW else doc for doc in DOCS])
    def test_document_runs_as_printed(doc, tmp_path):
        found, settings = blocks((ROOT / doc).read_text(encoding="utf-8"))
        assert found, f"{doc} has no ```python block: nothing to run"
        backend = keras.config.backend()
        if backend not in settings["backends"]:
            pytest.skip(f"{doc} claims only {', '.join(settings['backends'])} (docs-test backends)")
        if doc not in EVERY_BACKEND:
            turns.skip_unless_its_turn(doc, _turns(), "The document")
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", **settings["env"]}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        completed = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(ROOT / doc)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert completed.returncode == 0, (
            f"{doc} failed on {backend}:\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
        )
        ran = re.findall(r"^ran block at line (\d+)$", completed.stdout, re.M)
        expected = [str(block["line"]) for block in found if not block["skip"]]
        assert ran == expected, completed.stdout  # every block not marked skip ran (those are listed below)

    def _turns():
        claims = {doc: blocks((ROOT / doc).read_text(encoding="utf-8"))[1]["backends"] for doc in DOCS}
        return turns.dealt([doc for doc in DOCS if doc not in EVERY_BACKEND], claims)

    def _blocks_not_run():
        for doc in DOCS:
            for block in blocks((ROOT / doc).read_text(encoding="utf-8"))[0]:
                if block["skip"]:
                    yield pytest.param(doc, block["line"], block["skip"], id=f"{doc}:{block['line']}")

    @pytest.mark.parametrize("doc, line, reason", list(_blocks_not_run()))
    def test_block_marked_skip_is_listed_with_its_reason(doc, line, reason):
        """Each block a document marks `docs-test skip` is reported here, as a skip of its own with the document's
        reason (its document's test passes: every other block ran). A mark without a reason fails."""
        assert reason != "no reason given", f"{doc}, line {line}: `docs-test skip` needs a reason after the colon"
        pytest.skip(f"{doc}, block at line {line} not run: {reason}")

    @pytest.mark.parametrize("doc", DOCS)
    def test_every_block_compiles(doc):
        """The fast check (`make test-fast`): each block, with its setup, is valid Python."""
        found, _ = blocks((ROOT / doc).read_text(encoding="utf-8"))
        for block in found:
            for line, code in block["setup"] + [(block["line"], block["code"])]:
                compile("\n" * (line - 1) + code, doc, "exec")

    def test_blocks_finds_setup_skip_and_settings():
        text = (
            "<!-- docs-test backends: jax -->\n<!-- docs-test env: A=1 -->\n"
            "```python\nx = 1\n```\n\n<!-- docs-test setup\ny = 2\n-->\n```python\nprint(x + y)\n```\n"
            "```bash\nmake demo\n```\n<!-- docs-test skip: needs two hosts -->\n```python\nboom()\n```\n"
        )
        found, settings = blocks(text)
        assert settings == {"backends": ["jax"], "env": {"A": "1"}}
        assert [(b["line"], b["code"], b["skip"]) for b in found] == [
            (4, "x = 1\n", None),
            (11, "print(x + y)\n", None),
            (18, "boom()\n", "needs two hosts"),
        ]
        assert found[1]["setup"] == [(8, "y = 2\n")]

    def test_a_failing_block_fails_with_the_document_line(tmp_path):
        doc = tmp_path / "doc.md"
        doc.write_text("# t\n\n```python\nx = 1\n```\n\ntext\n\n```python\nx.no_such_method()\n```\n")
        completed = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), str(doc)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert completed.returncode != 0
        assert f'File "{doc}", line 10' in completed.stderr and "no_such_method" in completed.stderr
        assert "ran block at line 4" in completed.stdout


if __name__ == "__main__":
    sys.path[0] = ""  # as `python` started in the current directory: not this file's tests/ folder
    run_document(sys.argv[1])


def test_documents_run_elsewhere_are_run_there():
    for doc, test in RUN_ELSEWHERE.items():
        assert (ROOT / doc).exists(), doc
        assert doc in (ROOT / test).read_text(), f"{test} must read {doc}"
