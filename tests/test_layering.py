"""The layering of keras_transformer/, read from the source with `ast` (nothing is imported):
no import cycle, no function-level import of the package's own modules, and the floors: every
module imports only modules on its own floor or below (FLOORS), and the lowest floors only
themselves. See docs/architecture.md."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "keras_transformer"

# The two doors into the library, which nothing inside it imports back: the package's lazy
# `__init__` and the command line load the floors on first use, so that `import keras_transformer`
# and `keras-transformer --help` need no Keras. Their deferred imports still count as edges below.
DOORS = {"keras_transformer", "keras_transformer.cli"}

# Function-level imports of our own modules that stay, each with its reason. Each entry is (importer,
# imported); the cycle check leaves these edges out. Only an optional dependency's door belongs here.
ALLOWLIST = set()  # empty: decoding/compile.py imports the PyTorch kernels at module level, on PyTorch only


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _source_files():
    return sorted((ROOT / PACKAGE).rglob("*.py"))


MODULES = {_module_name(path): path for path in _source_files()}


def _resolve(name):
    """The most specific module of ours that `name` (a dotted module or attribute) denotes."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(path):
    """[(imported module, line, inside a function?)] for the package's own modules that `path` imports."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                # `from a import b` imports the submodule a.b when there is one, else a.
                names = [f"{base}.{alias.name}" for alias in child.names]
            else:
                visit(child, nested)
                continue
            for name in names:
                if name == PACKAGE or name.startswith(PACKAGE + "."):
                    target = _resolve(name)
                    if target is not None and target != module:
                        found.append((target, child.lineno, in_function))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


IMPORTS = {name: _imports(path) for name, path in MODULES.items()}


def _graph():
    return {
        name: sorted({target for target, _, _ in edges if (name, target) not in ALLOWLIST})
        for name, edges in IMPORTS.items()
    }


def _cycles(graph):
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_graph_is_read():
    # The parser finds what a reader sees: the package's floors and their best-known edges.
    assert {
        "keras_transformer.presets",
        "keras_transformer.layers.multi_head_attention",
        "keras_transformer.models.backbone",
    } <= set(MODULES)
    assert "keras_transformer.presets" in _graph()["keras_transformer.models.backbone"]
    assert "keras_transformer.layers.kv_cache" in _graph()["keras_transformer.layers.multi_head_attention"]


def test_cycle_detection_finds_a_cycle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert _cycles({"a": ["b"], "b": []}) == []


def test_no_import_cycle():
    """Function-level imports count as edges too: a deferred import must not hide a cycle."""
    assert _cycles(_graph()) == []


def test_no_function_level_import_of_our_own_modules():
    """Only optional heavy dependencies (tensorflow, torch, onnx, ...) may be imported inside functions."""
    found = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: {target}"
        for name, edges in IMPORTS.items()
        if name not in DOORS
        for target, line, in_function in edges
        if in_function and (name, target) not in ALLOWLIST
    ]
    assert found == []


def test_nothing_imports_a_door():
    assert [
        (name, target)
        for name, edges in IMPORTS.items()
        for target, _, _ in edges
        if target in DOORS and name not in DOORS
    ] == []


def test_allowlist_holds_only_edges_that_exist():
    # An entry whose import is gone must leave the list, so the list only shrinks to empty.
    edges = {(name, target) for name, found in IMPORTS.items() for target, _, _ in found}
    assert sorted(ALLOWLIST - edges) == []


def _imports_of(prefix):
    return {
        (name, target)
        for name, edges in IMPORTS.items()
        if name == prefix or name.startswith(prefix + ".")
        for target, _, _ in edges
    }


@pytest.mark.parametrize(
    "floor, allowed",
    [
        ("keras_transformer.layers", ("keras_transformer.layers",)),
        ("keras_transformer.tokenizers", ("keras_transformer.tokenizers",)),
        ("keras_transformer.kernels", ("keras_transformer.kernels", "keras_transformer.layers")),
    ],
)
def test_lower_floors_import_only_themselves(floor, allowed):
    outside = sorted(
        (name, target)
        for name, target in _imports_of(floor)
        if not any(target == a or target.startswith(a + ".") for a in allowed)
    )
    assert outside == []


# The floors, lowest first. A module imports only modules on its own floor or below; nothing imports back up.
# An entry names a module or a package (with every module under it); a module takes its most specific
# entry's floor. A name not in the tree matches nothing, so the table holds while packages move. The
# top-level package, a door, declares and loads the floors above lazily and sits on no floor.
FLOORS = (
    # stand-alone modules: none imports a floor of ours
    (
        "keras_transformer.version",
        "keras_transformer.backend_check",
        "keras_transformer.entry_points",
        "keras_transformer.startup",
        "keras_transformer.bundle_runtime",
        "keras_transformer.hub",
        "keras_transformer.distribution",
        "keras_transformer.metrics",
        "keras_transformer.corpus",
        "keras_transformer.progress",
    ),
    ("keras_transformer.layers", "keras_transformer.tokenizers"),  # the KV cache lives with the layers
    ("keras_transformer.kernels",),  # the layer-kernel table and its runtimes
    ("keras_transformer.samplers",),  # what a user passes: samplers choose tokens
    ("keras_transformer.decoding",),  # the engine: runs the step, asks the samplers
    ("keras_transformer.presets",),  # the registry the models register into, and the loader
    ("keras_transformer.models",),
    ("keras_transformer.convert", "keras_transformer.export"),  # built on the models
    ("keras_transformer.cli",),
)


def _floor(module):
    """The index in FLOORS of `module`'s most specific entry; None for the top-level door (and the unknown)."""
    matches = [
        (len(entry), level)
        for level, entries in enumerate(FLOORS)
        for entry in entries
        if module == entry or module.startswith(entry + ".")
    ]
    return max(matches)[1] if matches else None


