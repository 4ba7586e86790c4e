"""``MultiBackend`` over ``FakeBackend`` replicas: routing by prefix and free blocks,
admission where one replica fits, affinity of a parked lease, failover (of calls and
streams), pins set up on a replica that comes back, round robin, tenants kept apart.

The replicas are fakes (a subclass that records its open budgets and can play a replica
that stopped answering, or whose stream breaks after a given number of chunks) so that
each rule is checked exactly and fast: a real server cannot be made to fail exactly
before or after a stream's first chunk. The same flows against real ``kvgov serve``
processes, one killed mid-run, are in ``test_multi_replicas.py``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from backends import MultiBackend, Routing
from governor import (
    AdmissionMode,
    AdmissionRejected,
    AdmissionTimeout,
    AgentSpec,
    BackendError,
    BackendUnavailable,
    ConfigError,
    FakeBackend,
    GenerationChunk,
    GenerationRequest,
    Governor,
    GovernorConfig,
)

BLOCK = 16


class Replica(FakeBackend):
    """A fake replica that records the budgets open on it and can stop answering."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.open: set[str] = set()
        self.unreachable = False
        self.refuse_open = False
        self.stream_breaks_after: int | None = None  # chunks sent before the connection breaks

    def _check(self) -> None:
        if self.unreachable:
            raise BackendUnavailable("connection refused (a fake replica that is down)")

    def capacity(self):  # type: ignore[no-untyped-def]
        self._check()
        return super().capacity()

    def health(self):  # type: ignore[no-untyped-def]
        self._check()
        return super().health()

    def open_budget(self, name: str, *, max_blocks: int) -> None:
        self._check()
        if self.refuse_open:
            raise BackendError("budget refused (a fake replica that says no)")
        super().open_budget(name, max_blocks=max_blocks)
        self.open.add(name)

    def close_budget(self, name: str) -> None:
        self.open.discard(name)  # a replica that is down lost it anyway
        self._check()
        super().close_budget(name)

    def generate(self, request: GenerationRequest):  # type: ignore[no-untyped-def]
        self._check()
        return super().generate(request)

    def metrics(self):  # type: ignore[no-untyped-def]
        self._check()
        return super().metrics()

    async def astream(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self._check()
        async with aclosing(super().astream(request)) as chunks:
            num_sent = 0
            async for chunk in chunks:
                if num_sent == self.stream_breaks_after:
                    raise BackendUnavailable("the connection broke mid-stream (a fake replica)")
                num_sent += 1
                yield chunk

    def budgets_called(self) -> list[str | None]:
        return [request.budget for request in self.calls]


def _replicas(n: int, num_blocks: int = 400) -> list[Replica]:
    return [Replica(num_blocks=num_blocks, block_size=BLOCK) for _ in range(n)]


def _prompt(team: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Team {team} rules. " + "Follow them. " * 150}]


def _turn(governor: Governor, lease, team: str, text: str = "go"):  # type: ignore[no-untyped-def]
    return governor.complete(lease, [*_prompt(team), {"role": "user", "content": text}],
                             max_tokens=4)  # fmt: skip


def _governor(backend: MultiBackend, ceiling: int = 1_600, **config: object) -> Governor:
    return Governor(
        backend,
        config=GovernorConfig(**config),  # type: ignore[arg-type]
        agents=[AgentSpec(name="agent", ceiling_tokens=ceiling)],
    )


def _where(replicas: list[Replica], budget: str) -> list[int]:
    return [i for i, r in enumerate(replicas) if budget in r.budgets_called()]


def test_a_teams_agents_land_where_its_prompt_is_cached() -> None:
    replicas = _replicas(3)
    multi = MultiBackend(replicas)
    governor = _governor(multi)
    placed: dict[str, set[int]] = {"A": set(), "B": set(), "C": set()}
    for team in "ABCABCCBA":
        with governor.lease("agent") as lease:
            _turn(governor, lease, team)
            (replica,) = _where(replicas, lease.budget)
            placed[team].add(replica)
    # each team on one replica, and a new team on a replica caching no other team's prompt
    assert sorted(len(where) for where in placed.values()) == [1, 1, 1]
    assert set().union(*placed.values()) == {0, 1, 2}
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert multi.budgets() == {}
    assert all(not r.open for r in replicas)


def test_a_new_team_goes_to_the_replica_with_the_most_free_blocks() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas)
    governor = _governor(multi)
    with governor.lease("agent") as first:  # 100 blocks reserved on one replica
        _turn(governor, first, "A")
        (busy,) = _where(replicas, first.budget)
        with governor.lease("agent") as second:
            _turn(governor, second, "B")
            assert _where(replicas, second.budget) == [1 - busy]


def test_admission_only_where_one_replica_fits_the_lease() -> None:
    # Two replicas of 100 blocks: limits of 90 each at a safety factor of 0.9, 180 summed.
    multi = MultiBackend(_replicas(2, num_blocks=100))
    governor = _governor(multi, ceiling=60 * BLOCK, admission_timeout_s=0.2)
    assert governor.admission.available_blocks == 200
    with pytest.raises(AdmissionRejected):  # 95 blocks fit the sum, never one replica
        governor.lease("agent", ceiling_tokens=95 * BLOCK).__enter__()
    # 60 + 60 + 60 = 180 fits the sum, but each replica holds one lease of 60
    with (
        governor.lease("agent"),
        governor.lease("agent"),
        pytest.raises(AdmissionTimeout),
        governor.lease("agent"),
    ):
        pass
    with governor.lease("agent"), governor.lease("agent"):
        pass  # room again once they were released
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert multi.budgets() == {}  # leases that made no call leave nothing behind


def test_a_parked_agent_returns_to_its_replica_unless_it_no_longer_fits_there() -> None:
    replicas = _replicas(2, num_blocks=400)  # limits of 360 blocks; leases of 150
    multi = MultiBackend(replicas)
    governor = _governor(multi, ceiling=150 * BLOCK)
    with governor.lease("agent") as agent:
        _turn(governor, agent, "A")
        (home,) = _where(replicas, agent.budget)
        governor.park(agent, reason="tool")
        with governor.lease("agent") as mate:  # the same team: to home, by prefix
            _turn(governor, mate, "A")
            assert _where(replicas, mate.budget) == [home]
            # home has 210 blocks left, the other replica 360: affinity wins, it fits
            _turn(governor, agent, "A", "back from the tool")
            assert _where(replicas, agent.budget) == [home]
            assert agent.budget in replicas[home].open
            governor.park(agent, reason="tool")
            with governor.lease("agent") as third:
                _turn(governor, third, "A")
                assert _where(replicas, third.budget) == [home]
                # home has 60 left: saturated, so it moves, closed at home, open elsewhere
                _turn(governor, agent, "A", "back again")
                assert agent.budget not in replicas[home].open
                assert agent.budget in replicas[1 - home].open
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert multi.budgets() == {}
    assert all(not r.open for r in replicas)


def test_a_replica_that_stops_answering_leaves_rotation_and_is_probed_back() -> None:
    replicas = _replicas(3)
    multi = MultiBackend(replicas, routing=Routing(probe_interval_s=0.05))
    governor = _governor(multi)
    with governor.lease("agent") as agent:
        _turn(governor, agent, "A")
        (home,) = _where(replicas, agent.budget)
        replicas[home].unreachable = True
        result = _turn(governor, agent, "A", "again")  # sent again to another replica
        assert result.completion_tokens == 4
        (moved,) = set(_where(replicas, agent.budget)) - {home}
        assert agent.budget in replicas[moved].open
        assert home not in multi.in_rotation()
        assert governor.admission.available_blocks == 2 * 400  # the hook read it again
    replicas[home].unreachable = False
    time.sleep(0.06)
    with governor.lease("agent") as agent:
        _turn(governor, agent, "B")
    assert sorted(multi.in_rotation()) == [0, 1, 2]
    assert governor.admission.available_blocks == 3 * 400
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert multi.budgets() == {}
    assert all(not r.open for r in replicas)


def test_no_replica_in_rotation_is_a_retriable_error() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas, routing=Routing(failover_retries=1))
    governor = _governor(multi)
    for replica in replicas:
        replica.unreachable = True
    with governor.lease("agent") as agent, pytest.raises(BackendUnavailable) as caught:
        _turn(governor, agent, "A")
    assert caught.value.retriable
    assert multi.in_rotation() == []
    assert governor.admission.ledger() == (0, 0, 0, 0)


