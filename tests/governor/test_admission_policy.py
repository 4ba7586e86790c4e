"""The admission-policy protocol and its default, through ``AdmissionController`` with a
fake clock and waiters that record the order they are woken in."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governor import AgentSpec, ConfigError, GovernorConfig, Lease, LeaseState
from governor.admission import AdmissionController, Waiter
from governor.admission_policy import AdmissionPolicy, PriorityWithAging
from governor.clock import Timer

WORKER = AgentSpec(name="worker", ceiling_tokens=160)  # 10 blocks of 16 tokens
REVIEWER = AgentSpec(name="reviewer", ceiling_tokens=160)


def lease(
    arrival: int,
    *,
    priority: int = 0,
    requested_at: float = 0.0,
    tenant: str | None = None,
    agent: AgentSpec = WORKER,
    ceiling_tokens: int | None = None,
) -> Lease:
    return Lease(
        lease_id=str(arrival),
        agent=agent,
        ceiling_tokens=agent.ceiling_tokens if ceiling_tokens is None else ceiling_tokens,
        priority=priority,
        block_size=16,
        arrival=arrival,
        requested_at=requested_at,
        tenant=tenant,
    )


class Clock:
    """A ``governor.Clock`` the test sets by hand (``at``); the controller arms no timers."""

    def __init__(self) -> None:
        self.at = 0.0

    def now(self) -> float:
        return self.at

    def wall(self) -> float:
        return self.at

    def call_later(self, seconds: float, fn: Callable[..., None], *args: object) -> Timer:
        raise AssertionError("the admission controller arms no timers")


class Woken:
    """Fake waiters: ``waiter(lease)`` records the lease's id when it is woken."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def waiter(self, lease: Lease) -> Waiter:
        return cast(Waiter, _Wake(self.ids, lease.lease_id))


class _Wake:
    def __init__(self, ids: list[str], lease_id: str) -> None:
        self._ids = ids
        self._lease_id = lease_id

    def wake(self) -> None:
        self._ids.append(self._lease_id)


def controller(
    slots: int, *, policy: AdmissionPolicy | None = None, **config: object
) -> tuple[AdmissionController, Clock, Woken]:
    """A controller with room for ``slots`` 10-block leases (safety factor 1)."""
    clock = Clock()
    ctl = AdmissionController(
        config=GovernorConfig(safety_factor=1.0, **config),  # type: ignore[arg-type]
        available_blocks=10 * slots,
        block_size=16,
        policy=policy,
        clock=clock,
    )
    return ctl, clock, Woken()


def admitted_one_at_a_time(ctl: AdmissionController, woken: Woken, holder: Lease) -> list[str]:
    """Release the one active lease again and again: the order the queue drains in."""
    by_id = {queued.lease.lease_id: queued.lease for queued in ctl._queue}
    order: list[str] = []
    current = holder
    while ctl.counts()[1]:
        before = len(woken.ids)
        ctl.release(current)
        assert len(woken.ids) == before + 1  # one slot freed, one lease admitted
        current = by_id[woken.ids[-1]]
        order.append(current.lease_id)
    ctl.release(current)
    return order


def queue_behind_a_holder(ctl: AdmissionController, woken: Woken, leases: Sequence[Lease]) -> Lease:
    holder = lease(1_000)
    ctl.enqueue(holder, woken.waiter(holder))
    assert holder.state is LeaseState.ACTIVE
    for waiting in leases:
        ctl.enqueue(waiting, woken.waiter(waiting))
    assert ctl.counts()[:2] == (1, len(leases))
    return holder


# -- the default ------------------------------------------------------------------------
def test_the_default_is_priority_with_aging_at_the_configs_aging_s() -> None:
    ctl, _, _ = controller(1, aging_s=3.0)
    assert ctl.policy == PriorityWithAging(aging_s=3.0)
    assert isinstance(ctl.policy, AdmissionPolicy)
    assert PriorityWithAging().aging_s == 10.0


