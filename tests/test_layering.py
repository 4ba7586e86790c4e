"""The import rules between the layers (CONTRIBUTING.md, "Layers and the direction of imports").

``check_imports`` reads one module with ``ast`` and returns each import that breaks a
rule; the last test runs it over every module of the four layers. The tests before it
feed it bad sources, one per kind of violation, so that this check is known to bite.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("offline", "engine", "governor", "policies", "backends", "integrations")
COMPOSITION_ROOT = "kvgov"  # the top floor: imports every layer, imported by none
LOCAL_BACKEND = "backends.local"  # the one package that touches engine/, lazily


class Scope(Enum):
    MODULE = "at module level"
    FUNCTION = "inside a function"
    TYPE_CHECKING = "under if TYPE_CHECKING"


@dataclass(frozen=True, slots=True)
class Violation:
    module: str
    line: int
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.imported}: {self.rule}"


def check_imports(
    module_name: str,
    source: str,
    *,
    is_package: bool = False,
    known_modules: frozenset[str] = frozenset(),
) -> list[Violation]:
    """Every import in ``source`` that breaks a layering rule.

    ``module_name`` is the dotted name of the module (``governor`` for
    governor/__init__.py, with ``is_package=True``). ``known_modules`` names the
    modules of the tree, so that ``from governor import lease`` is recognised as an
    import of the submodule governor.lease.
    """
    package = module_name if is_package else module_name.rpartition(".")[0]
    violations = []
    for node, scope in _scoped(ast.parse(source), Scope.MODULE):
        for imported in _imported_modules(node, package, known_modules):
            rule = _broken_rule(module_name, imported, scope)
            if rule is not None:
                violations.append(Violation(module_name, node.lineno, imported, rule))
    return violations


def _scoped(node: ast.AST, scope: Scope) -> Iterator[tuple[ast.AST, Scope]]:
    """Every node below ``node``, with the scope its imports run in."""
    for child in ast.iter_child_nodes(node):
        yield child, scope
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _scoped(child, Scope.FUNCTION)
        elif isinstance(child, ast.If) and scope is Scope.MODULE and _is_type_checking(child.test):
            for statement in child.body:
                yield statement, Scope.TYPE_CHECKING
                yield from _scoped(statement, Scope.TYPE_CHECKING)
            for statement in child.orelse:
                yield statement, scope
                yield from _scoped(statement, scope)
        else:
            yield from _scoped(child, scope)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imported_modules(node: ast.AST, package: str, known_modules: frozenset[str]) -> list[str]:
    """The absolute names of the modules that ``node`` imports, if it is an import."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = _absolute_base(node, package)
        submodules = [f"{base}.{alias.name}" for alias in node.names]
        return [base, *(name for name in submodules if name in known_modules)]
    if isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
        name = getattr(node.args[0], "value", None)  # a string literal, or not checked
        if isinstance(name, str) and not name.startswith("."):
            return [name]
    return []


def _absolute_base(node: ast.ImportFrom, package: str) -> str:
    if node.level == 0:
        assert node.module is not None  # `from import x` does not parse
        return node.module
    parts = package.split(".") if package else []
    if node.level > len(parts):
        # Python refuses these at run time; report them rather than guess a target.
        return "." * node.level + (node.module or "")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _is_dynamic_import(func: ast.expr) -> bool:
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name in ("import_module", "__import__")


def _broken_rule(module_name: str, imported: str, scope: Scope) -> str | None:
    """The rule that importing ``imported`` from ``module_name`` in ``scope`` breaks."""
    layer = module_name.split(".")[0]
    if imported.startswith("."):
        return "relative import beyond the top-level package"
    private = _private_package(imported)
    if private is not None and not _within(module_name, private):
        return f"{imported} is private to {private}/: import what {private} exports"
    target = imported.split(".")[0]
    if layer == COMPOSITION_ROOT:
        return None
    if target == COMPOSITION_ROOT:
        return f"{layer}/ never imports kvgov/, the composition root above every layer"
    if target not in LAYERS or target == layer:
        return None
    if layer == "offline":
        return "offline/ is below every layer: it imports no other package of kvgov"
    if target == "offline":  # below every layer: each may use it
        return None if imported == target else "use offline's public API: `from offline import X`"
    if layer == "engine":
        return "engine/ never imports governor/, policies/, backends/ or integrations/"
    if layer == "governor":
        return "governor/ never imports engine/, policies/, backends/ or integrations/"
    if layer == "backends" and target == "engine":
        if not _within(module_name, LOCAL_BACKEND):
            return "only backends/local/ (lazily) imports engine/"
        if scope is Scope.MODULE:
            return "backends/local/ imports engine/ only in functions or TYPE_CHECKING"
        return None
    allowed = {
        "policies": ("governor",),
        "backends": ("governor",),
        "integrations": ("governor", "policies"),
    }[layer]
    if target not in allowed:
        return f"{layer}/ import only {' and '.join(allowed)}, never {target}/"
    if imported != target:
        return f"{layer}/ use the public API of {target}: `from {target} import X`"
    return None


