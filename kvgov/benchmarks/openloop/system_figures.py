"""The figures of the whole-system comparison (``system``), every one a median over the
evaluation seeds with its paired 95% bootstrap interval (``stats``), in ``Measurement``
lines of the ``swarm`` bench, every one modelled.

Per rate: each system's mean job time, goodput and prompt tokens computed
(``jct_mean_system[<system>]``, ``goodput_system[<system>]``,
``prefill_tokens_system[<system>]``), and kvgov's goodput over the best baseline system's
(``goodput_kvgov_over_best_system``, with ``_lower95``), the best picked once on its
median (``stats.best_of``) and paired seed by seed (``stats.paired_ratio``). Over all
rates: each system's facts kept (``facts_kept_pct_<system>``, its handling's), kvgov's
over the best LangChain handling's, and the jobs that failed. kvgov's other contexts
(``SeedRuns.also``) are systems of their own (``kvgov@<ceiling>``), with the same
figures and no target.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

from engine.benchmarks import Direction, Measurement
from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop.editing_knobs import EditingKnobs
from kvgov.benchmarks.openloop.facts import FactsKept
from kvgov.benchmarks.openloop.handled import KVGOV
from kvgov.benchmarks.openloop.langchain_context import (
    CONTEXT_EDITING,
    HANDLINGS,
    TRIM,
    ContextHandling,
)
from kvgov.benchmarks.openloop.panel import reference_card
from kvgov.benchmarks.openloop.system_runs import (
    POLICIES,
    SeedRuns,
    System,
    check_seeds,
    systems,
)

__all__ = ["figures"]

_BENCH = "swarm"
_LOWER, _HIGHER = Direction.LOWER_IS_BETTER, Direction.HIGHER_IS_BETTER
_PREFILL_NOTE = (
    "the prompt tokens the engine computed in the run, every job's (those its prefix cache "
    "served are not counted; a recomputed token is)"
)


def figures(
    runs: Sequence[SeedRuns],
    rates: Sequence[float],
    *,
    policies: Sequence[str] = POLICIES,
) -> Iterator[Measurement]:
    """The figures of ``runs`` (one per evaluation seed, from ``run_seed``), every
    system of ``systems(policies)`` at every one of ``rates``."""
    check_seeds([r.seed for r in runs])
    every = systems(policies, runs[0].also)
    baselines = [s.name for s in every if s.policy != KVGOV]
    ours = [s.name for s in every if s.policy == KVGOV]
    panel = reference_card()
    window, editing = runs[0].window_tokens, runs[0].editing
    seeds = sorted(r.seed for r in runs)
    what = _what(runs, rates, window, editing)
    where = f"{panel.title}; {len(runs)} evaluation seeds ({_span(seeds)}); {what}"
    for rate in rates:
        at = f"{rate:g}/min"
        per_system = {}
        for system in every:
            jct = {r.seed: r.results[(system.name, rate)].jct_mean_s for r in runs}
            per_system[system.name] = good = {r.seed: r.goodput(system.name, rate) for r in runs}
            computed = {
                r.seed: float(r.results[(system.name, rate)].counters.prefill_tokens) for r in runs
            }
            for figure, values, unit, direction in (
                ("jct_mean_system", jct, "s", _LOWER),
                ("goodput_system", good, "jobs/min", _HIGHER),
                ("prefill_tokens_system", computed, "tokens", _LOWER),
            ):
                interval = stats.median_interval(values)
                yield Measurement(
                    _BENCH,
                    f"{figure}[{system.name}]@{at}_twin",
                    interval.value,
                    unit,
                    None,
                    direction,
                    note=f"modelled; whole system; median and 95% band {interval}; "
                    + (f"{_slo_note()}; " if figure == "goodput_system" else "")
                    + (f"{_PREFILL_NOTE}; " if figure == "prefill_tokens_system" else "")
                    + where,
                )
        for name in ours:
            yield from _against_best(name, rate, per_system, baselines, where)
    yield from _facts(runs, rates, every, window, editing)
    failed = {
        s.name: sum(len(r.results[(s.name, rate)].failed) for r in runs for rate in rates)
        for s in every
    }
    yield Measurement(
        _BENCH,
        "jobs_failed_system_twin",
        float(sum(failed.values())),
        "jobs",
        0.0,
        _LOWER,
        note="whole system, every rate and seed: "
        + ", ".join(f"{n} {v}" for n, v in failed.items()),
    )


def _against_best(
    ours: str,
    rate: float,
    goodput: Mapping[str, Mapping[int, float]],
    baselines: Sequence[str],
    where: str,
) -> Iterator[Measurement]:
    """``ours`` (kvgov, or kvgov at another context) over the best baseline system."""
    best = stats.best_of({s: goodput[s] for s in baselines}, lower_is_better=False)
    name = f"goodput_{ours}_over_best_system@{rate:g}/min_twin"
    zero = sorted(s for s, v in goodput[best].items() if v <= 0)
    if zero:
        note = (
            f"modelled; no figure: {best} (best by median goodput) finished no job within "
            f"its SLO on seed(s) {', '.join(map(str, zero))}; the goodputs are reported apart"
        )
        yield Measurement(_BENCH, name, math.nan, "ratio", 2.0, _HIGHER, note=note)
        return
    ratio = stats.paired_ratio(goodput[ours], goodput[best])
    yield Measurement(
        _BENCH,
        name,
        ratio.value,
        "ratio",
        2.0 if ours == KVGOV else None,
        _HIGHER,
        note=f"modelled; {ours} over {best} (the best baseline system by median goodput), "
        f"{ratio}; {_slo_note()}; {where}",
    )
    yield Measurement(
        _BENCH,
        name + "_lower95",
        ratio.low,
        "ratio",
        None,
        _HIGHER,
        note=f"the paired interval's lower bound: {ours} over {best}, {ratio}",
    )


def _facts(
    runs: Sequence[SeedRuns],
    rates: Sequence[float],
    every: Sequence[System],
    window: int,
    editing: EditingKnobs,
) -> Iterator[Measurement]:
    by_handling: dict[str, dict[int, float]] = {}
    counts: dict[str, FactsKept] = {}
    ours = [s.handling for s in every if s.policy == KVGOV]
    for handling in (*ours, *HANDLINGS):
        by_handling[handling] = {}
        counts[handling] = FactsKept(0, 0)
        for r in runs:
            pooled = FactsKept(0, 0)
            for rate in rates:
                pooled += r.facts[(handling, rate)]
            by_handling[handling][r.seed] = pooled.pct
            counts[handling] += pooled
    labels = {
        KVGOV: "kvgov's reducer and compaction",
        **{c.system: f"kvgov's reducer and compaction, {c.describe()}" for c in runs[0].also},
        TRIM: ContextHandling(name=TRIM, window_tokens=window).label,
        CONTEXT_EDITING: editing.handling(window).label,
    }
    for system in every:
        interval = stats.median_interval(by_handling[system.handling])
        c = counts[system.handling]
        yield Measurement(
            _BENCH,
            f"facts_kept_pct_{system.name}",
            interval.value,
            "%",
            None,
            _HIGHER,
            note=f"whole system; facts planted in the tool outputs whose exact text is in "
            f"what each agent sends at its last call, {labels[system.handling]} (the same for "
            f"every policy with it); median over seeds {interval}; {c.num_kept:,} of "
            f"{c.num_planted:,} in all",
        )
    best = stats.best_of({h: by_handling[h] for h in HANDLINGS}, lower_is_better=False)
    if not all(v > 0 for v in by_handling[best].values()):
        return
    for handling in ours:
        ratio = stats.paired_ratio(by_handling[handling], by_handling[best])
        yield Measurement(
            _BENCH,
            f"facts_kept_{handling}_over_best_langchain_twin",
            ratio.value,
            "ratio",
            1.0 if handling == KVGOV else None,
            _HIGHER,
            note=f"whole system; {handling}'s facts kept over {labels[best]}'s (the best "
            f"LangChain handling by median), seed by seed: {ratio}",
        )


def _what(
    runs: Sequence[SeedRuns], rates: Sequence[float], window: int, editing: EditingKnobs
) -> str:
    windows = runs[0].window_s
    trimmed = sum(r.num_trimmed_after_edit for r in runs)
    context = runs[0].kvgov_context
    kvgov_context = "its context as its runs set it" if context is None else context.describe()
    return (
        f"teams at {', '.join(f'{r:g}' for r in rates)}/min over "
        f"{', '.join(f'{windows[r]:g}' for r in rates)} s, facts planted in every raw tool "
        f"output; kvgov: {kvgov_context}; the baselines: raw outputs, trim_messages at "
        f"the {window:,}-token window or ClearToolUsesEdit ({editing.describe()}; "
        f"{trimmed} calls still over the window trimmed after it); each policy with its "
        "knobs tuned on seed 0"
    )


def _slo_note() -> str:
    return (
        f"goodput counts the jobs a minute within {stats.SLO_FACTOR:g}x the job's unloaded "
        "time, the least over the three context handlings (its team alone under paged, room "
        "for every context): the same SLO whichever system runs the job"
    )


def _span(seeds: Sequence[int]) -> str:
    return f"{min(seeds)}-{max(seeds)}" if len(seeds) > 1 else str(seeds[0])
