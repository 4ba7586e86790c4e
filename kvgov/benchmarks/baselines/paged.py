"""vLLM's memory policy, the baseline every agent stack runs today."""

from __future__ import annotations

import math
from typing import ClassVar

from engine import Engine
from kvgov.benchmarks.swarm.runner import Agent

__all__ = ["Paged"]


class Paged:
    """vLLM's policy (PagedAttention, SOSP'23; vLLM v1's scheduler): requests first come
    first served, KV freed when a request finishes (its full blocks stay in the prefix
    cache, evicted least recently used first), recompute on preemption, no admission or
    fan-out control beyond the engine's own."""

    name = "paged"
    # vLLM's scheduler knobs (batch sizes, chunked prefill) are the engine's, the same
    # for every policy; its memory policy has none to tune.
    KNOBS: ClassVar[tuple[str, ...]] = ()

    def priority(self, agent: Agent) -> int:
        return 0

    def order_time(self, agent: Agent) -> float | None:
        return None

    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None:
        return None

    def before_call(self, engine: Engine, agent: Agent) -> None:
        return None

    def tick(self, engine: Engine, now: float) -> None:
        return None

    def quiet_until(self, now: float) -> float:
        return math.inf
