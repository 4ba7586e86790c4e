"""``Waiters``: threads and coroutines waiting, under one lock, for blocks to come back.

The fake backend's calls wait for the same thing whether they run on a thread
(``generate``) or on an event loop (``agenerate``, ``astream``): some change to the
block accounting that the lock guards. ``wait`` parks a thread on a condition of that
lock, ``await_`` parks a coroutine on an ``asyncio.Event`` that ``notify`` sets through
its loop, so one ``notify`` after blocks return wakes both kinds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import TypeVar

from governor.testing.fake_pool import fake_error

__all__ = ["Waiters"]

T = TypeVar("T")


class Waiters:
    """Retry an attempt under ``lock`` until it answers; ``num_waiting`` counts the
    ``queued`` callers waiting now (read it under the lock)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self._changed = threading.Condition(lock)
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self.num_waiting = 0

    def wait(self, attempt: Callable[[], T | None], *, queued: bool = False) -> T:
        """``attempt()`` under the lock until it gives an answer, waiting between tries;
        ``queued`` callers count as requests waiting in the metrics."""
        with self._changed:
            waited = False
            try:
                while True:
                    answer = attempt()
                    if answer is not None:
                        return answer
                    if _event_loop_running():
                        raise fake_error(
                            "generate() would block this event loop while it waits for "
                            "blocks held by calls that run on it; use await agenerate()"
                        )
                    if queued and not waited:
                        waited = True
                        self.num_waiting += 1
                    self._changed.wait()
            finally:
                if waited:
                    self.num_waiting -= 1

    async def await_(self, attempt: Callable[[], T | None], *, queued: bool = False) -> T:
        """``wait`` for a coroutine: it awaits an event between tries, never the lock."""
        loop = asyncio.get_running_loop()
        waited = False
        try:
            while True:
                event = asyncio.Event()
                with self._lock:
                    answer = attempt()
                    if answer is not None:
                        return answer
                    if queued and not waited:
                        waited = True
                        self.num_waiting += 1
                    waiter = (loop, event)
                    self._async_waiters.add(waiter)
                try:
                    await event.wait()
                finally:
                    with self._lock:
                        self._async_waiters.discard(waiter)
        finally:
            if waited:
                with self._lock:
                    self.num_waiting -= 1

    def notify(self) -> None:
        """Wake every waiter to try again; called under the lock after blocks return."""
        self._changed.notify_all()
        for loop, event in self._async_waiters:
            with suppress(RuntimeError):  # its loop closed: nobody is left to wake
                loop.call_soon_threadsafe(event.set)


def _event_loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
