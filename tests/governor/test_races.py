"""Races between an agent's own calls and the governor's other threads: the deadline
thread parking an idle lease, another thread growing or releasing it. The reservation
ledger the admission controller keeps must equal the sum over the leases at every
moment, and a lease whose next call has begun is never parked under it."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from governor import AgentSpec, Governor, GovernorConfig, LeaseState
from governor.admission import AdmissionController, Waiter
from governor.lease import Lease
from governor.testing import FakeBackend

WORKER = AgentSpec(name="worker", ceiling_tokens=320)  # 20 blocks
TASK = [{"role": "user", "content": "Find the failing test."}]


@pytest.fixture
def fine_switching() -> Iterator[None]:
    """Switch threads every few microseconds, so the interleavings a race needs happen."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_a_lease_whose_next_call_has_begun_is_never_parked() -> None:
    """The park deadline fires just as the lease's next call begins: the call either
    sees the lease parked (and waits to be admitted again) or it is not parked at all.
    The call begins, here, in the moment between the deadline's check and its park."""
    backend = FakeBackend(num_blocks=200)
    config = GovernorConfig(park_after_s=0.02, retain_s=0)
    governor = Governor(backend, config=config, agents=[WORKER])
    park = governor.idle._park
    seen: list[LeaseState] = []

    def call_begins_meanwhile(lease: Lease) -> bool:
        def begin_call() -> None:  # what Governor.resume does first
            governor.idle.end(lease)
            seen.append(lease.state)  # ACTIVE: the call goes ahead without admission

        caller = threading.Thread(target=begin_call)
        caller.start()
        caller.join(1.0)  # it waits for the lock the deadline holds, or goes ahead
        return park(lease)

    governor.idle._park = call_begins_meanwhile
    with governor.lease("worker") as lease:
        governor.complete(lease, TASK, max_tokens=2)
        with governor.tool_call(lease, "ls"):
            deadline = time.monotonic() + 5
            while not seen:
                assert time.monotonic() < deadline, "the park deadline never fired"
                time.sleep(0.005)
        assert seen == [lease.state]  # what the call saw is what holds: never parked under it
    assert governor.admission.counts()[:2] == (0, 0)


class _Watched(Lease):
    """A lease that runs ``on_grow`` (once) the moment its ceiling is set above ``at``."""

    __slots__ = ()
    hooks: dict[int, object] = {}  # noqa: RUF012 - id(lease) -> hook, set once per test

    @property  # type: ignore[override]
    def ceiling_tokens(self) -> int:
        return Lease.ceiling_tokens.__get__(self)  # type: ignore[attr-defined,no-any-return]

    @ceiling_tokens.setter
    def ceiling_tokens(self, value: int) -> None:
        Lease.ceiling_tokens.__set__(self, value)  # type: ignore[attr-defined]
        hook = self.hooks.pop(id(self), None)
        if hook is not None and value > WORKER.ceiling_tokens:
            hook()  # type: ignore[operator]


def test_a_park_while_the_ceiling_grows_subtracts_the_reservation_it_added() -> None:
    """Another thread parks the lease at the moment ``try_grow`` changes its ceiling: it
    must park it either before the change or after it, never subtract the new
    reservation when the old one was added."""
    ctl = AdmissionController(config=GovernorConfig(), available_blocks=1_000, block_size=16)
    lease = _Watched(
        lease_id="0", agent=WORKER, ceiling_tokens=320, priority=0, block_size=16, arrival=0,
        requested_at=0.0,
    )  # fmt: skip
    ctl.enqueue(lease, Waiter())
    assert lease.state is LeaseState.ACTIVE

    def park_meanwhile() -> None:
        parker = threading.Thread(target=ctl.park, args=(lease,))
        parker.start()
        parker.join(0.5)  # it waits for the admission lock, or parks at once

    _Watched.hooks[id(lease)] = park_meanwhile
    ctl.try_grow(lease, 480)
    deadline = time.monotonic() + 5
    while lease.state is not LeaseState.PARKED:
        assert time.monotonic() < deadline, "the park never happened"
        time.sleep(0.001)
    reserved, reserved_sum, held, held_sum = ctl.ledger()
    assert (reserved, held) == (reserved_sum, held_sum) == (0, 0)


def _check_ledger(governor: Governor, stop: threading.Event, errors: list[str]) -> None:
    while not stop.is_set():
        reserved, reserved_sum, held, held_sum = governor.admission.ledger()
        if (reserved, held) != (reserved_sum, held_sum):
            errors.append(f"ledger {reserved}/{held} against leases {reserved_sum}/{held_sum}")
            return
        time.sleep(0.0005)


def test_park_grow_call_and_release_from_threads_and_event_loops_keep_the_ledger(
    fine_switching: None,
) -> None:
    """Agents on threads and on event loops call, run tools (parked by the deadline
    thread mid-tool), grow their ceilings as they run, and release; a checker compares
    the ledger with the leases throughout."""
    backend = FakeBackend(num_blocks=400, num_host_blocks=400)
    config = GovernorConfig(park_after_s=0.001, retain_s=0.01, admission_timeout_s=30)
    governor = Governor(backend, config=config, agents=[WORKER])
    stop, errors = threading.Event(), []
    checker = threading.Thread(target=_check_ledger, args=(governor, stop, errors))
    checker.start()

    def turns(lease: Lease, rng: random.Random) -> Iterator[str]:
        for _ in range(6):
            yield rng.choice(("call", "tool", "grow", "park"))

    def sync_agent(seed: int) -> None:
        rng = random.Random(seed)
        with governor.lease("worker") as lease:
            for turn in turns(lease, rng):
                if turn == "call":
                    governor.complete(lease, TASK, max_tokens=4)
                elif turn == "tool":
                    with governor.tool_call(lease, "pytest"):
                        time.sleep(rng.random() * 0.002)
                        lease.grow(16)  # as the deadline thread parks it
                elif turn == "grow":
                    lease.grow(16)
                else:
                    lease.park()
                    lease.resume()

    async def async_agent(seed: int) -> None:
        rng = random.Random(seed)
        async with governor.lease("worker") as lease:
            for turn in turns(lease, rng):
                if turn == "call":
                    await governor.acomplete(lease, TASK, max_tokens=4)
                elif turn == "tool":
                    async with governor.tool_call(lease, "pytest"):
                        await asyncio.sleep(rng.random() * 0.002)
                        await lease.agrow(16)
                elif turn == "grow":
                    await lease.agrow(16)
                else:
                    lease.park()
                    await lease.aresume()

    def event_loop(first_seed: int) -> None:
        async def main() -> None:
            await asyncio.gather(*(async_agent(first_seed + i) for i in range(6)))

        asyncio.run(main())

    workers = [threading.Thread(target=sync_agent, args=(seed,)) for seed in range(8)]
    workers += [threading.Thread(target=event_loop, args=(100 * n,)) for n in range(1, 4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    stop.set()
    checker.join(timeout=5)
    assert not any(worker.is_alive() for worker in workers)
    assert errors == []
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert governor.admission.counts()[:2] == (0, 0)
    assert not governor._budgets_open
    m = backend.metrics()
    assert (m.num_blocks_in_use, m.num_blocks_swapped) == (0, 0)