def _private_package(imported: str) -> str | None:
    """The package a private module (``_name``, or one inside it) belongs to, else None."""
    parts = imported.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def _within(module_name: str, package: str) -> bool:
    return module_name == package or module_name.startswith(package + ".")


BAD_SOURCES = [
    pytest.param("engine.block", "import governor", id="engine-imports-governor"),
    pytest.param("engine.block", "def f():\n    from policies import x", id="engine-lazy-policies"),
    pytest.param("engine.block", "import integrations.otel", id="engine-imports-integrations"),
    pytest.param(
        "engine.block", "import importlib\nimportlib.import_module('governor')", id="engine-dynamic"
    ),
    pytest.param("engine.benchmarks.alloc", "from ...governor import x", id="relative-beyond-top"),
    pytest.param("engine.block", "from kvgov import cli", id="engine-imports-kvgov"),
    pytest.param("governor.plan", "def f():\n    import kvgov.memory_map", id="governor-kvgov"),
    pytest.param("integrations.otel", "import kvgov.demo", id="integrations-imports-kvgov"),
    pytest.param("governor.cli", "import engine", id="no-governor-module-is-exempt"),
    pytest.param("governor.lease", "import engine", id="governor-imports-engine"),
    pytest.param("governor.lease", "class A:\n    import engine", id="governor-class-body"),
    pytest.param(
        "governor.lease", "def f():\n    import engine.kv_cache", id="governor-lazy-engine"
    ),
    pytest.param(
        "governor.lease",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine import Engine",
        id="governor-type-checking-engine",
    ),
    pytest.param(
        "backends.local.backend", "from engine import Engine", id="local-backend-module-level"
    ),
    pytest.param(
        "backends.local.backend",
        "if TYPE_CHECKING:\n    pass\nelse:\n    import engine",
        id="local-backend-else-branch",
    ),
    pytest.param("backends.multi.backend", "def f():\n    import engine", id="backends-engine"),
    pytest.param("backends.remote.backend", "from integrations import x", id="backends-up"),
    pytest.param("backends.http.errors", "from governor.errors import E", id="backends-submod"),
    pytest.param("governor.plan", "from backends import LocalBackend", id="governor-backends"),
    pytest.param("policies.summarize", "import backends", id="policies-backends"),
    pytest.param("engine.block", "def f():\n    import backends.local", id="engine-backends"),
    pytest.param("integrations.otel", "import backends", id="integrations-backends"),
    pytest.param("offline.encodings", "from governor import TokenCounter", id="offline-up"),
    pytest.param("engine.tokenizer", "from offline.encodings import x", id="offline-submodule"),
    pytest.param(
        "backends.openai.backend", "from backends.remote._paths import API", id="sibling-private"
    ),
    pytest.param(
        "kvgov.demo.swarm", "from integrations.langchain._turn import x", id="kvgov-private"
    ),
    pytest.param("kvgov.cli.plan", "from kvgov.demo._runs import x", id="kvgov-sibling-private"),
    pytest.param("governor.admission", "from policies import Admit", id="governor-policies"),
    pytest.param(
        "governor.admission", "def f():\n    import integrations", id="governor-integrations"
    ),
    pytest.param("policies.summarize", "from governor.lease import Lease", id="policies-submod"),
    pytest.param("policies.summarize", "import governor.lease", id="policies-import-submod"),
    pytest.param("policies.summarize", "from governor import lease", id="policies-from-submod"),
    pytest.param("policies.summarize", "def f():\n    import engine", id="policies-engine"),
    pytest.param("policies.summarize", "from integrations import x", id="policies-integrations"),
    pytest.param("integrations.otel", "from engine import Engine", id="integrations-engine"),
    pytest.param(
        "integrations.otel", "from policies.summarize import S", id="integrations-policies-submod"
    ),
    pytest.param(
        "integrations.otel",
        "import typing\nif typing.TYPE_CHECKING:\n    from governor.lease import Lease",
        id="integrations-governor-submod",
    ),
]

