"""Shared prefixes: system prompts and tool schemas pinned once in the backend.

Each prefix is pinned per tenant, under the tenant's cache salt, so no tenant can time
another's cache hits. ``shared=True`` pins one unsalted copy for every tenant: calls
that start with it then run unsalted, so tenants may observe each other's cache hits on
what follows it. Share only prefixes that no tenant's data follows, or accept that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from governor.backend import Backend, Message, PrefixHandle
from governor.errors import ConfigError

__all__ = ["PrefixRegistry", "RegisteredPrefix"]


@dataclass(frozen=True, slots=True)
class RegisteredPrefix:
    name: str
    messages: tuple[Message, ...]
    handle: PrefixHandle

    @property
    def cache_salt(self) -> str | None:
        return self.handle.cache_salt


class PrefixRegistry:
    """Pinned prefixes by (name, cache salt); the salt is None for shared ones."""

    __slots__ = ("_backend", "_prefixes")

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._prefixes: dict[tuple[str, str | None], RegisteredPrefix] = {}

    def register(
        self, name: str, prefix: str | Sequence[Message], *, tenant: str | None, shared: bool
    ) -> PrefixHandle:
        messages = (
            ({"role": "system", "content": prefix},) if isinstance(prefix, str) else tuple(prefix)
        )
        key = (name, None if shared else tenant)
        if key in self._prefixes:
            raise ConfigError(
                f"prefix {name!r} is already registered for this tenant; unregister it first",
                setting="prefix",
            )
        handle = self._backend.pin_prefix(list(messages), cache_salt=key[1])
        self._prefixes[key] = RegisteredPrefix(name, messages, handle)
        return handle

    def unregister(self, name: str, *, tenant: str | None, shared: bool) -> None:
        entry = self._prefixes.pop((name, None if shared else tenant), None)
        if entry is None:
            raise ConfigError(f"no prefix {name!r} is registered for this tenant", setting="prefix")
        self._backend.unpin_prefix(entry.handle)

    def pinned_blocks(self, name: str | None, *, tenant: str | None) -> int:
        """The pinned blocks of the prefix an agent's calls start with; 0 for none, or
        one not registered yet."""
        entry = None if name is None else self._find(name, tenant)
        return 0 if entry is None else entry.handle.num_blocks

    def lookup(self, name: str, *, tenant: str | None, agent: str) -> RegisteredPrefix:
        """The tenant's own copy of the prefix, else the shared one."""
        entry = self._find(name, tenant)
        if entry is not None:
            return entry
        raise ConfigError(
            f"agent {agent!r} starts with prefix {name!r}, which is not registered for its "
            "tenant; call governor.register_prefix() first",
            setting="prefix",
        )

    def _find(self, name: str, tenant: str | None) -> RegisteredPrefix | None:
        """The tenant's own copy of the prefix, else the shared one, else None."""
        for salt in (tenant, None):
            entry = self._prefixes.get((name, salt))
            if entry is not None:
                return entry
        return None
