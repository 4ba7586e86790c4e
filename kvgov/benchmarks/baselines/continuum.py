"""Continuum's time-to-live pins for agents' KV across tool calls, with offload on expiry."""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import KW_ONLY, dataclass, field
from typing import ClassVar

from engine import Engine
from kvgov.benchmarks.baselines.costs import Costs
from kvgov.benchmarks.swarm.runner import Agent, AgentState

__all__ = ["ToolDurations", "TtlPin"]


@dataclass(slots=True)
class ToolDurations:
    """Continuum's tool-call records (§4.2) as a prior that every record moves.

    ``cdf(tool, tau)`` is P(the tool returns within tau). The paper's cold start is an
    exponential (unit mean, where nothing else is known; here the runtime's expected
    duration of the tool); with more than K records it trusts all tools' records, and
    with more than K of one tool's, that tool's own. Here each tier is weighted against
    K instead of switched at the (K+1)th record, so the estimate moves with every record:
    the global estimate is the exponential worth K records plus all records, and a tool's
    is the global estimate worth K records plus that tool's own.
    """

    num_prior_samples: int = 100  # the paper's K
    _all: list[float] = field(default_factory=list)  # sorted
    _by_tool: dict[str, list[float]] = field(default_factory=dict)  # each sorted

    def __post_init__(self) -> None:
        k = self.num_prior_samples
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(
                f"num_prior_samples must be an int >= 1 (the records the cold-start prior "
                f"is worth; the paper uses 100), got {k!r}"
            )

    def record(self, tool: str, seconds: float) -> None:
        """A call of ``tool`` took ``seconds`` (the next call's arrival less the end of
        the call that made it, as the paper's handler measures it)."""
        seconds = max(0.0, seconds)
        bisect.insort(self._all, seconds)
        bisect.insort(self._by_tool.setdefault(tool, []), seconds)

    def num_records(self, tool: str | None = None) -> int:
        return len(self._all if tool is None else self._by_tool.get(tool, ()))

    def prior_weight(self, tool: str) -> float:
        """The exponential prior's share of ``cdf(tool, ...)``."""
        k = self.num_prior_samples
        return k / (k + len(self._all)) * k / (k + self.num_records(tool))

    def cdf(self, tool: str, tau: float, *, mean_s: float) -> float:
        k = self.num_prior_samples
        prior = 1.0 - math.exp(-tau / mean_s)
        everyone = (k * prior + bisect.bisect_right(self._all, tau)) / (k + len(self._all))
        own = self._by_tool.get(tool, [])
        return (k * everyone + bisect.bisect_right(own, tau)) / (k + len(own))

    def best_ttl(self, tool: str, *, mean_s: float, benefit_s: float) -> float:
        """The paper's tau* = argmax P(tau, f) x benefit - tau (Eq. 2), the shortest on ties.

        Between two records P rises only through the exponential, which is concave, so
        the best tau is 0, a record (P jumps there), or where the exponential's slope
        times the benefit falls to 1."""
        candidates = {0.0, *self._all}
        share = self.prior_weight(tool) * benefit_s
        if share > mean_s:
            candidates.add(mean_s * math.log(share / mean_s))
        return max(
            sorted(candidates),
            key=lambda tau: self.cdf(tool, tau, mean_s=mean_s) * benefit_s - tau,
        )


