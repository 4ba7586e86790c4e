"""The admission-policy protocol: in which order waiting leases are tried for admission.

``order(waiting, active=..., now=...)`` returns the waiting leases, each exactly once, in
the order to try them (any other answer is refused with a ``ConfigError``). It runs under
the admission lock on every pass: quick, deterministic, reading time only from ``now`` and
never calling back into the governor. An optional ``key(lease)``, for orders that nothing
changes while a lease waits, lets the controller keep its queue sorted. The default is
``PriorityWithAging``; policies/ ships others.

The contract in full: docs/design/admission.md.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from governor.errors import ConfigError
from governor.lease import Lease

__all__ = [
    "AdmissionPolicy",
    "PriorityWithAging",
    "check_policy",
    "checked_order",
    "order_error",
]


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Orders the waiting leases for one admission pass (see the module docstring)."""

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class PriorityWithAging:
    """The default: highest effective priority first, then first come, first served.

    A lease's effective priority is its ``priority`` plus one level per ``aging_s``
    seconds it has waited in the queue (since ``queued_at``: a lease re-queued after
    parking ages from then, not from its first request), so a low-priority lease
    overtakes higher-priority work that keeps arriving after it, and nobody starves.
    Ties go to the earlier ``arrival``.
    """

    aging_s: float = 10.0

    def __post_init__(self) -> None:
        aging = self.aging_s
        number = isinstance(aging, (int, float)) and not isinstance(aging, bool)
        if not number or not math.isfinite(aging) or aging <= 0:
            raise ConfigError(
                f"aging_s must be a number of seconds > 0, got {aging!r}; a waiting lease "
                "gains one priority level per aging_s seconds (10.0 is the default)",
                setting="aging_s",
            )

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        return sorted(waiting, key=self.key)

    def key(self, lease: Lease) -> tuple[float, int]:
        """Effective priority, highest first, then arrival. Every waiting lease gains a
        level per ``aging_s`` alike, so their order never changes while they wait: the
        effective priority at any ``now`` is ``now / aging_s`` less the first member."""
        queued_at = lease.requested_at if lease.queued_at is None else lease.queued_at
        return (queued_at / self.aging_s - lease.priority, lease.arrival)


# -- checking a policy and its answers (the controller calls these under its lock) --------
T = TypeVar("T")


def check_policy(policy: object) -> None:
    if not isinstance(policy, AdmissionPolicy):
        raise ConfigError(
            f"an admission policy needs an order(waiting, *, active, now) method that returns "
            f"the waiting leases in the order to try them, got {reprlib.repr(policy)}; use "
            "PriorityWithAging() or a class from policies/",
            setting="policy",
        )


def checked_order(policy: object, waiting: Mapping[Lease, T], items: list[Any]) -> list[T]:
    """``items`` (a policy's answer) as the queue entries of ``waiting``, or the error
    that says what is wrong with them."""
    remaining = dict(waiting)
    ordered = []
    for item in items:
        queued = remaining.pop(item, None) if isinstance(item, Lease) else None
        if queued is None:
            if isinstance(item, Lease) and item in waiting:
                raise order_error(policy, f"it returned {_describe(item)} twice")
            what = _describe(item) if isinstance(item, Lease) else reprlib.repr(item)
            raise order_error(policy, f"it returned {what}, which is not waiting")
        ordered.append(queued)
    if remaining:
        missing = next(iter(remaining))
        raise order_error(
            policy, f"it left out {len(remaining)} of them, {_describe(missing)} among them"
        )
    return ordered


def order_error(policy: object, problem: str) -> ConfigError:
    return ConfigError(
        f"admission policy {policy!r}: order() must return the waiting leases, each "
        f"exactly once, in the order to try them, but {problem}; fix the policy or set "
        "another (nobody was admitted and the queue is unchanged)",
        setting="policy",
    )


def _describe(lease: Lease) -> str:
    return f"lease {lease.lease_id!r} of agent {lease.agent.name!r}"
