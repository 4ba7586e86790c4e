"""No two modules of kvgov import each other in a circle, type-only and lazy imports included.

A circle through ``if TYPE_CHECKING:`` or a function's import runs fine, but it means two
modules know each other: the governor's mixins that shared one ``self`` were such a
circle. Imports are read with ``ast``, so a module is never imported here. ``from pkg
import sub`` is an import of the submodule ``sub`` only (a package's implicit import of
its parent ``__init__`` is not counted); ``from pkg import Name`` is one of ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("offline", "engine", "governor", "policies", "backends", "integrations", "kvgov")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    # ``from governor import lease`` names a module, ``import Lease`` the package.
                    submodule = f"{base}.{alias.name}"
                    targets.add(submodule if submodule in paths else base)
        edges = set()
        for target in targets:
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle() -> None:
    graph = _graph()
    circles = [
        {name: sorted(graph[name] & set(component)) for name in component}
        for component in _cycles(graph)
    ]
    assert not circles, f"modules import each other in a circle: {circles}"


def test_the_graph_sees_type_only_and_relative_imports() -> None:
    graph = _graph()
    assert "governor.lease" in graph["governor.lifecycle"]
    assert "governor.lease" in graph["governor.events"]  # under TYPE_CHECKING only
    assert "engine.attention.triton_kernels" in graph["engine.attention.triton_attention"]  # lazy
    assert "engine.attention" not in graph["engine.attention.triton_attention"]  # a submodule
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
