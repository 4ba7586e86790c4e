"""Admission under ``max_per_agent`` and ``max_per_tenant``: the controller keeps the
active and waiting leases per agent and per tenant, and stops a pass once a cap holds
back every waiting lease. Neither may change who is admitted."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governor import AgentSpec, Lease, LeaseState
from governor.admission_policy import AdmissionPolicy
from tests.governor.test_admission_policy import (
    WORKER,
    NewestFirst,
    apply_op,
    controller,
    lease,
)

_AGENTS = [WORKER, *(AgentSpec(name=n, ceiling_tokens=WORKER.ceiling_tokens) for n in "ab")]
_TENANTS = ["acme", "initech", None]
_OPS = st.lists(
    st.tuples(st.sampled_from(["enqueue", "release", "park", "grow"]), st.integers(0, 11)),
    max_size=80,
)


def _leases() -> list[Lease]:
    return [
        lease(i, priority=i % 2, agent=_AGENTS[i % 3], tenant=_TENANTS[(i // 3) % 3])
        for i in range(12)
    ]


@pytest.mark.parametrize("policy", [None, NewestFirst], ids=["keyed", "ordered-each-pass"])
@pytest.mark.parametrize(
    "caps",
    [{"max_per_agent": 2}, {"max_per_tenant": 2}, {"max_per_agent": 3, "max_per_tenant": 2}],
)
@settings(max_examples=300)
@given(ops=_OPS)
def test_stopping_a_pass_when_all_are_capped_admits_the_same_leases(
    policy: type[AdmissionPolicy] | None, caps: dict[str, int], ops: list[tuple[str, int]]
) -> None:
    """Against a controller that walks every pass to its end: after every step the same
    leases are active, waiting and parked, and the counts are the real ones."""
    runs = []
    for stops in (True, False):
        ctl, _, woken = controller(6, policy=None if policy is None else policy(), **caps)
        if not stops:
            ctl._all_capped = lambda: False  # type: ignore[method-assign]
        runs.append((ctl, woken, _leases()))
    fresh = set(range(12))
    for op, i in ops:
        for ctl, woken, leases in runs:
            apply_op(ctl, woken, leases[i], op, fresh=i in fresh)
        if op == "enqueue":
            fresh.discard(i)
        states = [[x.state for x in leases] for _, _, leases in runs]
        assert states[0] == states[1]
        ctl, _, leases = runs[0]
        queued = [x for n, x in enumerate(leases) if n not in fresh]  # a new lease says WAITING
        waiting = [x for x in queued if x.state is LeaseState.WAITING]
        active = [x for x in leases if x.state is LeaseState.ACTIVE]
        # counted only where the cap is set
        by_agent, by_tenant = "max_per_agent" in caps, "max_per_tenant" in caps
        assert ctl._waiting_agents == (Counter(x.agent.name for x in waiting) if by_agent else {})
        assert ctl._waiting_tenants == (Counter(x.tenant for x in waiting) if by_tenant else {})
        assert ctl._per_agent == (Counter(x.agent.name for x in active) if by_agent else {})
        tenants = Counter(x.tenant for x in active if x.tenant is not None)
        assert ctl._per_tenant == (tenants if by_tenant else {})


def test_a_pass_stops_at_the_first_capped_lease_when_all_are_one_agents() -> None:
    """2 active of a cap of 2, 50 waiting of the same agent: a release admits one and
    the pass stops at the next, rather than asking about all 49 behind it."""
    ctl, _, woken = controller(100, max_per_agent=2)
    leases = [lease(i) for i in range(52)]
    for x in leases:
        ctl.enqueue(x, woken.waiter(x))
    asked: list[str] = []
    verdict = ctl._verdict

    def counted(x: Lease) -> str:
        asked.append(x.lease_id)
        return verdict(x)

    ctl._verdict = counted  # type: ignore[method-assign]
    ctl.release(leases[0])
    assert asked == ["2", "3"]
    assert [x.state for x in leases[:4]] == [
        LeaseState.RELEASED,
        LeaseState.ACTIVE,
        LeaseState.ACTIVE,
        LeaseState.WAITING,
    ]


@pytest.mark.parametrize("cap", ["max_per_agent", "max_per_tenant"])
def test_a_pass_goes_on_past_a_capped_lease_to_one_that_is_not(cap: str) -> None:
    ctl, _, woken = controller(6, **{cap: 2})
    acme = [lease(i, priority=1, tenant="acme") for i in range(3)]
    # another agent and tenant, of lower priority: tried after acme's third
    other = lease(3, tenant="initech", agent=_AGENTS[1])
    for x in [*acme, other]:
        ctl.enqueue(x, woken.waiter(x))
    assert [x.state for x in acme] == [LeaseState.ACTIVE, LeaseState.ACTIVE, LeaseState.WAITING]
    assert other.state is LeaseState.ACTIVE
