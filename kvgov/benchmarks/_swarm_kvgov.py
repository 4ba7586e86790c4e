"""The swarm under kvgov, configured as a user would: ``Governor`` over ``LocalBackend``.

Each agent is a thread, as in an agent runtime: a planner takes a lease, plans, fans out
to its workers through ``Governor.child`` (its ``max_fanout`` caps how many run at once,
and the planner is parked meanwhile), and merges their reports; a worker's tool calls
run inside ``Governor.tool_call`` with the tool's expected duration, so the governor
parks the lease, holds its KV (``retain_s``), offloads it under pressure and restores it
before the next call. Admission is overcommit: leases are admitted on live use plus
headroom. Each team's system prompt is registered once as a shared prefix. The tool
output and ceiling policies are kvgov's defaults for a coding swarm; the workload's
prompts already fit them, so they change nothing here and every policy sends the same
requests.

The engine is the one the baselines ran on (same blocks, same settings), wrapped in an
``EngineLoop`` for the run and left as it was after.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from engine import Engine
from engine.engine_loop import EngineLoop
from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig, LocalBackend, Policies
from kvgov.benchmarks._swarm_result import EngineTap, RunResult
from kvgov.benchmarks._swarm_runner import SwarmTimeout
from kvgov.benchmarks._swarm_workload import AgentScript, SwarmWorkload
from policies import ExtractiveSummarizer, SummarizeOldest

__all__ = ["KVGOV_CONFIG", "run_kvgov"]

KVGOV_CONFIG = GovernorConfig(mode=AdmissionMode.OVERCOMMIT, park_after_s=0.05)
_MAX_FANOUT = 4


def run_kvgov(
    engine: Engine,
    scripts: Sequence[AgentScript],
    workload: SwarmWorkload,
    result: RunResult,
    *,
    deadline_s: float,
    on_call: Callable[[], None] = lambda: None,
    config: GovernorConfig = KVGOV_CONFIG,
) -> None:
    names: dict[str, str] = {}
    tap = EngineTap(engine, result, lambda budget: names.get(budget, budget))
    backend = LocalBackend(EngineLoop(engine))
    try:
        _run(backend, scripts, workload, result, names, deadline_s, on_call, config)
    finally:
        backend.close()
        tap.close()


def _ceiling(peers: Sequence[AgentScript], workload: SwarmWorkload, backend: LocalBackend) -> int:
    """The ceiling a user sets for an agent kind: its largest context and a reply, with a
    block to spare (at most the workload's own ceiling, at which it compacts)."""
    peak = max(backend.counter.count_messages(list(t.messages)) for s in peers for t in s.turns)
    return min(workload.ceiling_tokens, peak + workload.reply_tokens + 16)


def _run(
    backend: LocalBackend,
    scripts: Sequence[AgentScript],
    workload: SwarmWorkload,
    result: RunResult,
    names: dict[str, str],
    deadline_s: float,
    on_call: Callable[[], None],
    config: GovernorConfig,
) -> None:
    policies = Policies(
        tool_output=ExtractiveSummarizer(backend.counter),
        ceiling=SummarizeOldest(summary_tokens=160),
    )
    governor = Governor(backend, config=config, policies=policies)
    for team in sorted({s.team for s in scripts}):
        planner = next(s for s in scripts if s.planner and s.team == team)
        governor.register_prefix(f"team-{team}", [planner.system])
        for kind, fanout in (("planner", _MAX_FANOUT), ("worker", 1)):
            peers = [s for s in scripts if s.team == team and s.planner == (kind == "planner")]
            governor.register_agent(AgentSpec(
                name=f"t{team}-{kind}", ceiling_tokens=_ceiling(peers, workload, backend),
                max_fanout=fanout, prefix=f"team-{team}",
                tool_output_tokens=None if kind == "planner" else workload.tool_output_tokens,
            ))  # fmt: skip
    lock, t0 = threading.Lock(), time.perf_counter()

    def call(lease: object, script: AgentScript, index: int) -> None:
        turn = script.turns[index]
        governor.complete(lease, list(turn.messages), max_tokens=workload.reply_tokens)  # type: ignore[arg-type]
        on_call()

    def finished(script: AgentScript, started: float, error: BaseException | None) -> None:
        with lock:
            if error is None:
                result.jct_s[script.name] = time.perf_counter() - t0 - started
            else:
                result.failed.append(f"{script.name}: {type(error).__name__}")

    def worker(planner_lease: object, script: AgentScript, started: float) -> None:
        error = None
        try:
            with governor.child(planner_lease, f"t{script.team}-worker") as lease:  # type: ignore[arg-type]
                names[lease.budget] = script.name
                for index, turn in enumerate(script.turns):
                    call(lease, script, index)
                    if turn.tool is not None:
                        with governor.tool_call(lease, turn.tool, expected_s=turn.expected_s):
                            time.sleep(turn.tool_s)
        except Exception as exc:  # the job fails; the run goes on and counts it
            error = exc
        finished(script, started, error)

    def planner(script: AgentScript) -> None:
        time.sleep(script.arrival_s)
        started, error = time.perf_counter() - t0, None
        try:
            with governor.lease(f"t{script.team}-planner") as lease:
                names[lease.budget] = script.name
                call(lease, script, 0)
                fanned = time.perf_counter() - t0
                workers = [s for s in scripts if s.team == script.team and not s.planner]
                threads = [threading.Thread(target=worker, args=(lease, w, fanned), daemon=True)
                           for w in workers]  # fmt: skip
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(max(0.0, deadline_s - (time.perf_counter() - t0)))
                call(lease, script, 1)
        except Exception as exc:
            error = exc
        finished(script, started, error)

    planners = [threading.Thread(target=planner, args=(s,), daemon=True)
                for s in scripts if s.planner]  # fmt: skip
    try:
        for thread in planners:
            thread.start()
        for thread in planners:
            thread.join(max(0.0, deadline_s - (time.perf_counter() - t0)))
        if any(thread.is_alive() for thread in planners):
            raise SwarmTimeout(f"kvgov: past {deadline_s:.0f} s")
        result.makespan_s = time.perf_counter() - t0
    finally:
        for team in sorted({s.team for s in scripts}):
            governor.unregister_prefix(f"team-{team}")
