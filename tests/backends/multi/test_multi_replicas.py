"""``MultiBackend`` over real ``kvgov serve`` replicas, each in its own process: a team's
agents land where its system prompt is cached (the servers' own prefix-cache counters
say so), a parked agent comes back to its replica, and a replica killed (SIGKILL) in
the middle of a run leaves the run finishing on the others with nothing left over, in
the governor's ledger or on the servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backends import MultiBackend, RemoteBackend, Routing
from governor import AgentSpec, Governor, GovernorConfig
from tests.serve_process import ServerProcess

BLOCK = 16
_CONFIG = {"num_blocks": 256, "max_model_len": 2048}


@pytest.fixture(scope="module")
def servers() -> Iterator[list[ServerProcess]]:
    servers = [ServerProcess(_CONFIG) for _ in range(2)]  # 3 in `kvgov bench replicas`
    try:
        for server in servers:  # built side by side: importing torch takes seconds
            server.prepare()
        for server in servers:
            server.start(timeout_s=180.0)
        yield servers
    finally:
        for server in servers:
            server.stop()
            server.log.close()


def _backend(servers: list[ServerProcess], **routing: object) -> MultiBackend:
    remotes = [RemoteBackend(s.base_url, timeout=60.0) for s in servers if s.process]
    return MultiBackend(remotes, routing=Routing(**routing))  # type: ignore[arg-type]


def _system(team: str) -> dict[str, str]:
    return {"role": "system", "content": f"You work for team {team}. " + "Check twice. " * 60}


def _governor(backend: MultiBackend, **config: object) -> Governor:
    return Governor(
        backend,
        config=GovernorConfig(**config),  # type: ignore[arg-type]
        agents=[AgentSpec(name="agent", ceiling_tokens=40 * BLOCK)],
    )


def _hits(backend: MultiBackend) -> list[int]:
    return [m.prefix_cache_hits if m else 0 for m in backend.replica_metrics()]


def test_a_teams_agents_land_where_its_prompt_is_cached(servers: list[ServerProcess]) -> None:
    backend = _backend(servers)
    governor = _governor(backend)
    system_tokens = governor.counter.count_messages([_system("A")])
    homes: dict[str, set[int]] = {"A": set(), "B": set()}
    cached: dict[str, list[int]] = {"A": [], "B": []}
    try:
        for team in "ABAB":
            hits_before = _hits(backend)
            with governor.lease("agent") as lease:
                result = governor.complete(
                    lease, [_system(team), {"role": "user", "content": "status?"}], max_tokens=2
                )
                home = backend.placed_on(lease.budget)
                assert home is not None
                homes[team].add(home)
                cached[team].append(result.cached_tokens)
            # the server it ran on counted the hit; the others counted nothing
            after = _hits(backend)
            gained = [after[i] - hits_before[i] for i in range(len(servers))]
            assert gained == [result.cached_tokens if i == home else 0 for i in range(len(servers))]
        assert len(homes["A"]) == len(homes["B"]) == 1 and homes["A"] != homes["B"]
        for team in "AB":  # the second agent found the whole prompt cached, but a block
            assert cached[team][1] >= system_tokens - BLOCK
        assert governor.admission.ledger() == (0, 0, 0, 0)
    finally:
        backend.close()


def test_a_parked_agent_comes_back_to_its_replica(servers: list[ServerProcess]) -> None:
    backend = _backend(servers)
    governor = _governor(backend, park_after_s=0.0, retain_s=30.0)
    try:
        with governor.lease("agent") as agent:
            messages = [_system("C"), {"role": "user", "content": "look it up"}]
            first = governor.complete(agent, messages, max_tokens=4)
            home = backend.placed_on(agent.budget)
            # parked, its KV held on its replica, while another team's agent runs
            with (
                governor.tool_call(agent, "search", expected_s=0.1),
                governor.lease("agent") as other,
            ):
                governor.complete(other, [_system("D"), {"role": "user", "content": "hi"}],
                                  max_tokens=2)  # fmt: skip
                assert backend.placed_on(other.budget) != home
            messages += [{"role": "assistant", "content": first.text},
                         {"role": "user", "content": "found it"}]  # fmt: skip
            second = governor.complete(agent, messages, max_tokens=2)
            assert backend.placed_on(agent.budget) == home
            assert second.cached_tokens >= first.prompt_tokens - BLOCK
        assert governor.admission.ledger() == (0, 0, 0, 0)
    finally:
        backend.close()


def test_a_replica_killed_mid_run_and_the_run_finishes(servers: list[ServerProcess]) -> None:
    """Last in this module: the killed server stays down (the fixture ends with it)."""
    backend = _backend(servers, probe_interval_s=60.0)
    governor = _governor(backend, park_after_s=0.0, retain_s=30.0)
    teams = "EFEF"
    turn_one_done = [asyncio.Event() for _ in teams]

    async def agent(number: int, team: str, go_on: asyncio.Event) -> int:
        async with governor.lease("agent") as lease:
            messages = [_system(team), {"role": "user", "content": f"task {number}"}]
            for turn in range(3):
                result = await governor.acomplete(lease, messages, max_tokens=2)
                messages += [{"role": "assistant", "content": result.text},
                             {"role": "user", "content": f"turn {turn}"}]  # fmt: skip
                if turn == 0:
                    async with governor.tool_call(lease, "wait", expected_s=0.1):
                        turn_one_done[number].set()
                        await go_on.wait()
            return lease.num_calls

    async def run() -> list[int]:
        go_on = asyncio.Event()
        tasks = [asyncio.create_task(agent(n, t, go_on)) for n, t in enumerate(teams)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in turn_one_done)), 60)
        # every agent is parked with its KV held; kill the busiest replica
        counts = [0] * len(servers)
        for replica in backend.budgets().values():
            if replica is not None:
                counts[replica] += 1
        victim = counts.index(max(counts))
        await asyncio.to_thread(servers[victim].kill)
        go_on.set()
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 120))

    try:
        assert asyncio.run(run()) == [3] * len(teams)
        assert len(backend.in_rotation()) == len(servers) - 1
        assert governor.admission.ledger() == (0, 0, 0, 0)
        assert backend.budgets() == {}
        for i in backend.in_rotation():  # nothing left open on the replicas that stayed
            remote = backend.replicas[i]
            assert isinstance(remote, RemoteBackend)
            assert remote.kv_map().budgets == {}
    finally:
        backend.close()
