"""The swarm under kvgov, configured as a user would: ``Governor`` over ``LocalBackend``.

Each agent is a task on an event loop, as in an async agent runtime (LangGraph's
``ainvoke``): a planner takes a lease, plans, fans out to its workers through
``Governor.child`` (its ``max_fanout`` caps how many run at once, and the planner is
parked meanwhile), and merges their reports; a worker's tool calls run inside
``Governor.tool_call`` with the tool's expected duration, so the governor parks the
lease, holds its KV (``retain_s``), offloads it under pressure and restores it before the
next call. Admission is overcommit: leases are admitted on live use plus headroom, in
program order (``ProgramOrder``: a parked worker's next call keeps its program's place,
as the engine's queue keeps it; chosen on the open-loop benchmark's tuning seed). Each
team's system prompt is registered once as a shared prefix. The tool output and ceiling
policies are kvgov's defaults for a coding swarm; the workload's prompts already fit
them, so they change nothing here and every policy sends the same requests.

One program (``kvgov_program``) runs both ways: ``run_kvgov`` on a real event loop over
the engine's ``EngineLoop`` thread; on the hardware twin (``swarm.twin``) on a
virtual-time loop over a ``TwinEngineLoop``, the governor on that loop's clock. Each tool
wait records how late it returned (``RunResult.tool_lateness_s``): on a real loop busy
with other agents a tool returns a few milliseconds after its time, which moves a tool
that takes about ``park_after_s`` across the park; the twin's loop is punctual unless
``tool_delay`` adds such lateness.

The engine is the one the baselines ran on (same blocks, same settings), wrapped in an
``EngineLoop`` for the run and left as it was after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from backends import LocalBackend
from engine import Engine
from engine.engine_loop import EngineLoop
from governor import AdmissionMode, AgentSpec, Governor, GovernorConfig, Lease, Policies
from governor.clock import SYSTEM_CLOCK, Clock
from kvgov.benchmarks.swarm.result import EngineTap, RunResult
from kvgov.benchmarks.swarm.runner import SwarmTimeout
from kvgov.benchmarks.swarm.workload import AgentScript, SwarmWorkload
from policies import ExtractiveSummarizer, ProgramOrder, SummarizeOldest

__all__ = ["KVGOV_CONFIG", "kvgov_program", "run_kvgov"]

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
        program = kvgov_program(
            backend,
            scripts,
            workload,
            result,
            names=names,
            deadline_s=deadline_s,
            on_call=on_call,
            config=config,
        )
        asyncio.run(program)
    finally:
        backend.close()
        tap.close()


def _ceiling(peers: Sequence[AgentScript], workload: SwarmWorkload, backend: LocalBackend) -> int:
    """The ceiling a user sets for an agent kind: its largest context and a reply, with a
    block to spare (at most the workload's own ceiling, at which it compacts)."""
    needed = 16 + max(
        backend.counter.count_messages(list(t.messages))
        + (workload.reply_tokens if t.reply_tokens is None else t.reply_tokens)
        for s in peers
        for t in s.turns
    )
    return needed if workload.ceiling_tokens is None else min(workload.ceiling_tokens, needed)


async def kvgov_program(
    backend: LocalBackend,
    scripts: Sequence[AgentScript],
    workload: SwarmWorkload,
    result: RunResult,
    *,
    names: dict[str, str],
    deadline_s: float,
    on_call: Callable[[], None] = lambda: None,
    config: GovernorConfig = KVGOV_CONFIG,
    clock: Clock | None = None,
    tool_delay: Callable[[], float] = lambda: 0.0,
) -> None:
    """Every agent of ``scripts`` under one governor over ``backend``, on the running loop
    and its time; ``names`` hears each lease's budget -> agent; ``clock`` is the
    governor's (the real one unless given); ``tool_delay()`` is added to each tool's
    wait."""
    policies = Policies(
        tool_output=ExtractiveSummarizer(backend.counter),
        ceiling=SummarizeOldest(summary_tokens=160),
        # Programs first come, first served, as the engine orders its queue: what an
        # agent swarm under memory pressure is served by (policies.program_order).
        admission=ProgramOrder(aging_s=config.aging_s),
    )
    clock = SYSTEM_CLOCK if clock is None else clock
    governor = Governor(backend, config=config, policies=policies, clock=clock)
    for team in sorted({s.team for s in scripts}):
        lead = next(s for s in scripts if s.planner and s.team == team)
        governor.register_prefix(f"team-{team}", [lead.system])
        for kind, fanout in (("planner", _MAX_FANOUT), ("worker", 1)):
            peers = [s for s in scripts if s.team == team and s.planner == (kind == "planner")]
            governor.register_agent(
                AgentSpec(
                    name=f"t{team}-{kind}",
                    ceiling_tokens=_ceiling(peers, workload, backend),
                    max_fanout=fanout,
                    prefix=f"team-{team}",
                    tool_output_tokens=None if kind == "planner" else workload.tool_output_tokens,
                )
            )
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def call(lease: Lease, script: AgentScript, index: int) -> None:
        turn = script.turns[index]
        tokens = workload.reply_tokens if turn.reply_tokens is None else turn.reply_tokens
        await governor.acomplete(lease, list(turn.messages), max_tokens=tokens)
        on_call()

    def finished(script: AgentScript, started: float, error: BaseException | None) -> None:
        if error is None:
            result.jct_s[script.name] = loop.time() - t0 - started
        else:
            result.failed.append(f"{script.name}: {type(error).__name__}")

    async def worker(planner_lease: Lease, script: AgentScript, started: float) -> None:
        error = None
        try:
            async with governor.child(planner_lease, f"t{script.team}-worker") as lease:
                names[lease.budget] = script.name
                for index, turn in enumerate(script.turns):
                    await call(lease, script, index)
                    if turn.tool is not None:
                        async with governor.tool_call(lease, turn.tool, expected_s=turn.expected_s):
                            began = loop.time()
                            await asyncio.sleep(turn.tool_s + tool_delay())
                            result.tool_lateness_s.append(loop.time() - began - turn.tool_s)
        except Exception as exc:  # the job fails; the run goes on and counts it
            error = exc
        finished(script, started, error)

    async def planner(script: AgentScript) -> None:
        await asyncio.sleep(script.arrival_s)
        started, error = loop.time() - t0, None
        try:
            async with governor.lease(f"t{script.team}-planner") as lease:
                names[lease.budget] = script.name
                await call(lease, script, 0)
                fanned = loop.time() - t0
                workers = [s for s in scripts if s.team == script.team and not s.planner]
                await asyncio.gather(*(worker(lease, w, fanned) for w in workers))
                await call(lease, script, 1)
        except Exception as exc:
            error = exc
        finished(script, started, error)

    try:
        planners = [planner(s) for s in scripts if s.planner]
        try:
            await asyncio.wait_for(asyncio.gather(*planners), deadline_s)
        except TimeoutError:
            raise SwarmTimeout(f"kvgov: past {deadline_s:.0f} s") from None
        result.makespan_s = loop.time() - t0
    finally:
        for team in sorted({s.team for s in scripts}):
            governor.unregister_prefix(f"team-{team}")