def _upward(edges):
    """The (importer, imported) edges that run back up: the imported module sits on a higher floor."""
    return sorted(
        (name, target)
        for name, target in edges
        if name != PACKAGE
        and (name, target) not in ALLOWLIST
        and _floor(target) is not None
        and _floor(target) > _floor(name)
    )


def test_every_module_stands_on_a_floor():
    """A new module or package must be placed in FLOORS (and in docs/architecture.md's drawing)."""
    assert sorted(name for name in MODULES if name != PACKAGE and _floor(name) is None) == []


def test_upward_imports_are_found():
    # What the models package once did to register the converters and exporters, and the loader's old sin.
    assert _upward(
        [
            ("keras_transformer.models", "keras_transformer.convert"),
            ("keras_transformer.models.task", "keras_transformer.export.onnx"),
            ("keras_transformer.presets.loading", "keras_transformer.models.backbone"),
            ("keras_transformer.samplers.sampler", "keras_transformer.decoding.rows"),
            ("keras_transformer.export", "keras_transformer.models"),
            ("keras_transformer", "keras_transformer.cli"),
        ]
    ) == [
        ("keras_transformer.models", "keras_transformer.convert"),
        ("keras_transformer.models.task", "keras_transformer.export.onnx"),
        ("keras_transformer.presets.loading", "keras_transformer.models.backbone"),
        ("keras_transformer.samplers.sampler", "keras_transformer.decoding.rows"),
    ]


def test_no_import_runs_back_up():
    """Function-level imports count too. What a lower floor looks up but may not import (the Hugging Face
    reader behind `from_preset`, the writers behind `Task.export`) the top-level package declares
    (keras_transformer/entry_points.py)."""
    edges = [(name, target) for name, found in IMPORTS.items() for target, _, _ in found]
    assert [
        f"{name} (floor {_floor(name)}) -> {target} (floor {_floor(target)})" for name, target in _upward(edges)
    ] == []


def test_no_source_file_is_longer_than_450_lines():
    """A file that outgrows 450 lines holds several jobs: split it by job (see docs/architecture.md)."""
    files = sorted((ROOT / PACKAGE).rglob("*.py")) + sorted((ROOT / "export" / "runtime").rglob("*.py"))
    assert len(files) > 50 and any(path.parts[-3:-1] == ("export", "runtime") for path in files)  # both trees read
    lengths = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines()) for path in files}
    assert sorted(f"{name}: {count} lines" for name, count in lengths.items() if count > 450) == []