def test_higher_priority_first_and_first_come_first_served_within_a_priority() -> None:
    ctl, _, woken = controller(1)
    priorities = [0, 2, 0, 1, 2, 0]
    holder = queue_behind_a_holder(
        ctl, woken, [lease(i, priority=p) for i, p in enumerate(priorities)]
    )
    assert admitted_one_at_a_time(ctl, woken, holder) == ["1", "4", "3", "0", "2", "5"]


@pytest.mark.parametrize(
    ("released_at", "first"),
    [
        pytest.param(5.0, "1", id="not-waited-enough"),  # 0 + 5/10 < 1
        pytest.param(15.0, "0", id="aged-past-it"),  # 0 + 15/10 > 1 + 0/10
    ],
)
def test_aging_lets_a_low_priority_waiter_overtake(released_at: float, first: str) -> None:
    ctl, clock, woken = controller(1, aging_s=10.0)
    low = lease(0, priority=0, requested_at=0.0)
    high = lease(1, priority=1, requested_at=released_at)
    holder = queue_behind_a_holder(ctl, woken, [low])
    clock.at = released_at
    ctl.enqueue(high, woken.waiter(high))  # just arrived
    assert admitted_one_at_a_time(ctl, woken, holder)[0] == first


def test_a_lease_requeued_after_parking_ages_from_then_not_from_its_request() -> None:
    """Time spent running is not time waited: a lease admitted at 0 that runs for 100 s,
    parks and queues again has waited 5 s at 105, so a priority-1 lease queued beside it
    goes first (aged from its request it would count 10.5 levels and overtake)."""
    ctl, clock, woken = controller(1, aging_s=10.0)
    low = lease(0, priority=0, requested_at=0.0)
    ctl.enqueue(low, woken.waiter(low))
    assert low.state is LeaseState.ACTIVE
    clock.at = 100.0
    ctl.park(low)
    holder = queue_behind_a_holder(ctl, woken, [])
    high = lease(1, priority=1, requested_at=100.0)
    for waiting in (low, high):  # the parked lease resumes: it queues again
        ctl.enqueue(waiting, woken.waiter(waiting))
    assert low.queued_at == 100.0
    clock.at = 105.0
    assert admitted_one_at_a_time(ctl, woken, holder) == ["1", "0"]


def _old_order(waiting: Sequence[Lease], now: float, aging_s: float) -> list[Lease]:
    """The order ``AdmissionController._pump`` hard-coded before policies."""

    def key(lease: Lease) -> tuple[float, int]:
        waited = now - lease.requested_at
        return (-(lease.priority + waited / aging_s), lease.arrival)

    return sorted(waiting, key=key)


# Times in quarter seconds and aging_s a power of two: every sum and quotient below is
# exact, so both ways of writing the effective priority tie exactly when they should (in
# general floats the old one, which subtracts from ``now``, can round two requests a
# subnormal apart into a tie; the key cannot).
@given(
    st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 400)), max_size=20),
    st.integers(0, 200),
    st.sampled_from([0.5, 1.0, 2.0, 4.0, 8.0, 16.0]),
)
def test_the_default_orders_exactly_as_the_controller_did_before_policies(
    specs: list[tuple[int, int]], waited: int, aging_s: float
) -> None:
    waiting = [lease(i, priority=p, requested_at=t / 4) for i, (p, t) in enumerate(specs)]
    waiting.reverse()  # the order queued does not matter
    now = 100.0 + waited / 4
    policy = PriorityWithAging(aging_s=aging_s)
    order = policy.order(waiting, active=(), now=now)
    assert order == _old_order(waiting, now, aging_s)
    assert order == sorted(waiting, key=policy.key)  # the key the controller sorts by


class _OrderOnly:
    """``policy`` without its ``key``: the controller orders the whole queue each pass."""

    def __init__(self, policy: AdmissionPolicy) -> None:
        self.policy = policy

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        return self.policy.order(waiting, active=active, now=now)


