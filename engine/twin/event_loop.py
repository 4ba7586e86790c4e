"""An asyncio event loop in virtual time: a twin run's agents, governor and engine driver
are tasks on it, and its clock jumps to the next timer whenever every task waits.

``run_virtual(main(), clock=VirtualClock())`` runs a coroutine to its end the way
``asyncio.run`` does, on a ``VirtualTimeLoop`` whose ``time()`` is ``clock.now()``:

- when callbacks are ready, they run, and no virtual time passes while they do (a
  model's step is charged by the twin, not by the host's seconds);
- when none is ready and a timer is set (``asyncio.sleep``, ``wait_for``'s timeout,
  ``loop.call_later``: a tool's latency, a park deadline, an engine step's end), the
  clock moves to the earliest one at once, so a 30-minute workload takes as long as its
  bookkeeping;
- when none is ready and no timer is set, every task waits on something nothing will
  bring: ``TwinStalledError``, rather than a hang.

Everything runs on the loop's one thread, so the same program gives the same figures to
the last bit: ``run_in_executor`` (and so ``asyncio.to_thread``) runs the call inline and
hands back a finished future (a blocking call would block the whole simulation; in a twin
run every call into the engine is a quick, in-process one). Callbacks from other threads
(``call_soon_threadsafe``) still work, for code that uses them on the loop's own thread.

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── TwinStalledError   every task waits and no timer is set

Torch-free.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from engine.errors import InvalidRequestError
from engine.twin.clock import VirtualClock

__all__ = ["WALL_EPOCH_S", "TwinStalledError", "VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")


class TwinStalledError(InvalidRequestError):
    """A virtual-time run in which every task waits and no timer will wake any."""

    def __init__(self, at: float) -> None:
        super().__init__(
            f"the twin run stalled at {at:.3f} virtual seconds: every task waits and no timer "
            "is set, so nothing can wake them. A task waits on a thread or a real-time wait "
            "(run the governor through its async API, with a clock from the loop), or two "
            "tasks wait on each other"
        )


class _VirtualSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The loop's selector: looks at its file descriptors without waiting, and where the
    loop would wait for a timer, moves the clock to it instead."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise TwinStalledError(self._clock.now())
        self._clock.advance(timeout)
        return []


# What ``wall()`` reads at virtual time 0: a fixed epoch (2026-01-01T00:00:00Z), so a
# twin run's event timestamps are the same on every run.
WALL_EPOCH_S = 1_767_225_600.0


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on ``clock`` (see the module docstring).

    It is also the clock a ``governor.Governor`` takes (``clock=loop``): ``now()`` is the
    virtual time, ``wall()`` the same on a fixed epoch, and ``call_later`` the loop's own,
    so the governor's park and retain deadlines are timers in the same virtual time.
    """

    def __init__(self, clock: VirtualClock, *, wall_epoch_s: float = WALL_EPOCH_S) -> None:
        super().__init__(selector=_VirtualSelector(clock))
        self.clock = clock
        self.wall_epoch_s = wall_epoch_s

    def time(self) -> float:
        return self.clock.now()

    def now(self) -> float:
        return self.clock.now()

    def wall(self) -> float:
        return self.wall_epoch_s + self.clock.now()

    def run_in_executor(  # type: ignore[override]
        self, executor: object, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # handed to the awaiting task, as a thread's would be
            future.set_exception(exc)
        return future


def run_virtual(main: Coroutine[Any, Any, T], *, clock: VirtualClock | None = None) -> T:
    """Run ``main`` to its end on a ``VirtualTimeLoop`` (a new clock at 0.0 unless given),
    then cancel what it left running and close the loop, as ``asyncio.run`` does."""
    loop = VirtualTimeLoop(VirtualClock() if clock is None else clock)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
