"""``kvgov bench openloop``: the swarm under open-loop load on the twin of the reference
card (issue 34), every policy at its papers' best, on evaluation seeds with paired 95%
intervals.

Teams arrive as a Poisson process (``workload``: three tenants, 20-40 tool calls a
worker, 100-300-token replies, tools from milliseconds to 30 s, contexts to the 16k
ceiling) at each rate of ``RATES``, from below the paged engine's saturation to four
times past it, each over a window in which ``TEAMS_PER_WINDOW`` teams arrive on average,
on the twin of an RX 9070 XT running Qwen3-8B in
int4 with host memory for KV at three times the card's (``panel.reference_card``). Each
policy runs on the card's KV and with room for every context, and is divided by that
run of its own (``figures``). Every figure is modelled: decisions are the real engine's,
governor's and policies'; times and bytes are the twin's (its validation against the real
engine: docs/twin.md, ``kvgov twin check``).

Seeds (``sweep``): ``TUNING_SEED`` (0) is the seed every knob is tuned on, and no figure
reported here comes from it; the figures are medians over ``EVALUATION_SEEDS``. Each
policy runs with its knobs as tuned there (``tuned.TUNED``, chosen by ``tuning``'s one
rule for all).

After the memory-policy panel, in this order:

- goodput against the KV budget (``budgets``): at the rate nearest 0.8 of the paged
  engine's saturation, every policy again with half and three quarters of the card's KV;
- the whole system (``system``): at the highest rate, each baseline with the context
  handling its users have (LangChain's ``trim_messages`` or context editing) against
  kvgov with its own, facts kept beside goodput;
- the CPU panel (``cpu``): the twin of this machine beside the real engine's short form,
  last, when no other process shares the cores the real runs are timed on.

The twin's runs go to one process per core (``processes``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from engine.benchmarks import Measurement
from kvgov.benchmarks.openloop import cpu, plots, system
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.budgets import SHARES, BudgetFigures, run_budgets
from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.openloop.kvgov_context import KVGOV_CONTEXT, KVGOV_FASTEST
from kvgov.benchmarks.openloop.panel import reference_card, run_panel
from kvgov.benchmarks.openloop.processes import default_processes
from kvgov.benchmarks.openloop.sweep import (
    EVALUATION_SEEDS,
    POLICIES,
    RATES,
    TEAMS_PER_WINDOW,
    TUNING_SEED,
    windows,
)
from kvgov.benchmarks.openloop.tuned import TUNED

__all__ = ["EVALUATION_SEEDS", "POLICIES", "RATES", "TUNING_SEED", "run"]

_QUICK_SEEDS = (1, 2)
_QUICK_RATES = (0.5,)
_QUICK_TEAMS = 1.5
_QUICK_SHARES = (0.5, 1.0)


def run(*, quick: bool = False, plot: Path | None = None) -> Iterator[Measurement]:
    """``kvgov bench openloop``; ``plot``: a folder for the pictures (``plots``)."""
    seeds = _QUICK_SEEDS if quick else EVALUATION_SEEDS
    rates = _QUICK_RATES if quick else RATES
    window = windows(rates, _QUICK_TEAMS if quick else TEAMS_PER_WINDOW)
    shares = _QUICK_SHARES if quick else SHARES
    yield from measure(seeds, rates, POLICIES, window_s=window, shares=shares, plot=plot)
    # The whole system at the highest rate, where memory binds hardest (each system's
    # cost grows with its rates: a rate is a run of every system on every seed).
    # kvgov at its grid's fastest point runs beside the chosen one: the trade shows.
    top = max(rates)
    fastest = () if KVGOV_FASTEST == KVGOV_CONTEXT else (KVGOV_FASTEST,)
    yield from system.measure(
        seeds,
        (top,),
        window_s=window[top],
        also=fastest,
        progress=_progress,
        processes=default_processes(),
    )
    # Last, with the twin's processes done: the real runs are timed on the wall clock.
    # The profile is fitted now, minutes before them: a shared host's speed drifts.
    yield from cpu.measure(quick=quick, fit_now=True, progress=_progress)


def measure(
    seeds: Sequence[int],
    rates: Sequence[float],
    policies: Sequence[str],
    *,
    window_s: float | Mapping[float, float],
    shares: Sequence[float] = SHARES,
    plot: Path | None = None,
) -> Iterator[Measurement]:
    """The panel's figures on ``seeds`` at ``rates``, then goodput against the KV
    budget at each of ``shares`` of the card's KV (``budgets``); ``window_s``: the
    arrival window, one for every rate or each rate's (``windows``); ``plot``: where to
    draw them."""
    if TUNING_SEED in seeds:
        raise ValueError(
            f"seed {TUNING_SEED} is the tuning seed: no reported figure comes from it; "
            "evaluate on other seeds"
        )
    window = window_s if isinstance(window_s, Mapping) else dict.fromkeys(rates, window_s)
    workloads = [
        dataclasses.replace(openloop.TWIN, rate_per_min=rate, duration_s=window[rate], seed=seed)
        for rate in rates
        for seed in seeds
    ]
    processes = default_processes()
    runs = run_panel(
        reference_card(),
        workloads,
        policies,
        knobs=TUNED,
        progress=_progress,
        processes=processes,
    )
    _progress(f"{len(runs.results)} runs in {runs.wall_s:.0f} s, {processes} workloads at a time")
    what = _what(workloads, rates)
    figures = PanelFigures(runs, rates, seeds, policies, window, "twin", what=what)
    yield from figures.measurements()
    note = f"modelled; {runs.panel.title}; {figures.what}"
    if plot is not None:
        for path in plots.plot(figures, plot, note=note):
            _progress(f"wrote {path}")
    rate = figures.rate_near(0.8)
    if rate is None:
        return  # no paged run to find its saturation by: no load to read budgets at
    at_rate = [w for w in workloads if w.rate_per_min == rate]
    budget_runs = run_budgets(
        runs.panel,
        runs,
        at_rate,
        policies,
        shares=shares,
        knobs=TUNED,
        progress=_progress,
        processes=processes,
    )
    budgets = BudgetFigures(budget_runs, rate, seeds, policies, window[rate], "twin", what=what)
    yield from budgets.measurements()
    if plot is not None:
        for path in plots.plot_budgets(budgets, plot, note=note):
            _progress(f"wrote {path}")


def _what(workloads: Sequence[openloop.OpenLoopWorkload], rates: Sequence[float]) -> str:
    """What ran, for every figure's note: the workload at every rate, and the knobs."""
    every_rate = (
        "teams at "
        + ", ".join(f"{rate:g}" for rate in rates)
        + "/min (Poisson) over "
        + ", ".join(f"{w.duration_s:g}" for w in {w.rate_per_min: w for w in workloads}.values())
        + " s"
    )
    what = re.sub(
        r"teams at \S+/min \(Poisson\) for \S+ s", every_rate, openloop.describe(workloads[0])
    )
    what = re.sub(r", seed \d+", "", what)
    return f"{what}; each policy with its knobs tuned on seed {TUNING_SEED} (openloop/tuned.py)"


def _progress(line: str) -> None:
    print(f"[openloop] {line}", file=sys.stderr, flush=True)
