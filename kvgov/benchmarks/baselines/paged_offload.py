"""vLLM with CPU KV offloading: every idle agent's context written to host memory, LRU."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from engine import Engine
from kvgov.benchmarks.swarm.runner import Agent

__all__ = ["PagedOffload"]


@dataclass(slots=True)
class PagedOffload:
    """vLLM's scheduler (``Paged``: first come first served, priority 0, KV freed into the
    prefix cache when a request ends, recompute on preemption) with its CPU KV offloading
    (vLLM v1's ``OffloadingConnector`` with the CPU ``LRUOffloadingManager``, as LMCache's
    local CPU backend does): the KV of a finished request is also kept in a CPU cache,
    the least recently used evicted when it is full, and a later request whose prefix is
    there loads it instead of computing it again.

    Here: when a call ends in a tool call, its context is held (``retain``) and offloaded
    to host memory at once; its device blocks stay in the prefix cache, evictable, as
    vLLM's GPU blocks do after a store. When the host has no room, the contexts offloaded
    longest ago are dropped (``release_retained``) until it has; a context that still
    cannot fit (the host holds swapped requests, or is smaller than the context) stays
    in the prefix cache only, as ``paged``. Before the agent's next call the context is
    restored: only blocks the prefix cache lost are copied back, as vLLM loads only the
    blocks past its GPU prefix-cache hit.

    Where vLLM differs: it writes every full block through to the CPU as it is computed
    (prompt and output, of every request, the last call of an agent's too), keyed by
    block hash, and evicts and loads single blocks, so a context may come back in part;
    here a whole context per agent moves once, when its call ends, and comes back whole.
    vLLM keeps the CPU copy after a load (a later miss finds it again); here a restored
    context leaves the host, and the next call's end offloads it again. vLLM's copies are
    asynchronous, overlapped with compute on CUDA; this engine copies between two steps.
    """

    # The offloading connector's one setting, the CPU cache's size, is the host memory
    # every policy gets (the panel's), and LRU is its eviction; nothing is left to tune.
    KNOBS: ClassVar[tuple[str, ...]] = ()
    name: str = "paged+offload"
    num_offloaded: int = 0  # contexts written to host
    num_evicted: int = 0  # offloaded contexts dropped for room, least recently used first
    _lru: dict[str, None] = field(default_factory=dict)  # on the host, oldest first

    def priority(self, agent: Agent) -> int:
        return 0

    def order_time(self, agent: Agent) -> float | None:
        return None

    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None:
        budget = agent.budget
        if not engine.retain(budget):
            return  # nothing of it is cached any more
        host = engine.block_manager.host_pool
        needed = engine.retained.num_host_blocks_needed(budget)
        while host.num_free_blocks < needed and self._lru:
            oldest = next(iter(self._lru))
            del self._lru[oldest]
            if engine.retained.is_offloaded(oldest):  # else the engine ended it already
                engine.release_retained(oldest)
                self.num_evicted += 1
        if host.num_free_blocks < needed:
            engine.release_retained(budget)
            return
        engine.offload(budget=budget)
        self._lru[budget] = None
        self.num_offloaded += 1

    def before_call(self, engine: Engine, agent: Agent) -> None:
        budget = agent.budget
        if budget not in self._lru:
            return
        del self._lru[budget]
        if engine.retained.is_offloaded(budget):
            engine.restore(budget=budget)

    def tick(self, engine: Engine, now: float) -> None:
        return None

    def quiet_until(self, now: float) -> float:
        return math.inf