def test_round_robin_places_new_budgets_in_turn_and_keeps_them() -> None:
    replicas = _replicas(3)
    multi = MultiBackend(replicas, routing=Routing(policy="round_robin"))
    governor = _governor(multi, mode=AdmissionMode.OVERCOMMIT)
    leases = [governor.lease("agent").__enter__() for _ in range(6)]
    for lease in leases:
        _turn(governor, lease, "A")
    for lease in leases:
        _turn(governor, lease, "A", "second turn")
    assert [_where(replicas, lease.budget) for lease in leases] == [
        [0], [1], [2], [0], [1], [2]
    ]  # fmt: skip
    for lease in leases:
        governor.release(lease)
    assert all(not r.open for r in replicas)


def test_pins_go_to_every_replica_and_count_once_each() -> None:
    replicas = _replicas(3)
    multi = MultiBackend(replicas)
    handle = multi.pin_prefix("shared " * 200)
    assert multi.capacity().num_pinned_blocks == 3 * handle.num_blocks
    multi.unpin_prefix(handle)
    assert multi.capacity().num_pinned_blocks == 0


def test_a_failed_call_leaves_no_call_counted_in_flight() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas)
    governor = _governor(multi)
    for replica in replicas:
        replica.refuse_open = True
    with governor.lease("agent") as agent, pytest.raises(BackendError, match="says no"):
        _turn(governor, agent, "A")
    assert [state.in_flight for state in multi._ledger.replicas] == [0, 0]
    replicas[1].unreachable = True  # metrics skip it and take it out of rotation
    assert multi.metrics().num_blocks_free == replicas[0].metrics().num_blocks_free
    assert multi.in_rotation() == [0]


