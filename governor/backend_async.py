"""``ThreadedAsyncBookkeeping``: the ``a``-prefixed bookkeeping calls of ``Backend`` for a
backend whose sync calls do the work, each run on a worker thread (``asyncio.to_thread``).

``LocalBackend``'s calls wait for the engine thread's next step; ``FakeBackend``'s are
quick, but a subclass may make them wait as an engine would, and an event loop must not
notice either. A backend that does I/O of its own (``RemoteBackend``) writes its async
calls itself, on an async client.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from governor.backend import Backend, BackendCapacity, BackendMetrics

__all__ = ["ThreadedAsyncBookkeeping"]


class ThreadedAsyncBookkeeping:
    """Mixed into a ``Backend``: its sync bookkeeping, each call on a worker thread (``self``
    is typed ``Backend``, so the checker holds each host class to the sync calls)."""

    async def acapacity(self: Backend) -> BackendCapacity:
        return await asyncio.to_thread(self.capacity)

    async def aopen_budget(self: Backend, name: str, *, max_blocks: int) -> None:
        await asyncio.to_thread(self.open_budget, name, max_blocks=max_blocks)

    async def aresize_budget(self: Backend, name: str, *, max_blocks: int) -> None:
        await asyncio.to_thread(self.resize_budget, name, max_blocks=max_blocks)

    async def aclose_budget(self: Backend, name: str) -> None:
        await asyncio.to_thread(self.close_budget, name)

    async def aretain(self: Backend, *, budget: str) -> int:
        return await asyncio.to_thread(self.retain, budget=budget)

    async def arelease_retained(self: Backend, *, budget: str) -> None:
        await asyncio.to_thread(self.release_retained, budget=budget)

    async def aoffload(self: Backend, *, budget: str) -> None:
        await asyncio.to_thread(self.offload, budget=budget)

    async def arestore(self: Backend, *, budget: str) -> None:
        await asyncio.to_thread(self.restore, budget=budget)

    async def ametrics(self: Backend) -> BackendMetrics:
        return await asyncio.to_thread(self.metrics)
