"""Tenancy inside the server: one tenant's budgets, prefixes and cache never meet another's.

``gateway.Gateway`` puts the tenant id on ``request.state.kvgov_tenant`` ("" when the
server has no API keys; else a short id derived from the key, never the key). Budget names
are scoped here before they reach the engine, and every pin is recorded with its owner, so
tenant A can neither see, resize, hold nor close B's. With no keys nothing is scoped: the
engine sees exactly the names a client sent, as an in-process ``LocalBackend`` would.

The one exception to per-tenant salts is a prefix pinned shared by an admin key
(``kvgov.serve.control``): the engine hashes its blocks unsalted and, for each salted call,
counts how many leading blocks are a shared pin's and salts only the blocks after them,
so the routes send the tenant's salt as always and nothing else.

``TenantPins`` is thread-safe; its lock is a leaf (nothing is called under it).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request

from governor.backend import PrefixHandle

__all__ = [
    "TenantPins",
    "cache_salt_for",
    "own_budgets",
    "owns_salt",
    "scoped_budget",
    "tenant_of",
    "unscoped_budget",
]

_SEPARATOR = "/"
_Held = TypeVar("_Held")


def tenant_of(request: Request) -> str:
    """The request's tenant: "" when the server has no API keys (set by
    ``gateway.Gateway``)."""
    return str(getattr(request.state, "kvgov_tenant", "") or "")


def scoped_budget(tenant: str, name: str) -> str:
    """The engine's name for a tenant's budget."""
    return name if not tenant else f"{tenant}{_SEPARATOR}{name}"


def unscoped_budget(tenant: str, engine_name: str) -> str | None:
    """The tenant's name for an engine budget; None when the budget is another tenant's."""
    if not tenant:
        return engine_name
    prefix = f"{tenant}{_SEPARATOR}"
    return engine_name[len(prefix) :] if engine_name.startswith(prefix) else None


def own_budgets(tenant: str, budgets: Mapping[str, _Held]) -> dict[str, _Held]:
    """The tenant's own engine budgets, by the tenant's names (all of them without keys)."""
    own = {}
    for engine_name, held in budgets.items():
        name = unscoped_budget(tenant, engine_name)
        if name is not None:
            own[name] = held
    return own


def owns_salt(tenant: str, cache_salt: str | None) -> bool:
    """Whether a request salted ``cache_salt`` is the tenant's: the server salts every
    request of a tenant with ``cache_salt_for``, so the salt names its tenant."""
    if not tenant:
        return True
    return cache_salt is not None and (
        cache_salt == tenant or cache_salt.startswith(f"{tenant}{_SEPARATOR}")
    )


def cache_salt_for(tenant: str, cache_salt: str | None) -> str | None:
    """The salt the engine hashes a tenant's block 0 with: the tenant's own, plus the
    client's (so a client may split its cache further, never join another tenant's)."""
    if not tenant:
        return cache_salt
    return tenant if cache_salt is None else f"{tenant}{_SEPARATOR}{cache_salt}"


@dataclass(slots=True)
class TenantPins:
    """The prefixes each tenant pinned, by the key the backend gave them."""

    _owners: dict[str, tuple[str, PrefixHandle]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tenant: str, handle: PrefixHandle) -> None:
        with self._lock:
            self._owners[handle.key] = (tenant, handle)

    def take(self, tenant: str, key: str) -> PrefixHandle | None:
        """Remove and return the tenant's pin ``key``; None when it has no such pin."""
        with self._lock:
            owner = self._owners.get(key)
            if owner is None or owner[0] != tenant:
                return None
            del self._owners[key]
            return owner[1]

    def put_back(self, tenant: str, handle: PrefixHandle) -> None:
        """Undo ``take`` when the backend refused to unpin."""
        self.add(tenant, handle)

    def num_pins(self) -> int:
        with self._lock:
            return len(self._owners)
