"""Waking a coroutine that waits on a future of its own event loop, from any thread.

The admission queue and the fan-out limiter both park async callers on a future and
resolve it when a lease or slot frees up, which may happen on any thread. From another
thread the future is resolved through ``call_soon_threadsafe`` (a write to the loop's
self-pipe, and a loop iteration to read it); on the loop's own thread, the common case
of a lease admitted as it was queued or a slot freed by a sibling task, it is resolved
at once. ``Waiter`` wakes one admission waiter, a thread or a coroutine.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Waiter", "wake"]


def wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> bool:
    """Resolve ``future`` (on ``loop``) unless it is done; False when its loop is closed
    and nobody is left to wake."""
    if asyncio._get_running_loop() is loop:
        _resolve(future)
        return True
    try:
        loop.call_soon_threadsafe(_resolve, future)
    except RuntimeError:
        return False
    return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # a timeout may have cancelled it meanwhile
        future.set_result(None)


class Waiter:
    """Wakes one waiting caller: a thread (an Event) or a coroutine (a future on its
    own event loop, woken thread-safely)."""

    __slots__ = ("_event", "_future", "_loop")

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._event = threading.Event() if loop is None else None
        self._future: asyncio.Future[None] | None = None if loop is None else loop.create_future()

    def wake(self) -> None:
        if self._event is not None:
            self._event.set()
            return
        assert self._loop is not None and self._future is not None
        wake(self._loop, self._future)  # False: its event loop is gone, nobody waits

    def wait(self, timeout: float | None) -> bool:
        assert self._event is not None
        return self._event.wait(timeout)

    async def await_(self, timeout: float | None) -> bool:
        assert self._future is not None
        if self._future.done():  # woken already (admitted as it was queued)
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._future), timeout)
        except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11
            return False
        return True
