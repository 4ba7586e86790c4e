"""``LocalBackend.metrics``/``capacity`` read the engine thread's snapshot: they answer
while the engine thread is busy, and agree with the engine read between two steps.

Real engine (tiny-random) and a real ``EngineLoop``. The engine thread is kept busy by a
command that waits on an event: the stand-in for a long step, which a CPU step of the
tiny model is too short to be reliably.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from backends.local.backend import LocalBackend
from engine.config import EngineConfig
from engine.engine import Engine
from engine.engine_loop import EngineLoop
from governor.backend import GenerationRequest


@pytest.fixture
def parts() -> Iterator[tuple[LocalBackend, EngineLoop, Engine]]:
    engine = Engine(EngineConfig(num_blocks=64))
    loop = EngineLoop(engine)
    with LocalBackend(loop) as backend:
        yield backend, loop, engine


def test_metrics_and_capacity_do_not_wait_for_the_engine_thread(
    parts: tuple[LocalBackend, EngineLoop, Engine],
) -> None:
    backend, loop, _ = parts
    release = threading.Event()
    busy = loop.call_soon(release.wait, 10.0)
    try:
        with ThreadPoolExecutor(1) as pool:
            read = pool.submit(lambda: (backend.metrics(), backend.capacity()))
            # Before: both queued behind the busy command and timed out here.
            metrics, capacity = read.result(timeout=2.0)
    finally:
        release.set()
    assert busy.result(timeout=10.0) is True
    assert capacity.num_blocks == 64
    assert metrics.num_blocks_in_use + metrics.num_blocks_free == 64


def test_snapshot_is_the_engine_read_between_steps(
    parts: tuple[LocalBackend, EngineLoop, Engine],
) -> None:
    backend, loop, engine = parts
    backend.open_budget("a", max_blocks=32)
    backend.generate(GenerationRequest(prompt="one two three " * 20, max_tokens=4, budget="a"))
    held = backend.retain(budget="a")
    # Read-your-writes: the hold made by the call that just returned is in the snapshot.
    snap = loop.snapshot()
    exact = loop.call(engine.metrics)
    assert snap.metrics == exact
    assert snap.capacity == loop.call(engine.capacity)
    assert backend.metrics().num_blocks_in_use == exact.num_blocks_in_use >= held // 16
    assert backend.capacity().num_free_blocks == exact.num_blocks_free
    backend.release_retained(budget="a")
    backend.close_budget("a")
    assert backend.metrics().num_blocks_in_use == loop.call(engine.metrics).num_blocks_in_use
