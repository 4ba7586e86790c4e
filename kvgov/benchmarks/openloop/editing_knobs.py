"""Context editing's knobs in the whole-system comparison (``system``): its trigger and how
many tool results it keeps, chosen on the tuning seed by one rule, never on a reported
seed.

``ClearToolUsesEdit`` clears every tool result but the latest ``keep`` once the history
passes ``trigger`` tokens (LangChain's default trigger, 100,000, is past Qwen3-8B's
32,768-token window, so a user must set one; its default ``keep`` is 3). kvgov's context
is tuned on two knobs (``kvgov_context``), so context editing is tuned on its two as well:
on ``bench.TUNING_SEED`` only, every point of ``TRIGGERS`` x ``KEEPS`` runs each baseline
with context editing at the tuning rates; the point with the least geometric mean over
those runs of the mean job time is chosen, and a point within 1% of the least goes to the
greatest such (``EditingKnobs`` order: the later trigger, then the more results kept, so
its agents keep more). ``EDITING_KNOBS`` is what the rule chose (``tune`` reruns it).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.langchain_context import CONTEXT_EDITING, ContextHandling

__all__ = ["EDITING_KNOBS", "KEEPS", "TRIGGERS", "EditingKnobs", "choose", "tune"]


@dataclass(frozen=True, slots=True, order=True)
class EditingKnobs:
    """``ClearToolUsesEdit``'s knobs: clear once the history passes ``trigger_tokens``,
    keeping the latest ``keep`` tool results whole. Ordered by how late it clears, then
    by how much it keeps."""

    trigger_tokens: int
    keep: int = 3  # ClearToolUsesEdit's default

    def handling(self, window_tokens: int) -> ContextHandling:
        """The context handling these knobs make, for a model of ``window_tokens``."""
        return ContextHandling(
            name=CONTEXT_EDITING,
            window_tokens=window_tokens,
            trigger_tokens=self.trigger_tokens,
            keep=self.keep,
        )

    def describe(self) -> str:
        return f"trigger {self.trigger_tokens:,}, keep {self.keep}"


# From an eighth of the window to just under it, less the longest reply (300 tokens).
TRIGGERS = (4_000, 8_000, 16_000, 24_000, 32_000)
# The latest result alone, LangChain's default, and twice it.
KEEPS = (1, 3, 6)
_TIE = 0.01

# Chosen by ``tune`` on seed 0 with the trigger alone, keep 3 (started at commit 5a1f234,
# 2026-12-07 02:07 UTC, 1,072 s of host time), twin-rx9070xt, each rate's window holding
# 1.5 teams on average (the quick form's: 900, 450, 225, 90 s). Mean job time, s, at 0.1,
# 0.2, 0.4 and 1 teams/min (paged, paged+offload, ttl-pin, intercept), and the objective,
# their geometric mean (* chosen):
#
# | trigger | objective | 0.1/min | 0.2/min | 0.4/min | 1/min |
# |---|---|---|---|---|---|
# | 8,000 | 354* | 302 301 301 301 | 349 347 353 348 | 376 375 384 374 | 394 391 408 392 |
# | 16,000 | 364 | 302 301 301 301 | 385 356 366 355 | 402 379 401 380 | 411 395 428 396 |
# | 24,000 | 438 | 413 329 335 330 | 516 396 425 398 | 607 438 465 431 | 640 461 481 460 |
# | 32,000 | 558 | 610 414 439 409 | 739 500 517 492 | 834 534 534 536 | 906 563 574 554 |
#
# The least was the grid's smallest trigger, and keep was never tuned: the grid now holds
# 4,000 and keeps of 1 and 6 (to be run again).
EDITING_KNOBS = EditingKnobs(trigger_tokens=8_000, keep=3)

K = TypeVar("K", bound=Any)  # a grid point: ordered, the greatest keeping the most


def choose(objective: Mapping[K, float]) -> K:
    """The point of least ``objective`` (point -> geometric mean job time), a point
    within 1% of it going to the greatest: the one that keeps most. The same rule
    chooses kvgov's context (``kvgov_context``), its points ordered by what they keep."""
    least = min(objective.values())
    return max(t for t, v in objective.items() if v <= least * (1 + _TIE))


def tune(
    rates: Sequence[float],
    *,
    window_s: Mapping[float, float],
    policies: Sequence[str],
    triggers: Sequence[int] = TRIGGERS,
    keeps: Sequence[int] = KEEPS,
    base: openloop.OpenLoopWorkload = openloop.TWIN,
    window_tokens: int | None = None,
    processes: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[EditingKnobs, dict[EditingKnobs, dict[str, float]]]:
    """The chosen point, and each point's mean job time by ``policy@rate``, all on the
    tuning seed; ``processes`` points at once, each in a process of its own. ``base``
    and ``window_tokens`` as ``system.run_seed`` takes them."""
    from kvgov.benchmarks.openloop.processes import in_processes

    points = [EditingKnobs(trigger, keep) for trigger in triggers for keep in keeps]
    began = time.perf_counter()
    jobs = [
        functools.partial(
            _jct_by_run, point, tuple(rates), dict(window_s), tuple(policies), base, window_tokens
        )
        for point in points
    ]

    def done(index: int, row: dict[str, float]) -> None:
        progress(f"{points[index].describe()}: {row} ({time.perf_counter() - began:.0f} s)")

    rows = in_processes(jobs, processes=processes, done=done)
    table = dict(zip(points, rows, strict=True))
    objective = {p: stats.tuning_objective(row.values()) for p, row in table.items()}
    return choose(objective), table


def _jct_by_run(
    point: EditingKnobs,
    rates: tuple[float, ...],
    window_s: dict[float, float],
    policies: tuple[str, ...],
    base: openloop.OpenLoopWorkload,
    window_tokens: int | None,
) -> dict[str, float]:
    """Each baseline's mean job time with context editing so, by ``policy@rate``, on the
    tuning seed."""
    from kvgov.benchmarks.openloop import bench
    from kvgov.benchmarks.openloop.system import System, run_seed

    runs = run_seed(
        bench.TUNING_SEED,
        rates,
        window_s=window_s,
        policies=policies,
        editing=point,
        only=[System(p, CONTEXT_EDITING) for p in policies],
        base=base,
        window_tokens=window_tokens,
    )
    return {
        f"{name.rsplit('+', 1)[0]}@{rate:g}": result.jct_mean_s
        for (name, rate), result in runs.results.items()
    }
