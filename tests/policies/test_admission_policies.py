"""The admission policies: exact orders, and fair share end to end through a governor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor import (
    AgentSpec,
    ConfigError,
    Governor,
    GovernorConfig,
    Lease,
    LeaseState,
    Policies,
)
from governor.admission import AdmissionController, Waiter
from governor.admission_policy import AdmissionPolicy
from governor.testing import FakeBackend
from policies.fair_share import FairShare
from policies.fifo import Fifo
from policies.program_order import ProgramOrder

WORKER = AgentSpec(name="worker", ceiling_tokens=160)  # 10 blocks of 16 tokens
MESSAGES = [{"role": "user", "content": "Run the tests."}]


def lease(lease_id: str, arrival: int, *, tenant: str | None = None, priority: int = 0) -> Lease:
    return Lease(
        lease_id=lease_id,
        agent=WORKER,
        ceiling_tokens=WORKER.ceiling_tokens,
        priority=priority,
        block_size=16,
        arrival=arrival,
        requested_at=0.0,
        tenant=tenant,
    )


def ids(leases: list[Lease]) -> list[str]:
    return [lease.lease_id for lease in leases]


@pytest.mark.parametrize("policy", [Fifo(), FairShare()])
def test_the_policies_are_admission_policies(policy: object) -> None:
    assert isinstance(policy, AdmissionPolicy)
    assert repr(policy) in ("Fifo()", "FairShare()")


# -- Fifo -------------------------------------------------------------------------------
def test_fifo_is_arrival_order_whatever_the_priority_or_the_wait() -> None:
    waiting = [
        lease("c", 7, priority=9),
        lease("a", 2, priority=-1),
        lease("d", 8),
        lease("b", 5, priority=3, tenant="acme"),
    ]
    assert ids(Fifo().order(waiting, active=[lease("x", 0)], now=1e6)) == ["a", "b", "c", "d"]
    assert Fifo().order([], active=(), now=0.0) == []
    # Its key (the controller keeps the queue sorted by it) is that same order.
    assert ids(sorted(waiting, key=Fifo().key)) == ["a", "b", "c", "d"]


# -- FairShare ----------------------------------------------------------------------------
def test_fair_share_with_nothing_active_interleaves_tenants_from_the_earliest() -> None:
    waiting = [lease(f"a{i}", i, tenant="A") for i in range(5)] + [lease("b0", 10, tenant="B")]
    assert ids(FairShare().order(waiting, active=(), now=0.0)) == [
        "a0",
        "b0",
        "a1",
        "a2",
        "a3",
        "a4",
    ]
    waiting[-1].arrival = -1  # b0 arrived first
    assert ids(FairShare().order(waiting, active=(), now=0.0))[:3] == ["b0", "a0", "a1"]


def test_fair_share_starts_with_the_tenants_holding_the_fewest_active_leases() -> None:
    active = [
        lease("A-run-1", 0, tenant="A"),
        lease("A-run-2", 1, tenant="A"),
        lease("none-run", 2),
    ]
    waiting = [
        lease("a1", 10, tenant="A"),
        lease("a2", 11, tenant="A"),
        lease("n1", 12),
        lease("b1", 13, tenant="B"),
        lease("b2", 14, tenant="B"),
        lease("b3", 15, tenant="B"),
    ]
    # ranks: B 0 1 2, tenant None 1, A 2 3; ties by arrival
    order = FairShare().order(waiting, active=active, now=0.0)
    assert ids(order) == ["b1", "n1", "b2", "a1", "b3", "a2"]


def test_fair_share_orders_a_tenant_by_priority_then_arrival() -> None:
    waiting = [
        lease("low", 1, tenant="A"),
        lease("high", 4, tenant="A", priority=2),
        lease("mid-early", 2, tenant="A", priority=1),
        lease("mid-late", 3, tenant="A", priority=1),
    ]
    order = FairShare().order(waiting, active=(), now=0.0)
    assert ids(order) == ["high", "mid-early", "mid-late", "low"]


def test_fair_share_ties_between_tenants_go_by_arrival_not_priority() -> None:
    waiting = [lease("b-urgent", 5, tenant="B", priority=100), lease("a-calm", 1, tenant="A")]
    assert ids(FairShare().order(waiting, active=(), now=0.0)) == ["a-calm", "b-urgent"]


def test_fair_share_counts_leases_without_a_tenant_as_one_tenant() -> None:
    waiting = [lease("n1", 1), lease("n2", 2), lease("n3", 3), lease("t1", 4, tenant="t")]
    assert ids(FairShare().order(waiting, active=(), now=0.0)) == ["n1", "t1", "n2", "n3"]


@given(
    st.lists(st.tuples(st.sampled_from(["A", "B", "C", None]), st.integers(-2, 2)), max_size=25),
    st.lists(st.sampled_from(["A", "B", "C", None]), max_size=6),
)
def test_fair_share_returns_each_waiting_lease_once_in_round_robin(
    specs: list[tuple[str | None, int]], active_tenants: list[str | None]
) -> None:
    waiting = [lease(str(i), i, tenant=t, priority=p) for i, (t, p) in enumerate(specs)]
    active = [lease(f"run{i}", -1 - i, tenant=t) for i, t in enumerate(active_tenants)]
    order = FairShare().order(waiting, active=active, now=0.0)
    assert sorted(ids(order), key=int) == ids(waiting)
    # Any prefix of the order spreads over the tenants: counting the active ones, no
    # tenant ever gets two leases ahead of one that still has leases waiting.
    held = {t: active_tenants.count(t) for t in ("A", "B", "C", None)}
    left = {t: sum(1 for x in waiting if x.tenant == t) for t in held}
    for x in order:
        assert all(held[x.tenant] <= held[t] for t in held if left[t])
        held[x.tenant] += 1
        left[x.tenant] -= 1


def test_three_free_slots_admit_one_of_b_and_two_of_a_in_one_pass() -> None:
    ctl = AdmissionController(
        config=GovernorConfig(safety_factor=1.0),
        available_blocks=0,
        block_size=16,
        policy=FairShare(),
    )
    waiting = [lease(f"a{i}", i, tenant="A") for i in range(5)] + [lease("b0", 5, tenant="B")]
    for x in waiting:
        ctl.enqueue(x, Waiter())
    assert ctl.counts()[:2] == (0, 6)
    ctl.set_available_blocks(30)  # three 10-block slots at once
    admitted = [x.lease_id for x in waiting if x.state is LeaseState.ACTIVE]
    assert admitted == ["a0", "a1", "b0"] and ctl.counts()[:2] == (3, 3)


# -- end to end -----------------------------------------------------------------------------
async def _until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


def _admission_order(policy: AdmissionPolicy | None) -> list[str]:
    """Two slots held by tenantless leases, four leases of tenant a queued, then four of
    b; each admitted lease makes a call and holds its slot until the test releases it,
    the longest-held first, so capacity frees one slot at a time."""
    backend = FakeBackend(num_blocks=23, block_size=16)  # floor(23 * 0.9) = 20: two leases
    policies = Policies(admission=policy)
    governor = Governor(backend, config=GovernorConfig(), agents=[WORKER], policies=policies)
    names = [("h1", None), ("h2", None)]
    names += [(f"{t}{i}", t) for t in "ab" for i in range(1, 5)]
    admitted: list[str] = []

    async def main() -> None:
        done = {name: asyncio.Event() for name, _ in names}

        async def agent(name: str, tenant: str | None) -> None:
            async with governor.lease("worker", tenant=tenant) as lease:
                admitted.append(name)
                await governor.acomplete(lease, MESSAGES, max_tokens=2)
                await done[name].wait()

        tasks = []
        for i, (name, tenant) in enumerate(names):
            tasks.append(asyncio.create_task(agent(name, tenant)))
            await _until(lambda i=i: sum(governor.admission.counts()[:2]) == i + 1)
        assert governor.admission.counts()[:2] == (2, 8)
        for k in range(len(names)):
            done[admitted[k]].set()
            await _until(lambda k=k: len(admitted) == min(k + 3, len(names)))
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert governor.admission.counts()[:2] == (0, 0)
    assert backend.metrics().num_blocks_in_use == 0
    return admitted[2:]


def test_fair_share_admits_tenants_in_turn_as_slots_free_one_at_a_time() -> None:
    order = _admission_order(FairShare())
    assert order == ["a1", "b1", "a2", "b2", "a3", "b3", "a4", "b4"]


@pytest.mark.parametrize("policy", [None, Fifo()], ids=["default", "fifo"])
def test_without_fair_share_the_earlier_tenant_takes_every_slot(
    policy: AdmissionPolicy | None,
) -> None:
    order = _admission_order(policy)
    assert order == ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"]


# -- ProgramOrder -------------------------------------------------------------------------
def test_program_order_serves_a_parked_programs_next_call_before_programs_begun_after() -> None:
    """The controller's own run: program A (a planner and its worker) began first; B's
    planner queued while A's worker was on a tool. When A's worker queues again for its
    next call it goes ahead of B, where the default ages it from its new queue time and
    puts it behind."""
    from tests.governor.test_admission_policy import (
        admitted_one_at_a_time,
        controller,
        queue_behind_a_holder,
    )
    from tests.governor.test_admission_policy import lease as timed_lease

    for policy, expected in ((ProgramOrder(), ["a-worker", "b"]), (None, ["b", "a-worker"])):
        ctl, clock, woken = controller(1, policy=policy)
        planner = timed_lease(0, requested_at=0.0)
        worker = timed_lease(1, requested_at=1.0)
        worker.lease_id, worker.parent = "a-worker", planner
        ctl.enqueue(worker, woken.waiter(worker))
        assert worker.state is LeaseState.ACTIVE
        clock.at = 50.0
        ctl.park(worker)  # on a tool
        holder = queue_behind_a_holder(ctl, woken, [])
        b = timed_lease(2, requested_at=50.0)
        b.lease_id = "b"
        ctl.enqueue(b, woken.waiter(b))
        clock.at = 52.0
        ctl.enqueue(worker, woken.waiter(worker))  # its tool returned: its next call
        assert admitted_one_at_a_time(ctl, woken, holder) == expected, policy
    # A worker requested after B began, of a program begun before it, goes first too.
    for policy, expected in ((ProgramOrder(), ["late-worker", "b"]), (None, ["b", "late-worker"])):
        ctl, clock, woken = controller(1, policy=policy)
        b = timed_lease(2, requested_at=50.0)
        b.lease_id = "b"
        late = timed_lease(3, requested_at=60.0)
        late.lease_id, late.parent = "late-worker", timed_lease(0, requested_at=0.0)
        clock.at = 60.0
        holder = queue_behind_a_holder(ctl, woken, [b, late])
        assert admitted_one_at_a_time(ctl, woken, holder) == expected, policy


def test_program_order_is_priority_with_aging_from_the_programs_request() -> None:
    old, new = lease("old-root", 0), lease("new-root", 1, priority=1)
    new.requested_at = 5.0
    child = lease("old-child", 7)
    child.parent, child.requested_at = old, 30.0
    # 10 s a level: the old program (begun at 0) has aged half a level on the new one
    # (priority 1, begun at 5): the new one goes first, then the old program's leases.
    assert ids(ProgramOrder().order([child, new, old], active=(), now=40.0)) == [
        "new-root",
        "old-root",
        "old-child",
    ]
    # At 2 s a level it has aged 2.5 levels: every lease of the old program first.
    assert ids(ProgramOrder(aging_s=2.0).order([new, child, old], active=(), now=40.0)) == [
        "old-root",
        "old-child",
        "new-root",
    ]
    # Programs requested at the same moment: the first to arrive goes first, its
    # children with it, though they arrived after the other program.
    first, second = lease("first", 2), lease("second", 3)
    kid = lease("kid", 9)
    kid.parent = first
    assert ids(ProgramOrder().order([second, kid, first], active=(), now=0.0)) == [
        "first",
        "kid",
        "second",
    ]
    assert isinstance(ProgramOrder(), AdmissionPolicy)
    with pytest.raises(ConfigError, match="aging_s must be a number of seconds > 0"):
        ProgramOrder(aging_s=0)