@given(
    st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 400)), min_size=1, max_size=30),
    st.sampled_from(["default", "fifo"]),
)
def test_a_keyed_queue_drains_as_ordering_it_every_pass_does(
    specs: list[tuple[int, int]], which: str
) -> None:
    """A policy with a ``key`` is kept in order as leases arrive; the same policy without
    it is sorted on every pass: both admit the same leases in the same order."""
    policy: AdmissionPolicy = PriorityWithAging(aging_s=2.0) if which == "default" else ByArrival()
    drained = []
    for chosen in (policy, _OrderOnly(policy)):
        ctl, clock, woken = controller(1, policy=chosen)
        waiting = [lease(i, priority=p, requested_at=t / 4) for i, (p, t) in enumerate(specs)]
        holder = queue_behind_a_holder(ctl, woken, waiting)
        clock.at = 500.0
        drained.append(admitted_one_at_a_time(ctl, woken, holder))
    assert drained[0] == drained[1]


def test_swapping_keyed_and_unkeyed_policies_keeps_every_waiting_lease() -> None:
    ctl, _, woken = controller(1)
    holder = queue_behind_a_holder(
        ctl, woken, [lease(0, priority=0), lease(1, priority=2), lease(2, priority=1)]
    )
    ctl.policy = NewestFirst()  # no key: ordered each pass
    ctl.policy = ByArrival()  # a key again: the queue is sorted by it
    with pytest.raises(ZeroDivisionError):
        ctl.policy = cast(AdmissionPolicy, _KeyRaises())
    assert isinstance(ctl.policy, ByArrival)  # the failed swap left everything as it was
    ctl.enqueue(late := lease(3), woken.waiter(late))
    assert admitted_one_at_a_time(ctl, woken, holder) == ["0", "1", "2", "3"]


class ByArrival:
    """First come, first served, with a ``key``."""

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        return sorted(waiting, key=self.key)

    def key(self, lease: Lease) -> int:
        return lease.arrival


class _KeyRaises:
    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        return list(waiting)

    def key(self, lease: Lease) -> int:
        return 1 // 0


def apply_op(
    ctl: AdmissionController, woken: Woken, chosen: Lease, op: str, *, fresh: bool
) -> None:
    """One step of a random sequence: ``enqueue`` a new or parked lease, ``release`` one
    (cancel it while it waits), ``park`` it, or ``grow`` an active one's ceiling."""
    if op == "enqueue" and (fresh or chosen.state is LeaseState.PARKED):
        ctl.enqueue(chosen, woken.waiter(chosen))
    elif op == "release" and not fresh and chosen.state is not LeaseState.RELEASED:
        if chosen.state is LeaseState.WAITING:
            ctl.cancel(chosen)
        else:
            ctl.release(chosen)
    elif op == "park":
        ctl.park(chosen)
    elif op == "grow" and chosen.state is LeaseState.ACTIVE:
        ctl.try_grow(chosen, chosen.ceiling_tokens + 16)


@given(
    st.lists(
        st.tuples(st.sampled_from(["enqueue", "release", "park", "grow"]), st.integers(0, 9)),
        max_size=60,
    )
)
def test_the_blocks_committed_are_always_the_active_leases_reservations(
    ops: list[tuple[str, int]],
) -> None:
    """Guaranteed mode keeps its committed blocks, and the caps their active leases per
    agent and per tenant, as leases come and go and grow, rather than summing every
    active lease on each verdict: the two never differ."""
    ctl, _, woken = controller(4, max_per_agent=3, max_per_tenant=2)
    agents = [WORKER, AgentSpec(name="reviewer", ceiling_tokens=WORKER.ceiling_tokens)]
    tenants = ["acme", "initech", None]
    leases = [lease(i, agent=agents[i % 2], tenant=tenants[i % 3]) for i in range(10)]
    fresh = set(range(10))
    for op, i in ops:
        apply_op(ctl, woken, leases[i], op, fresh=i in fresh)
        if op == "enqueue":
            fresh.discard(i)
        active = [x for x in leases if x.state is LeaseState.ACTIVE]
        assert ctl.blocks_committed() == sum(x.blocks_reserved for x in active)
        assert ctl.counts()[0] == len(active)
        # the caps' counts too, kept the same way
        assert ctl._per_agent == Counter(x.agent.name for x in active)
        assert ctl._per_tenant == Counter(x.tenant for x in active if x.tenant is not None)
        assert max(ctl._per_agent.values(), default=0) <= 3
        # and the waiting leases by lease, which cancel looks them up in
        assert len(ctl._waiting) == len(ctl._queue)
        assert all(ctl._waiting[queued.lease] is queued for queued in ctl._queue)
        assert max(ctl._per_tenant.values(), default=0) <= 2


