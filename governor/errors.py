"""Errors raised by the governor.

Every error a caller can provoke is typed, carries the numbers that explain it as
fields, and says in its message what to do about it. ``assert`` is kept for the
governor's own invariants.

    GovernorError
    ├── AdmissionRejected      a lease that can never be admitted (requested, possible)
    ├── AdmissionTimeout       a lease not admitted within the timeout; also a TimeoutError
    ├── CeilingExceeded        an agent's context would pass its token ceiling
    ├── LeaseError             a lease used wrongly
    │   ├── LeaseNotFound      no lease with that id
    │   ├── LeaseReleased      the lease was already released
    │   └── LeaseExpired       the lease's process stopped heartbeating; its room went to others
    ├── TopologyError          a planner/worker topology that does not fit the budget
    ├── BackendError           the backend (engine, server) failed
    │   └── BackendUnavailable the backend cannot be reached or restarted; retriable
    ├── StoreUnavailable       the shared state store (Redis) cannot be reached; retriable
    └── ConfigError            invalid configuration; also a ValueError
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "AdmissionRejected",
    "AdmissionTimeout",
    "BackendError",
    "BackendUnavailable",
    "CeilingExceeded",
    "ConfigError",
    "GovernorError",
    "LeaseError",
    "LeaseExpired",
    "LeaseNotFound",
    "LeaseReleased",
    "StoreUnavailable",
    "TopologyError",
]


class GovernorError(Exception):
    """Base of every error the governor raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The constructors take fields, not the message that ends up in ``args``, so the
        # default reduce (``cls(*args)``) cannot rebuild them: restore args and fields as
        # they are. Errors cross process boundaries in worker pools.
        return (_restore, (type(self), self.args), self.__dict__)


def _restore(cls: type[GovernorError], args: tuple[Any, ...]) -> GovernorError:
    return cls.__new__(cls, *args)


class AdmissionRejected(GovernorError):
    """``requested`` tokens of ceiling can never be admitted; ``possible`` is the most that can."""

    def __init__(self, requested: int, possible: int, *, agent: str | None = None) -> None:
        self.requested = requested
        self.possible = possible
        self.agent = agent
        who = "" if agent is None else f" for agent {agent!r}"
        if possible <= 0:
            advice = (
                "no ceiling fits at all; free memory (unpin shared prefixes, give the engine "
                "more KV blocks) or raise safety_factor"
            )
        else:
            advice = (
                f"the largest ceiling possible is {possible:,} tokens; ask for at most that, "
                "or free memory (unpin shared prefixes, give the engine more KV blocks)"
            )
        super().__init__(f"a ceiling of {requested:,} tokens{who} can never be admitted: {advice}")


class AdmissionTimeout(GovernorError, TimeoutError):
    """A lease waited ``timeout_s`` without being admitted; it left the queue."""

    def __init__(self, agent: str, timeout_s: float | None) -> None:
        self.agent = agent
        self.timeout_s = timeout_s
        super().__init__(
            f"agent {agent!r} was not admitted within {timeout_s} s: every block it could "
            "use is held by other leases; retry later, lower its ceiling, raise "
            "admission_timeout_s, or use overcommit mode"
        )


class CeilingExceeded(GovernorError):
    """Agent ``agent`` would hold ``tokens`` tokens, over its ``ceiling``."""

    def __init__(self, agent: str, tokens: int, ceiling: int) -> None:
        self.agent = agent
        self.tokens = tokens
        self.ceiling = ceiling
        super().__init__(
            f"agent {agent!r} would hold {tokens:,} tokens, over its ceiling of {ceiling:,}; "
            "compact or summarize its context, or ask for more with lease.grow()"
        )


class LeaseError(GovernorError):
    """A lease was used in a way its state does not allow."""


class LeaseNotFound(LeaseError):
    def __init__(self, lease_id: object) -> None:
        self.lease_id = lease_id
        super().__init__(
            f"no lease {lease_id!r}: this governor never granted it or has already forgotten "
            "it; use the Lease that governor.lease() returned"
        )


class LeaseReleased(LeaseError):
    def __init__(self, lease_id: object, *, agent: str | None = None) -> None:
        self.lease_id = lease_id
        self.agent = agent
        who = "" if agent is None else f" of agent {agent!r}"
        super().__init__(
            f"lease {lease_id!r}{who} was already released; open a new one with governor.lease()"
        )


