"""An event loop never waits on the engine: with every engine round trip made slow (a
long step), a governed agent's whole life (its budget opened and closed, its KV held
over a tool call, a fan-out that parks it, its chat prompts tokenized) leaves the loop
free, and another agent's coroutine keeps ticking throughout. The bundled engine
(tiny-random) with its bookkeeping calls slowed, so the waits are the real ones."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from backends import LocalBackend
from governor import AgentSpec, Governor, GovernorConfig
from tests.loop_ticker import loop_ticker

STEP_S = 0.25  # what each engine round trip takes here
TASK = [{"role": "user", "content": "Find the failing test."}]
PLANNER = AgentSpec(name="planner", ceiling_tokens=256, max_fanout=2)
WORKER = AgentSpec(name="worker", ceiling_tokens=256)
_ENGINE_CALLS = (
    "open_budget", "close_budget", "resize_budget", "retain", "release_retained", "offload",
    "restore", "metrics",
)  # fmt: skip


def _slow(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(STEP_S)  # the engine thread is busy: the caller waits this long
        return fn(*args, **kwargs)

    return slow


class _RecordingTokenizer:
    """The engine's tokenizer, noting the thread each chat prompt is tokenized on."""

    def __init__(self, tokenizer: Any, threads: set[int]) -> None:
        self._tokenizer = tokenizer
        self._threads = threads

    def encode_chat(self, *args: Any, **kwargs: Any) -> list[int]:
        self._threads.add(threading.get_ident())
        return self._tokenizer.encode_chat(*args, **kwargs)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def test_a_slow_engine_never_stalls_the_event_loop() -> None:
    backend = LocalBackend(config={"num_blocks": 64})
    config = GovernorConfig(park_after_s=0, retain_s=5, pressure_watermark=0.01)
    governor = Governor(backend, config=config, agents=[PLANNER, WORKER])
    for name in _ENGINE_CALLS:
        setattr(backend._engine, name, _slow(getattr(backend._engine, name)))
    tokenized_on: set[int] = set()
    backend._tokenizer = _RecordingTokenizer(backend._tokenizer, tokenized_on)
    gaps: list[float] = []

    async def work(child: Any) -> None:
        async with child as lease:
            await governor.acomplete(lease, TASK, max_tokens=2)

    async def governed_agent() -> None:
        async with governor.lease("planner") as plan:
            await governor.acomplete(plan, TASK, max_tokens=2)
            async with governor.tool_call(plan, "ls"):  # held, then offloaded: pressure
                await asyncio.sleep(0)
            await governor.acomplete(plan, TASK, max_tokens=2)  # restored
            await asyncio.gather(*(work(c) for c in governor.fanout(plan, "worker", 2)))
            await governor.acomplete(plan, TASK, max_tokens=2)

    async def main() -> int:
        started = time.monotonic()
        async with loop_ticker() as ticks:
            await asyncio.wait_for(governed_agent(), timeout=60)
        gaps.extend(ticks)
        # How many slow round trips the agent's life took, all of them off the loop.
        return round((time.monotonic() - started) / STEP_S)

    try:
        loop_thread = threading.get_ident()  # asyncio.run runs its loop on this thread
        round_trips = asyncio.run(main())
        assert round_trips >= 6  # budgets opened and closed, a hold, an offload, a restore
        assert max(gaps) < STEP_S / 2  # the other agent never waited on a round trip
        assert tokenized_on and loop_thread not in tokenized_on
        assert not governor._budgets_open
    finally:
        backend.close()
