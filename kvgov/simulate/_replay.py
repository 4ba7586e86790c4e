"""A recorded trace replayed on the hardware twin: one program for the three schemes of
``kvgov.simulate``, each on its own engine, in virtual time.

Every agent of the ``TraceWorkload`` is a task on a virtual-time loop
(``engine.twin.event_loop``), as in an async agent runtime: it starts where the
workload says (a root at its offset or after the leases of its run it followed; a child
when its parent's phase fans it out, after the recorded delay), then for each phase runs
its tool for the recorded time, fans out its children, waits for them where it did, or
idles for the recorded gap, and makes its next call with the recorded prompt
(``PromptBook``: the recorded token count, grown as its context grew) for the recorded
number of tokens. The engine is the real one with no forward pass (every decision its
own, every step timed by the twin) behind ``LocalBackend`` on a ``TwinEngineLoop``:

- ``reserve`` and ``paged`` send each call to the backend as it comes, with no governor:
  what an agent runtime does in front of a server (the engine's own first come, first
  served; KV freed when a call ends, its full blocks left to the prefix cache);
- ``kvgov`` runs the same program under a ``Governor`` as ``kvgov bench swarm``
  configures one (overcommitted admission, parking, held KV offloaded under pressure):
  a lease per agent, a child's through ``Governor.child`` (a parent fans out at most
  four at once), tools inside ``Governor.tool_call`` with the mean recorded time of that
  tool as its expected length, and each kind's shared prefix registered once. Each kind's
  ceiling holds its largest recorded context, so nothing is compacted: every scheme
  replays the same contexts.

An agent whose call fails (the model's context outgrown, the budget refusing it) ends
there; the children it had yet to fan out never start and fail with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from backends import LocalBackend
from engine import Engine
from engine.twin import Direction, HostLink, VirtualClock
from engine.twin.event_loop import run_virtual
from engine.twin.twin_engine import attach_twin
from engine.twin.twin_loop import TwinEngineLoop
from governor import AgentSpec, GenerationRequest, GenerationResult, Governor, Lease
from kvgov.benchmarks.swarm.kvgov import KVGOV_CONFIG
from kvgov.benchmarks.swarm.result import EngineCounters, EngineTap, RunResult
from kvgov.benchmarks.swarm.runner import SwarmTimeout
from kvgov.simulate._prompts import PromptBook
from kvgov.simulate.trace import Phase, TracedAgent, TraceWorkload

__all__ = ["AgentReplay", "Replay", "replay"]

_MAX_FANOUT = 4  # kvgov bench swarm's cap on a planner's children at once


@dataclass(slots=True)
class AgentReplay:
    """What one agent did in a replay, in virtual seconds from the replay's start."""

    started_s: float | None = None
    # (start, end, prompt tokens, output tokens), the tokens as the engine counted them
    calls: list[tuple[float, float, int, int]] = field(default_factory=list)
    tools: list[tuple[str, float]] = field(default_factory=list)  # (tool, seconds it took)
    failed: str | None = None  # why it ended early


@dataclass(slots=True)
class Replay:
    """One scheme's replay: the benchmark's figures, the twin's, and each agent's log."""

    result: RunResult
    agents: dict[str, AgentReplay]
    compute_s: float
    stall_s: float
    link_bytes: int
    peak_running: int
    wall_s: float


