"""The runner the research baselines run through: the swarm's agents on one engine,
driven from one thread, with no governor.

The runner owns the engine (``Engine`` is single-threaded) and is the agents' program:
it submits each agent's next call when its tool returns, steps the engine while any
request is unfinished, and otherwise sleeps until the next tool returns. Tool latencies
are real seconds on the wall clock, as in the kvgov run, so a policy that holds KV
through a long tool holds it that long. What each policy decides about an agent's KV
while it waits on a tool, and the priority of its calls, is the policy's
(``baselines``); the runner only calls it at the points an engine integration
would: when a call ends in a tool call, before the next call, and between steps.

A planner waits on its workers as on a tool (``fanout``) whose expected length is the
longest worker's: every policy sees it like that.

Time is the runner's ``clock``: the wall clock (``WallClock``) in a real run; on the
hardware twin (``swarm.twin``) a virtual one, where the engine's steps move it by their
modelled durations and a wait for the next tool moves it to that tool's return.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from engine import Engine, FinishReason, SamplingParams
from kvgov.benchmarks.swarm.result import RunResult
from kvgov.benchmarks.swarm.workload import AgentScript

__all__ = [
    "Agent",
    "AgentState",
    "KVPolicy",
    "RunnerClock",
    "SwarmRunner",
    "SwarmTimeout",
    "WallClock",
]

_IDLE_S = 0.02  # the longest real sleep between two looks at the clock
_OK = (FinishReason.LENGTH, FinishReason.STOP)


class SwarmTimeout(RuntimeError):
    """A run went past its deadline: the machine is far slower than the workload's sizes
    assume; run with ``--quick`` or on a quieter machine."""


class AgentState(Enum):
    NOT_STARTED = "not started"
    READY = "ready"  # its next call is due at ``ready_at``
    CALLING = "calling"
    IDLE = "idle"  # on a tool, or waiting on its workers
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class Agent:
    script: AgentScript
    index: int  # its position in the run: program-level arrival order
    budget: str
    state: AgentState = AgentState.NOT_STARTED
    turn: int = 0
    ready_at: float = 0.0
    started_at: float = 0.0
    request_id: str | None = None
    context_tokens: int = 0  # its latest call's prompt and output

    @property
    def tool_expected_s(self) -> float:
        return self.script.turns[self.turn].expected_s


class RunnerClock(Protocol):
    def now(self) -> float: ...  # seconds since the run's clock started
    # Nothing runs: wait for the next event, ``seconds`` ahead (infinity: none is known).
    def wait(self, seconds: float) -> None: ...
    # Before a step: the next time (on this clock) at which the runner or its policy
    # acts. A clock whose engine may take several decode steps in one call (the twin's,
    # ``engine.decode_run``) takes none that ends at or after it.
    def next_event(self, at: float) -> None: ...
    # After a step: when each step the engine's last call made ended, in order.
    def steps_ended(self) -> Sequence[float]: ...


class WallClock:
    """The real run's clock: ``time.perf_counter`` from when it was made, real sleeps."""

    def __init__(self) -> None:
        self._t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def wait(self, seconds: float) -> None:
        time.sleep(min(_IDLE_S, seconds) if seconds > 0 else _IDLE_S)  # a look now and then

    def next_event(self, at: float) -> None:
        return None  # a real engine takes one step a call

    def steps_ended(self) -> Sequence[float]:
        return (self.now(),)


class KVPolicy(Protocol):
    name: str

    def priority(self, agent: Agent) -> int: ...
    # When the agent's next call counts as having arrived, in the run's seconds, for its
    # order within its priority (the engine's ``order_time``); None: when it is sent.
    def order_time(self, agent: Agent) -> float | None: ...
    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None: ...
    def before_call(self, engine: Engine, agent: Agent) -> None: ...
    def tick(self, engine: Engine, now: float) -> None: ...
    # Until when (the run's seconds) ``tick`` does nothing that decode steps taken in
    # one call would change (``RunnerClock.next_event``): ``now`` when it must see every
    # step's engine state, infinity when it never acts on its own.
    def quiet_until(self, now: float) -> float: ...


