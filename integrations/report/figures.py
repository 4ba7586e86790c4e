"""The figures of a recorded run: how a value spread over it (``Spread``, nearest-rank
percentiles, so every figure is one the run reached) and one agent's (``AgentFigures``)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["AgentFigures", "Spread"]


@dataclass(frozen=True, slots=True)
class Spread:
    """How a figure spread over a run: count, nearest-rank p50 and p95, and maximum."""

    count: int
    p50: float
    p95: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        ordered = sorted(values)
        if not ordered:
            return cls(0, 0, 0, 0)
        return cls(len(ordered), _rank(ordered, 0.5), _rank(ordered, 0.95), ordered[-1])


@dataclass(frozen=True, slots=True)
class AgentFigures:
    agent: str
    num_leases: int
    num_calls: int
    context_tokens: Spread  # over its leases, each lease's deepest context
    ceiling_tokens: int  # the largest ceiling its leases had
    prefix_blocks: int  # its shared prefix's pinned blocks (the fewest a lease had; 0: none)
    admission_wait_s: Spread
    compactions: int
    compaction_tokens_saved: int
    summarizations: int
    summarize_tokens_saved: int
    tool_output_tokens: int | None  # its AgentSpec's budget, when set
    tool_result_tokens: Spread  # what its context grew by across each tool call
    tool_share: float  # of its deepest contexts, the part that tool results brought
    recommended_ceiling: int
    # (error.type, leases) of its leases whose span ended in error, most common first
    failures: tuple[tuple[str, int], ...] = ()

    @property
    def num_failed(self) -> int:
        return sum(count for _, count in self.failures)


def _rank(ordered: Sequence[float], q: float) -> float:
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