def replay(
    engine: Engine,
    scheme: str,
    workload: TraceWorkload,
    book: PromptBook,
    *,
    profile: Any,
    model_shape: Any,
    deadline_s: float,
) -> Replay:
    """``workload`` on ``engine``'s twin under ``scheme``, from a cold prefix cache."""
    began = time.perf_counter()
    cold = engine.reset_prefix_cache()
    assert cold, "a replay starts from a cold prefix cache, with nothing held or pinned"
    capacity = engine.capacity()
    result = RunResult(
        scheme, 1.0, capacity.num_blocks, capacity.bytes_per_block, capacity.num_host_blocks
    )
    agents = {a.name: AgentReplay() for a in workload.agents}
    before = EngineCounters.of(engine.metrics())
    twin = attach_twin(
        engine,
        profile=profile,
        model_shape=model_shape,
        clock=VirtualClock(),
        link=HostLink(profile=profile),
        advance=False,
        forward=False,
    )
    try:
        tap = EngineTap(engine, result, lambda budget: budget)
        try:
            program = _Program(workload, book, agents, result, governed=scheme == "kvgov")
            run_virtual(program.run(twin, deadline_s), clock=twin.clock)
        finally:
            tap.close()
    finally:
        twin.detach()
    result.counters = EngineCounters.of(engine.metrics()) - before
    return Replay(
        result=result,
        agents=agents,
        compute_s=twin.compute_s,
        stall_s=twin.stall_s,
        link_bytes=sum(twin.link.totals(d).num_bytes for d in Direction),
        peak_running=twin.peak_sequences,
        wall_s=time.perf_counter() - began,
    )


