"""Cancellation storms: tasks cancelled at random while they wait for admission, while
their model call is in flight, and while they wait to be admitted again after parking on
a tool call. Whatever the moment, every lease is released exactly once and returns its
budget, its held KV and its place in the ledger, on FakeBackend (exact block accounting,
no model) and on LocalBackend over the tiny-random engine."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from backends import LocalBackend
from governor import AdmissionTimeout, AgentSpec, GovernorConfig, GovernorEvent, Lease, LeaseState
from governor.backend import Backend
from governor.governor import Governor
from governor.testing import FakeBackend

TASK = [{"role": "user", "content": "Find the failing test and explain it in one line."}]


@dataclass(slots=True)
class Storm:
    """What each cancel hit: the state of the task's lease at that moment."""

    leases: dict[int, Lease] = field(default_factory=dict)
    in_call: set[int] = field(default_factory=set)
    hit: Counter[str] = field(default_factory=Counter)

    def classify(self, i: int) -> str:
        lease = self.leases.get(i)
        if lease is None or lease.state is LeaseState.RELEASED:
            return "done"
        if lease.state is LeaseState.WAITING:  # resuming: queued again after parking
            return "resuming" if lease.admitted_at is not None else "waiting"
        if i in self.in_call and lease.state is LeaseState.ACTIVE:
            return "in flight"
        return lease.state.value


def _storm(
    governor: Governor, *, agents: int, seed: int, max_tokens: int, tool_s: float, gap_s: float
) -> tuple[Storm, list[GovernorEvent]]:
    """``agents`` tasks that each call the model, run a tool (parked at once, KV held)
    and call again (queued again: re-admitted), cancelled one by one at random times."""
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    rng = random.Random(seed)
    storm = Storm()

    async def agent(i: int) -> None:
        context = governor.lease("worker")
        storm.leases[i] = context.lease
        async with context as lease:
            for turn in range(2):
                storm.in_call.add(i)
                try:
                    await governor.acomplete(lease, TASK, max_tokens=max_tokens)
                finally:
                    storm.in_call.discard(i)
                if turn == 0:
                    async with governor.tool_call(lease, "pytest"):
                        await asyncio.sleep(tool_s)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(agent(i)) for i in range(agents)]
        left = rng.sample(range(agents), agents)
        # One cancel aimed at each kind of moment as soon as some task is in it, then
        # the rest at random times.
        for moment in ("waiting", "in flight", "resuming"):
            deadline = loop.time() + 30
            while not (found := [i for i in left if storm.classify(i) == moment]):
                assert loop.time() < deadline, f"no task was {moment} within 30 s"
                await asyncio.sleep(0.0005)
            left.remove(i := rng.choice(found))
            storm.hit[moment] += 1
            tasks[i].cancel()
        for i in left:
            await asyncio.sleep(rng.random() * 2 * gap_s)
            storm.hit[storm.classify(i)] += 1
            tasks[i].cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=60)

    asyncio.run(main())
    return storm, events


def _assert_released_exactly_once(
    governor: Governor, backend: Backend, events: list[GovernorEvent]
) -> None:
    assert governor.admission.counts()[:2] == (0, 0)
    assert not governor._budgets_open
    reserved, reserved_sum, held, held_sum = governor.admission.ledger()
    assert (reserved, reserved_sum, held, held_sum) == (0, 0, 0, 0)
    admitted = {e.lease_id for e in events if e.kind == "admitted"}
    released = Counter(e.lease_id for e in events if e.kind == "released")
    assert set(released) == admitted  # every admitted lease ended its span...
    assert set(released.values()) == {1}  # ...once
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (m.num_blocks_pinned, 0)
    assert m.num_requests_running == 0


