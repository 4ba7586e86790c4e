"""The virtual-time event loop: timers fire in virtual time, in order, with no real
wait; a run in which every task waits and no timer is set fails instead of hanging."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from engine.twin.clock import VirtualClock
from engine.twin.event_loop import WALL_EPOCH_S, TwinStalledError, VirtualTimeLoop, run_virtual


def test_half_an_hour_of_sleeps_passes_in_virtual_time_in_order_and_at_once() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        woke: list[tuple[str, float]] = []

        async def sleeper(name: str, seconds: float) -> None:
            await asyncio.sleep(seconds)
            woke.append((name, loop.time()))

        await asyncio.gather(sleeper("long", 1800.0), sleeper("short", 0.25), sleeper("mid", 3.0))
        return woke

    clock = VirtualClock()
    started = time.perf_counter()
    woke = run_virtual(main(), clock=clock)
    assert woke == [("short", 0.25), ("mid", 3.0), ("long", 1800.0)]
    assert clock.now() == 1800.0
    assert time.perf_counter() - started < 5.0  # no real waiting: 30 minutes would show


def test_timeouts_and_call_later_run_on_the_virtual_clock() -> None:
    async def main() -> tuple[float, list[float], bool]:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        loop.call_later(7.5, lambda: fired.append(loop.time()))
        cancelled = loop.call_later(2.0, lambda: fired.append(-1.0))
        cancelled.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 10.0)
        return loop.time(), fired, isinstance(loop, VirtualTimeLoop)

    now, fired, virtual = run_virtual(main())
    assert (now, fired, virtual) == (10.0, [7.5], True)


def test_the_loop_is_a_governor_clock_on_a_fixed_epoch() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(4.0)
        assert isinstance(loop, VirtualTimeLoop)
        return loop.now(), loop.wall()

    assert run_virtual(main()) == (4.0, WALL_EPOCH_S + 4.0)


def test_work_for_a_thread_runs_inline_on_the_loop_thread() -> None:
    import threading

    async def main() -> tuple[str, str]:
        ran_on = await asyncio.to_thread(lambda: threading.current_thread().name)
        with pytest.raises(ZeroDivisionError):
            await asyncio.to_thread(lambda: 1 / 0)
        return ran_on, threading.current_thread().name

    ran_on, loop_thread = run_virtual(main())
    assert ran_on == loop_thread  # one thread: the same program gives the same figures


def test_every_task_waiting_with_no_timer_is_a_typed_error_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.sleep(2.0)
        await asyncio.Event().wait()

    clock = VirtualClock()
    with pytest.raises(TwinStalledError, match=r"stalled at 2\.000 virtual seconds"):
        run_virtual(main(), clock=clock)
