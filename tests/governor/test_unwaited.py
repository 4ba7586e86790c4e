"""A released lease's budget is closed without waiting for the engine thread
(``governor.unwaited``): the release returns while a step is in progress, what it asked
is in every read after it, and a close that fails is logged and counted.

Real engine (tiny-random), real ``EngineLoop`` and ``LocalBackend``. The engine thread is
kept busy by a command that waits on an event: the stand-in for a long step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.local.backend import LocalBackend
from engine.config import EngineConfig
from engine.engine import Engine
from engine.engine_loop import EngineLoop
from governor import AgentSpec, Governor, GovernorConfig

AGENT = AgentSpec(name="agent", ceiling_tokens=400)
TASK = [{"role": "user", "content": "Find the failing test and explain it in one line."}]


@pytest.fixture
def parts() -> Iterator[tuple[Governor, LocalBackend, EngineLoop]]:
    loop = EngineLoop(Engine(EngineConfig(num_blocks=64)))
    with LocalBackend(loop) as backend:
        yield (
            Governor(backend, config=GovernorConfig(park_after_s=0), agents=[AGENT]),
            backend,
            loop,
        )


def test_releasing_a_lease_does_not_wait_for_the_engine_thread(
    parts: tuple[Governor, LocalBackend, EngineLoop],
) -> None:
    governor, backend, loop = parts
    context = governor.lease("agent")
    lease = context.__enter__()
    governor.complete(lease, TASK, max_tokens=4)
    release = threading.Event()
    busy = loop.call_soon(release.wait, 10.0)
    try:
        with ThreadPoolExecutor(1) as pool:
            # Before: close_budget queued behind the busy command and this timed out.
            pool.submit(context.__exit__, None, None, None).result(timeout=2.0)
    finally:
        release.set()
    assert busy.result(timeout=10.0) is True
    # The close queued by the release has run before any later read.
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)
    assert lease.budget not in loop.call(
        lambda: [b.name for b in loop.engine.block_manager.budgets]
    )
    assert governor.unwaited.count == 0


def test_a_close_that_fails_is_logged_and_counted(
    parts: tuple[Governor, LocalBackend, EngineLoop], caplog: pytest.LogCaptureFixture
) -> None:
    governor, backend, _ = parts
    with caplog.at_level(logging.WARNING, logger="governor.unwaited"):
        with governor.lease("agent") as lease:
            governor.complete(lease, TASK, max_tokens=4)
            backend.close_budget(lease.budget)  # behind the governor's back: its close fails
        backend.metrics()  # waits for the queued close
    assert governor.unwaited.count == 1
    what, error = governor.unwaited.last  # type: ignore[misc]
    assert what == f"close_budget({lease.budget!r})"
    assert lease.budget in str(error)
    assert [r.name for r in caplog.records] == ["governor.unwaited"]
