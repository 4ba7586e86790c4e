"""InferCept's min-waste choice at each interception: preserve, swap or discard."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine import Engine
from kvgov.benchmarks._swarm_runner import Agent
from kvgov.benchmarks.baselines.costs import Costs

__all__ = ["Intercept"]


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

    def order_time(self, agent: Agent) -> float | None:
        return None

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
