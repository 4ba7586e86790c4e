"""The virtual-time event loop: timers fire in virtual time, in order, with no real
wait; a run in which every task waits and no timer is set fails instead of hanging."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from engine.twin.clock import VirtualClock
from engine.twin.event_loop import (
    WALL_EPOCH_S,
    ThreadClock,
    TwinStalledError,
    VirtualTimeLoop,
    run_virtual,
)


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


def test_a_thread_call_hears_back_when_what_it_asked_is_answered() -> None:
    """A call run for a thread that asked the engine something mid-step (``reply_at``)
    hears back then, not at once: the wait a worker thread really loses. A nested call's
    reply holds up the outer one; outside such a call, ``reply_at`` changes nothing."""

    async def main() -> tuple[float, float, float, float | None]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)

        def asks(at: float) -> str:
            assert loop.replying_at() is not None
            loop.reply_at(at)
            loop.reply_at(at - 0.5)  # the latest answer counts, not the last asked
            return "answered"

        def nests() -> float:
            loop.run_in_executor(None, asks, 7.0)  # an inner call answered at 7.0
            reached = loop.replying_at()
            assert reached == 7.0
            return reached

        await asyncio.sleep(1.0)
        assert await asyncio.to_thread(asks, 3.0) == "answered"
        first = loop.time()
        await asyncio.to_thread(asks, 0.5)  # answered already: no wait
        second = loop.time()
        await loop.run_in_executor(None, nests)
        loop.reply_at(99.0)  # not in a call: nothing waits
        return first, second, loop.time(), loop.replying_at()

    assert run_virtual(main()) == (3.0, 3.0, 7.0, None)


def test_a_thread_call_cancelled_before_its_answer_is_dropped_and_errors_keep_their_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)

        def fails() -> None:
            loop.reply_at(2.0)
            raise ZeroDivisionError

        waiting = asyncio.ensure_future(loop.run_in_executor(None, loop.reply_at, 5.0))
        await asyncio.sleep(1.0)
        waiting.cancel()
        with pytest.raises(ZeroDivisionError):
            await loop.run_in_executor(None, fails)
        failed_at = loop.time()
        await asyncio.sleep(10.0)  # the cancelled call's answer at 5.0 fires into nothing
        return failed_at, loop.time()

    assert run_virtual(main()) == (2.0, 12.0)


def test_a_thread_clock_runs_its_callbacks_one_at_a_time_as_a_deadline_thread() -> None:
    """Under ``SystemClock`` a governor's deadlines run on one thread: a callback due while
    an earlier one still waits for the engine starts when that one has heard back."""

    async def main() -> tuple[list[tuple[str, float]], list[object]]:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        clock = ThreadClock(loop)
        ran: list[tuple[str, float]] = []
        errors: list[object] = []
        loop.set_exception_handler(lambda _, context: errors.append(context["exception"]))

        def slow(name: str) -> None:
            ran.append((name, clock.now()))
            loop.reply_at(clock.now() + 2.0)  # what it asked the engine comes back later

        def fails() -> None:
            ran.append(("fails", clock.now()))
            raise ValueError("boom")

        clock.call_later(1.0, slow, "first")
        clock.call_later(1.5, slow, "second")  # due while the first waits: runs at 3.0
        clock.call_later(1.6, slow, "cancelled").cancel()
        waiting = clock.call_later(1.7, slow, "cancelled while waiting")
        clock.call_later(1.8, fails)
        await asyncio.sleep(2.0)
        waiting.cancel()  # due at 1.7, waiting for the thread: never runs
        await asyncio.sleep(10.0)
        return ran, errors

    ran, errors = run_virtual(main())
    assert ran == [("first", 1.0), ("second", 3.0), ("fails", 5.0)]
    assert [str(error) for error in errors] == ["boom"]  # reported, as the thread warns


def test_every_task_waiting_with_no_timer_is_a_typed_error_not_a_hang() -> None:
    async def main() -> None:
        await asyncio.sleep(2.0)
        await asyncio.Event().wait()

    clock = VirtualClock()
    with pytest.raises(TwinStalledError, match=r"stalled at 2\.000 virtual seconds"):
        run_virtual(main(), clock=clock)