class LeaseExpired(LeaseError):
    """The lease's process stopped heartbeating to the shared store for longer than
    ``ttl_s`` (paused, or cut off from it): another process returned its blocks, closed
    its engine budget and gave its room to other agents. The lease cannot be used again."""

    def __init__(self, lease_id: object, *, agent: str | None = None, ttl_s: float) -> None:
        self.lease_id = lease_id
        self.agent = agent
        self.ttl_s = ttl_s
        who = "" if agent is None else f" of agent {agent!r}"
        super().__init__(
            f"lease {lease_id!r}{who} expired: its process sent the state store no heartbeat "
            f"for more than its lease TTL ({ttl_s:g} s), so its blocks and engine budget went "
            "back to the other agents; open a new lease with governor.lease() and start the "
            "agent's turn again, or raise RedisStore(lease_ttl_s=...) where pauses this long "
            "are normal"
        )


class TopologyError(GovernorError):
    """A topology that cannot run: ``reason`` says why, ``suggestion`` what would fit."""

    def __init__(self, reason: str, suggestion: str) -> None:
        self.reason = reason
        self.suggestion = suggestion
        super().__init__(f"{reason}; {suggestion}")


class BackendError(GovernorError):
    """The backend failed; ``problem`` says how, ``backend`` names it when known.
    ``retriable``: the same call may succeed later, unchanged."""

    retriable: bool = False

    def __init__(self, problem: str, *, backend: str | None = None) -> None:
        self.problem = problem
        self.backend = backend
        super().__init__(problem if backend is None else f"backend {backend}: {problem}")


class BackendUnavailable(BackendError):
    """The backend could not be reached, answered 5xx, or restarted while the call was in
    flight (what it held for the call is gone). Retriable: the call may be made again once
    the backend is back; ``RemoteBackend`` re-establishes budgets and pins first."""

    retriable = True

    def __init__(self, problem: str, *, backend: str | None = None) -> None:
        super().__init__(
            f"{problem}; the backend is unavailable: retry once it is back (kvgov serve's "
            "/health says when)",
            backend=backend,
        )
        self.problem = problem


class StoreUnavailable(GovernorError):
    """The state store that governors of several processes share (``RedisStore``) could
    not be reached. New admissions fail fast with it; leases already admitted keep running
    their calls, and what they return is handed to the store once it is back. Retriable."""

    retriable = True

    def __init__(self, store: str, problem: str) -> None:
        self.store = store
        self.problem = problem
        super().__init__(
            f"the state store {store} cannot be reached ({problem}); no lease is admitted "
            "while it is down (admitted leases keep running): retry once it is back, or "
            "check that redis-server is running at that address"
        )


class ConfigError(GovernorError, ValueError):
    """Invalid configuration, refused when it is constructed.

    ``problem`` says what is wrong and what to do; ``setting`` names the setting, or is
    None when the problem spans several. The class methods build the common cases so
    that every part of the governor words them the same way.
    """

    def __init__(self, problem: str, *, setting: str | None = None) -> None:
        self.problem = problem
        self.setting = setting
        super().__init__(problem)

    @classmethod
    def safety_factor_out_of_range(cls, value: object) -> ConfigError:
        return cls(
            f"safety_factor must be a number in (0, 1], got {value!r}; use a fraction such as "
            "0.9 to keep 10% of the KV blocks in reserve, or 1.0 to use them all",
            setting="safety_factor",
        )

    @classmethod
    def below_minimum(cls, setting: str, value: object, minimum: int) -> ConfigError:
        return cls(
            f"{setting} must be a whole number of at least {minimum:,}, got {value!r}; "
            f"pass {setting}={minimum} or more",
            setting=setting,
        )

    @classmethod
    def unknown_agent(cls, agent: str, known: Iterable[str]) -> ConfigError:
        names = sorted(known)
        listed = ", ".join(repr(name) for name in names) if names else "none yet"
        return cls(
            f"no agent named {agent!r} (known: {listed}); register it with "
            f"AgentSpec(name={agent!r}, ...) or use a known name",
            setting="agent",
        )