def test_the_cache_module_is_self_contained():
    """layers/kv_cache.py (every cache layout, and a backbone's L-layer cache forms) needs only the mask helpers,
    which need nothing of ours: samplers and models take their cache code from it, nothing else."""
    assert sorted({target for target, _, _ in IMPORTS["keras_transformer.layers.kv_cache"]}) == [
        "keras_transformer.layers.masks"
    ]
    assert IMPORTS["keras_transformer.layers.masks"] == []
    # The cache helpers are defined there and nowhere else.
    defined = {
        name: [
            module
            for module, path in MODULES.items()
            if any(isinstance(node, ast.FunctionDef) and node.name == name for node in ast.parse(path.read_text()).body)
        ]
        for name in ("split_cache", "layer_cache_of", "like_cache", "cache_keys", "as_cache")
    }
    assert defined == {name: ["keras_transformer.layers.kv_cache"] for name in defined}


def _imported_names(prefix, source_module):
    """{(importer, imported module, name)} for `from <source_module...> import name` in modules under `prefix`."""
    found = set()
    for module, path in MODULES.items():
        if module != prefix and not module.startswith(prefix + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and not node.level
                and node.module
                and (node.module == source_module or node.module.startswith(source_module + "."))
            ):
                found |= {(module, node.module, alias.name) for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {
                    (module, alias.name, None)
                    for alias in node.names
                    if alias.name == source_module or alias.name.startswith(source_module + ".")
                }
    return found


@pytest.mark.parametrize("prefix", ["keras_transformer.export", "keras_transformer.convert"])
def test_export_uses_the_samplers_public_entry_points(prefix):
    """Export and convert import decoding from the `keras_transformer.samplers` package's `__all__` only:
    no private module (`samplers.decode_loop`, ...), no private name (`_...`)."""
    init = MODULES["keras_transformer.samplers"]
    public = next(
        ast.literal_eval(node.value)
        for node in ast.parse(init.read_text()).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__"
    )
    used = _imported_names(prefix, "keras_transformer.samplers")
    assert sorted(f"{module}: {source}" for module, source, _ in used if source != "keras_transformer.samplers") == []
    assert sorted(f"{module}: {name}" for module, _, name in used if name not in public) == []


# The bundle runtime (export/runtime/, copied into every bundle) runs without Keras: the standard library,
# these packages, its own files and the chat template the export copies next to them.
RUNTIME_PACKAGES = {
    "numpy",
    "onnxruntime",
    "tokenizers",
    "jinja2",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "llguidance",
}


def _top_level_imports(path):
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module)
    return names


def test_the_bundle_runtime_imports_no_framework():
    import sys

    runtime = ROOT / "export" / "runtime"
    own = {path.stem for path in runtime.glob("*.py")} | {"chat_template"}
    outside = {}
    for path in sorted(runtime.glob("*.py")) + [MODULES["keras_transformer.tokenizers.chat_template"]]:
        for name in _top_level_imports(path):
            top = name.split(".")[0]
            # bundle_files.py falls back to the package's chat template when run from the repository itself.
            fallback = path.name == "bundle_files.py" and name == "keras_transformer.tokenizers"
            if top not in own | RUNTIME_PACKAGES | set(sys.stdlib_module_names) and not fallback:
                outside.setdefault(path.name, []).append(name)
    assert outside == {}
    assert {"numpy", "onnxruntime"} <= set().union(*(_top_level_imports(p) for p in runtime.glob("*.py")))


def test_the_bundle_runtime_has_no_import_cycle():
    """export/runtime/'s files import each other by plain name (they lie side by side in a bundle): one job per
    file, each importing only files below it (docs/architecture.md draws them)."""
    runtime = ROOT / "export" / "runtime"
    own = {path.stem for path in runtime.glob("*.py")}
    graph = {
        path.stem: sorted({name.split(".")[0] for name in _top_level_imports(path)} & own - {path.stem})
        for path in runtime.glob("*.py")
    }
    assert graph["generate"] and graph["serve"]  # the graph is read
    assert _cycles(graph) == []
