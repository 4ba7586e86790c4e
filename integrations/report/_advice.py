"""The sizing advisor of ``kvgov report``: ceilings, ``max_concurrent``, and which lever to
pull first.

A recommended ceiling holds the p95 of an agent's deepest contexts with a quarter more
as headroom, rounded up to whole KV blocks, and never less than the deepest context
the run saw. ``max_concurrent`` is the governor's own formula (``governor.
max_concurrent``) over the budget the run span recorded, each agent's shared prefix
counted once (``kvgov.lease.prefix_blocks``), as admission counts it.

Levers come in CONTRIBUTING.md's order, matched to the diagnosis, and the first is the one
to pull first:

1. tool results make up at least half of an agent's context and it sets no
   ``tool_output_tokens``: reduce them before they are appended;
2. a ceiling at least a third above what is recommended: lower it, so more agents fit
   (or admit in overcommit mode);
3. a ceiling that binds (the agent was compacted and needs more): raise it if the
   budget allows;
4. admission waits with a p95 of half a second or more: agents queue for memory;
5. offloads or engine preemptions: memory ran short while agents were admitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from governor import blocks_per_seq, max_concurrent
from integrations.jsonl import SpanRecord
from integrations.otel import names as n
from integrations.report.figures import AgentFigures, Spread

__all__ = [
    "Budget",
    "Lever",
    "RunFigures",
    "advise",
    "recommended_ceiling",
    "suggested_tool_budget",
]


class RunFigures(Protocol):
    """What ``advise`` reads of a run (``RunReport`` has all of it)."""

    @property
    def budget(self) -> Budget | None: ...
    @property
    def agents(self) -> tuple[AgentFigures, ...]: ...
    @property
    def admission_wait_s(self) -> Spread: ...
    @property
    def peak_active_leases(self) -> int: ...
    @property
    def offloads(self) -> int: ...
    @property
    def preemptions(self) -> int: ...


HEADROOM = 0.25  # above the p95 of the deepest contexts
LOWER_WHEN = 0.75  # recommended / current ceiling at or below which lowering pays
TOOL_SHARE = 0.5  # of an agent's context, at or above which tool results dominate
WAIT_P95_S = 0.5


@dataclass(frozen=True, slots=True)
class Budget:
    """The KV budget a run span recorded."""

    num_blocks: int
    num_available_blocks: int  # less the pinned shared prefixes
    block_size: int
    bytes_per_block: int
    safety_factor: float
    mode: str  # "guaranteed" or "overcommit"

    @classmethod
    def of(cls, span: SpanRecord) -> Budget | None:
        a = span.attributes
        try:
            budget = cls(
                num_blocks=int(a[n.NUM_BLOCKS]),
                num_available_blocks=int(a.get(n.NUM_AVAILABLE_BLOCKS, a[n.NUM_BLOCKS])),
                block_size=int(a[n.BLOCK_SIZE]),
                bytes_per_block=int(a.get(n.BYTES_PER_BLOCK, 0)),
                safety_factor=float(a.get(n.SAFETY_FACTOR, 0.9)),
                mode=str(a.get(n.ADMISSION_MODE, "guaranteed")),
            )
        except (KeyError, TypeError, ValueError):
            return None
        sane = budget.block_size >= 1 and budget.num_available_blocks >= 0
        return budget if sane and 0 < budget.safety_factor <= 1 else None

    def max_concurrent(self, ceiling_tokens: int, prefix_blocks: int = 0) -> int:
        """Leases that can all reach ``ceiling_tokens`` at once in this budget, each
        starting with a shared prefix of ``prefix_blocks`` pinned blocks (counted once)."""
        if ceiling_tokens < 1:
            return 0
        return max_concurrent(
            self.num_available_blocks,
            ceiling_tokens,
            self.block_size,
            self.safety_factor,
            prefix_blocks,
        )


@dataclass(frozen=True, slots=True)
class Lever:
    """One change to make: the setting, the agent it is for (None: the governor's), what
    to do, and the figures that call for it."""

    setting: str  # "tool_output_tokens", "ceiling_tokens", "mode", "max_concurrent" or "none"
    agent: str | None
    action: str
    reason: str


def recommended_ceiling(context: Spread, block_size: int) -> int:
    """p95 plus ``HEADROOM``, never below the maximum, in whole blocks (0: no data)."""
    if context.count == 0 or context.max <= 0:
        return 0
    want = math.ceil(max(context.p95 * (1 + HEADROOM), context.max))
    return blocks_per_seq(want, block_size) * block_size


def suggested_tool_budget(tool_result: Spread, block_size: int) -> int:
    """A quarter of the median tool result, in whole blocks."""
    want = max(block_size, math.ceil(tool_result.p50 / 4))
    return blocks_per_seq(want, block_size) * block_size


def advise(report: RunFigures) -> tuple[Lever, ...]:
    budget = report.budget
    block_size = 16 if budget is None else budget.block_size
    levers = []
    for a in report.agents:
        if a.tool_output_tokens is None and a.tool_share >= TOOL_SHARE:
            value = suggested_tool_budget(a.tool_result_tokens, block_size)
            levers.append(
                Lever(
                    "tool_output_tokens",
                    a.agent,
                    f"set AgentSpec(name={a.agent!r}, tool_output_tokens={value})",
                    f"tool results are {a.tool_share:.0%} of {a.agent}'s context "
                    f"(p50 {a.tool_result_tokens.p50:,.0f} tokens each)",
                )
            )
    lower = [a for a in report.agents if 0 < a.recommended_ceiling <= a.ceiling_tokens * LOWER_WHEN]
    for a in sorted(lower, key=lambda a: (a.recommended_ceiling - a.ceiling_tokens) * a.num_leases):
        overcommit = " (or admit in overcommit mode)" if _guaranteed(report) else ""
        concurrency = _concurrency(budget, a)
        levers.append(
            Lever(
                "ceiling_tokens",
                a.agent,
                f"lower {a.agent}'s ceiling_tokens from {a.ceiling_tokens:,} to "
                f"{a.recommended_ceiling:,}{concurrency}{overcommit}",
                f"p95 of its deepest contexts is {a.context_tokens.p95:,.0f} tokens "
                f"(max {a.context_tokens.max:,.0f})",
            )
        )
    for a in report.agents:
        if a.compactions and a.recommended_ceiling > a.ceiling_tokens:
            levers.append(
                Lever(
                    "ceiling_tokens",
                    a.agent,
                    f"raise {a.agent}'s ceiling_tokens from {a.ceiling_tokens:,} to "
                    f"{a.recommended_ceiling:,}"
                    f"{_concurrency(budget, a)} if that "
                    "many at once is enough, or keep compacting",
                    f"compacted {_times(a.compactions)}, dropping "
                    f"{a.compaction_tokens_saved:,} tokens",
                )
            )
    wait = report.admission_wait_s
    if wait.count and wait.p95 >= WAIT_P95_S:
        mode = (
            "admit in overcommit mode (GovernorConfig(mode=AdmissionMode.OVERCOMMIT)), "
            if _guaranteed(report)
            else ""
        )
        levers.append(
            Lever(
                "mode",
                None,
                f"{mode}lower the ceilings, or park idle agents sooner (park_after_s)",
                f"leases waited for admission: p95 {wait.p95:.2f} s, max {wait.max:.2f} s; "
                f"peak {report.peak_active_leases} active at once",
            )
        )
    if report.offloads or report.preemptions:
        cap = _pressure_cap(report)
        levers.append(
            Lever(
                "max_concurrent",
                None,
                f"cap GovernorConfig(max_concurrent={cap})" if cap else "add KV blocks",
                f"memory ran short: {report.offloads} offloads, {report.preemptions} "
                f"preemptions at a peak of {report.peak_active_leases} active leases",
            )
        )
    if not levers:
        levers.append(
            Lever(
                "none",
                None,
                "keep the settings",
                "contexts fit their ceilings with little to spare, admission did not queue "
                "and memory never ran short",
            )
        )
    return tuple(levers)


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def _guaranteed(report: RunFigures) -> bool:
    return report.budget is None or report.budget.mode == "guaranteed"


def _concurrency(budget: Budget | None, a: AgentFigures) -> str:
    """``max_concurrent`` at the agent's ceiling now and at the recommended one."""
    if budget is None:
        return ""
    now = budget.max_concurrent(a.ceiling_tokens, a.prefix_blocks)
    then = budget.max_concurrent(a.recommended_ceiling, a.prefix_blocks)
    return f" (max_concurrent {now} -> {then})"


def _pressure_cap(report: RunFigures) -> int:
    """One fewer than the peak of active leases, at least one."""
    return max(1, report.peak_active_leases - 1)
