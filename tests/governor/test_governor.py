"""Leases and admission with real asyncio and threads, on FakeBackend (exact block
accounting, no model) and on LocalBackend over the tiny-random engine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from backends import LocalBackend
from governor import (
    AdmissionMode,
    AdmissionRejected,
    AgentSpec,
    CeilingExceeded,
    ConfigError,
    GovernorConfig,
)
from governor.errors import AdmissionTimeout
from governor.governor import Governor
from governor.lease import LeaseState
from governor.testing import FakeBackend

WORKER = AgentSpec(name="worker", ceiling_tokens=1_600)  # 100 blocks of 16 tokens
MESSAGES = [{"role": "user", "content": "Summarize the build log."}]


def _governor(num_blocks: int = 900, **config: object) -> tuple[Governor, FakeBackend]:
    backend = FakeBackend(num_blocks=num_blocks, block_size=16)
    governor = Governor(backend, config=GovernorConfig(**config), agents=[WORKER])  # type: ignore[arg-type]
    return governor, backend


def _assert_nothing_held(governor: Governor, backend: FakeBackend) -> None:
    active, waiting, _ = governor.admission.counts()
    assert (active, waiting) == (0, 0)
    assert not governor._budgets_open
    assert backend.metrics().num_blocks_in_use == 0


def test_fifty_agents_on_a_budget_for_eight() -> None:
    governor, backend = _governor()  # floor(900 * 0.9 / 100) = 8 at a time
    assert governor.admission.max_concurrent(WORKER.ceiling_tokens) == 8
    seen_active: list[int] = []

    async def agent(i: int) -> int:
        async with governor.lease("worker") as lease:
            seen_active.append(governor.admission.counts()[0])
            await asyncio.sleep(0)  # a real agent awaits I/O here: the others run
            result = await governor.acomplete(lease, MESSAGES, max_tokens=20)
            assert lease.tokens_in_context == result.prompt_tokens + result.completion_tokens
            return i

    async def main() -> list[int]:
        return await asyncio.gather(*(agent(i) for i in range(50)))

    assert sorted(asyncio.run(main())) == list(range(50))
    assert max(seen_active) <= 8 and governor.admission.counts()[2] == 8
    assert backend.peak_blocks_in_use <= 900
    _assert_nothing_held(governor, backend)


def test_threads_use_the_sync_twin() -> None:
    governor, backend = _governor()
    done: list[int] = []

    def agent(i: int) -> None:
        with governor.lease("worker") as lease:
            assert lease.state is LeaseState.ACTIVE
            governor.complete(lease, MESSAGES, max_tokens=5)
            done.append(i)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(done) == list(range(20))
    assert governor.admission.counts()[2] <= 8
    _assert_nothing_held(governor, backend)


def test_a_ceiling_that_can_never_fit_is_refused_with_the_largest_possible() -> None:
    governor, _ = _governor()
    with pytest.raises(AdmissionRejected) as info:
        governor.lease("worker", ceiling_tokens=20_000)
    assert info.value.requested == 20_000
    assert info.value.possible == 810 * 16


def test_a_prompt_over_the_ceiling_is_refused_before_the_call() -> None:
    governor, backend = _governor()
    with (
        governor.lease("worker", ceiling_tokens=8) as lease,
        pytest.raises(CeilingExceeded) as info,
    ):
        governor.complete(lease, [{"role": "user", "content": "word " * 20}])
    assert info.value.ceiling == 8
    assert not backend.calls
    _assert_nothing_held(governor, backend)


def test_parking_lets_another_lease_in_and_resume_waits_its_turn() -> None:
    governor, backend = _governor(num_blocks=120)  # room for one 100-block lease
    planner = governor.lease("worker")
    lease = planner.__enter__()
    governor.park(lease)
    assert lease.state is LeaseState.PARKED
    with governor.lease("worker") as child:  # admitted only because the planner parked
        assert child.state is LeaseState.ACTIVE
        governor.complete(child, MESSAGES, max_tokens=3)
    governor.resume(lease)
    assert lease.state is LeaseState.ACTIVE
    planner.__exit__(None, None, None)
    _assert_nothing_held(governor, backend)


def test_a_waiter_that_times_out_leaves_the_queue() -> None:
    governor, backend = _governor(num_blocks=120, admission_timeout_s=0.05)
    with governor.lease("worker"):
        with pytest.raises(AdmissionTimeout), governor.lease("worker"):
            pass
        assert governor.admission.counts()[1] == 0
    _assert_nothing_held(governor, backend)


def test_overcommit_admits_far_more_than_guaranteed() -> None:
    peaks = {}
    for mode in AdmissionMode:
        governor, backend = _governor(mode=mode)

        async def agent(governor: Governor = governor) -> None:
            async with governor.lease("worker") as lease:
                await governor.acomplete(lease, MESSAGES, max_tokens=40)
                await asyncio.sleep(0.01)

        async def main() -> None:
            await asyncio.gather(*(agent() for _ in range(60)))

        asyncio.run(main())
        peaks[mode] = governor.admission.counts()[2]
        _assert_nothing_held(governor, backend)
    assert peaks[AdmissionMode.GUARANTEED] == 8
    assert peaks[AdmissionMode.OVERCOMMIT] >= 2.5 * peaks[AdmissionMode.GUARANTEED]


def test_leases_on_the_bundled_engine() -> None:
    backend = LocalBackend(config={"num_blocks": 96})
    agent = AgentSpec(name="coder", ceiling_tokens=256)  # 16 blocks: 5 at a time
    governor = Governor(backend, agents=[agent])
    try:

        async def run(i: int) -> str:
            async with governor.lease("coder") as lease:
                messages = [{"role": "user", "content": f"Task {i}: fix the test."}]
                result = await governor.acomplete(lease, messages, max_tokens=8)
                return result.finish_reason

        async def main() -> list[str]:
            return await asyncio.gather(*(run(i) for i in range(12)))

        assert set(asyncio.run(main())) <= {"length", "stop"}
        assert governor.admission.counts() == (0, 0, 5)
        metrics = backend.metrics()
        assert metrics.num_blocks_in_use == 0 and metrics.num_requests_running == 0
    finally:
        backend.close()


def test_grow_is_granted_queued_or_refused() -> None:
    governor, backend = _governor(num_blocks=230)  # limit floor(230 * 0.9) = 207 blocks
    with governor.lease("worker") as a:
        a.grow(160)  # 110 blocks: fits beside nothing else
        assert (a.ceiling_tokens, a.state) == (1_760, LeaseState.ACTIVE)
        with pytest.raises(AdmissionRejected):
            a.grow(2_000)  # 235 blocks can never fit
        assert a.ceiling_tokens == 1_760
        b_context = governor.lease("worker", ceiling_tokens=1_536)  # 96 blocks
        b = b_context.__enter__()
        grown = threading.Event()

        def grow() -> None:
            a.grow(32)  # 112 + 96 = 208 > 207: queued until b is released
            grown.set()

        thread = threading.Thread(target=grow)
        thread.start()
        assert not grown.wait(0.1)
        assert a.state is LeaseState.WAITING
        b_context.__exit__(None, None, None)
        thread.join(timeout=10)
        assert grown.is_set() and a.ceiling_tokens == 1_792 and a.state is LeaseState.ACTIVE
        assert b.state is LeaseState.RELEASED
    _assert_nothing_held(governor, backend)


def test_a_lease_with_a_parent_comes_only_from_child_or_fanout() -> None:
    """``lease(parent=...)`` would take no fan-out slot: refused, saying what to use."""
    governor, backend = _governor(num_blocks=900)
    governor.register_agent(PLANNER)
    with governor.lease("planner") as planner:
        with pytest.raises(ConfigError, match=r"governor\.child\(parent, 'worker'\)") as info:
            governor.lease("worker", parent=planner)
        assert info.value.setting == "parent"
        assert governor.admission.counts()[:2] == (1, 0)  # nothing was requested
        with governor.child(planner, "worker") as child:
            assert governor.fanout_limiter.active(planner.lease_id) == 1
            assert child.parent is planner
    _assert_nothing_held(governor, backend)


PLANNER = AgentSpec(name="planner", ceiling_tokens=1_600, max_fanout=3)


def _planner_run(governor: Governor, num_workers: int) -> tuple[int, int]:
    """A planner fans out to workers; returns (workers finished, most active at once)."""
    active = 0
    most = 0

    async def work(child) -> None:  # type: ignore[no-untyped-def]
        nonlocal active, most
        async with child as lease:
            active += 1
            most = max(most, active)
            await governor.acomplete(lease, MESSAGES, max_tokens=4)
            await asyncio.sleep(0.005)
            active -= 1

    async def main() -> int:
        async with governor.lease(PLANNER) as planner:
            await governor.acomplete(planner, MESSAGES, max_tokens=4)
            children = governor.fanout(planner, WORKER, num_workers)
            await asyncio.gather(*(work(child) for child in children))
            await governor.acomplete(planner, MESSAGES, max_tokens=4)  # resumed
            assert planner.state is LeaseState.ACTIVE
            return len(children)

    return asyncio.run(main()), most


def test_a_planner_with_twelve_workers_and_fanout_three_cannot_deadlock() -> None:
    # Room for three 100-block leases: the planner and three workers fit only because
    # the planner is parked while its workers run.
    governor, backend = _governor(num_blocks=340)
    report = governor.check_topology(planner=PLANNER, worker=WORKER, num_workers=12)
    assert report.fit("guaranteed", parking=True).fits
    assert not report.fit("guaranteed", parking=False).fits
    finished, most = _planner_run(governor, 12)
    assert (finished, most) == (12, 3)
    assert governor.fanout_limiter.num_parents == 0
    _assert_nothing_held(governor, backend)


def test_on_the_bundled_engine_fifty_agents_and_a_planner_with_workers() -> None:
    """The same guarantees with LocalBackend over the tiny-random engine."""
    small_worker = AgentSpec(name="worker", ceiling_tokens=256)  # 16 blocks
    small_planner = AgentSpec(name="planner", ceiling_tokens=256, max_fanout=3)
    backend = LocalBackend(config={"num_blocks": 143})  # floor(143 * 0.9) = 128: 8 leases
    governor = Governor(backend, agents=[small_worker, small_planner])
    try:
        assert governor.admission.max_concurrent(256) == 8

        async def agent(i: int) -> str:
            async with governor.lease("worker") as lease:
                messages = [{"role": "user", "content": f"step {i}"}]
                return (await governor.acomplete(lease, messages, max_tokens=4)).finish_reason

        async def main() -> list[str]:
            return await asyncio.gather(*(agent(i) for i in range(50)))

        assert len(asyncio.run(main())) == 50
        assert governor.admission.counts() == (0, 0, 8)

        active = most = 0

        async def work(child) -> None:  # type: ignore[no-untyped-def]
            nonlocal active, most
            async with child as lease:
                active += 1
                most = max(most, active)
                await governor.acomplete(lease, MESSAGES, max_tokens=4)
                active -= 1

        async def planner_run() -> None:
            async with governor.lease("planner") as planner:
                await asyncio.gather(*(work(c) for c in governor.fanout(planner, "worker", 12)))
                await governor.acomplete(planner, MESSAGES, max_tokens=4)

        asyncio.run(planner_run())
        assert most == 3
        metrics = backend.metrics()
        assert metrics.num_blocks_in_use == 0 and metrics.num_requests_running == 0
        assert not governor._budgets_open
    finally:
        backend.close()


def test_a_streamed_call_records_its_usage() -> None:
    governor, backend = _governor()

    async def main() -> tuple[str, int]:
        async with governor.lease("worker") as lease:
            text = ""
            async for chunk in governor.astream(lease, MESSAGES, max_tokens=6):
                text += chunk.text
            return text, lease.tokens_in_context

    text, tokens = asyncio.run(main())
    assert text and tokens == backend.count_messages(MESSAGES) + 6
    _assert_nothing_held(governor, backend)


def test_a_registered_prefix_is_pinned_once_and_reused_by_every_lease() -> None:
    backend = LocalBackend(config={"num_blocks": 200})
    coder = AgentSpec(name="coder", ceiling_tokens=512, prefix="house-rules")
    governor = Governor(backend, agents=[coder])
    try:
        before = governor.admission.available_blocks
        rules = "You are a careful coding agent. Follow the house rules. " * 8
        handle = governor.register_prefix("house-rules", rules, tenant="acme")
        assert handle.num_blocks >= 2
        assert governor.admission.available_blocks == before - handle.num_blocks
        results = []
        for task in ("fix the test", "write the docs"):
            with governor.lease("coder", tenant="acme") as lease:
                messages = [{"role": "user", "content": task}]
                results.append(governor.complete(lease, messages, max_tokens=4))
        assert all(r.cached_tokens >= handle.num_pinned_tokens for r in results)
        with (
            pytest.raises(ConfigError, match="not registered"),
            governor.lease("coder", tenant="other") as lease,
        ):
            governor.complete(lease, [{"role": "user", "content": "hi"}])
        governor.unregister_prefix("house-rules", tenant="acme")
        assert governor.admission.available_blocks == before
        assert backend.metrics().num_blocks_pinned == 0
    finally:
        backend.close()


def test_per_agent_caps_let_other_agents_pass_and_priority_goes_first() -> None:
    backend = FakeBackend(num_blocks=900)
    reviewer = AgentSpec(name="reviewer", ceiling_tokens=160)
    governor = Governor(backend, config=GovernorConfig(max_per_agent=1), agents=[WORKER, reviewer])
    first = governor.lease("worker").__enter__()
    blocked = governor.lease("worker")
    order: list[str] = []

    def take(context, name: str) -> None:  # type: ignore[no-untyped-def]
        with context:
            order.append(name)

    thread = threading.Thread(target=take, args=(blocked, "worker-2"))
    thread.start()
    with governor.lease("reviewer") as review:  # not held back by the worker's cap
        assert review.state is LeaseState.ACTIVE
    assert order == []
    governor.release(first)
    thread.join(timeout=10)
    assert order == ["worker-2"]
    _assert_nothing_held(governor, backend)


def test_higher_priority_waiters_are_admitted_first() -> None:
    governor, backend = _governor(num_blocks=120)  # one lease at a time
    holder = governor.lease("worker").__enter__()
    order: list[int] = []

    def take(priority: int) -> None:
        with governor.lease("worker", priority=priority):
            order.append(priority)

    threads = [threading.Thread(target=take, args=(p,)) for p in (0, 5, 1)]
    for thread in threads:
        thread.start()
        deadline = time.monotonic() + 10
        while governor.admission.counts()[1] < threads.index(thread) + 1:
            assert time.monotonic() < deadline, "a waiter never queued"
            time.sleep(0.001)  # queued in this order
    governor.release(holder)
    for thread in threads:
        thread.join(timeout=10)
    assert order == [5, 1, 0]
    _assert_nothing_held(governor, backend)
