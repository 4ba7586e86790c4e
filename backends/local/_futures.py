"""``settle``: how ``LocalBackend``'s async calls hand a request's end from the engine
thread to the caller's event loop when the caller may have been cancelled meanwhile."""

from __future__ import annotations

import asyncio

__all__ = ["settle"]


def settle(future: asyncio.Future[object], item: object) -> None:
    """Set ``future``'s result from a callback the engine thread scheduled; a cancelled
    caller's future stays cancelled."""
    if not future.done():
        future.set_result(item)
