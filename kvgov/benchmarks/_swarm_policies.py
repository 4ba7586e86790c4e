"""The memory policies kvgov is measured against, each on the bundled engine as it is.

Each policy decides what happens to an agent's KV while the agent waits on a tool, and
the priority of its calls; the engine (``SwarmRunner``) does the rest, with the same
settings for all: prefix caching with LRU eviction, recompute on preemption, the same
blocks and the same host swap space. The two research policies price their choices with
``Costs`` measured on this engine before the runs, as their papers profile their GPUs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine import Engine, SamplingParams
from kvgov.benchmarks._swarm_runner import Agent

__all__ = ["Costs", "Intercept", "Paged", "TtlPin", "measure_costs"]


@dataclass(frozen=True, slots=True)
class Costs:
    prefill_s_per_token: float  # recomputing a context, per token
    swap_s_per_block: float  # one block to host memory or back


def measure_costs(
    engine: Engine,
    *,
    num_tokens: int = 512,
    now: Callable[[], float] = time.perf_counter,
    wait_for_copies: Callable[[Engine], None] | None = None,
) -> Costs:
    """Time a cold prefill and an offload and restore of its context on ``engine``, on the
    clock ``now``; ``wait_for_copies`` returns once the copies are done (the twin's moves
    its virtual clock to the end of its link's queue, so they cost their modelled time)."""
    wait_for_copies = wait_for_copies or _wait_for_copies
    prompt = [(i * 7919) % 50_000 + 1 for i in range(num_tokens)]
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    engine.generate(prompt[:64], sampling)  # warm-up, untimed
    engine.open_budget("costs", engine.capacity().num_blocks)
    try:
        started = now()
        engine.generate(prompt, sampling, budget="costs")
        prefill_s = now() - started
        engine.retain("costs")
        started = now()
        engine.offload(budget="costs")
        engine.restore(budget="costs")
        wait_for_copies(engine)  # on a GPU both return once the copies are queued
        num_blocks = num_tokens // engine.config.block_size
        swap_s = (now() - started) / (2 * num_blocks)
    finally:
        engine.close_budget("costs")
        engine.reset_prefix_cache()
    return Costs(prefill_s / num_tokens, swap_s)


def _wait_for_copies(engine: Engine) -> None:
    engine.kv_cache.synchronize()
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


class Paged:
    """vLLM's policy (PagedAttention, SOSP'23; vLLM v1's scheduler): requests first come
    first served, KV freed when a request finishes (its full blocks stay in the prefix
    cache, evicted least recently used first), recompute on preemption, no admission or
    fan-out control beyond the engine's own."""

    name = "paged"

    def priority(self, agent: Agent) -> int:
        return 0

    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None:
        return None

    def before_call(self, engine: Engine, agent: Agent) -> None:
        return None

    def tick(self, engine: Engine, now: float) -> None:
        return None


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


@dataclass(slots=True)
class Intercept:
    """InferCept (Abhyankar et al., ICML'24): at each interception (a tool call), keep the
    KV on the device, swap it to host memory or discard it, whichever wastes least, by
    its min-waste formulas (memory held x time, in block-seconds):

    - preserve: ``T_tool x C`` (the context's C blocks held through the tool);
    - discard: ``T_recompute x (C + C_others)`` (recomputing stalls every resident block);
    - swap: ``2 x T_swap x (C + C_others)`` (out and back in, the batch waiting on each).

    ``T_tool`` is the runtime's expected tool duration; ``T_recompute`` and ``T_swap``
    come from ``Costs``. A swap is ``retain`` then ``offload`` (skipped for discard when
    the host is full) and comes back with ``restore`` before the next call. This engine
    copies blocks between two steps, so the copies are not overlapped with compute: the
    swap's waste counts them in full.
    """

    costs: Costs
    name: str = "intercept"
    decisions: dict[str, int] = field(default_factory=dict)  # "keep"/"swap"/"discard"
    _swapped: set[str] = field(default_factory=set)

    def priority(self, agent: Agent) -> int:
        return 0

    def choose(self, engine: Engine, agent: Agent) -> str:
        blocks = math.ceil(agent.context_tokens / engine.config.block_size)
        others = max(0, engine.block_manager.pool.num_in_use - blocks)
        waste = {
            "keep": agent.tool_expected_s * blocks,
            "discard": agent.context_tokens * self.costs.prefill_s_per_token * (blocks + others),
            "swap": 2 * blocks * self.costs.swap_s_per_block * (blocks + others),
        }
        if engine.block_manager.host_pool.num_free_blocks < blocks:
            del waste["swap"]
        return min(waste, key=waste.__getitem__)

    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None:
        choice = self.choose(engine, agent)
        self.decisions[choice] = self.decisions.get(choice, 0) + 1
        if choice == "discard" or not engine.retain(agent.budget):
            return
        if choice == "swap":
            engine.offload(budget=agent.budget)
            self._swapped.add(agent.budget)

    def before_call(self, engine: Engine, agent: Agent) -> None:
        if agent.budget in self._swapped:
            self._swapped.discard(agent.budget)
            engine.restore(budget=agent.budget)

    def tick(self, engine: Engine, now: float) -> None:
        return None