class _Program:
    """The agents' tasks on the running loop; see the module docstring."""

    def __init__(
        self,
        workload: TraceWorkload,
        book: PromptBook,
        log: dict[str, AgentReplay],
        result: RunResult,
        *,
        governed: bool,
    ) -> None:
        self.workload = workload
        self.book = book
        self.log = log
        self.result = result
        self.governed = governed
        self.agents = {a.name: a for a in workload.agents}
        self.governor: Governor | None = None
        self.backend: LocalBackend | None = None
        self.ended: dict[str, asyncio.Event] = {}
        self.expected_s = _mean_tool_times(workload)
        self.t0 = 0.0

    async def run(self, twin: Any, deadline_s: float) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        self.ended = {name: asyncio.Event() for name in self.agents}
        self.backend = LocalBackend(TwinEngineLoop(twin))
        try:
            if self.governed:
                self.governor = self._governor(self.backend, loop)
            roots = [self._root(a) for a in self.workload.agents if a.parent is None]
            try:
                await asyncio.wait_for(asyncio.gather(*roots), deadline_s)
            except TimeoutError:
                raise SwarmTimeout(f"trace replay: past {deadline_s:.0f} s") from None
            self.result.makespan_s = self._now()
        finally:
            if self.governor is not None:
                for kind in self.book.prefixes:
                    self.governor.unregister_prefix(f"trace-{kind}")
            self.backend.close()

    def _governor(self, backend: LocalBackend, clock: Any) -> Governor:
        governor = Governor(backend, config=KVGOV_CONFIG, clock=clock)
        for kind, message in self.book.prefixes.items():
            governor.register_prefix(f"trace-{kind}", [message])
        block = backend.capacity().block_size
        for kind in sorted({a.kind for a in self.workload.agents}):
            mine = [a for a in self.workload.agents if a.kind == kind]
            peak = max(
                (
                    sent + call.output_tokens
                    for a in mine
                    for sent, call in zip(self.book.sent_tokens[a.name], a.calls, strict=True)
                ),
                default=0,
            )
            fans_out = any(p.children for a in mine for p in a.phases)
            governor.register_agent(
                AgentSpec(
                    name=kind,
                    # Its largest recorded context and a block to spare: never compacted.
                    ceiling_tokens=max(block, math.ceil((peak + 1) / block) * block),
                    max_fanout=_MAX_FANOUT if fans_out else 1,
                    prefix=f"trace-{kind}" if kind in self.book.prefixes else None,
                )
            )
        return governor

    def _now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    async def _root(self, agent: TracedAgent) -> None:
        for name in agent.after:
            await self.ended[name].wait()
        await asyncio.sleep(agent.delay_s)
        await self._agent(agent, None)

    async def _child(self, agent: TracedAgent, parent: Lease | None, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        await self._agent(agent, parent)

    async def _agent(self, agent: TracedAgent, parent: Lease | None) -> None:
        entry = self.log[agent.name]
        entry.started_s = self._now()
        spawned: list[asyncio.Task[None]] = []
        index = 0
        try:
            async with self._lease(agent, parent) as lease:
                try:
                    for index, phase in enumerate(agent.phases):
                        await self._phase(agent, phase, lease, spawned)
                        if index < len(agent.calls):
                            await self._call(agent, index, lease)
                except Exception as exc:  # the job fails; the replay goes on and counts it
                    self._fail(agent, type(exc).__name__)
                    for phase in agent.phases[index + 1 :]:
                        for child, _ in phase.children:
                            self._never_started(child)
                finally:
                    await asyncio.gather(*spawned)  # a lease outlives its children
        except Exception as exc:  # no lease: refused at admission
            self._fail(agent, type(exc).__name__)
            for phase in agent.phases:
                for child, _ in phase.children:
                    self._never_started(child)
        finally:
            self.ended[agent.name].set()
        if entry.failed is None:
            end = entry.calls[-1][1] if entry.calls else self._now()
            self.result.jct_s[agent.name] = end - entry.started_s

    @contextlib.asynccontextmanager
    async def _lease(self, agent: TracedAgent, parent: Lease | None) -> AsyncIterator[Lease | None]:
        if self.governor is None:
            yield None
        elif parent is None:
            async with self.governor.lease(agent.kind) as lease:
                yield lease
        else:
            async with self.governor.child(parent, agent.kind) as lease:
                yield lease

    async def _phase(
        self,
        agent: TracedAgent,
        phase: Phase,
        lease: Lease | None,
        spawned: list[asyncio.Task[None]],
    ) -> None:
        """Its tools, its children fanned out (each at its delay; added to ``spawned``),
        and the wait for them or the recorded gap."""
        children = [
            asyncio.ensure_future(self._child(self.agents[name], lease, delay))
            for name, delay in phase.children
        ]
        spawned += children
        if phase.tool is not None:
            started = self._now()
            await self._tool(phase, lease)
            self.log[agent.name].tools.append((phase.tool, self._now() - started))
        if phase.waits:
            await asyncio.gather(*children)
            await asyncio.sleep(phase.post_wait_s)
        elif phase.idle_s:
            await asyncio.sleep(phase.idle_s)

    async def _tool(self, phase: Phase, lease: Lease | None) -> None:
        assert phase.tool is not None
        if self.governor is None or lease is None:
            await asyncio.sleep(phase.tool_s)
            return
        expected = self.expected_s[phase.tool]
        async with self.governor.tool_call(lease, phase.tool, expected_s=expected):
            await asyncio.sleep(phase.tool_s)

    async def _call(self, agent: TracedAgent, index: int, lease: Lease | None) -> None:
        messages = self.book.messages[agent.name][index]
        max_tokens = max(1, agent.calls[index].output_tokens)
        started = self._now()
        done: Awaitable[GenerationResult]
        if self.governor is not None and lease is not None:
            done = self.governor.acomplete(lease, messages, max_tokens=max_tokens)
        else:
            assert self.backend is not None
            request = GenerationRequest(messages=messages, max_tokens=max_tokens)
            done = self.backend.agenerate(request)
        result = await done
        self.log[agent.name].calls.append(
            (started, self._now(), result.prompt_tokens, result.completion_tokens)
        )

    def _fail(self, agent: TracedAgent, why: str) -> None:
        entry = self.log[agent.name]
        if entry.failed is None:  # the first reason: a failed release after a failed call
            entry.failed = why
            self.result.failed.append(f"{agent.name}: {why}")

    def _never_started(self, name: str) -> None:
        """A child its parent failed before fanning out, and its own children with it."""
        agent = self.agents[name]
        if self.log[name].started_s is not None:
            return
        self._fail(agent, "its parent failed first")
        self.ended[name].set()
        for phase in agent.phases:
            for child, _ in phase.children:
                self._never_started(child)


def _mean_tool_times(workload: TraceWorkload) -> dict[str, float]:
    """Each tool's mean recorded time: what a runtime can know of it in advance."""
    times: dict[str, list[float]] = {}
    for agent in workload.agents:
        for phase in agent.phases:
            if phase.tool is not None:
                times.setdefault(phase.tool, []).append(phase.tool_s)
    return {tool: sum(ts) / len(ts) for tool, ts in times.items()}
