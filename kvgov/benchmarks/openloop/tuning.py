"""Every policy's knobs tuned on the tuning seed, by one rule for all (issue 34):
``kvgov bench openloop-tune``.

``GRIDS`` declares, in this one place, each policy's knobs that a user of that system
would tune and a few values of each, the paper's setting (kvgov's: what
``KVGOV_CONFIG`` ships) always among them; a policy whose paper leaves nothing to tune
has one point, and its grid says why. kvgov has no more points than the baseline with
the most.

The rule, the same for every policy: on ``TUNING_SEED`` (0) only, on the reference card
(``panel.reference_card``), at the benchmark's rates and arrival windows (``sweep.RATES``,
``sweep.windows``), each grid point runs on the card's KV (constrained). A point's
objective is the geometric mean over the rates of the policy's mean job time, so every
rate weighs the same whatever its scale. The chosen point has the least objective, but a
point within 1% of the default's objective does not displace it (ties go to the paper);
a point where any job failed is disqualified. A grid of one point has nothing to choose
and is not run. The choice is committed as ``tuned.TUNED``, which ``kvgov bench
openloop`` runs with, on evaluation seeds only; no figure it reports comes from here.
Then the whole-system comparison's context knobs by the same rule (``editing_knobs``
and ``kvgov_context``), each point's figure named ``tuning_objective[...]`` as well.

Errors, raised before any run::

    ValueError
     ├── TuningSeedError    a workload not on TUNING_SEED: tuning never sees an evaluation seed
     ├── GridError          a grid whose default is not one of its points, or of bad size
     └── UnknownKnobError   a knob the policy does not have (baselines.knobs)
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from engine.benchmarks import Direction, Measurement
from kvgov.benchmarks.baselines import BASELINES
from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.context_tuning import tune_editing, tune_kvgov_context
from kvgov.benchmarks.openloop.panel import (
    Panel,
    _run,
    check_knobs,
    reference_card,
)
from kvgov.benchmarks.openloop.processes import default_processes
from kvgov.benchmarks.openloop.sweep import RATES, TEAMS_PER_WINDOW, TUNING_SEED, windows
from kvgov.benchmarks.openloop.workload import OpenLoopWorkload
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup
from kvgov.benchmarks.swarm.kvgov import KVGOV_CONFIG

__all__ = [
    "GRIDS",
    "TIE_SHARE",
    "Grid",
    "GridError",
    "PointRun",
    "Tuning",
    "TuningSeedError",
    "choose",
    "run",
    "tune",
]

TIE_SHARE = 0.01  # a point must beat the default's objective by more than this to win
_BENCH = "openloop-tune"
_QUICK_RATES = (0.5,)
_QUICK_TEAMS = 2.0
# The context grids' arrival windows: 1.5 teams at each rate, as both were chosen with.
_CONTEXT_TEAMS = 1.5


class TuningSeedError(ValueError):
    """A workload to tune on is on another seed than ``TUNING_SEED``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        super().__init__(
            f"knobs are tuned on seed {TUNING_SEED} only, got a workload on seed "
            f"{seed}: tuning on an evaluation seed would report figures from the data the "
            f"knobs were chosen on; build the tuning workloads with seed={TUNING_SEED}"
        )


