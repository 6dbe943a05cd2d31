"""Short functions: none in the library or the bundle runtime has more than 60 lines of code.

A function's lines of code run from its first statement after the docstring to its end, blank and
comment-only lines left out; a nested function counts toward the one around it (and on its own).
Backbone constructors stay short by building their blocks in helpers. Read from the source with
`ast`, nothing imported.
"""

import ast
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "keras_transformer").rglob("*.py")) + sorted((ROOT / "export" / "runtime").rglob("*.py"))
LIMIT = 60


def lines_of_code(function, source_lines):
    """The non-blank, non-comment lines of `function` (an ast def) after its docstring."""
    body = function.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]  # the docstring
    if not body:
        return 0
    lines = source_lines[body[0].lineno - 1 : function.end_lineno]
    return sum(1 for line in lines if line.strip() and not line.strip().startswith("#"))


def long_functions(source, name="<source>"):
    """[(name:line function, lines of code)] for every function of `source` over LIMIT lines of code."""
    source_lines = source.splitlines()
    return [
        (f"{name}:{node.lineno} {node.name}", lines_of_code(node, source_lines))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and lines_of_code(node, source_lines) > LIMIT
    ]


def _synthetic(code_lines):
    """A function with a docstring, comments and blank lines around `code_lines` statements."""
    statements = []
    for i in range(code_lines):
        statements += [f"x{i} = {i}  # a trailing comment counts as code", "", "# a comment line"]
    body = textwrap.indent("\n".join(statements), "    ")
    return f'def f():\n    """A docstring\n\n    over several lines.\n    """\n{body}\n'


def test_the_counter_counts_code_only():
    assert len(SOURCES) > 50 and any("runtime" in path.parts for path in SOURCES)
    over = _synthetic(LIMIT + 1)
    assert len(over.splitlines()) > 3 * LIMIT  # blank and comment lines would push it far over
    assert long_functions(over) == [("<source>:1 f", LIMIT + 1)]
    assert long_functions(_synthetic(LIMIT)) == []
    # A nested function's lines (its def, docstring and body) count toward the one around it.
    inner = textwrap.indent(_synthetic(LIMIT - 5), "    ")  # def + 3 docstring lines + LIMIT - 5 statements
    outer = f"def outer():\n{inner}    return f\n"  # LIMIT lines of code
    assert long_functions(outer) == []
    longer = outer.replace("    return f", "    g = f\n    return g")
    assert long_functions(longer) == [("<source>:1 outer", LIMIT + 1)]


def test_no_function_is_over_the_limit():
    found = []
    for path in SOURCES:
        found += long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == [], f"functions over {LIMIT} lines of code (split them into named helpers): {found}"
