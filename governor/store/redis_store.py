"""``RedisStore``: the governor's state on Redis (or Valkey), shared by many processes.

``Governor(backend, store=RedisStore("redis://host:6379/0"))`` in every process that
drives the same engine (or the same replicas): their leases are admitted against one
budget, in one queue. Each process heartbeats; one that stops for ``lease_ttl_s`` loses
its leases to the others. How it works: docs/design/store.md. redis-py is the
``kvgov[redis]`` extra; this module imports it only when a governor connects.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from governor.config import AdmissionMode, GovernorConfig
from governor.errors import ConfigError

if TYPE_CHECKING:
    from governor.admission_policy import AdmissionPolicy
    from governor.clock import Clock
    from governor.store.shared import SharedAdmission

__all__ = ["RedisStore"]

_INSTALL = "pip install 'kvgov[redis]'"


class RedisStore:
    """``url``: redis-py's (``redis://[:password@]host:port/db``, ``rediss://`` for TLS,
    ``unix://``). ``namespace``: the keys' prefix, ``kvgov:{namespace}:``; governors share a
    budget when they share the store and the namespace. ``lease_ttl_s``: how long a
    process may go without a heartbeat (sent every third of it) before its leases expire.
    ``connect_timeout_s`` and ``timeout_s``: how long a call waits for the store before
    ``StoreUnavailable``."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: str = "default",
        lease_ttl_s: float = 5.0,
        connect_timeout_s: float = 0.5,
        timeout_s: float = 2.0,
    ) -> None:
        if not isinstance(url, str) or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"RedisStore needs a redis:// (or rediss://, unix://) URL, got {url!r}; for "
                "a local server: RedisStore('redis://127.0.0.1:6379/0')",
                setting="url",
            )
        if not isinstance(namespace, str) or not namespace or any(c in namespace for c in "{}"):
            raise ConfigError(
                f"namespace must be a non-empty name without braces, got {namespace!r}",
                setting="namespace",
            )
        for name, value, least in (
            ("lease_ttl_s", lease_ttl_s, 0.3),
            ("connect_timeout_s", connect_timeout_s, 0.001),
            ("timeout_s", timeout_s, 0.001),
        ):
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < least:
                raise ConfigError(
                    f"{name} must be a number of seconds of at least {least:g}, got {value!r}",
                    setting=name,
                )
        self.url = url
        self.namespace = namespace
        self.lease_ttl_s = float(lease_ttl_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.timeout_s = float(timeout_s)

    def __repr__(self) -> str:
        return f"RedisStore({self.where!r}, namespace={self.namespace!r})"

    @property
    def prefix(self) -> str:
        # The braces are a hash tag: a Redis Cluster keeps a namespace's keys on one node.
        return f"kvgov:{{{self.namespace}}}:"

    @property
    def where(self) -> str:
        """The URL without its password, for messages."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))

    def client(self) -> Any:
        """A new redis-py client (its own connection pool) for one governor."""
        redis = _redis()
        return redis.Redis.from_url(
            self.url,
            socket_connect_timeout=self.connect_timeout_s,
            socket_timeout=self.timeout_s,
        )

    @staticmethod
    def connection_errors() -> tuple[type[BaseException], ...]:
        """What redis-py raises while the store is away (refused, timed out, loading)."""
        exceptions = _redis().exceptions
        return (exceptions.ConnectionError, exceptions.TimeoutError)

    def admission(
        self,
        *,
        config: GovernorConfig,
        available_blocks: int,
        block_size: int,
        policy: AdmissionPolicy | None,
        clock: Clock,
    ) -> SharedAdmission:
        """The admission ledger of one governor, on this store."""
        if config.mode is not AdmissionMode.GUARANTEED:
            raise ConfigError(
                "a shared store admits in guaranteed mode (every lease's ceiling reserved); "
                "overcommit's live use is one process's view: use "
                "GovernorConfig(mode='guaranteed') with a RedisStore",
                setting="mode",
            )
        from governor.store.shared import SharedAdmission

        return SharedAdmission(
            self,
            config=config,
            available_blocks=available_blocks,
            block_size=block_size,
            policy=policy,
            clock=clock,
        )


def _redis() -> Any:
    try:
        import redis
    except ImportError as exc:
        raise ConfigError(
            f"RedisStore needs redis-py, which is not installed: {_INSTALL}", setting="store"
        ) from exc
    return redis
