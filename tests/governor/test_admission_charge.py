"""A shared prefix's pinned blocks are counted once by admission, on the bundled engine
(tiny-random): they are out of the limit already (the pins), so overcommit charges a
lease only its context beyond them (``Lease.blocks_charged``) and guaranteed mode
reserves only its ceiling beyond them (``Lease.own_blocks_reserved``). Charged its
prefix, every lease paid again for blocks pinned once, and a team that shares a long
system prompt ran one at a time."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from backends import LocalBackend
from governor import (
    AdmissionMode,
    AdmissionRejected,
    AgentSpec,
    Governor,
    GovernorConfig,
    LeaseState,
)

BLOCK = 16


@pytest.fixture(scope="module")
def backend() -> Iterator[LocalBackend]:
    made = LocalBackend(config={"num_blocks": 128})
    yield made
    made.close()


SYSTEM = "You are one of a team. " + "Team rules apply to every task here. " * 40


def _config(**overrides: object) -> GovernorConfig:
    # No holds between calls: a parked lease comes back charged its whole call.
    settings: dict[str, object] = {
        "mode": AdmissionMode.OVERCOMMIT,
        "park_after_s": 0,
        "retain_s": 0,
        "admission_timeout_s": 0.5,
    }
    return GovernorConfig(**{**settings, **overrides})  # type: ignore[arg-type]


def _task(backend: LocalBackend, blocks: int, tag: str) -> list[dict[str, str]]:
    """A user turn that alone counts at least ``blocks`` blocks."""
    words = blocks * BLOCK
    while True:
        task = [{"role": "user", "content": f"{tag}: " + "word " * words}]
        if backend.count_messages(task) >= blocks * BLOCK:
            return task
        words += BLOCK


def _blocks(tokens: int) -> int:
    return math.ceil(tokens / BLOCK)


def test_a_shared_prefix_is_charged_once_not_by_every_lease(backend: LocalBackend) -> None:
    governor = Governor(backend, config=_config())
    handle = governor.register_prefix("team", SYSTEM)
    available = governor.admission.available_blocks  # after the pin
    try:
        assert handle.num_blocks >= 15
        governor.register_agent(AgentSpec(name="agent", ceiling_tokens=70 * BLOCK, prefix="team"))
        task = _task(backend, 25, "task")
        with governor.lease("agent") as first, governor.lease("agent") as second:
            assert first.prefix_blocks == second.prefix_blocks == handle.num_blocks
            governor.complete(first, task, max_tokens=8)
            assert first.blocks_live >= handle.num_blocks + 25
            governor.complete(second, task, max_tokens=8)
            with governor.tool_call(second, "build"):
                assert second.state is LeaseState.PARKED
            # Both contexts in full would not fit live x 1.25; their own blocks do.
            whole = first.blocks_live + second.blocks_live + 1
            assert whole * 1.25 > governor.admission.limit_blocks
            own = whole - 2 * handle.num_blocks
            assert own * 1.25 <= governor.admission.limit_blocks
            governor.complete(second, task, max_tokens=8)  # admitted at once
            assert second.state is LeaseState.ACTIVE
            assert governor.admission.blocks_committed() == (
                first.blocks_live - handle.num_blocks + second.blocks_live - handle.num_blocks
            )
    finally:
        governor.unregister_prefix("team")
    assert governor.admission.available_blocks > available
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert backend.metrics().num_blocks_in_use == 0


def test_guaranteed_mode_reserves_a_shared_prefix_once(backend: LocalBackend) -> None:
    config = GovernorConfig(park_after_s=0, retain_s=30, admission_timeout_s=0.5)
    governor = Governor(backend, config=config)
    handle = governor.register_prefix("team", SYSTEM)
    try:
        pinned, limit = handle.num_blocks, governor.admission.limit_blocks
        ceiling = (limit // 2 + pinned) * BLOCK  # two fit on their own blocks, not whole
        assert 2 * ceiling / BLOCK > limit
        governor.register_agent(AgentSpec(name="agent", ceiling_tokens=ceiling, prefix="team"))
        task = _task(backend, 10, "task")
        assert governor.admission.max_concurrent(ceiling) == 1
        assert governor.admission.max_concurrent(ceiling, pinned) == 2
        with governor.lease("agent") as first, governor.lease("agent") as second:
            assert first.own_blocks_reserved == first.blocks_reserved - pinned
            assert governor.admission.ledger()[:2] == (2 * (limit // 2),) * 2
            governor.complete(first, task, max_tokens=8)
            with governor.tool_call(first, "build"):  # its hold, less the prefix, counts
                held = governor.admission.ledger()[2]
                assert held == first.num_retained_blocks - pinned > 0
            governor.complete(second, task, max_tokens=8)
        # The largest ceiling is the limit on top of the pins; one block more never fits.
        largest = (limit + pinned) * BLOCK
        with governor.lease("agent", ceiling_tokens=largest) as lease:
            assert lease.state is LeaseState.ACTIVE
            assert lease.own_blocks_reserved == limit
        with pytest.raises(AdmissionRejected, match=f"{largest:,} tokens"):
            governor.lease("agent", ceiling_tokens=largest + BLOCK)
    finally:
        governor.unregister_prefix("team")
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert backend.metrics().num_blocks_in_use == 0


def test_check_topology_counts_a_shared_prefix_once_and_what_it_calls_fit_runs(
    backend: LocalBackend,
) -> None:
    """Counted whole by every worker, the team prompt made check_topology (and so
    ``govern(topology=...)``) refuse a fan-out that admission runs at once."""
    config = GovernorConfig(park_after_s=0, retain_s=0, admission_timeout_s=0.5, expected_use=0.5)
    governor = Governor(backend, config=config)
    handle = governor.register_prefix("team", SYSTEM)
    try:
        pinned, limit = handle.num_blocks, governor.admission.limit_blocks
        own = limit // 3  # three workers fit on their own blocks, not whole
        assert 3 * (own + pinned) > limit
        worker = AgentSpec(name="worker", ceiling_tokens=(own + pinned) * BLOCK, prefix="team")
        planner = AgentSpec(name="planner", ceiling_tokens=own * BLOCK, max_fanout=3)
        governor.register_agent(worker)
        governor.register_agent(planner)
        report = governor.check_topology(planner="planner", worker="worker", num_workers=3)
        assert (report.worker_prefix_blocks, report.planner_prefix_blocks) == (pinned, 0)
        assert report.expected_use == 0.5  # the governor's, for the overcommit rows
        row = report.fit("guaranteed")
        assert row.fits and row.worker_blocks == own and row.workers_at_once == 3
        assert f"worker {pinned:,} blocks" in str(report)
        report.raise_if_unfit("guaranteed")
        # The largest worker ceiling it names at fan-out 3 is admitted three at once.
        largest = report.guaranteed.largest_worker_ceiling
        assert largest >= worker.ceiling_tokens
        with governor.lease("planner") as parent:
            children = governor.fanout(parent, "worker", 3, ceiling_tokens=largest)
            with children[0] as a, children[1] as b, children[2] as c:
                assert {a.state, b.state, c.state} == {LeaseState.ACTIVE}
                governor.complete(a, _task(backend, 4, "task"), max_tokens=8)
    finally:
        governor.unregister_prefix("team")
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert backend.metrics().num_blocks_in_use == 0


def test_a_lease_alone_is_admitted_though_its_context_leaves_no_headroom(
    backend: LocalBackend,
) -> None:
    """Overcommit holds ``headroom_ratio`` back for the growth of the leases it runs at
    once. A lease alone, its context within the limit but not with the headroom on top,
    must still run: nothing else can make room for it. Held out, it waited forever (the
    open-loop swarm on a small card stalled with five such leases queued and none active)."""
    governor = Governor(backend, config=_config())
    limit = governor.admission.limit_blocks
    blocks = math.floor(limit / 1.25) + 4  # x 1.25 past the limit, alone within it
    governor.register_agent(AgentSpec(name="agent", ceiling_tokens=(limit - 2) * BLOCK))
    task = _task(backend, blocks, "task")
    with governor.lease("agent") as lease:
        governor.complete(lease, task, max_tokens=4)
        assert lease.blocks_charged * 1.25 > limit >= lease.blocks_charged
        with governor.tool_call(lease, "build"):
            assert lease.state is LeaseState.PARKED
        governor.complete(lease, task, max_tokens=4)  # resumed, not held out till timeout
        assert lease.state is LeaseState.ACTIVE
    assert governor.admission.counts()[:2] == (0, 0)
