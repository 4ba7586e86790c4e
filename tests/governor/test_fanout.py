"""governor.fanout: the fan-out cap under real threads and real asyncio, FIFO order,
timeouts and cancellation that leave nothing behind, and the parent's park/resume hooks."""

from __future__ import annotations

import asyncio
import pickle
import random
import threading
import time
from collections.abc import Hashable

import pytest

from governor.errors import ConfigError, GovernorError
from governor.fanout import FanoutLimiter, FanoutTimeout


class Recorder:
    """Counts each parent's hook calls and checks they alternate first, last, first..."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Hashable]] = []
        self.busy: set[Hashable] = set()

    def first(self, parent_id: Hashable) -> None:
        assert parent_id not in self.busy
        self.busy.add(parent_id)
        self.events.append(("first", parent_id))

    def last(self, parent_id: Hashable) -> None:
        assert parent_id in self.busy
        self.busy.discard(parent_id)
        self.events.append(("last", parent_id))

    def count(self, kind: str, parent_id: Hashable) -> int:
        return self.events.count((kind, parent_id))


def recorded_limiter() -> tuple[FanoutLimiter, Recorder]:
    recorder = Recorder()
    return FanoutLimiter(on_first_child=recorder.first, on_last_child=recorder.last), recorder


def assert_empty(limiter: FanoutLimiter, *parents: Hashable) -> None:
    assert limiter.num_parents == 0
    for parent in parents:
        assert (limiter.active(parent), limiter.waiting(parent), limiter.peak(parent)) == (0, 0, 0)


def test_twelve_threads_never_exceed_three_active_and_all_finish() -> None:
    limiter, recorder = recorded_limiter()
    seen: list[int] = []
    done: list[int] = []
    peaks: list[int] = []

    def child(i: int) -> None:
        with limiter.slot("planner", 3):
            seen.append(limiter.active("planner"))
            time.sleep(0.01)
            peaks.append(limiter.peak("planner"))
            done.append(i)

    threads = [threading.Thread(target=child, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(done) == list(range(12))
    assert max(seen) == 3 and max(peaks) == 3
    assert recorder.count("first", "planner") == recorder.count("last", "planner") == 1
    assert_empty(limiter, "planner")


def test_twelve_coroutines_never_exceed_three_active_and_all_finish() -> None:
    limiter, recorder = recorded_limiter()
    seen: list[int] = []

    async def child(i: int) -> int:
        async with limiter.slot("planner", 3):
            seen.append(limiter.active("planner"))
            await asyncio.sleep(0.005)
            return i

    async def main() -> list[int]:
        return await asyncio.gather(*(child(i) for i in range(12)))

    assert asyncio.run(main()) == list(range(12))
    assert max(seen) == 3
    assert recorder.events == [("first", "planner"), ("last", "planner")]
    assert_empty(limiter, "planner")


def test_threads_and_event_loops_share_one_cap() -> None:
    limiter, recorder = recorded_limiter()
    lock = threading.Lock()
    state = {"now": 0, "max": 0, "done": 0}

    def enter() -> None:
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])

    def leave() -> None:
        with lock:
            state["now"] -= 1
            state["done"] += 1

    def thread_child() -> None:
        with limiter.slot("p", 3):
            enter()
            time.sleep(0.003)
            leave()

    async def async_child() -> None:
        async with limiter.slot("p", 3):
            enter()
            await asyncio.sleep(0.003)
            leave()

    async def loop_main() -> None:
        await asyncio.gather(*(async_child() for _ in range(8)))

    workers = [threading.Thread(target=thread_child) for _ in range(8)]
    workers += [threading.Thread(target=asyncio.run, args=(loop_main(),)) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert state == {"now": 0, "max": 3, "done": 24}
    assert recorder.count("first", "p") == recorder.count("last", "p") >= 1
    assert_empty(limiter, "p")


def test_two_parents_are_independent() -> None:
    limiter = FanoutLimiter()

    async def main() -> None:
        async with limiter.slot("a", 1), limiter.slot("b", 2), limiter.slot("b", 2):
            assert (limiter.active("a"), limiter.active("b")) == (1, 2)
            # a is full, b is full, yet neither blocks the other's accounting
            with pytest.raises(FanoutTimeout):
                async with limiter.slot("a", 1, timeout_s=0.01):
                    pass
            assert (limiter.waiting("a"), limiter.waiting("b")) == (0, 0)

    asyncio.run(main())
    assert_empty(limiter, "a", "b")


def test_nested_fanout_a_child_is_itself_a_parent() -> None:
    limiter, recorder = recorded_limiter()
    leaves: list[str] = []
    max_seen = {"root": 0, "mid-0": 0, "mid-1": 0, "mid-2": 0}

    async def leaf(parent: str, i: int) -> None:
        async with limiter.slot(parent, 2):
            max_seen[parent] = max(max_seen[parent], limiter.active(parent))
            await asyncio.sleep(0.002)
            leaves.append(f"{parent}/{i}")

    async def mid(i: int) -> None:
        async with limiter.slot("root", 2):
            max_seen["root"] = max(max_seen["root"], limiter.active("root"))
            await asyncio.gather(*(leaf(f"mid-{i}", j) for j in range(5)))

    async def main() -> None:
        await asyncio.gather(*(mid(i) for i in range(3)))

    asyncio.run(main())
    assert len(leaves) == 15
    assert max_seen == {"root": 2, "mid-0": 2, "mid-1": 2, "mid-2": 2}
    for parent in max_seen:
        assert recorder.count("first", parent) == recorder.count("last", parent) == 1
    assert_empty(limiter, *max_seen)


def test_waiters_are_served_first_in_first_out() -> None:
    limiter = FanoutLimiter()
    order: list[int] = []

    async def child(i: int, gate: asyncio.Event) -> None:
        async with limiter.slot("p", 1):
            order.append(i)
            await gate.wait()

    async def main() -> None:
        gate = asyncio.Event()
        tasks = []
        for i in range(6):
            tasks.append(asyncio.create_task(child(i, gate)))
            await asyncio.sleep(0)  # queue them in a known order
        assert (limiter.active("p"), limiter.waiting("p")) == (1, 5)
        gate.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert order == list(range(6))


def test_a_thread_timeout_leaves_no_trace() -> None:
    limiter = FanoutLimiter()
    with limiter.slot("p", 1):
        started = time.monotonic()
        with pytest.raises(FanoutTimeout) as caught, limiter.slot("p", 1, timeout_s=0.05):
            pass
        assert time.monotonic() - started >= 0.05
        assert (limiter.active("p"), limiter.waiting("p")) == (1, 0)
    assert_empty(limiter, "p")
    error = caught.value
    assert isinstance(error, TimeoutError) and isinstance(error, GovernorError)
    assert (error.parent_id, error.max_fanout, error.timeout_s) == ("p", 1, 0.05)
    assert "raise max_fanout" in str(error)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.timeout_s) == (FanoutTimeout, str(error), 0.05)


def test_a_released_slot_wakes_exactly_the_next_waiter() -> None:
    limiter = FanoutLimiter()
    got: list[str] = []

    async def waiter(name: str) -> None:
        async with limiter.slot("p", 1):
            got.append(name)
            await asyncio.sleep(1)  # holds the slot until cancelled

    async def main() -> None:
        holder = limiter.slot("p", 1)
        await holder.__aenter__()
        first = asyncio.create_task(waiter("first"))
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0.01)
        await holder.__aexit__(None, None, None)
        await asyncio.sleep(0.01)
        assert got == ["first"]
        assert (limiter.active("p"), limiter.waiting("p")) == (1, 1)
        for task in (first, second):
            task.cancel()
        await asyncio.gather(first, second, return_exceptions=True)

    asyncio.run(main())
    assert_empty(limiter, "p")


def test_a_hundred_random_cancellations_leak_nothing() -> None:
    limiter, recorder = recorded_limiter()
    rng = random.Random(4)
    finished: list[int] = []

    async def child(parent: str, i: int) -> None:
        async with limiter.slot(parent, 3):
            assert limiter.active(parent) <= 3
            await asyncio.sleep(rng.uniform(0, 0.004))
            finished.append(i)

    async def main() -> None:
        tasks = [asyncio.create_task(child(f"p{i % 4}", i)) for i in range(200)]
        for task in rng.sample(tasks, 100):
            await asyncio.sleep(rng.uniform(0, 0.001))
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
        assert cancelled + len(finished) == 200 and cancelled > 0

    asyncio.run(main())
    assert_empty(limiter, "p0", "p1", "p2", "p3")
    for parent in ("p0", "p1", "p2", "p3"):
        assert recorder.count("first", parent) == recorder.count("last", parent) >= 1
    assert not recorder.busy


def test_async_timeouts_mixed_with_releases_leak_nothing() -> None:
    limiter = FanoutLimiter()
    outcomes: list[str] = []

    async def child(timeout_s: float) -> None:
        try:
            async with limiter.slot("p", 2, timeout_s=timeout_s):
                await asyncio.sleep(0.003)
                outcomes.append("ran")
        except FanoutTimeout:
            outcomes.append("timed out")

    async def main() -> None:
        rng = random.Random(7)
        await asyncio.gather(*(child(rng.uniform(0, 0.01)) for _ in range(60)))

    asyncio.run(main())
    assert len(outcomes) == 60 and {"ran", "timed out"} <= set(outcomes)
    assert_empty(limiter, "p")


def test_a_failing_first_hook_gives_no_slot() -> None:
    def refuse(parent_id: Hashable) -> None:
        raise RuntimeError("cannot park")

    limiter = FanoutLimiter(on_first_child=refuse)
    with pytest.raises(RuntimeError, match="cannot park"), limiter.slot("p", 2):
        pass
    assert_empty(limiter, "p")


def test_caller_errors_say_what_to_do() -> None:
    limiter = FanoutLimiter()
    with pytest.raises(ConfigError, match="max_fanout=1 or more"):
        limiter.slot("p", 0)
    with pytest.raises(ConfigError, match="timeout_s"):
        limiter.slot("p", 1, timeout_s=-1)
    slot = limiter.slot("p", 2)
    with slot:
        with pytest.raises(ConfigError, match="same max_fanout"), limiter.slot("p", 3):
            pass
        with pytest.raises(ConfigError, match="already held"), slot:
            pass
        assert limiter.active("p") == 1
    with slot:  # reusable once released
        assert limiter.active("p") == 1
    assert_empty(limiter, "p")