class GridError(ValueError):
    """A grid that cannot be tuned as declared: ``policy``'s ``knob`` and what is wrong."""

    def __init__(self, policy: str, knob: str, problem: str) -> None:
        self.policy, self.knob = policy, knob
        super().__init__(f"{policy}'s grid, knob {knob!r}: {problem}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    """One policy's knobs and the values tried: every combination is a point."""

    default: Mapping[str, Any]  # the paper's setting (kvgov's: KVGOV_CONFIG's)
    values: Mapping[str, tuple[Any, ...]]  # knob -> its values, the default's among them
    why: str  # which knobs and why these, or why there are none

    def check(self, policy: str) -> None:
        """Raises ``GridError`` unless every knob has 1-4 values, its default among them,
        and the default names exactly the grid's knobs."""
        for knob in sorted({*self.default, *self.values}):
            if knob not in self.values or knob not in self.default:
                raise GridError(policy, knob, "give it both a default and values to try")
            values = self.values[knob]
            if not 1 <= len(values) <= 4 or len(set(values)) != len(values):
                raise GridError(policy, knob, f"give 1-4 distinct values, got {values!r}")
            if self.default[knob] not in values:
                raise GridError(
                    policy, knob, f"its default {self.default[knob]!r} must be one of {values!r}"
                )

    def points(self) -> list[dict[str, Any]]:
        """Every combination of the knobs' values, the default first."""
        knobs = sorted(self.values)
        every = [
            dict(zip(knobs, combo, strict=True))
            for combo in itertools.product(*(self.values[k] for k in knobs))
        ]
        default = {k: self.default[k] for k in knobs}
        return [default, *(p for p in every if p != default)]


GRIDS: Mapping[str, Grid] = MappingProxyType(
    {
        "paged": Grid(
            default={},
            values={},
            why="vLLM's memory policy has no knob: its scheduler's settings are the engine's, "
            "the same for every policy",
        ),
        "paged+offload": Grid(
            default={},
            values={},
            why="vLLM's CPU offloading has one setting, the CPU cache's size, which is the "
            "panel's host memory for every policy, and LRU eviction",
        ),
        "ttl-pin": Grid(
            default={"num_prior_samples": 100, "queue_window": 100},
            values={"num_prior_samples": (25, 100, 400), "queue_window": (25, 100)},
            why="Continuum's K (how many records the cold-start prior over a tool's duration "
            "is worth, §4.2; the paper's 100) and the sliding window of T, the queueing delay "
            "its TTL prices (100 calls); prior_mean_s stays 1 s: every tool here comes with the "
            "runtime's expected duration, which replaces it",
        ),
        "intercept": Grid(
            default={},
            values={},
            why="InferCept has no knob: it derives every choice from profiled costs (its waste "
            "equations, the swap limit from one iteration's compute); step_s, the one setting "
            "the class takes, stands in for that profiled iteration and stays measured",
        ),
        "kvgov": Grid(
            default={
                "retain_s": KVGOV_CONFIG.retain_s,
                "headroom_ratio": KVGOV_CONFIG.headroom_ratio,
            },
            values={"retain_s": (2.0, 5.0, 15.0), "headroom_ratio": (0.1, 0.25)},
            why="how long an idle agent's KV is held on the device before it goes to host memory "
            "(retain_s), and the growth overcommit admission keeps in reserve (headroom_ratio); "
            "6 points, as many as ttl-pin's; park_after_s stays at KVGOV_CONFIG's 0.05 s",
        ),
    }
)


@dataclass(frozen=True, slots=True)
class PointRun:
    """One grid point's constrained runs on the tuning seed, one a rate."""

    policy: str
    knobs: Mapping[str, Any]
    jct_mean_s: Mapping[float, float]  # rate -> the mean time of its finished jobs
    num_failed: int  # jobs failed, every rate

    @property
    def objective_s(self) -> float | None:
        """The geometric mean over rates of the mean job time; None: disqualified (a job
        failed, or a rate finished none)."""
        times = list(self.jct_mean_s.values())
        if self.num_failed or not times or not all(t > 0 for t in times):
            return None
        return stats.tuning_objective(times)


def choose(grid: Grid, runs: Sequence[PointRun]) -> dict[str, Any]:
    """The rule: the least objective among the qualified points, the default kept where
    it is within ``TIE_SHARE`` of that (or where no point qualified)."""
    default = dict(grid.default)
    scored = [(r.objective_s, dict(r.knobs)) for r in runs if r.objective_s is not None]
    if not scored:
        return default
    best_s, best = min(scored, key=lambda pair: pair[0])  # the first of equals
    default_s = next((s for s, knobs in scored if knobs == default), None)
    if default_s is not None and default_s <= best_s * (1 + TIE_SHARE):
        return default
    return best


@dataclass(slots=True)
class Tuning:
    """What ``tune`` ran and chose."""

    panel: Panel
    rates: tuple[float, ...]
    window_s: tuple[float, ...]  # each rate's arrival window
    grids: Mapping[str, Grid]
    points: list[PointRun] = field(default_factory=list)
    chosen: dict[str, dict[str, Any]] = field(default_factory=dict)
    wall_s: float = 0.0  # host seconds, every run

    def measurements(self) -> Iterator[Measurement]:
        """Each grid point's objective (NaN where it was not run or disqualified), its
        note giving the mean job time at each rate and whether it was chosen."""
        where = (
            f"tuning seed {TUNING_SEED} only; {self.panel.title}; modelled; "
            f"constrained runs at {_rates(self.rates)} teams/min over {_rates(self.window_s)} s; "
            "objective: geometric mean over rates of the mean job time"
        )
        for policy, grid in self.grids.items():
            runs = [p for p in self.points if p.policy == policy]
            if not runs:
                yield Measurement(
                    bench=_BENCH,
                    metric=f"tuning_objective[{policy}]",
                    value=math.nan,
                    unit="s",
                    direction=Direction.LOWER_IS_BETTER,
                    note=f"its only point ({_knobs(grid.default)}): not run; {grid.why}",
                )
                continue
            for point in runs:
                objective = point.objective_s
                per_rate = ", ".join(
                    f"{rate:g}/min {point.jct_mean_s[rate]:,.0f} s" for rate in self.rates
                )
                marks = [f"mean job {per_rate}"]
                if objective is None:
                    marks.append(f"disqualified: {point.num_failed} jobs failed")
                if dict(point.knobs) == self.chosen[policy]:
                    marks.append("chosen")
                yield Measurement(
                    bench=_BENCH,
                    metric=f"tuning_objective[{policy} {_knobs(point.knobs)}]",
                    value=math.nan if objective is None else objective,
                    unit="s",
                    direction=Direction.LOWER_IS_BETTER,
                    note=f"{'; '.join(marks)}; {where}",
                )

    def literal(self, *, command: str, commit: str, date: str) -> str:
        """The text of ``tuned.py``: the chosen knobs, and a header saying how to redo it
        and every point's objective."""
        lines = [
            '"""The knobs each policy of ``kvgov bench openloop`` runs with, chosen on the',
            'tuning seed by ``tuning``\'s rule. Written by that run (below), not by hand."""',
            "",
            f"# Produced by `{command}`, started at commit {commit}, {date},",
            f"# in {self.wall_s:,.0f} s of host time. Tuning seed {TUNING_SEED}; "
            f"{self.panel.name};",
            f"# constrained runs at {_rates(self.rates)} teams/min over {_rates(self.window_s)} s. "
            "Objective: the",
            "# geometric mean over rates of the mean job time, s (* chosen; - disqualified).",
            "#",
            "# | policy | knobs | objective | "
            + " | ".join(f"{r:g}/min" for r in self.rates)
            + " |",
            "# |---|---|---|" + "---|" * len(self.rates),
        ]
        for policy, grid in self.grids.items():
            runs = [p for p in self.points if p.policy == policy]
            if not runs:
                empty = " | ".join("" for _ in self.rates)
                lines.append(
                    f"# | {policy} | {_knobs(grid.default)} | not run: one point | {empty} |"
                )
            for point in runs:
                objective = point.objective_s
                mark = "*" if dict(point.knobs) == self.chosen[policy] else ""
                shown = "-" if objective is None else f"{objective:,.0f}{mark}"
                per_rate = " | ".join(f"{point.jct_mean_s[r]:,.0f}" for r in self.rates)
                lines.append(f"# | {policy} | {_knobs(point.knobs)} | {shown} | {per_rate} |")
        lines += [
            "",
            "from __future__ import annotations",
            "",
            "from typing import Any",
            "",
            '__all__ = ["TUNED"]',
            "",
            "TUNED: dict[str, dict[str, Any]] = {",
        ]
        for policy in self.grids:
            knobs = ", ".join(f"{json.dumps(k)}: {v!r}" for k, v in self.chosen[policy].items())
            lines.append(f"    {json.dumps(policy)}: {{{knobs}}},")
        lines.append("}")
        return "\n".join(lines) + "\n"


def tune(
    panel: Panel,
    workloads: Sequence[OpenLoopWorkload],
    grids: Mapping[str, Grid] = GRIDS,
    *,
    progress: Callable[[str], None] = lambda line: None,
) -> Tuning:
    """Every point of every grid on each workload (one a rate, all on ``TUNING_SEED``),
    constrained, and each policy's point chosen by the rule (``choose``)."""
    from kvgov.benchmarks.swarm.twin import TwinDevice, measure_twin_costs
    from kvgov.simulate import stand_in_engine

    for workload in workloads:
        if workload.seed != TUNING_SEED:
            raise TuningSeedError(workload.seed)
    for policy, grid in grids.items():
        grid.check(policy)
        for point in grid.points():
            check_knobs(policy, point)
    began = time.perf_counter()
    rates = tuple(w.rate_per_min for w in workloads)
    tuning = Tuning(panel, rates, tuple(w.duration_s for w in workloads), grids)
    scenario = panel.scenario
    device = TwinDevice(scenario.profile, scenario.target.shape, forward=False)
    engine = stand_in_engine(scenario)
    costs = measure_twin_costs(engine, device)
    times: dict[tuple[str, str], dict[float, float]] = {}
    failed: dict[tuple[str, str], int] = {}
    for workload in workloads:
        setup = WorkloadSetup.of(workload, block_size=scenario.block_size)
        fraction = engine.capacity().num_blocks / max(1, setup.peak_blocks)
        for policy, grid in grids.items():
            points = grid.points()
            if len(points) == 1:
                continue  # nothing to choose
            for point in points:
                progress(f"{policy} {_knobs(point)} at {workload.rate_per_min:g} teams/min ...")
                result = _run(engine, device, policy, setup, costs, fraction=fraction, knobs=point)
                key = (policy, _knobs(point))
                times.setdefault(key, {})[workload.rate_per_min] = result.jct_mean_s
                failed[key] = failed.get(key, 0) + len(result.failed)
    for policy, grid in grids.items():
        points = grid.points()
        runs = [
            PointRun(policy, p, times[(policy, _knobs(p))], failed[(policy, _knobs(p))])
            for p in points
            if (policy, _knobs(p)) in times
        ]
        tuning.points += runs
        tuning.chosen[policy] = choose(grid, runs) if runs else dict(grid.default)
    tuning.wall_s = time.perf_counter() - began
    return tuning


def run(*, quick: bool = False) -> Iterator[Measurement]:
    """``kvgov bench openloop-tune``: the grids on the tuning seed at the benchmark's
    rates and windows (``--quick``: one rate, two teams), each point's objective, and
    the ``tuned.py`` it chose printed to stderr to commit."""
    rates = _QUICK_RATES if quick else RATES
    window = windows(rates, _QUICK_TEAMS if quick else TEAMS_PER_WINDOW)
    workloads = [
        dataclasses.replace(
            openloop.TWIN, rate_per_min=rate, duration_s=window[rate], seed=TUNING_SEED
        )
        for rate in rates
    ]
    # The code that runs is the checkout's at the start; others may commit meanwhile.
    commit = _commit()
    began = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    tuning = tune(reference_card(), workloads, progress=_progress)
    command = "kvgov bench openloop-tune" + (" --quick" if quick else "")
    literal = tuning.literal(command=command, commit=commit, date=began)
    _progress(f"{len(tuning.points)} points in {tuning.wall_s:.0f} s of host time; tuned.py:")
    print(literal, file=sys.stderr, flush=True)
    yield from tuning.measurements()
    yield from _contexts(rates, _QUICK_TEAMS if quick else _CONTEXT_TEAMS)


def _contexts(rates: Sequence[float], teams: float) -> Iterator[Measurement]:
    """The whole-system comparison's context knobs, each on the tuning seed by the rule
    ``editing_knobs`` states: context editing's trigger and keep (``tune_editing``, the
    baselines with context editing), then kvgov's ceiling and tool-output budget
    (``tune_kvgov_context``, among the points that keep as many facts as the best
    LangChain handling); each point's objective, the chosen one marked, to commit as
    ``EDITING_KNOBS`` and ``KVGOV_CONTEXT``."""
    window = windows(rates, teams)
    where = (
        f"tuning seed {TUNING_SEED} only; whole system; modelled; at {_rates(rates)} "
        f"teams/min over {_rates(list(window.values()))} s; objective: geometric mean over "
        "rates of the mean job time"
    )
    editing, by_editing = tune_editing(
        rates,
        window_s=window,
        policies=BASELINES,
        processes=default_processes(),
        progress=_progress,
    )
    for point, row in by_editing.items():
        yield _context_point(
            f"context_editing {point.trigger_tokens} {point.keep}", row, point == editing, where
        )
    # kvgov's floor is the best LangChain handling's facts: context editing's as chosen.
    context, by_context = tune_kvgov_context(
        rates,
        window_s=window,
        editing=editing,
        processes=default_processes(),
        progress=_progress,
    )
    for knobs, run in by_context.items():
        row = {f"{rate:g}/min": jct for rate, jct in run.jct_mean_s.items()}
        kept = (
            f"facts kept {run.facts_kept_pct:.1f}% (the best LangChain handling "
            f"{run.facts_floor_pct:.1f}%)"
        )
        yield _context_point(
            f"kvgov_context {knobs.ceiling_tokens} {knobs.tool_output_tokens} "
            f"{knobs.summary_share:g} {knobs.compact_to:g}",
            row,
            knobs == context,
            f"{kept}; {where}",
        )
    _progress(f"chosen: EDITING_KNOBS = {editing!r}, KVGOV_CONTEXT = {context!r}")


def _context_point(
    name: str, jct_mean_s: Mapping[str, float], chosen: bool, where: str
) -> Measurement:
    """One point of a context grid: its objective, its mean job times in the note."""
    objective = stats.tuning_objective(jct_mean_s.values())
    times = ", ".join(f"{key} {value:,.0f} s" for key, value in jct_mean_s.items())
    return Measurement(
        bench=_BENCH,
        metric=f"tuning_objective[{name}]",
        value=objective,
        unit="s",
        direction=Direction.LOWER_IS_BETTER,
        note=f"mean job {times}{'; chosen' if chosen else ''}; {where}",
    )


def _knobs(knobs: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v!r}" for k, v in sorted(knobs.items())) or "(none)"


def _rates(rates: Sequence[float]) -> str:
    return ", ".join(f"{r:g}" for r in rates)


def _commit() -> str:
    """The checkout's commit, and whether files it tracks were changed (``unknown``
    outside a git checkout), for the header of what a run writes."""
    here = Path(__file__).parent
    try:
        head = _git(here, "rev-parse", "--short", "HEAD")
        changed = _git(here, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head} with uncommitted changes" if changed else head


def _git(where: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=True
    )
    return out.stdout.strip()


def _progress(line: str) -> None:
    print(f"[openloop-tune] {line}", file=sys.stderr, flush=True)
