"""A coroutine beside the one under test, ticking every 5 ms on the same event loop:
the gaps between its ticks show whether anything held the loop (waited on the engine,
a model or a thread on it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["loop_ticker"]

TICK_S = 0.005


@asynccontextmanager
async def loop_ticker() -> AsyncIterator[list[float]]:
    """``async with loop_ticker() as gaps``: the gaps between ticks while the block ran,
    in seconds (complete once the block has exited)."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(tick())
    try:
        yield gaps
    finally:
        done.set()
        await ticking
