"""The control plane's paths that carry a name (``/kvgov/v1/budgets/{name}/...``,
``/kvgov/v1/prefixes/{key}``), each name checked against the wire's rule
(``backends.remote.wire.name_problem``) and escaped as exactly one path segment.

Unescaped, a name is part of the URL: ``../prefixes/k`` reaches the prefix route (httpx
removes dot segments as a browser does) and ``worker?x=1`` sends ``worker`` with a query.
Escaped with nothing safe, ``?``, ``#`` and ``%`` travel as themselves; ``/``, ``.`` and
``..``, which no escaping keeps one segment through every server, are refused with the
rest of what the server refuses: ``InvalidNameError``, here, before any request.
"""

from __future__ import annotations

from urllib.parse import quote

from backends.http.errors import InvalidNameError
from backends.remote import wire

__all__ = ["API", "budget_path", "checked_name", "prefix_path"]

API = "/kvgov/v1"


def checked_name(name: object, *, what: str = "budget name", backend: str | None) -> str:
    """``name``, or ``InvalidNameError`` when the server would refuse it."""
    reason = wire.name_problem(name)
    if reason is not None:
        raise InvalidNameError(name, reason, what=what, backend=backend)
    return name  # type: ignore[return-value]  # name_problem passed: a str


def budget_path(name: object, action: str | None = None, *, backend: str | None) -> str:
    """``/kvgov/v1/budgets/{name}``, then ``/{action}`` (``retain``, ``release``...)."""
    path = f"{API}/budgets/{_segment(checked_name(name, backend=backend))}"
    return path if action is None else f"{path}/{action}"


def prefix_path(key: object, *, backend: str | None) -> str:
    """``/kvgov/v1/prefixes/{key}`` for a key the server gave."""
    return f"{API}/prefixes/{_segment(checked_name(key, what='prefix key', backend=backend))}"


def _segment(name: str) -> str:
    return quote(name, safe="")