class SwarmRunner:
    def __init__(
        self,
        engine: Engine,
        scripts: Sequence[AgentScript],
        prompts: dict[tuple[str, int], list[int]],
        policy: KVPolicy,
        *,
        reply_tokens: int,
        on_call: Callable[[], None] = lambda: None,
        clock: RunnerClock | None = None,
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.prompts = prompts  # (agent, turn) -> the chat template's token ids
        self.sampling = SamplingParams(max_tokens=reply_tokens, temperature=0.0)
        self.agents = [Agent(s, i, f"agent-{s.name}") for i, s in enumerate(scripts)]
        self.on_call = on_call
        self.clock = clock if clock is not None else WallClock()
        self._by_request: dict[str, Agent] = {}

    def drive(self, result: RunResult, *, deadline_s: float) -> None:
        engine, clock = self.engine, self.clock
        t0 = clock.now()
        for agent in self.agents:
            engine.open_budget(agent.budget, engine.capacity().num_blocks)
            if agent.script.planner:
                self._start(agent, agent.script.arrival_s)
        try:
            while any(a.state not in (AgentState.DONE, AgentState.FAILED) for a in self.agents):
                now = clock.now() - t0
                if now > deadline_s:
                    raise SwarmTimeout(f"{self.policy.name}: past {deadline_s:.0f} s")
                for agent in self.agents:
                    if agent.state is AgentState.READY and agent.ready_at <= now:
                        self._submit(agent, result, now)
                if engine.has_unfinished():
                    due = [a.ready_at for a in self.agents if a.state is AgentState.READY]
                    clock.next_event(t0 + min([self.policy.quiet_until(now), *due]))
                    outputs = engine.step()
                    now = clock.now() - t0
                    for output in outputs:
                        if output.finished:
                            self._finished(self._by_request.pop(output.request_id), now, result)
                    # One tick after each step, as between steps taken one at a time.
                    for ended in clock.steps_ended()[:-1]:
                        self.policy.tick(engine, ended - t0)
                else:
                    due = [a.ready_at for a in self.agents if a.state is AgentState.READY]
                    clock.wait(min([self.policy.quiet_until(now), *due]) - now)
                self.policy.tick(engine, clock.now() - t0)
            result.makespan_s = clock.now() - t0
        finally:
            for request_id in list(self._by_request):
                engine.abort(request_id)
                engine.pop_completion(request_id)
            for agent in self.agents:
                engine.close_budget(agent.budget)

    def _start(self, agent: Agent, at: float) -> None:
        agent.state, agent.ready_at, agent.started_at = AgentState.READY, at, at

    def _submit(self, agent: Agent, result: RunResult, now: float) -> None:
        self.policy.before_call(self.engine, agent)
        at = self.policy.order_time(agent)
        # The run's seconds on the engine's clock: as many seconds before its now.
        order_time = None if at is None else self.engine.clock() - (now - at)
        try:
            turn = agent.script.turns[agent.turn]
            sampling = self.sampling
            if turn.reply_tokens is not None:
                sampling = SamplingParams(max_tokens=turn.reply_tokens, temperature=0.0)
            agent.request_id = self.engine.add_request(
                self.prompts[(agent.script.name, agent.turn)],
                sampling,
                budget=agent.budget,
                priority=self.policy.priority(agent),
                order_time=order_time,
            )
        except Exception as exc:  # the engine refused it: the job fails, the run goes on
            self._fail(agent, type(exc).__name__, result, agent.ready_at)
            return
        agent.state = AgentState.CALLING
        self._by_request[agent.request_id] = agent

    def _finished(self, agent: Agent, now: float, result: RunResult) -> None:
        completion = self.engine.pop_completion(agent.request_id or "")
        self.on_call()
        if completion.finish_reason not in _OK:
            self._fail(agent, completion.finish_reason.value, result, now)
            return
        agent.context_tokens = len(completion.prompt_token_ids) + len(completion.token_ids)
        turn = agent.script.turns[agent.turn]
        if turn.tool is None:
            agent.state = AgentState.DONE
            result.jct_s[agent.script.name] = now - agent.started_at
            self._worker_ended(agent, now)
            return
        agent.state = AgentState.IDLE
        self.policy.on_idle(self.engine, agent, now)
        agent.turn += 1
        if turn.tool == "fanout":
            for worker in self._workers(agent):
                self._start(worker, now)
        else:
            agent.state, agent.ready_at = AgentState.READY, now + turn.tool_s

    def _fail(self, agent: Agent, why: str, result: RunResult, now: float) -> None:
        agent.state = AgentState.FAILED
        result.failed.append(f"{agent.script.name}: {why}")
        self._worker_ended(agent, now)

    def _worker_ended(self, agent: Agent, now: float) -> None:
        if agent.script.planner:
            return
        planner = next(
            a for a in self.agents if a.script.planner and a.script.team == agent.script.team
        )
        workers = self._workers(planner)
        ended = (AgentState.DONE, AgentState.FAILED)
        if planner.state is AgentState.IDLE and all(w.state in ended for w in workers):
            planner.state, planner.ready_at = AgentState.READY, now

    def _workers(self, planner: Agent) -> list[Agent]:
        team = planner.script.team
        return [a for a in self.agents if a.script.team == team and not a.script.planner]
