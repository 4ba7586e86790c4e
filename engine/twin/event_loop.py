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
the last bit: ``run_in_executor`` (and so ``asyncio.to_thread``) runs the call inline (a
blocking call would block the whole simulation; in a twin run every call into the engine
is a quick, in-process one). The future it hands back is settled at once, or, where the
call asked the engine something while a step was in progress (``reply_at``, which
``TwinEngineLoop`` calls), when that step ends: a worker thread waiting on a real engine
hears back between its steps, and that wait is time the caller really loses (a tool
call's start, a restore before a call). Callbacks from other threads
(``call_soon_threadsafe``) still work, for code that uses them on the loop's own thread.

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── TwinStalledError   every task waits and no timer is set

Torch-free.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from functools import partial
from typing import Any, TypeVar

from typing_extensions import TypeVarTuple, Unpack

from engine.errors import InvalidRequestError
from engine.twin.clock import VirtualClock

__all__ = ["WALL_EPOCH_S", "ThreadClock", "TwinStalledError", "VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class TwinStalledError(InvalidRequestError):
    """A virtual-time run in which every task waits and no timer will wake any."""

    def __init__(self, at: float) -> None:
        super().__init__(
            f"the twin run stalled at {at:.3f} virtual seconds: every task waits and no timer "
            "is set, so nothing can wake them. A task waits on a thread or a real-time wait "
            "(run the governor through its async API, with a clock from the loop), or two "
            "tasks wait on each other"
        )


class _VirtualSelector(selectors.DefaultSelector):
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
        self._reply_at: float | None = None  # while run_in_executor runs a call: see reply_at

    def time(self) -> float:
        return self.clock.now()

    def now(self) -> float:
        return self.clock.now()

    def wall(self) -> float:
        return self.wall_epoch_s + self.clock.now()

    def next_event_at(self) -> float:
        """When the loop next runs anything besides its caller: now when a callback is
        ready, else its earliest timer (infinity with none)."""
        if self._ready:  # type: ignore[attr-defined]  # BaseEventLoop's, not in typeshed
            return self.time()
        timers = self._scheduled  # type: ignore[attr-defined]  # BaseEventLoop's, not in typeshed
        return min((t.when() for t in timers if not t.cancelled()), default=math.inf)

    def replying_at(self) -> float | None:
        """Where the call ``run_in_executor`` is running stands in virtual time: when its
        latest call into the engine was answered (its start before any); None outside
        such a call."""
        return self._reply_at

    def reply_at(self, at: float) -> None:
        """The call ``run_in_executor`` is running hears back at virtual time ``at`` at
        the earliest (a worker thread's call waits for the engine's step in progress).
        Outside such a call, nothing: code on the loop itself never waits on the engine."""
        if self._reply_at is not None:
            self._reply_at = max(self._reply_at, at)

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[Unpack[Ts]], T], *args: Unpack[Ts]
    ) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self.create_future()
        self.run_as_thread(future, func, *args)
        return future

    def run_as_thread(self, future: asyncio.Future[T], func: Callable[..., T], *args: Any) -> float:
        """Run ``func(*args)`` inline as a worker thread's call: settle ``future`` with
        its result or error when it hears back (see ``reply_at``); that virtual time."""
        outer, self._reply_at = self._reply_at, self.time()
        try:
            try:
                result: T = func(*args)
            finally:
                at, self._reply_at = self._reply_at, outer
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # handed to the awaiting task, as a thread's would be
            self._settle_at(at, future, partial(future.set_exception, exc))
        else:
            self._settle_at(at, future, partial(future.set_result, result))
        if outer is not None:  # a nested call: the outer one hears back no earlier
            self.reply_at(at)
        return at

    def _settle_at(
        self, at: float, future: asyncio.Future[T], set_outcome: Callable[[], None]
    ) -> None:
        def settle() -> None:
            if not future.cancelled():
                set_outcome()

        if at > self.time():
            self.call_at(at, settle)
        else:
            settle()


class ThreadClock:
    """A governor's clock on a ``VirtualTimeLoop`` whose callbacks run as under
    ``SystemClock``: one at a time, on one deadline thread. Each runs as that thread's
    call (``run_as_thread``), so what it asks the engine is answered between steps, and
    the next callback waiting for the thread starts when it has heard back. (With the
    loop itself as the clock, callbacks run on the loop and are answered at once.)"""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self.loop = loop
        self._free_at = 0.0  # when the thread is done with its latest callback
        self._due: deque[tuple[_ThreadTimer, Callable[..., None], tuple[object, ...]]] = deque()

    def now(self) -> float:
        return self.loop.now()

    def wall(self) -> float:
        return self.loop.wall()

    def call_later(self, seconds: float, fn: Callable[..., None], *args: object) -> _ThreadTimer:
        timer = _ThreadTimer()
        timer.handle = self.loop.call_later(seconds, self._fire, timer, fn, args)
        return timer

    def _fire(self, timer: _ThreadTimer, fn: Callable[..., None], args: tuple[object, ...]) -> None:
        """Due: run now, or after the callbacks due before it, in the order they fell due."""
        self._due.append((timer, fn, args))
        if len(self._due) == 1:
            self._run_due()

    def _run_due(self) -> None:
        loop = self.loop
        while self._due:
            if self._free_at > loop.time():  # still waiting on what it asked the engine
                loop.call_at(self._free_at, self._run_due)
                return
            timer, fn, args = self._due.popleft()
            if timer.cancelled:
                continue
            done: asyncio.Future[None] = loop.create_future()
            done.add_done_callback(_report)
            self._free_at = loop.run_as_thread(done, fn, *args)


class _ThreadTimer:
    __slots__ = ("cancelled", "handle")

    def __init__(self) -> None:
        self.cancelled = False
        self.handle: asyncio.TimerHandle | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()


def _report(done: asyncio.Future[None]) -> None:
    """A callback's error, where the deadline thread would warn of it: the loop's handler."""
    if not done.cancelled() and done.exception() is not None:
        done.get_loop().call_exception_handler(
            {"message": "a deadline callback raised", "exception": done.exception()}
        )


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
