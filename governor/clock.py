"""The clock the governor reads: ``Clock`` (the protocol), ``SystemClock`` and ``SYSTEM_CLOCK``.

A governor reads time only through the clock it is given (``Governor(clock=...)``), and
hands the same clock to every collaborator that reads time:

- ``now()``: monotonic seconds. Every duration, deadline, queue age and order time: a
  lease's ``requested_at``, ``queued_at``, ``admitted_at`` and ``released_at``, a tool's
  ``tool_started_at``, the admission policy's ``now``, the ``order_time`` sent to the
  backend, the ``wait_s`` and ``elapsed_s`` of events. Elapsed times are measured on it
  too, not on ``time.perf_counter``: on Linux both read ``CLOCK_MONOTONIC`` at nanosecond
  resolution, so nothing is lost there; elsewhere ``perf_counter`` may resolve finer
  (Windows' ``monotonic`` ticks in steps of about 16 ms, so a quick call's ``elapsed_s``
  may read 0 there).
- ``wall()``: seconds since the epoch, only for the time an event happened
  (``GovernorEvent.at``), which is read against other machines' logs.
- ``call_later(seconds, fn, *args)``: run ``fn(*args)`` after ``seconds`` unless the
  returned ``Timer`` is cancelled first. The governor arms one at every tool call and
  every hold of KV (park after ``park_after_s``, end the hold after ``retain_s``), and
  with 0 seconds to move work off a caller that must not wait.

``SystemClock`` is real time: ``time.monotonic``, ``time.time``, and its callbacks run on
one daemon thread (``governor.deadlines``), started on first use. ``SYSTEM_CLOCK``, the
default, is one instance, so every governor left at the default shares that thread.

Another clock (the hardware twin's virtual clock) runs callbacks wherever it runs its own,
on its event loop's thread. A clock's ``call_later`` and ``Timer.cancel`` are called from
any thread, under the governor's locks (the idle keeper's and the admission controller's:
lock order in ``governor.lifecycle``), so they must never run ``fn`` before returning, even
for 0 seconds, nor wait; ``fn`` takes those locks itself. Some callbacks call the backend
and wait for it (the idle keeper holds, offloads and drops a context's KV on them, where
no caller waits), so a clock must run them where a blocking backend call is allowed:
under ``SystemClock`` that is the deadline thread; on an event loop's thread, only a
backend whose sync calls never wait on that loop.

Waits. The async API waits on its event loop's time (``asyncio.wait_for`` and
``asyncio.sleep``), which a virtual event loop makes virtual too; the sync API's blocking
waits (``threading.Event.wait`` in ``governor.wakeup`` and ``governor.fanout``) are real
time, and a thread blocked in one cannot be woken by a virtual clock. A run on a virtual
clock therefore drives the governor through its async API: ``async with governor.lease``,
``aacquire``, ``await governor.acomplete``, ``async with governor.tool_call`` and
``async with governor.child``.
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
