"""The whole-system comparison's context knobs tuned on the tuning seed: context editing's
trigger and keep (``tune_editing``, the baselines with context editing) and kvgov's
context (``tune_kvgov_context``, among the points that keep as many facts as the best
LangChain handling), each grid point a run of ``system.run_seed`` on ``TUNING_SEED``
only, chosen by the rules beside the knobs (``editing_knobs.choose``,
``kvgov_context.choose_keeping``). ``kvgov bench openloop-tune`` runs both
(``tuning``); what they chose is committed as ``EDITING_KNOBS`` and ``KVGOV_CONTEXT``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.editing_knobs import (
    EDITING_KNOBS,
    KEEPS,
    TRIGGERS,
    EditingKnobs,
    choose,
)
from kvgov.benchmarks.openloop.handled import KVGOV
from kvgov.benchmarks.openloop.kvgov_context import (
    CEILINGS,
    COMPACT_TOS,
    SUMMARY_SHARES,
    TOOL_OUTPUTS,
    KvgovContext,
    choose_keeping,
)
from kvgov.benchmarks.openloop.langchain_context import CONTEXT_EDITING, HANDLINGS
from kvgov.benchmarks.openloop.processes import in_processes
from kvgov.benchmarks.openloop.sweep import TUNING_SEED
from kvgov.benchmarks.openloop.system import System, run_seed

__all__ = ["PointRun", "tune_editing", "tune_kvgov_context"]


def tune_editing(
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
    runs = run_seed(
        TUNING_SEED,
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


@dataclass(frozen=True, slots=True)
class PointRun:
    """One point of the grid on the tuning seed: kvgov's mean job time by rate, the
    facts its agents keep, and the most any LangChain handling keeps (percent)."""

    jct_mean_s: dict[float, float]
    facts_kept_pct: float
    facts_floor_pct: float


def tune_kvgov_context(
    rates: Sequence[float],
    *,
    window_s: Mapping[float, float],
    ceilings: Sequence[int] = CEILINGS,
    tool_outputs: Sequence[int] = TOOL_OUTPUTS,
    summary_shares: Sequence[float] = SUMMARY_SHARES,
    compact_tos: Sequence[float] = COMPACT_TOS,
    base: openloop.OpenLoopWorkload = openloop.TWIN,
    window_tokens: int | None = None,
    editing: EditingKnobs | None = None,
    processes: int = 1,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[KvgovContext, dict[KvgovContext, PointRun]]:
    """The chosen point, and each point's run, all on the tuning seed; ``processes``
    points at once, each in a process of its own. ``base``, ``window_tokens`` and
    ``editing`` (None: context editing's knobs as tuned) as ``system.run_seed`` takes
    them: every handling is built for the jobs' SLOs."""
    points = [
        KvgovContext(c, t, share, to)
        for c in ceilings
        for t in tool_outputs
        for share in summary_shares
        for to in compact_tos
    ]
    began = time.perf_counter()
    jobs = [
        functools.partial(
            _jct_by_rate, point, tuple(rates), dict(window_s), base, window_tokens, editing
        )
        for point in points
    ]

    def done(index: int, run: PointRun) -> None:
        progress(
            f"{points[index].describe()}: {run.jct_mean_s}, facts kept "
            f"{run.facts_kept_pct:.1f}% ({time.perf_counter() - began:.0f} s)"
        )

    rows = in_processes(jobs, processes=processes, done=done)
    table = dict(zip(points, rows, strict=True))
    objective = {p: stats.tuning_objective(run.jct_mean_s.values()) for p, run in table.items()}
    facts = {p: run.facts_kept_pct for p, run in table.items()}
    floor = max(run.facts_floor_pct for run in table.values())
    return choose_keeping(objective, facts, floor), table


def _jct_by_rate(
    point: KvgovContext,
    rates: tuple[float, ...],
    window_s: dict[float, float],
    base: openloop.OpenLoopWorkload,
    window_tokens: int | None,
    editing: EditingKnobs | None,
) -> PointRun:
    """kvgov's run on the tuning seed with its context so: its mean job time at each
    rate, and the facts kept by it and by the best LangChain handling."""
    runs = run_seed(
        TUNING_SEED,
        rates,
        window_s=window_s,
        only=[System(KVGOV, KVGOV)],
        base=base,
        window_tokens=window_tokens,
        editing=EDITING_KNOBS if editing is None else editing,
        kvgov_context=point,
    )
    rate = rates[0]  # facts kept are a handling's, the same at every rate
    return PointRun(
        {rate: result.jct_mean_s for (_, rate), result in runs.results.items()},
        runs.facts[(KVGOV, rate)].pct,
        max(runs.facts[(handling, rate)].pct for handling in HANDLINGS),
    )
