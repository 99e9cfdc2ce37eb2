"""The package's import structure (docs/internals.md, "Where things live"): no two modules
import each other, directly or round a circle, and private names cross module boundaries
only inside a subpackage or into the checks and engines floor."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "advcal"
# The floor every module may take private names from.
OPEN_FLOOR = ("advcal._validation", "advcal._blocks", "advcal._kernels")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]
             ) -> list[tuple[str, str | None]]:
    """(module imported, name taken or None) for every advcal import in ``path``, at any
    depth (a function-level import ties modules as much as a top-level one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("advcal")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("advcal"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, None) if sub in modules else (base, a.name))
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target, _ in _imports(name, path, modules):
            # importing a.b.c runs a and a.b too, but a package's face importing its own
            # modules is how a package is built: only the module itself is an edge
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_another_round_a_circle() -> None:
    graph = _graph()
    # A package's face may import its own modules, and they it only for names it defines:
    # faces define nothing here, so an edge into a face from inside is a circle too.
    assert _circles(graph) == []


def test_private_names_stay_inside_their_layer() -> None:
    modules = _modules()
    crossing = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, taken in _imports(name, path, modules):
            if taken is None or not taken.startswith("_") or taken.startswith("__"):
                continue
            inside = package != "advcal" and target.startswith(package + ".")
            if not inside and not target.startswith(OPEN_FLOOR):
                crossing.append(f"{name}: from {target} import {taken}")
    assert crossing == []


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    # The circle finder on a hand-made graph: a -> b -> c -> a, and d alone.
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
