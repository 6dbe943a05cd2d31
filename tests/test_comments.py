"""Numbers out of comments: the library's comments and docstrings say why, benchmarks/RESULTS.md says how
much. A comment cites a measurement by a heading of RESULTS.md, and that heading must exist; no timing or
speed-up sits in the source itself (they go stale). Read from the source, nothing imported."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "keras_transformer").rglob("*.py")) + sorted((ROOT / "export" / "runtime").rglob("*.py"))
RESULTS = ROOT / "benchmarks" / "RESULTS.md"

# `RESULTS.md, "a heading"` (or `RESULTS, "..."`), the name possibly wrapped over a comment's lines.
CITATION = re.compile(r'RESULTS(?:\.md)?\s*,\s*"([^"]+)"')
# A measured time, throughput or speed-up: "131 us", "2.7 ms", "850 tok/s", "1.6x faster", "3 s on this".
MEASUREMENT = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|tok/s|tokens/s|GB/s)\b"
    r"|\b\d+(?:\.\d+)?x (?:faster|slower|speed)"
    r"|\b\d+(?:\.\d+)? ?s (?:on this|per (?:step|token|call))"
)


def _text(path):
    """The file with comment continuations joined: `...\\n    # more` reads as `... more`."""
    return re.sub(r"\s*\n\s*#?\s*", " ", path.read_text(encoding="utf-8"))


def _headings():
    return [
        line.lstrip("#").strip() for line in RESULTS.read_text(encoding="utf-8").splitlines() if line.startswith("#")
    ]


def test_sources_are_read():
    assert len(SOURCES) > 50 and any("runtime" in path.parts for path in SOURCES)
    assert CITATION.findall('see (benchmarks/RESULTS.md,\n    # "first_argmax")'.replace("\n    # ", " ")) == [
        "first_argmax"
    ]
    assert MEASUREMENT.search("took 131 us at 4 rows") and MEASUREMENT.search("1.6x faster")
    assert not MEASUREMENT.search("the (D, V) array, 2 x (B, Hkv, S, Dh)")


def test_every_results_citation_names_a_heading():
    headings = _headings()
    uncited, unknown = [], []
    for path in SOURCES:
        text, name = _text(path), str(path.relative_to(ROOT))
        if text.count("RESULTS") != len(CITATION.findall(text)):
            uncited.append(name)  # cite it as: RESULTS.md, "<a heading>"
        unknown += [
            f"{name}: {cited!r}"
            for cited in CITATION.findall(text)
            if not any(cited in heading for heading in headings)
        ]
    assert (uncited, unknown) == ([], [])


def test_no_measurement_in_the_source():
    found = [
        f"{path.relative_to(ROOT)}: {match.group(0)!r}"
        for path in SOURCES
        for match in MEASUREMENT.finditer(_text(path))
    ]
    assert found == []


# A path into the repository named in a docstring, comment or doc: `decoding/decode_loop.py`,
# `keras_transformer/export/onnx.py`, `docs/deployment.md`. Paths under an example's output
# directory (`out/gpt_onnx/serve.py`) name files an export writes, not repository files.
NAMED_PATH = re.compile(r"(?<![\w/.])((?:[\w.]+/)+[\w.]+\.(?:py|md))\b")
DOCS = [ROOT / "README.md", ROOT / "export" / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def test_named_files_exist():
    """A renamed or split module leaves no docstring or doc pointing at its old file."""
    roots = {path.name for path in ROOT.iterdir() if path.is_dir()} | {
        path.name for path in (ROOT / "keras_transformer").iterdir() if path.is_dir()
    }
    missing = []
    for path in SOURCES + DOCS:
        for name in sorted(set(NAMED_PATH.findall(path.read_text(encoding="utf-8")))):
            if name.split("/")[0] not in roots:
                continue
            if not any(
                candidate.exists() for candidate in (ROOT / name, ROOT / "keras_transformer" / name, path.parent / name)
            ):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []
