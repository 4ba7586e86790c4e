"""Which of kvgov's optional parts this install has, and what to install for the rest.

``pip install kvgov`` is the governor alone (no torch): an agent runtime talking to a
remote engine. The bundled engine is the ``engine`` extra, ``kvgov serve`` the ``serve``
extra. What each extra needs is read from the installed distribution's metadata (its
``Requires-Dist`` lines marked ``extra == "..."``, an extra named in another followed),
so pyproject.toml is the one list. A requirement counts as present when its package
imports; a command that needs a missing one says what to install, not a traceback.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

__all__ = ["missing_for", "requirements_of"]

_DISTRIBUTION = "kvgov"
_TORCH_FIRST = "pip install torch==2.13.0 (or the build for your GPU), then "


def missing_for(extra: str) -> str | None:
    """None when the install has what ``extra`` needs; else what to run to get it."""
    absent = [name for name in requirements_of(extra) if not _installed(name)]
    if not absent:
        return None
    first = _TORCH_FIRST if "torch" in absent else ""
    return (
        f"this needs kvgov's {extra} extra ({', '.join(absent)} not installed): "
        f"{first}pip install 'kvgov[{extra}]'"
    )


def requirements_of(extra: str) -> list[str]:
    """The distributions ``kvgov[extra]`` adds, in pyproject's order, those of an extra it
    names (``kvgov[engine]``) in its place; none where kvgov's metadata cannot be read (a
    source tree run without an install: there is no extra to name)."""
    try:
        lines = importlib.metadata.requires(_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names: list[str] = []
    for line in lines:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or not marker.evaluate({"extra": extra}):
            continue
        if canonicalize_name(requirement.name) == _DISTRIBUTION:
            inner = [name for each in sorted(requirement.extras) for name in requirements_of(each)]
        else:
            inner = [requirement.name]
        names += [name for name in inner if name not in names]
    return names


def _installed(distribution: str) -> bool:
    """Whether ``distribution``'s package imports here: the module named like it where it
    installs one (an import hook may refuse it although its files are there), else any
    top-level module among its files."""
    named = distribution.replace("-", "_")
    if _importable(named):
        return True
    modules = _top_level_modules(distribution)
    return named not in modules and any(_importable(module) for module in modules)


def _top_level_modules(distribution: str) -> list[str]:
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        return []
    tops = (file.parts[0].removesuffix(".py") for file in files)
    return sorted({top for top in tops if top.isidentifier()})


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or an import hook refusing it
        return False
