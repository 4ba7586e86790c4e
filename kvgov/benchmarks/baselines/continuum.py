"""Continuum's time-to-live pins for agents' KV across tool calls."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine import Engine
from kvgov.benchmarks._swarm_runner import Agent
from kvgov.benchmarks.baselines.costs import Costs

__all__ = ["TtlPin"]


@dataclass(slots=True)
class TtlPin:
    """Continuum (Li et al., arXiv 2511.02230): when a call ends in a tool call, pin its
    KV for a time-to-live, then let it go; schedule program-level first come first
    served (an agent's calls keep the priority of its program's arrival).

    The TTL is Continuum's trade-off: pin for the tau that maximizes
    ``P(tool returns within tau) x reload cost - memory price x E[min(tool time, tau)]``,
    the reload cost being the context's recompute time on this engine and the memory
    price the pinned share of the pool (holding all of it for a second costs a second).
    The tool-time distribution is each tool's durations seen so far in the run, the
    runtime's expected duration as its first sample (Continuum's per-tool history). A
    pin is the engine's ``retain``; under pressure the engine may take a pin back before
    preempting a running request, as it does for every hold.
    """

    costs: Costs
    name: str = "ttl-pin"
    _durations: dict[str, list[float]] = field(default_factory=dict)
    _expiry: dict[str, float] = field(default_factory=dict)  # budget -> run time
    _idle_since: dict[str, tuple[str, float]] = field(default_factory=dict)

    def priority(self, agent: Agent) -> int:
        return -agent.index

    def order_time(self, agent: Agent) -> float | None:
        return None

    def ttl(self, engine: Engine, agent: Agent) -> float:
        tool = agent.script.turns[agent.turn].tool or ""
        seen = self._durations.setdefault(tool, [agent.tool_expected_s])
        reload_s = agent.context_tokens * self.costs.prefill_s_per_token
        blocks = math.ceil(agent.context_tokens / engine.config.block_size)
        price = blocks / engine.capacity().num_blocks
        best, best_gain = 0.0, 0.0
        for tau in sorted(seen):
            returned = [d for d in seen if d <= tau]
            gain = len(returned) / len(seen) * reload_s
            gain -= price * sum(min(d, tau) for d in seen) / len(seen)
            if gain > best_gain:
                best, best_gain = tau, gain
        return best

    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None:
        tool = agent.script.turns[agent.turn].tool or ""
        self._idle_since[agent.budget] = (tool, now)
        tau = self.ttl(engine, agent)
        if tau > 0 and engine.retain(agent.budget):
            self._expiry[agent.budget] = now + tau

    def before_call(self, engine: Engine, agent: Agent) -> None:
        tool, since = self._idle_since.pop(agent.budget, ("", 0.0))
        if tool:
            self._durations.setdefault(tool, []).append(agent.ready_at - since)
        self._expiry.pop(agent.budget, None)  # its next request takes the pinned blocks

    def tick(self, engine: Engine, now: float) -> None:
        for budget, deadline in list(self._expiry.items()):
            if deadline <= now:
                del self._expiry[budget]
                engine.release_retained(budget)
