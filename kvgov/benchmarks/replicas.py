"""``kvgov bench replicas``: prefix-aware routing against round robin across replicas.

Three ``kvgov serve`` replicas (tiny-random on CPU, each its own process, ``--num-blocks``
per replica set so that two teams' system prompts and their agents' contexts fit in one
replica's KV, but not all four) behind one ``MultiBackend``, governed by one
``Governor`` (overcommit admission: leases admitted on live use, the engines' own
limits doing the rest). 24 agents from 4 teams, each team's agents sharing a system
prompt of 2,000 tokens; each agent runs 3 turns, parked on a tool between turns (its KV
held on its replica, ``retain_s``). Every call streams (``Governor.astream``) 4 output
tokens. The same workload runs twice, round robin first, then cache-aware routing, on
the same three servers; each run has its own cache salt (tenant), so each starts with
none of its prefixes cached (cold), and the other run's blocks are evictable only.

- ``prefix_hit_rate_routed`` (target >= 0.8) and ``prefix_hit_rate_round_robin``: the
  servers' own counters (``prefix_cache_hits / prefix_cache_queries``, in tokens, summed
  over the replicas, deltas over the run).
- ``ttft_p50_round_robin_over_routed`` (target >= 2): the median time to the first
  streamed chunk of a call, round robin over routed.
- ``makespan_round_robin_over_routed`` (target >= 1.2): the run's wall time, likewise.

Scaled down for a 2-core CPU, as the note says: 4 output tokens a call, 3 turns of
about 40 new tokens each, agents arriving 0.1 s apart; ``--quick`` halves the agents
(12), the prompt (1,000 tokens) and each replica's blocks (200). Both runs send exactly
the same requests (the assistant turns in the history are scripted, not the model's, so a
numeric difference in one run cannot change the other's prompts); the benchmark's test
checks it, with the engine in process.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO

import httpx

from backends import MultiBackend, RemoteBackend, Routing
from engine.benchmarks import Measurement
from governor import AdmissionMode, AgentSpec, Backend, Governor, GovernorConfig

__all__ = ["DEFAULT", "QUICK", "RunResult", "Workload", "compare", "run"]

_BENCH = "replicas"
_START_TIMEOUT_S = 300.0  # three servers importing torch side by side on a loaded box


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    num_replicas: int = 3
    num_teams: int = 4
    agents_per_team: int = 6
    turns: int = 3
    system_tokens: int = 2_000
    max_tokens: int = 4
    num_blocks: int = 400  # per replica: 2 teams' prompts and contexts, not 4
    tool_s: float = 0.02
    arrival_s: float = 0.1  # agent n starts n x this after the first (teams interleaved)

    @property
    def num_agents(self) -> int:
        return self.num_teams * self.agents_per_team

    @property
    def ceiling_tokens(self) -> int:
        return self.system_tokens + 64 * (self.turns + 1) + 256


DEFAULT = Workload()
QUICK = replace(DEFAULT, agents_per_team=3, system_tokens=1_000, num_blocks=200)


@dataclass(slots=True)
class RunResult:
    policy: str
    makespan_s: float = 0.0
    ttfts_s: list[float] = field(default_factory=list)
    prompts: list[int] = field(default_factory=list)  # prompt tokens of each call, in order
    cached: list[int] = field(default_factory=list)  # cached tokens of each call, likewise
    prompt_tokens: int = 0  # as the calls' results say
    cached_tokens: int = 0
    queries: int = 0  # as the servers' counters say
    hits: int = 0
    ledger: tuple[int, int, int, int] = (0, 0, 0, 0)  # the governor's, after the run
    budgets_left: int = 0  # open on the replicas after the run

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else float("nan")

    @property
    def ttft_p50_s(self) -> float:
        return statistics.median(self.ttfts_s)


def run(*, quick: bool = False) -> Iterator[Measurement]:
    workload = QUICK if quick else DEFAULT
    clients: list[RemoteBackend] = []

    def connect() -> list[RemoteBackend]:
        made = [RemoteBackend(url, timeout=600.0) for url in urls]
        clients.extend(made)
        return made

    with _servers(workload) as urls:
        try:
            results = compare(connect, workload)
        finally:
            for client in clients:
                client.close()
    yield from measurements(results, workload)


def compare(replicas: Callable[[], Sequence[Backend]], workload: Workload) -> dict[str, RunResult]:
    """The workload under round robin, then routed, on the same replicas: ``replicas()``
    gives the backends of one run (fresh clients, or the same engines again; the caller
    closes them)."""
    return {
        policy: _measure(replicas(), workload, policy) for policy in ("round_robin", "cache_aware")
    }


def measurements(results: dict[str, RunResult], workload: Workload) -> Iterator[Measurement]:
    rr, routed = results["round_robin"], results["cache_aware"]
    what = (
        f"{workload.num_replicas} kvgov serve replicas (tiny-random, CPU, "
        f"{workload.num_blocks} blocks of 16 each), {workload.num_agents} agents of "
        f"{workload.num_teams} teams, {workload.system_tokens}-token team prompt, "
        f"{workload.turns} turns of {workload.max_tokens} output tokens, parked between; "
        f"{len(rr.prompts)} calls, {rr.prompt_tokens} prompt tokens in each run; cold caches"
    )
    yield Measurement(
        _BENCH,
        "prefix_hit_rate_routed",
        routed.hit_rate,
        "ratio",
        target=0.8,
        note=f"servers' counters: {routed.hits}/{routed.queries} tokens; {what}",
    )
    yield Measurement(
        _BENCH,
        "prefix_hit_rate_round_robin",
        rr.hit_rate,
        "ratio",
        note=f"servers' counters: {rr.hits}/{rr.queries} tokens; the same workload",
    )
    yield Measurement(
        _BENCH,
        "ttft_p50_round_robin_over_routed",
        rr.ttft_p50_s / routed.ttft_p50_s,
        "x",
        target=2.0,
        note=f"median time to first chunk: {rr.ttft_p50_s * 1000:.0f} ms round robin, "
        f"{routed.ttft_p50_s * 1000:.0f} ms routed",
    )
    yield Measurement(
        _BENCH,
        "makespan_round_robin_over_routed",
        rr.makespan_s / routed.makespan_s,
        "x",
        target=1.2,
        note=f"{rr.makespan_s:.1f} s round robin, {routed.makespan_s:.1f} s routed",
    )


# -- one run ---------------------------------------------------------------------------
def _measure(replicas: Sequence[Backend], workload: Workload, policy: str) -> RunResult:
    """One run (the replicas are the caller's to close)."""
    backend = MultiBackend(replicas, routing=Routing(policy=policy))
    governor = Governor(
        backend,
        config=GovernorConfig(mode=AdmissionMode.OVERCOMMIT, park_after_s=0.0),
        agents=[AgentSpec(name="agent", ceiling_tokens=workload.ceiling_tokens)],
    )
    prompts = _team_prompts(governor, workload)
    result = RunResult(policy)
    before = backend.replica_metrics()
    started = time.perf_counter()
    asyncio.run(_swarm(governor, workload, prompts, result, tenant=f"run-{policy}"))
    result.makespan_s = time.perf_counter() - started
    after = backend.replica_metrics()
    for old, new in zip(before, after, strict=True):
        if old is not None and new is not None:
            result.queries += new.prefix_cache_queries - old.prefix_cache_queries
            result.hits += new.prefix_cache_hits - old.prefix_cache_hits
    result.ledger = governor.admission.ledger()
    result.budgets_left = sum(_open_budgets(r) for r in backend.replicas)
    return result


def _team_prompts(governor: Governor, workload: Workload) -> list[str]:
    prompts = []
    for team in range(workload.num_teams):
        words = " ".join(f"rule-{team}-{i} applies to every ticket." for i in range(1_500))
        text = f"You are an agent of team {team}. Follow the team's rules. {words}"
        prompts.append(governor.counter.truncate(text, workload.system_tokens))
    return prompts


async def _swarm(
    governor: Governor, workload: Workload, prompts: list[str], result: RunResult, tenant: str
) -> None:
    calls: dict[tuple[int, int], tuple[float, int, int]] = {}

    async def agent(number: int) -> None:
        await asyncio.sleep(number * workload.arrival_s)
        team = number % workload.num_teams
        messages = [{"role": "system", "content": prompts[team]}]
        async with governor.lease("agent", tenant=tenant) as lease:
            for turn in range(workload.turns):
                messages.append({"role": "user", "content": _task(number, turn)})
                started = time.perf_counter()
                first, done = None, None
                stream = governor.astream(lease, messages, max_tokens=workload.max_tokens)
                async for chunk in stream:
                    if first is None:
                        first = time.perf_counter() - started
                    if chunk.result is not None:
                        done = chunk.result
                assert first is not None and done is not None
                calls[number, turn] = (first, done.prompt_tokens, done.cached_tokens)
                messages.append({"role": "assistant", "content": f"Noted: step {turn} done."})
                if turn + 1 < workload.turns:
                    async with governor.tool_call(lease, "lookup", expected_s=workload.tool_s):
                        await asyncio.sleep(workload.tool_s)

    await asyncio.gather(*(agent(n) for n in range(workload.num_agents)))
    for key in sorted(calls):
        ttft, prompt_tokens, cached_tokens = calls[key]
        result.ttfts_s.append(ttft)
        result.prompts.append(prompt_tokens)
        result.cached.append(cached_tokens)
        result.prompt_tokens += prompt_tokens
        result.cached_tokens += cached_tokens


def _task(number: int, turn: int) -> str:
    return (
        f"Ticket {number}-{turn}: the customer of account {1000 + number} reports that step "
        f"{turn} failed after the upgrade; find the cause in the logs and say what to do."
    )


def _open_budgets(replica: Backend) -> int:
    """Budgets open on a replica: ``kvgov serve``'s ``/kvgov/v1/kv``, or the engine's own
    snapshot in process."""
    for name in ("kv_map", "kv_snapshot"):
        snapshot = getattr(replica, name, None)
        if callable(snapshot):
            return len(snapshot().budgets)
    return 0


# -- the servers -----------------------------------------------------------------------
@contextmanager
def _servers(workload: Workload) -> Iterator[list[str]]:
    """``kvgov serve`` replicas on free loopback ports, started side by side."""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    processes, urls = [], []
    with tempfile.TemporaryFile() as log:
        try:
            for _ in range(workload.num_replicas):
                port = _free_port()
                flags = {
                    "--port": str(port),
                    "--num-blocks": str(workload.num_blocks),
                    "--device": "cpu",
                }
                command = [
                    sys.executable,
                    "-m",
                    "kvgov.serve",
                    *(p for f in flags.items() for p in f),
                ]
                processes.append(
                    subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
                )
                urls.append(f"http://127.0.0.1:{port}")
            for process, url in zip(processes, urls, strict=True):
                _wait_for(process, url, log)
            yield urls
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)


def _wait_for(process: subprocess.Popen[bytes], url: str, log: IO[bytes]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"a kvgov serve replica exited:\n{log.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"a kvgov serve replica did not answer /health within {_START_TIMEOUT_S} s")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