def test_a_replica_that_goes_away_takes_only_its_own_holds_with_it() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas)
    governor = _governor(multi, park_after_s=0.0, retain_s=30.0)
    dropped: list[str] = []
    governor.subscribe(lambda e: dropped.append(str(e.lease_id)) if e.kind == "dropped" else None)
    with governor.lease("agent") as first, governor.lease("agent") as second:
        _turn(governor, first, "A")
        _turn(governor, second, "B")
        (home,) = _where(replicas, first.budget)
        assert _where(replicas, second.budget) == [1 - home]
        with governor.tool_call(first, "t"), governor.tool_call(second, "t"):
            held = {lease: lease.num_retained_blocks for lease in (first, second)}
            assert governor.admission.ledger()[2] == sum(held.values())
            replicas[home].unreachable = True
            multi.metrics()  # finds it gone
            assert dropped == [first.lease_id]
            assert governor.admission.ledger()[2:] == (held[second], held[second])
    assert governor.admission.ledger() == (0, 0, 0, 0)


def test_a_planners_workers_spread_across_replicas_while_the_planner_stays_put() -> None:
    replicas = _replicas(3, num_blocks=400)  # limits of 360 blocks: two workers of 150
    multi = MultiBackend(replicas)
    governor = Governor(
        multi,
        agents=[
            AgentSpec(name="planner", ceiling_tokens=100 * BLOCK, max_fanout=4),
            AgentSpec(name="worker", ceiling_tokens=150 * BLOCK),
        ],
    )
    together = threading.Barrier(4, timeout=10)
    homes: list[int] = []

    def worker(child) -> None:  # type: ignore[no-untyped-def]
        with child as lease:
            _turn(governor, lease, "A", "a subtask")
            together.wait()  # all four active at once
            homes.extend(_where(replicas, lease.budget))

    with governor.lease("planner") as planner:
        _turn(governor, planner, "A", "plan")
        (home,) = _where(replicas, planner.budget)
        threads = [threading.Thread(target=worker, args=(child,))
                   for child in governor.fanout(planner, "worker", 4)]  # fmt: skip
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(homes) == 4 and max(homes.count(i) for i in range(3)) == 2
        _turn(governor, planner, "A", "merge the results")
        assert _where(replicas, planner.budget) == [home]  # its budget never moved
        assert planner.budget in replicas[home].open
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert multi.budgets() == {}
    assert all(not r.open for r in replicas)


def test_imbalance_sends_a_call_to_the_least_loaded_replica_whatever_it_matches() -> None:
    # SGLang's rule: max - min > balance_abs_threshold and max > balance_rel_threshold x min
    replicas = _replicas(2)
    multi = MultiBackend(replicas, routing=Routing(balance_abs_threshold=3))
    ledger = multi._ledger  # calls counted in flight and never finished: routing alone
    text = "system\x1f" + "Team A rules. " * 100
    where = [ledger.route(None, text, None).replica for _ in range(7)]  # type: ignore[union-attr]
    # 4 - 0 > 3: to the idle one; 4 - 1 is not: by prefix again; 5 - 1 > 3: the idle one
    assert where == [0, 0, 0, 0, 1, 0, 1]


