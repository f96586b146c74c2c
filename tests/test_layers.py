"""The library's layers: no import circle between modules, and no layer importing one above it.

Every import counts, also one made inside a function (a circle hidden there is still a
circle); only imports under ``if TYPE_CHECKING:`` are left out (they never run). The layers,
lowest first, are the ones docs/ARCHITECTURE.md draws.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parent.parent / "lib"
PACKAGE = "kvpressure"

# Lowest first. A module may import its own layer and those below; a top-level name is the
# module or package directly under kvpressure/ ("kvpressure" itself is the package's __init__).
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    "kvpressure errors user_files jsonable words paths extras table_files workers schema_files",
    "profiles",
    "simulation",
    "ingestion",
    "record",
    "stages",
    "analysis",
    "folders",
    "report",
    "twin",
    "sweeps notebooks verify",
    "investigation schemas",
    "live tune",
    "cli_config commands",
    "cli",
))


def _modules(lib: Path) -> dict[str, Path]:
    out = {}
    for path in (lib / PACKAGE).rglob("*.py"):
        parts = path.relative_to(lib).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def import_graph(lib: Path = LIB) -> dict[str, set[str]]:
    """Each module of the library and the library's modules it imports when it runs."""
    modules = _modules(lib)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else module
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise KeyError(top)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_the_graph_sees_imports_inside_functions_and_not_type_checking_ones(tmp_path):
    pkg = tmp_path / PACKAGE / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "b.py").write_text("")
    (pkg / "c.py").write_text("")
    (pkg / "d.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import d\n"
        "if TYPE_CHECKING:\n    from kvpressure.sub.c import C\n"
        "def f():\n    from kvpressure.sub import b\n")
    assert import_graph(tmp_path)["kvpressure.sub.a"] == {"kvpressure.sub", "kvpressure.sub.b",
                                                          "kvpressure.sub.d"}


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back(graph):
    assert cycles(graph) == []


def test_every_top_level_name_has_a_layer(graph):
    tops = {m.split(".")[1] if "." in m else m for m in graph}
    unplaced = sorted(t for t in tops if not any(t in layer for layer in LAYERS))
    assert unplaced == [], "add each to a layer in LAYERS (and docs/ARCHITECTURE.md)"


def test_no_layer_imports_one_above_it(graph):
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                    if layer_of(t) > layer_of(m))
    assert upward == []