@pytest.mark.parametrize("aging_s", [0, -1.0, math.nan, math.inf, True, "10"])
def test_priority_with_aging_refuses_a_bad_aging_s(aging_s: object) -> None:
    with pytest.raises(ConfigError, match="aging_s must be a number of seconds > 0") as info:
        PriorityWithAging(aging_s=aging_s)  # type: ignore[arg-type]
    assert info.value.setting == "aging_s"


def test_priority_with_aging_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        PriorityWithAging(5.0)  # type: ignore[misc]


# -- custom policies ----------------------------------------------------------------------
class NewestFirst:
    """Not an ``AdmissionPolicy`` subclass: an object with a matching ``order``."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str], float]] = []

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        ids = sorted(lease.lease_id for lease in active)
        self.calls.append(([lease.lease_id for lease in waiting], ids, now))
        return sorted(waiting, key=lambda lease: -lease.arrival)


def test_any_object_with_order_is_a_policy_and_sees_the_queue_the_active_and_the_clock() -> None:
    policy = NewestFirst()
    assert isinstance(policy, AdmissionPolicy)
    ctl, clock, woken = controller(1, policy=policy)
    assert ctl.policy is policy
    holder = queue_behind_a_holder(ctl, woken, [lease(i) for i in range(4)])
    assert policy.calls[-1] == (["0", "1", "2", "3"], ["1000"], 0.0)  # in the order queued
    clock.at = 7.5
    assert admitted_one_at_a_time(ctl, woken, holder) == ["3", "2", "1", "0"]
    assert policy.calls[-1] == (["0"], [], 7.5)


def test_a_lease_blocked_by_memory_holds_the_line_whatever_the_policy() -> None:
    ctl, _, woken = controller(3, policy=NewestFirst())
    holder = queue_behind_a_holder(ctl, woken, [])  # 10 of 30 blocks
    big = lease(1, ceiling_tokens=480)  # 30 blocks: waits for the holder
    small = lease(0)  # fits now, but the policy puts it behind big
    ctl.enqueue(big, woken.waiter(big))
    ctl.enqueue(small, woken.waiter(small))
    assert (big.state, small.state) == (LeaseState.WAITING, LeaseState.WAITING)
    ctl.release(holder)
    assert (big.state, small.state) == (LeaseState.ACTIVE, LeaseState.WAITING)


def test_a_lease_blocked_only_by_a_cap_lets_later_ones_pass() -> None:
    ctl, _, woken = controller(3, policy=NewestFirst(), max_per_agent=1)
    holder = queue_behind_a_holder(ctl, woken, [])  # agent "worker" is at its cap
    capped = lease(2)  # tried first, blocked by the cap only
    review = lease(1, agent=REVIEWER)
    ctl.enqueue(capped, woken.waiter(capped))
    ctl.enqueue(review, woken.waiter(review))
    assert (capped.state, review.state) == (LeaseState.WAITING, LeaseState.ACTIVE)
    ctl.release(holder)
    assert capped.state is LeaseState.ACTIVE


# -- broken policies ------------------------------------------------------------------------
class Answers:
    """A policy whose answer is ``answer(waiting)``; ``broken`` switches it on and off."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.broken = False

    def order(
        self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float
    ) -> list[Lease]:
        if not self.broken:
            return sorted(waiting, key=lambda lease: lease.arrival)
        return self.answer(list(waiting))  # type: ignore[operator, no-any-return]


