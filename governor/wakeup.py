"""Waking a coroutine that waits on a future of its own event loop, from any thread.

The admission queue and the fan-out limiter both park async callers on a future and
resolve it when a lease or slot frees up, which may happen on any thread. From another
thread the future is resolved through ``call_soon_threadsafe`` (a write to the loop's
self-pipe, and a loop iteration to read it); on the loop's own thread, the common case
of a lease admitted as it was queued or a slot freed by a sibling task, it is resolved
at once.
"""

from __future__ import annotations

import asyncio

__all__ = ["wake"]


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