@pytest.mark.parametrize(
    "setting",
    [{"policy": "random"}, {"cache_threshold": 1.5}, {"balance_abs_threshold": 0},
     {"balance_rel_threshold": 0.5}, {"failover_retries": -1}],
)  # fmt: skip
def test_routing_refuses_settings_it_cannot_follow(setting: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Routing(**setting)  # type: ignore[arg-type]


async def _aturn(governor: Governor, lease, team: str) -> None:  # type: ignore[no-untyped-def]
    messages = [*_prompt(team), {"role": "user", "content": "go"}]
    await governor.acomplete(lease, messages, max_tokens=4)


async def _stream(governor: Governor, lease, team: str):  # type: ignore[no-untyped-def]
    """The texts streamed before the end or the error, and the error (None: none)."""
    messages = [*_prompt(team), {"role": "user", "content": "stream it"}]
    texts: list[str] = []
    try:
        async for chunk in governor.astream(lease, messages, max_tokens=4):
            texts.append(chunk.text)
    except BackendUnavailable as exc:
        return texts, exc
    return texts, None


def test_a_stream_whose_replica_fails_before_its_first_chunk_runs_on_another() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas)
    governor = _governor(multi)

    async def run() -> None:
        async with governor.lease("agent") as agent:
            await _aturn(governor, agent, "A")
            (home,) = _where(replicas, agent.budget)
            replicas[home].unreachable = True  # refused before it sent anything
            texts, error = await _stream(governor, agent, "A")
            assert error is None
            assert "".join(texts) == " hello" * 4  # the whole answer, once, from the other
            assert len(replicas[1 - home].calls) == 1
            assert multi.in_rotation() == [1 - home]
            assert agent.budget in replicas[1 - home].open

    asyncio.run(run())
    assert [state.in_flight for state in multi._ledger.replicas] == [0, 0]
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert multi.budgets() == {}


def test_a_stream_that_breaks_after_a_chunk_raises_and_is_sent_nowhere_else() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas, routing=Routing(failover_retries=1))
    governor = _governor(multi)

    async def run() -> None:
        async with governor.lease("agent") as agent:
            await _aturn(governor, agent, "A")
            (home,) = _where(replicas, agent.budget)
            replicas[home].stream_breaks_after = 1
            texts, error = await _stream(governor, agent, "A")
            # the caller has one token of the answer: a second replica's answer would
            # repeat it, so the error is the caller's to handle
            assert texts == [" hello"]
            assert isinstance(error, BackendUnavailable) and error.retriable
            assert replicas[1 - home].calls == []
            assert multi.in_rotation() == [1 - home]

    asyncio.run(run())
    assert [state.in_flight for state in multi._ledger.replicas] == [0, 0]
    assert governor.admission.ledger() == (0, 0, 0, 0)
    assert multi.budgets() == {}


def test_a_replica_that_comes_back_gets_the_pins_made_while_it_was_out() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas, routing=Routing(probe_interval_s=0.01))
    replicas[1].unreachable = True
    multi.metrics()  # finds it gone
    assert multi.in_rotation() == [0]
    came_back: list[frozenset[str]] = []
    multi.on_lost(came_back.append)
    handle = multi.pin_prefix("shared " * 200)  # pinned on replica 0 only
    assert replicas[0].capacity().num_pinned_blocks == handle.num_blocks > 0
    replicas[1].unreachable = False
    assert replicas[1].capacity().num_pinned_blocks == 0
    time.sleep(0.02)  # past probe_interval_s: the next health check probes it
    assert multi.health().ok
    assert multi.in_rotation() == [0, 1]
    assert came_back == [frozenset()]  # the capacity changed: the governor reads it again
    assert replicas[1].capacity().num_pinned_blocks == handle.num_blocks
    assert multi.capacity().num_pinned_blocks == 2 * handle.num_blocks
    multi.unpin_prefix(handle)  # from both, through each replica's own handle
    assert [r.capacity().num_pinned_blocks for r in replicas] == [0, 0]


def test_another_tenants_copy_of_a_prompt_is_not_routed_to_its_cache() -> None:
    replicas = _replicas(2)
    multi = MultiBackend(replicas)
    governor = _governor(multi)
    with governor.lease("agent", tenant="acme") as first:
        _turn(governor, first, "A")
        (home,) = _where(replicas, first.budget)
        # home has the first lease's 100 blocks reserved: by free blocks the other wins,
        # by its cached prompt home does, for the same tenant only
        with governor.lease("agent", tenant="acme") as mate:
            _turn(governor, mate, "A")
            assert _where(replicas, mate.budget) == [home]
        with governor.lease("agent", tenant="globex") as other:
            _turn(governor, other, "A")
            assert replicas[home].calls[-1].cache_salt == "acme"
            assert _where(replicas, other.budget) == [1 - home]
            assert replicas[1 - home].calls[-1].cache_salt == "globex"
    assert governor.admission.ledger() == (0, 0, 0, 0)
