"""What one run of the swarm benchmark measured, and the engine tap that measures it.

Every figure comes from the engine itself: the prefill counters, preemptions and blocks
swapped are deltas of ``Engine.metrics()`` over the run (``engine.prefill_counter``),
blocks in use are read after every step, and the prompts each policy sent are taken
where the engine receives them (``EngineTap``, the same for every runner), so the
benchmark can check that every policy sent the same ones.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine import Engine, EngineMetrics

if TYPE_CHECKING:
    from kvgov.benchmarks.swarm.breakdown import JobTime

__all__ = ["EngineCounters", "EngineTap", "RunResult", "p95", "percentile"]


@dataclass(frozen=True, slots=True)
class EngineCounters:
    prefill_tokens: int
    recomputed_tokens: int
    preemptions: int
    blocks_swapped_out: int
    blocks_swapped_in: int
    swap_outs: int = 0  # sequences moved to host memory: offloads, not their blocks

    @classmethod
    def of(cls, metrics: EngineMetrics) -> EngineCounters:
        return cls(
            metrics.num_prefill_tokens,
            metrics.num_recomputed_tokens,
            metrics.num_preemptions,
            metrics.num_blocks_swapped_out,
            metrics.num_blocks_swapped_in,
            metrics.num_swap_outs,
        )

    def __sub__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(
            self.prefill_tokens - other.prefill_tokens,
            self.recomputed_tokens - other.recomputed_tokens,
            self.preemptions - other.preemptions,
            self.blocks_swapped_out - other.blocks_swapped_out,
            self.blocks_swapped_in - other.blocks_swapped_in,
            self.swap_outs - other.swap_outs,
        )


@dataclass(slots=True)
class RunResult:
    policy: str
    fraction: float  # of the blocks every agent's peak context needs at once
    num_blocks: int
    bytes_per_block: int
    host_blocks: int = 0  # the engine's host swap space, in blocks
    jct_s: dict[str, float] = field(default_factory=dict)  # finished agents' jobs
    failed: list[str] = field(default_factory=list)  # "agent: why"
    makespan_s: float = 0.0
    counters: EngineCounters = EngineCounters(0, 0, 0, 0, 0)
    peak_blocks: int = 0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (s, blocks in use)
    prompts: dict[str, str] = field(default_factory=dict)  # "agent/turn" -> digest
    calls: dict[str, str] = field(default_factory=dict)  # "agent/turn" -> request id
    # Finished jobs' time by where it went (``swarm.breakdown``): twin runs only.
    breakdown: dict[str, JobTime] = field(default_factory=dict)
    round: int = 0  # of the benchmark's rounds (each runs every policy once)
    # How much later than asked each tool's wait returned to its agent (the runtime's
    # event loop, busy with the other agents): kvgov's runs only, whose agents are tasks.
    tool_lateness_s: list[float] = field(default_factory=list)

    @property
    def jct_mean_s(self) -> float:
        return statistics.fmean(self.jct_s.values()) if self.jct_s else float("nan")

    @property
    def jct_p95_s(self) -> float:
        return p95(list(self.jct_s.values()))

    @property
    def recomputed_share(self) -> float:
        """Percent of the prefill tokens the engine computed that it had computed before."""
        counters = self.counters
        if not counters.prefill_tokens:
            return float("nan")
        return 100 * counters.recomputed_tokens / counters.prefill_tokens

    @property
    def bytes_swapped_out(self) -> int:
        return self.counters.blocks_swapped_out * self.bytes_per_block

    @property
    def bytes_swapped_in(self) -> int:
        return self.counters.blocks_swapped_in * self.bytes_per_block

    def sample(self, t: float, num_blocks_in_use: int) -> None:
        self.timeline.append((t, num_blocks_in_use))
        self.peak_blocks = max(self.peak_blocks, num_blocks_in_use)


def percentile(values: Sequence[float], percent: int) -> float:
    """The ``percent``-th percentile, nearest rank (NaN for no values)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, -(-percent * len(ordered) // 100) - 1)]


def p95(values: Sequence[float]) -> float:
    """The 95th percentile, nearest rank (NaN for no values)."""
    return percentile(values, 95)


class EngineTap:
    """Wraps one engine's ``add_request`` and ``step`` for a run, whoever calls them (the
    baselines' runner, or the engine loop under kvgov): a digest of every prompt and its
    request id, by the request's budget and its count within that budget (an agent's
    turn), and the blocks in use after every step."""

    def __init__(
        self, engine: Engine, result: RunResult, budget_names: Callable[[str], str]
    ) -> None:
        self._engine = engine
        self._result = result
        self._names = budget_names  # engine budget -> agent name
        self._add, self._step = engine.add_request, engine.step
        # What the instance had before (a twin's wrappers), for close to put back.
        self._previous = {n: engine.__dict__.get(n) for n in ("add_request", "step")}
        self._lock = threading.Lock()
        self._turns: dict[str, int] = {}
        self._t0 = engine.clock()  # the engine's clock: virtual on a twin
        # Instance attributes shadow the methods until close puts them back.
        engine.add_request = self._add_request  # type: ignore[method-assign]  # see above
        engine.step = self._stepped  # type: ignore[method-assign]  # see above

    def _add_request(self, prompt: Any, *args: Any, **kwargs: Any) -> str:
        # What the engine will queue (it checks them, and refuses bad ones before any is
        # recorded here).
        tokenizer = self._engine.tokenizer
        token_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        budget = kwargs.get("budget")
        request_id = self._add(token_ids, *args, **kwargs)
        if budget is not None:
            agent = self._names(budget)
            digest = hashlib.sha256(array("q", token_ids).tobytes()).hexdigest()[:16]
            with self._lock:
                turn = self._turns.get(agent, 0)
                self._turns[agent] = turn + 1
                self._result.prompts[f"{agent}/{turn}"] = digest
                self._result.calls[f"{agent}/{turn}"] = request_id
        return request_id

    def _stepped(self) -> list[Any]:
        outputs = self._step()
        in_use = self._engine.block_manager.pool.num_in_use
        with self._lock:
            self._result.sample(self._engine.clock() - self._t0, in_use)
        return outputs

    def close(self) -> None:
        for name, previous in self._previous.items():
            if previous is None:
                delattr(self._engine, name)  # the class's method again
            else:
                setattr(self._engine, name, previous)
