"""Two small moves on asyncio futures that ``LocalBackend``'s async calls make when the
engine thread and a caller's cancellation race: waiting a job out through further
cancellations, and settling a future only while nobody has cancelled it."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any

__all__ = ["settle", "wait_out"]


async def wait_out(job: asyncio.Future[Any]) -> None:
    """Wait for ``job`` to end, whatever it ends with, through further cancellations."""
    while not job.done():
        with suppress(asyncio.CancelledError, Exception):
            await asyncio.shield(job)
    if not job.cancelled():
        job.exception()  # retrieved: its outcome went to the orphan's abort


def settle(future: asyncio.Future[object], item: object) -> None:
    """Set ``future``'s result from a callback the engine thread scheduled; a cancelled
    caller's future stays cancelled."""
    if not future.done():
        future.set_result(item)
