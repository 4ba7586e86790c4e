"""Python 3.10 compatibility (``requires-python = ">=3.10"``), checked on CI's Python.

CI runs the suite on one Python (3.11). ``check_source`` reads a module with ``ast`` and
returns what would break it on 3.10: standard-library names added in 3.11 or later, and
``except TimeoutError`` around ``asyncio.wait_for`` (it raises ``asyncio.TimeoutError``,
which is ``TimeoutError`` itself only from 3.11). The tests before the last feed it bad
sources, so that the check is known to bite; the last runs it over every module of the
four layers. The whole suite was also run on Python 3.10.13 (see the README).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("engine", "governor", "policies", "integrations")

# Names that Python 3.10's standard library lacks, by module (3.11 and 3.12 additions).
NEWER: dict[str, frozenset[str]] = {
    "typing": frozenset(
        {
            "LiteralString",
            "Never",
            "NotRequired",
            "ReadOnly",
            "Required",
            "Self",
            "TypeAliasType",
            "TypeVarTuple",
            "Unpack",
            "assert_never",
            "assert_type",
            "clear_overloads",
            "dataclass_transform",
            "get_overloads",
            "override",
            "reveal_type",
        }
    ),
    "asyncio": frozenset({"Runner", "TaskGroup", "Timeout", "timeout", "timeout_at"}),
    "enum": frozenset({"ReprEnum", "StrEnum", "EnumCheck", "FlagBoundary", "verify"}),
    "datetime": frozenset({"UTC"}),
    "contextlib": frozenset({"chdir"}),
    "itertools": frozenset({"batched"}),
}
NEWER_MODULES = frozenset({"tomllib", "wsgiref.types"})
NEWER_BUILTINS = frozenset({"ExceptionGroup", "BaseExceptionGroup"})


def check_source(source: str, name: str = "<source>") -> list[str]:
    """What in ``source`` needs a Python newer than 3.10, as ``name:line: what``."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the module it is (import x as y)
    found: list[str] = []

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{name}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name
                if alias.name in NEWER_MODULES:
                    report(node, f"import {alias.name} (Python 3.11+)")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in NEWER_MODULES:
                report(node, f"from {node.module} import ... (Python 3.11+)")
            newer = NEWER.get(node.module, frozenset())
            for alias in node.names:
                if alias.name in newer:
                    report(node, f"from {node.module} import {alias.name} (Python 3.11+)")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module is not None and node.attr in NEWER.get(module, frozenset()):
                report(node, f"{module}.{node.attr} (Python 3.11+)")
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            report(node, f"{node.id} (Python 3.11+)")
        elif type(node).__name__ == "TryStar":
            report(node, "except* (Python 3.11+)")
        elif isinstance(node, ast.Try) and _calls_wait_for(node.body):
            for handler in node.handlers:
                if _catches_bare_timeout(handler.type):
                    report(
                        handler,
                        "except TimeoutError around asyncio.wait_for: on Python 3.10 it "
                        "raises asyncio.TimeoutError, a different class; catch that",
                    )
    return found


def _calls_wait_for(body: list[ast.stmt]) -> bool:
    for statement in body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "wait_for":
                    return True
    return False


def _catches_bare_timeout(caught: ast.expr | None) -> bool:
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    bare = any(isinstance(n, ast.Name) and n.id == "TimeoutError" for n in names)
    qualified = any(isinstance(n, ast.Attribute) and n.attr == "TimeoutError" for n in names)
    return bare and not qualified


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from typing import NotRequired\n", "from typing import NotRequired"),
        ("from typing import Annotated, Self\n", "from typing import Self"),
        ("import tomllib\n", "import tomllib"),
        (
            "import asyncio\nasync def f():\n    async with asyncio.TaskGroup():\n        pass\n",
            "asyncio.TaskGroup",
        ),
        (
            "import asyncio as aio\nasync def f():\n    async with aio.timeout(1):\n        pass\n",
            "asyncio.timeout",
        ),
        ("from enum import StrEnum\n", "from enum import StrEnum"),
        ("from datetime import UTC\n", "from datetime import UTC"),
        ("raise ExceptionGroup('x', [ValueError()])\n", "ExceptionGroup"),
        (
            "import asyncio\nasync def f(x):\n    try:\n        await asyncio.wait_for(x, 1)\n"
            "    except TimeoutError:\n        pass\n",
            "except TimeoutError around asyncio.wait_for",
        ),
    ],
)
def test_the_check_finds_what_python_3_10_lacks(source: str, expected: str) -> None:
    found = check_source(source)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.skipif(sys.version_info < (3, 11), reason="except* does not parse before 3.11")
def test_the_check_finds_except_star() -> None:
    source = "try:\n    pass\nexcept* ValueError:\n    pass\n"
    found = check_source(source)
    assert len(found) == 1 and "except*" in found[0], found


def test_what_python_3_10_has_passes_the_check() -> None:
    source = (
        "import asyncio\nfrom typing import Annotated\nfrom typing_extensions import Self\n"
        "async def f(x):\n    try:\n        await asyncio.wait_for(x, 1)\n"
        "    except asyncio.TimeoutError:\n        pass\n"
        "    try:\n        pass\n    except TimeoutError:\n        pass\n"
    )
    assert check_source(source) == []


def test_every_module_runs_on_python_3_10() -> None:
    found = []
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            found += check_source(path.read_text(encoding="utf-8"), name)
    assert found == []
