"""The clock the governor reads: ``Clock`` (the protocol), ``SystemClock`` and ``SYSTEM_CLOCK``.

A governor reads time only through its clock: ``now()`` (monotonic seconds: every duration,
deadline and queue age), ``wall()`` (only an event's timestamp) and ``call_later``
(deadlines). ``call_later`` and ``Timer.cancel`` are called from any thread under the
governor's locks, so they never run ``fn`` before returning, nor wait; a callback may
block on the backend. ``SystemClock`` runs callbacks on one daemon thread
(``governor.deadlines``), shared by every governor at the default ``SYSTEM_CLOCK``. A run
on a virtual clock drives the governor through its async API.

Where callbacks run, and real against virtual waits: docs/design/time.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from governor.deadlines import Deadlines

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "Timer"]


@runtime_checkable
class Timer(Protocol):
    """A callback armed by ``Clock.call_later``."""

    def cancel(self) -> None:
        """It will not run (a no-op once it has run or been cancelled)."""
        ...


@runtime_checkable
class Clock(Protocol):
    """What the governor reads time from (see the module docstring)."""

    def now(self) -> float:
        """Monotonic seconds: every duration, deadline, queue age and order time."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch: only for event timestamps (``GovernorEvent.at``)."""
        ...

    def call_later(self, seconds: float, fn: Callable[..., None], *args: object) -> Timer:
        """Run ``fn(*args)`` after ``seconds`` unless cancelled; never before returning."""
        ...


class SystemClock:
    """Real time: ``time.monotonic``, ``time.time``, and callbacks on one daemon thread
    (``governor.deadlines.Deadlines``), started on the first ``call_later``."""

    __slots__ = ("_deadlines",)

    def __init__(self, *, thread_name: str = "kvgov-deadlines") -> None:
        self._deadlines = Deadlines(name=thread_name)

    def __repr__(self) -> str:
        return "SystemClock()"

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def call_later(self, seconds: float, fn: Callable[..., None], *args: object) -> Timer:
        return self._deadlines.call_later(seconds, fn, *args)


SYSTEM_CLOCK = SystemClock()
