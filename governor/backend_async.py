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
    from governor.backend import BackendCapacity, BackendMetrics

__all__ = ["ThreadedAsyncBookkeeping"]


class ThreadedAsyncBookkeeping:
    """Mixed into a ``Backend``: its sync bookkeeping, each call on a worker thread."""

    async def acapacity(self) -> BackendCapacity:
        return await asyncio.to_thread(self.capacity)  # type: ignore[attr-defined]

    async def aopen_budget(self, name: str, *, max_blocks: int) -> None:
        await asyncio.to_thread(self.open_budget, name, max_blocks=max_blocks)  # type: ignore[attr-defined]

    async def aresize_budget(self, name: str, *, max_blocks: int) -> None:
        await asyncio.to_thread(self.resize_budget, name, max_blocks=max_blocks)  # type: ignore[attr-defined]

    async def aclose_budget(self, name: str) -> None:
        await asyncio.to_thread(self.close_budget, name)  # type: ignore[attr-defined]

    async def aretain(self, *, budget: str) -> int:
        return await asyncio.to_thread(self.retain, budget=budget)  # type: ignore[attr-defined]

    async def arelease_retained(self, *, budget: str) -> None:
        await asyncio.to_thread(self.release_retained, budget=budget)  # type: ignore[attr-defined]

    async def aoffload(self, *, budget: str) -> None:
        await asyncio.to_thread(self.offload, budget=budget)  # type: ignore[attr-defined]

    async def arestore(self, *, budget: str) -> None:
        await asyncio.to_thread(self.restore, budget=budget)  # type: ignore[attr-defined]

    async def ametrics(self) -> BackendMetrics:
        return await asyncio.to_thread(self.metrics)  # type: ignore[attr-defined]