GOOD_SOURCES = [
    pytest.param("engine.block", "import torch\nfrom engine.errors import E", id="engine"),
    pytest.param("engine", "from . import block\nfrom .errors import E", id="engine-relative"),
    pytest.param("kvgov.cli", "import engine\nimport policies\nimport integrations.otel", id="cli"),
    pytest.param("backends.local.backend", "def f():\n    from engine import Engine", id="lazy"),
    pytest.param(
        "backends.remote.backend", "from backends.remote._paths import API", id="own-private"
    ),
    pytest.param(
        "backends.openai.backend",
        "from governor import Backend\nfrom backends.http import Transport",
        id="backends",
    ),
    pytest.param(
        "backends.local.backend",
        "import typing\nif typing.TYPE_CHECKING:\n    from engine import Engine",
        id="local-backend-type-checking",
    ),
    pytest.param("governor.lease", "from governor.errors import E\nfrom . import x", id="governor"),
    pytest.param("engine.tokenizer", "from offline import loads_offline", id="engine-offline"),
    pytest.param("governor.tokens", "from offline import loads_offline", id="governor-offline"),
    pytest.param(
        "policies.summarize", "import governor\nfrom governor import Lease", id="policies"
    ),
    pytest.param("policies.summarize", "from . import governor", id="policies-relative"),
    pytest.param(
        "integrations.otel", "from governor import Lease\nfrom policies import S", id="integrations"
    ),
]


@pytest.mark.parametrize(("module_name", "source"), BAD_SOURCES)
def test_check_imports_catches(module_name: str, source: str) -> None:
    known = frozenset({"governor.lease", "policies.summarize"})
    violations = check_imports(module_name, source, known_modules=known)
    assert len(violations) == 1, violations
    assert violations[0].line == len(source.splitlines())


@pytest.mark.parametrize(("module_name", "source"), GOOD_SOURCES)
def test_check_imports_allows(module_name: str, source: str) -> None:
    known = frozenset({"governor.lease", "engine.block", "policies.governor"})
    is_package = "." not in module_name
    assert check_imports(module_name, source, is_package=is_package, known_modules=known) == []


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("from . import x", "engine.benchmarks", ["engine.benchmarks"]),
        ("from ..errors import E", "engine.benchmarks", ["engine.errors"]),
        ("from .. import block", "engine.benchmarks", ["engine", "engine.block"]),
        ("from governor import Lease, lease", "policies", ["governor", "governor.lease"]),
        ("import governor.lease as gl, torch", "policies", ["governor.lease", "torch"]),
        ("importlib.import_module('engine.block')", "governor", ["engine.block"]),
    ],
)
def test_imported_modules_resolves_names(source: str, package: str, expected: list[str]) -> None:
    node = ast.parse(source).body[0]
    if isinstance(node, ast.Expr):
        node = node.value
    known = frozenset({"engine.block", "governor.lease"})
    assert _imported_modules(node, package, known) == expected


def test_relative_imports_count_from_the_package_in_an_init() -> None:
    assert check_imports("governor.sub", "from .. import x", is_package=True) == []
    (violation,) = check_imports("governor.sub", "from .. import x")
    assert violation.rule == "relative import beyond the top-level package"


def _modules() -> Iterator[tuple[str, Path, bool]]:
    for layer in (*LAYERS, COMPOSITION_ROOT):
        for path in sorted((ROOT / layer).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            yield ".".join(parts[:-1] if is_package else parts), path, is_package


def test_the_tree_keeps_the_layering_rules() -> None:
    modules = list(_modules())
    assert {"governor", "backends.local", "kvgov", "kvgov.cli"} <= {name for name, _, _ in modules}
    known = frozenset(name for name, _, _ in modules)
    violations = [
        str(violation)
        for name, path, is_package in modules
        for violation in check_imports(
            name, path.read_text(encoding="utf-8"), is_package=is_package, known_modules=known
        )
    ]
    assert not violations, "\n".join(violations)