def test_cancelling_leases_waiting_running_and_resuming_leaks_nothing() -> None:
    backend = FakeBackend(num_blocks=140, block_size=16, latency_s=0.0005)
    worker = AgentSpec(name="worker", ceiling_tokens=320)  # 20 blocks: 6 of 126 at once
    config = GovernorConfig(park_after_s=0, retain_s=5)
    governor = Governor(backend, config=config, agents=[worker])
    storm, events = _storm(governor, agents=100, seed=7, max_tokens=16, tool_s=0.004, gap_s=0.004)
    # Each kind of moment was hit, the re-admission after parking among them.
    assert {"waiting", "in flight", "resuming"} <= set(storm.hit), storm.hit
    _assert_released_exactly_once(governor, backend, events)


def test_cancelling_leases_on_the_engine_leaks_nothing() -> None:
    backend = LocalBackend(config={"num_blocks": 100})
    worker = AgentSpec(name="worker", ceiling_tokens=256)  # 16 blocks: 5 of 90 at once
    config = GovernorConfig(park_after_s=0, retain_s=5)
    governor = Governor(backend, config=config, agents=[worker])
    try:
        storm, events = _storm(governor, agents=24, seed=11, max_tokens=12, tool_s=0.02, gap_s=0.04)
        assert {"waiting", "in flight", "resuming"} <= set(storm.hit), storm.hit
        backend._loop.call(lambda: None)  # aborts queued by cancelled streams have run
        _assert_released_exactly_once(governor, backend, events)
    finally:
        backend.close()


def test_a_resume_that_times_out_leaves_the_lease_parked_and_its_release_returns_all() -> None:
    """On a thread: the lease parks on a tool, another takes the room, and its
    re-admission times out. It stays its owner's, PARKED, and leaving the block still
    closes its budget, ends its hold and says ``released`` once."""
    backend = FakeBackend(num_blocks=112, block_size=16)  # room for one 1,600-token lease
    agent = AgentSpec(name="agent", ceiling_tokens=1_600)
    config = GovernorConfig(park_after_s=0, retain_s=30, admission_timeout_s=0.05)
    governor = Governor(backend, config=config, agents=[agent])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)
    with governor.lease("agent") as lease:
        governor.complete(lease, TASK, max_tokens=4)
        with governor.tool_call(lease, "build"):
            assert lease.state is LeaseState.PARKED
            other = governor.lease("agent").__enter__()  # its hold moved to host for this
        with pytest.raises(AdmissionTimeout):
            governor.complete(lease, TASK, max_tokens=4)
        assert lease.state is LeaseState.PARKED
        governor.release(other)
    _assert_released_exactly_once(governor, backend, events)
    assert [e.kind for e in events if e.lease_id == lease.lease_id].count("released") == 1


def test_a_lease_admitted_as_its_task_is_cancelled_says_so_before_it_ends() -> None:
    """The first lease's release admits the second and wakes its task, which is cancelled
    before it runs again: the second was admitted, so its events say ``admitted`` and then
    ``released`` (cancelled), and nothing is held."""
    backend = FakeBackend(num_blocks=30, block_size=16)  # 27 usable: one 20-block lease
    worker = AgentSpec(name="worker", ceiling_tokens=320)
    governor = Governor(backend, agents=[worker])
    events: list[GovernorEvent] = []
    governor.subscribe(events.append)

    async def main() -> None:
        first = governor.lease("worker")
        lease = await first.__aenter__()
        second = asyncio.ensure_future(governor.lease("worker").__aenter__())
        for _ in range(10):  # let it queue
            await asyncio.sleep(0)
        assert governor.admission.counts()[:2] == (1, 1)
        governor.release(lease)  # admits the second and wakes its task...
        second.cancel()  # ...which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await second

    asyncio.run(main())
    ids = sorted({e.lease_id for e in events if e.lease_id is not None})
    assert len(ids) == 2
    kinds = [e.kind for e in events if e.lease_id == ids[1]]
    assert kinds == ["requested", "admitted", "released"]
    released = next(e for e in events if e.lease_id == ids[1] and e.kind == "released")
    assert released.attributes["error"] == "cancelled"
    _assert_released_exactly_once(governor, backend, events)
