"""Backend writes the caller does not wait for, and where their errors go.

Closing a released lease's budget, and holding a lease's KV when its tool starts, need
no answer before the caller goes on: ``LocalBackend`` queues them on the engine loop
(``close_budget_soon``) or the deadline thread makes them, and the caller returns at
once instead of waiting for the engine's current step to end.

Ordering rule: the engine loop runs commands in the order they were queued, so a write
queued here reaches the engine after everything the same lease queued before it and
before anything queued after it; a lease's next call (the only thing that could depend
on its hold) first takes the idle keeper's backend lock, so it queues its request after
a hold being made, or the hold is skipped (``governor.idle``). A closed budget's name is
never used again (a lease's budget is its own), so nothing queued later depends on it.

Errors cannot be raised to a caller that has gone on: each is logged (logger
``governor.unwaited``, a warning) and counted here (``Governor.unwaited``); tests and
operators read ``count`` and ``last``. A backend without ``close_budget_soon`` is
called and waited for as before, and raises as before.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from governor.backend import Backend

__all__ = ["UnwaitedErrors", "close_budget_unwaited"]

_log = logging.getLogger("governor.unwaited")


@dataclass(slots=True)
class UnwaitedErrors:
    """Errors of writes nobody waited for: how many, and the latest (what, error)."""

    count: int = 0
    last: tuple[str, BaseException] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, what: str, error: BaseException) -> None:
        """Count and log one; any thread (the engine's too: it never blocks)."""
        with self._lock:
            self.count += 1
            self.last = (what, error)
        _log.warning(
            "%s failed, after its caller went on: %s: %s", what, type(error).__name__, error
        )


def close_budget_unwaited(backend: Backend, name: str, errors: UnwaitedErrors) -> None:
    """Close ``name`` without waiting where the backend can (errors go to ``errors``);
    otherwise close it and wait. Queueing itself (a closed backend) raises here."""
    soon = getattr(backend, "close_budget_soon", None)
    if soon is None:
        backend.close_budget(name)
        return
    # Recorded on the engine thread before the close is marked done: a read that waited
    # for it (LocalBackend.metrics does) sees the count.
    soon(name, on_error=lambda error: errors.record(f"close_budget({name!r})", error))
