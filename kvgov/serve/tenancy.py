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

Budget names are checked (``check_budget_name``) wherever a client names one: a name
that holds ``/`` would open a budget no URL can close, and one with control or bidi
characters would reach ``/metrics`` labels and the live page as they are. A bound key's
pins (``ServeSettings``: not an admin's, on a server with keys) are held to its share of
the pool (``TenantPins.reserve``).

``TenantPins`` is thread-safe; its lock is a leaf (nothing is called under it).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request

from backends.remote import wire
from governor.backend import PrefixHandle
from governor.errors import BackendError
from kvgov.serve.errors import ApiError

__all__ = [
    "PinShareExceededError",
    "TenantPins",
    "cache_salt_for",
    "check_budget_name",
    "own_budgets",
    "owns_salt",
    "scoped_budget",
    "tenant_id",
    "tenant_of",
    "unscoped_budget",
]

_SEPARATOR = "/"
_Held = TypeVar("_Held")


def tenant_id(key: str) -> str:
    """A stable short name for a key's tenant; the key cannot be read back from it."""
    return "t" + hashlib.sha256(b"kvgov-tenant\0" + key.encode()).hexdigest()[:15]


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


def check_budget_name(name: str, *, param: str = "name") -> None:
    """Refuse (400) a budget name that could not round-trip through a URL path, the
    tenant's scoping or a ``/metrics`` label unchanged: the rule of
    ``backends.remote.wire.name_problem``, which ``RemoteBackend`` checks before it sends."""
    problem = wire.name_problem(name)
    if problem is not None:
        raise ApiError(
            400,
            f"the budget name {name!r} cannot be used: {problem}",
            code="invalid_budget_name",
            param=param,
        )


class PinShareExceededError(BackendError):
    """A bound key's pins would hold more than its share of the pool: 403
    ``pin_share_exceeded``, with the counts as fields (``RemoteBackend`` raises an error
    of this name with them)."""

    def __init__(self, *, num_held: int, num_asked: int, cap: int) -> None:
        self.num_held = num_held
        self.num_asked = num_asked
        self.cap = cap
        super().__init__(
            f"this API key's pinned prefixes hold {num_held} blocks, and this pin needs "
            f"{num_asked} more: over the key's share of {cap} blocks (kvgov serve "
            "--tenant-pin-share, split between the keys that are not admins'); unpin a "
            "prefix this key pinned (DELETE /kvgov/v1/prefixes/KEY), pin a shorter one, or "
            "ask for an admin key",
            backend="kvgov serve",
        )


@dataclass(slots=True)
class TenantPins:
    """The prefixes each tenant pinned, by the key the backend gave them, and the blocks
    each tenant's pins hold (with those reserved for a pin being made)."""

    _owners: dict[str, tuple[str, PrefixHandle]] = field(default_factory=dict)
    _num_blocks: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reserve(self, tenant: str, num_blocks: int, *, cap: int) -> None:
        """Count ``num_blocks`` more for the tenant before it pins them, or raise
        ``PinShareExceededError`` when that would take it past ``cap``; the check and the
        count are one step, so two pins made at once cannot both slip under the cap.
        ``add`` (with ``reserved``) or ``cancel`` settles the reservation."""
        with self._lock:
            held = self._num_blocks.get(tenant, 0)
            if held + num_blocks > cap:
                raise PinShareExceededError(num_held=held, num_asked=num_blocks, cap=cap)
            self._num_blocks[tenant] = held + num_blocks

    def cancel(self, tenant: str, reserved: int) -> None:
        """Give back a reservation whose pin failed."""
        with self._lock:
            self._count(tenant, -reserved)

    def add(self, tenant: str, handle: PrefixHandle, *, reserved: int = 0) -> None:
        with self._lock:
            self._owners[handle.key] = (tenant, handle)
            self._count(tenant, handle.num_blocks - reserved)

    def take(self, tenant: str, key: str) -> PrefixHandle | None:
        """Remove and return the tenant's pin ``key``; None when it has no such pin."""
        with self._lock:
            owner = self._owners.get(key)
            if owner is None or owner[0] != tenant:
                return None
            del self._owners[key]
            self._count(tenant, -owner[1].num_blocks)
            return owner[1]

    def put_back(self, tenant: str, handle: PrefixHandle) -> None:
        """Undo ``take`` when the backend refused to unpin."""
        self.add(tenant, handle)

    def num_pins(self) -> int:
        with self._lock:
            return len(self._owners)

    def num_blocks(self, tenant: str) -> int:
        """The blocks the tenant's pins hold (counted once per pin: two pins of one
        prefix count its blocks twice, as the share is of what a key asked for)."""
        with self._lock:
            return self._num_blocks.get(tenant, 0)

    def _count(self, tenant: str, delta: int) -> None:
        left = self._num_blocks.get(tenant, 0) + delta
        assert left >= 0, (tenant, left)
        if left:
            self._num_blocks[tenant] = left
        else:
            self._num_blocks.pop(tenant, None)