STRANGER = lease(99)
BAD_ANSWERS = [
    pytest.param(lambda w: None, "it returned None", id="none"),
    pytest.param(lambda w: 3, "it returned 3", id="not-iterable"),
    pytest.param(lambda w: w[1:], "it left out 1 of them, lease '0' of agent", id="missing"),
    pytest.param(lambda w: [*w, w[0]], "it returned lease '0' of agent 'worker' twice", id="dup"),
    pytest.param(lambda w: [*w, STRANGER], "lease '99' of agent 'worker', which is not", id="x"),
    pytest.param(lambda w: [*w, "0"], "it returned '0', which is not waiting", id="not-a-lease"),
    pytest.param(lambda w: iter(w[::-1][1:]), "it left out 1 of them", id="short-iterator"),
]


@pytest.mark.parametrize(("answer", "problem"), BAD_ANSWERS)
def test_a_bad_answer_is_a_clear_error_and_the_controller_stays_usable(
    answer: object, problem: str
) -> None:
    policy = Answers(answer)
    ctl, _, woken = controller(1, policy=policy)
    holder = queue_behind_a_holder(ctl, woken, [lease(0), lease(1)])
    policy.broken = True

    with pytest.raises(ConfigError, match="order\\(\\) must return the waiting leases") as info:
        ctl.release(holder)
    assert problem in str(info.value) and info.value.setting == "policy"
    assert "fix the policy" in str(info.value)
    assert holder.state is LeaseState.RELEASED  # the release itself happened
    assert ctl.counts()[:2] == (0, 2) and woken.ids == ["1000"]  # nobody admitted

    newcomer = lease(2)
    with pytest.raises(ConfigError):
        ctl.enqueue(newcomer, woken.waiter(newcomer))
    assert newcomer.state is LeaseState.WAITING and ctl.counts()[:2] == (0, 2)  # not queued

    policy.broken = False
    ctl.enqueue(newcomer, woken.waiter(newcomer))
    assert woken.ids == ["1000", "0"] and ctl.counts()[:2] == (1, 2)


def test_a_policy_that_raises_leaves_no_trace_of_the_lease_it_was_queueing() -> None:
    def fail(waiting: list[Lease]) -> list[Lease]:
        raise RuntimeError("policy bug")

    policy = Answers(fail)
    ctl, _, woken = controller(2, policy=policy)
    parked = lease(0)
    ctl.enqueue(parked, woken.waiter(parked))
    ctl.park(parked)
    policy.broken = True
    with pytest.raises(RuntimeError, match="policy bug"):
        ctl.enqueue(parked, woken.waiter(parked))  # resuming
    assert parked.state is LeaseState.PARKED and ctl.counts()[:2] == (0, 0)
    policy.broken = False
    ctl.enqueue(parked, woken.waiter(parked))
    assert parked.state is LeaseState.ACTIVE


def test_setting_a_policy_retries_the_queue_and_keeps_the_old_one_when_that_fails() -> None:
    ctl, _, woken = controller(1, policy=NewestFirst())
    holder = queue_behind_a_holder(ctl, woken, [lease(0), lease(1)])
    working = ctl.policy
    with pytest.raises(ConfigError, match="it returned None"):
        ctl.policy = cast(AdmissionPolicy, _ReturnsNone())
    assert ctl.policy is working
    ctl.policy = PriorityWithAging()
    assert admitted_one_at_a_time(ctl, woken, holder) == ["0", "1"]


class _ReturnsNone:
    def order(self, waiting: Sequence[Lease], *, active: Collection[Lease], now: float) -> None:
        return None


@pytest.mark.parametrize("policy", [object(), "fifo", 42])
def test_an_object_without_order_is_refused_as_a_policy(policy: object) -> None:
    message = "an admission policy needs an order\\(waiting, \\*, active, now\\) method"
    with pytest.raises(ConfigError, match=message) as info:
        controller(1, policy=cast(AdmissionPolicy, policy))
    assert info.value.setting == "policy"
    ctl, _, _ = controller(1)
    with pytest.raises(ConfigError, match=message):
        ctl.policy = cast(AdmissionPolicy, policy)