@dataclass(slots=True)
class TtlPin:
    """Continuum (Li et al., "Continuum: Efficient and Robust Multi-Turn LLM Agent
    Scheduling with KV Cache Time-to-Live", arXiv 2511.02230), with DRAM offload.

    - TTL (§4.1-4.2): when a call ends in a tool call, its KV is pinned (the engine's
      ``retain``) for tau* = argmax_tau P(tau, f) x (T x eta + Prefill-Reload(r)) - tau.
      That is the paper's utility P x Benefit - Cost with both sides priced in the
      requests a pin blocks: Cost = MemUsage(r)/M x tau (M the average footprint of an
      active request, so MemUsage(r)/M is how many requests the pin holds up) and Benefit
      = MemUsage(r)/M x (Prefill-Reload + T x eta), and the shared MemUsage(r)/M cancels.
      Prefill-Reload is the context's reload from host (``Costs.swap_s_per_block`` per
      block) where the host has room for it, else its recompute (``prefill_s_per_token``),
      as the paper profiles both. T is the sliding-window mean of the queueing delay that
      calls whose context had been let go saw (from their tool's return to their
      admission; 0 until one is seen, as the paper starts it); eta = -Corr(k, N - k) over
      the finished programs' calls (k served, N - k left), 1 until two lengths are known,
      as the paper's cold start assumes. P is ``ToolDurations``.
    - Scheduling (§4.3): a call whose pin is still resident goes first (priority 1), then
      program-level first come first served: every call of an agent keeps its program's
      arrival (``order_time``: the agent's start). Unlike the paper's waiting-queue key,
      the priority also keeps a pinned call's request from being preempted first.
    - Expiry (§5.2): a pin whose TTL runs out, or a context given none (tau* = 0), is
      offloaded to host memory when the host has room (Continuum with DRAM offloading,
      §6: LMCache under the paper's runs keeps every context in DRAM, which is what
      Prefill-Reload prices) and restored before the agent's next call; only when the
      host is full is it dropped to the prefix cache, evictable. Under pressure the
      engine takes pins back before preempting a running request (the paper unpins the
      latest program's first; the engine's ``reclaim`` picks the oldest hold no queued
      request takes over).
    """

    KNOBS: ClassVar[tuple[str, ...]] = ("num_prior_samples", "prior_mean_s", "queue_window")
    costs: Costs
    _: KW_ONLY
    num_prior_samples: int = 100  # K (§4.2)
    prior_mean_s: float = 1.0  # the cold start's exponential, for a tool of unknown mean
    queue_window: int = 100  # calls in T's sliding window
    name: str = "ttl-pin"
    num_offloaded: int = 0  # contexts offloaded to host on expiry (or with no pin)
    num_dropped: int = 0  # contexts dropped on expiry, the host full
    durations: ToolDurations = field(init=False)
    _queue_delays: deque[float] = field(init=False)
    _expiry: dict[str, float] = field(default_factory=dict)  # budget -> run time
    _idle_since: dict[str, tuple[str, float]] = field(default_factory=dict)
    _pinned_calls: set[str] = field(default_factory=set)  # calls that found their pin resident
    _queued: dict[str, Agent] = field(default_factory=dict)  # let-go calls not admitted yet
    _programs: dict[str, Agent] = field(default_factory=dict)  # not finished yet
    _lengths: list[int] = field(default_factory=list)  # finished programs' calls

    def __post_init__(self) -> None:
        self.durations = ToolDurations(num_prior_samples=self.num_prior_samples)
        if not self.prior_mean_s > 0:
            raise ValueError(f"prior_mean_s must be > 0 seconds, got {self.prior_mean_s!r}")
        if not isinstance(self.queue_window, int) or self.queue_window < 1:
            raise ValueError(f"queue_window must be an int >= 1 calls, got {self.queue_window!r}")
        self._queue_delays = deque(maxlen=self.queue_window)

    def priority(self, agent: Agent) -> int:
        return 1 if agent.budget in self._pinned_calls else 0

    def order_time(self, agent: Agent) -> float | None:
        return agent.started_at

    @property
    def queue_delay_s(self) -> float:
        """T: the mean queueing delay of the latest calls whose context had been let go."""
        return statistics.fmean(self._queue_delays) if self._queue_delays else 0.0

    @property
    def memoryfulness(self) -> float:
        """eta = -Corr(k, N - k) over every finished program's calls (§4.1)."""
        served = [k for n in self._lengths for k in range(1, n)]
        left = [n - k for n in self._lengths for k in range(1, n)]
        if len(set(served)) < 2 or len(set(left)) < 2:
            return 1.0
        return -statistics.correlation(served, left)

    def reload_s(self, engine: Engine, agent: Agent) -> float:
        """Prefill-Reload(r): the context back from host where it would fit there, else
        computed again."""
        blocks = math.ceil(agent.context_tokens / engine.config.block_size)
        if engine.block_manager.host_pool.num_free_blocks >= blocks:
            return blocks * self.costs.swap_s_per_block
        return agent.context_tokens * self.costs.prefill_s_per_token

    def ttl(self, engine: Engine, agent: Agent) -> float:
        """tau* for the call that just ended in its turn's tool call."""
        tool = agent.script.turns[agent.turn].tool or ""
        mean_s = agent.tool_expected_s if agent.tool_expected_s > 0 else self.prior_mean_s
        benefit_s = self.reload_s(engine, agent) + self.queue_delay_s * self.memoryfulness
        return self.durations.best_ttl(tool, mean_s=mean_s, benefit_s=benefit_s)

    def on_idle(self, engine: Engine, agent: Agent, now: float) -> None:
        self._pinned_calls.discard(agent.budget)
        self._idle_since[agent.budget] = (agent.script.turns[agent.turn].tool or "", now)
        tau = self.ttl(engine, agent)
        if not engine.retain(agent.budget):
            return  # nothing of it is cached any more
        if tau > 0:
            self._expiry[agent.budget] = now + tau
        else:  # no pin: expired at once, to host as every context is under DRAM offload
            self._expire(engine, agent.budget)

    def before_call(self, engine: Engine, agent: Agent) -> None:
        budget, retained = agent.budget, engine.retained
        self._programs[budget] = agent
        within_ttl = self._expiry.pop(budget, None) is not None
        if budget not in self._idle_since:
            return  # its program's first call: nothing was kept or let go
        tool, since = self._idle_since.pop(budget)
        self.durations.record(tool, agent.ready_at - since)
        held = budget in retained.held_budgets()
        if held and within_ttl and not retained.is_offloaded(budget):
            self._pinned_calls.add(budget)  # its next request takes the pinned blocks
            return
        self._queued[budget] = agent  # let go: its wait for admission is a sample of T
        if held and retained.is_offloaded(budget):
            engine.restore(budget=budget)

    def quiet_until(self, now: float) -> float:
        """The next TTL to run out; the queue's bookkeeping changes only with admissions,
        which decode steps taken together never make."""
        return min(self._expiry.values(), default=math.inf)

    def tick(self, engine: Engine, now: float) -> None:
        for budget, deadline in list(self._expiry.items()):
            if deadline <= now:
                del self._expiry[budget]
                self._expire(engine, budget)
        if self._queued:
            waiting = {r.request_id for r in engine.scheduler.waiting}
            for budget, agent in list(self._queued.items()):
                if agent.state is AgentState.FAILED:
                    del self._queued[budget]
                elif agent.request_id not in waiting:
                    self._queue_delays.append(max(0.0, now - agent.ready_at))
                    del self._queued[budget]
        for budget, agent in list(self._programs.items()):
            if agent.state in (AgentState.DONE, AgentState.FAILED):
                del self._programs[budget]
                if agent.state is AgentState.DONE:
                    self._lengths.append(agent.turn + 1)

    def _expire(self, engine: Engine, budget: str) -> None:
        """The TTL ran out: to host memory when it has room, else to the prefix cache."""
        retained = engine.retained
        if budget not in retained.held_budgets() or retained.is_offloaded(budget):
            return  # taken over, ended or moved to host by the engine already
        needed = retained.num_host_blocks_needed(budget)
        if needed <= engine.block_manager.host_pool.num_free_blocks:
            engine.offload(budget=budget)
            self.num_offloaded += 1
        else:
            engine.release_retained(budget)
            self.num_dropped += 1
