"""The whole-system comparison of ``kvgov bench openloop`` (issue 34): each memory policy
with the context handling its users have, kvgov with its own, job time and goodput
beside the facts each agent still has at its last call.

The memory-policy comparison (``panel``) sends every policy the same prompts. Here each
system sends what its users' stack sends, on the same jobs (the same workload, with
facts planted in every raw tool output, ``OpenLoopWorkload.facts``):

- ``kvgov``: kvgov's policy with its tool-output reducer, ceiling and compaction (the
  open-loop workload as ``panel`` runs it: outputs reduced to 2,048 tokens by
  ``ExtractiveSummarizer``, histories compacted at 16,000 by ``SummarizeOldest``);
- ``<baseline>+trim_messages``: each baseline (``POLICIES``) with raw tool outputs, the
  history brought under the target model's context window (Qwen3-8B: 32,768) by
  LangChain's ``trim_messages`` (``langchain_context``);
- ``<baseline>+context_editing``: each baseline with LangChain's
  ``ContextEditingMiddleware`` and ``ClearToolUsesEdit``, its trigger chosen on the
  tuning seed (``editing_trigger``).

Systems with the same handling send the same prompts, so among them only memory policy
differs. A job's goodput SLO is the job's, not the system's: ``stats.SLO_FACTOR`` times
the least of its unloaded times over the three handlings (its team alone under paged
with room for every context, ``unloaded``), the same whichever system runs it. Facts kept
(``facts.kept``): a fact counts when its exact text is in the messages an agent sends at
its last call; it depends on the handling only. kvgov over the best baseline system: the
best picked once on its median goodput over the evaluation seeds (``stats.best_of``),
then paired seed by seed (``stats.paired_ratio``). Every figure is modelled (the twin of
the reference card, ``panel.reference_card``). No unconstrained runs: no figure here needs
one.

Errors: ``SystemComparisonError`` (a ``ValueError``) for a request that cannot give a
sound figure: the tuning seed among the seeds, or a workload whose jobs differ between
handlings; its message says what to change.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.benchmarks import Direction, Measurement
from kvgov.benchmarks._swarm_workload import AgentScript
from kvgov.benchmarks.baselines import BASELINES
from kvgov.benchmarks.context_workload import Fact
from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.editing_trigger import TRIGGER_TOKENS
from kvgov.benchmarks.openloop.facts import FactsKept, kept
from kvgov.benchmarks.openloop.langchain_context import (
    CONTEXT_EDITING,
    HANDLINGS,
    TRIM,
    ContextHandling,
    handle,
)

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer
    from governor import TokenCounter
    from kvgov.benchmarks._swarm_result import RunResult
    from kvgov.benchmarks.openloop.panel import WorkloadSetup

__all__ = [
    "KVGOV",
    "POLICIES",
    "Prepared",
    "SeedRuns",
    "System",
    "SystemComparisonError",
    "figures",
    "measure",
    "prepare",
    "run",
    "run_seed",
    "systems",
]

KVGOV = "kvgov"  # kvgov's policy, and its context handling
POLICIES = BASELINES  # the baselines run with each LangChain handling
_BENCH = "swarm"
_DEADLINE_S = 24 * 3600.0  # virtual: a run past it is a livelock, not a slow swarm
_LOWER, _HIGHER = Direction.LOWER_IS_BETTER, Direction.HIGHER_IS_BETTER
_QUICK_SEEDS = (1, 2)
_QUICK_RATES = (0.5,)
_QUICK_TEAMS = 1.5


class SystemComparisonError(ValueError):
    """A whole-system comparison that cannot give a sound figure."""


@dataclass(frozen=True, slots=True)
class System:
    """A memory policy and the context handling its users run it with."""

    policy: str
    handling: str  # KVGOV, or one of langchain_context.HANDLINGS

    @property
    def name(self) -> str:
        return KVGOV if self.policy == KVGOV else f"{self.policy}+{self.handling}"


def systems(policies: Sequence[str] = POLICIES) -> tuple[System, ...]:
    """kvgov, then each of ``policies`` with each LangChain handling."""
    return (
        System(KVGOV, KVGOV),
        *(System(p, h) for p in policies for h in HANDLINGS),
    )


@dataclass(slots=True)
class Prepared:
    """One workload as each handling sends it: its ``panel.WorkloadSetup`` by handling
    (``KVGOV`` and each of ``HANDLINGS``), every worker's planted facts, and the calls
    context editing left over the window."""

    setups: dict[str, WorkloadSetup]
    facts: dict[str, tuple[Fact, ...]]
    num_trimmed_after_edit: int

    def retimed(self, workload: openloop.OpenLoopWorkload) -> Prepared | None:
        """These setups with their teams arriving as in ``workload``, where ``workload``
        is this one at another rate and window that draw the same teams (a window holding
        the same expected teams: its gaps scaled, its teams and their draws the same);
        None where it is not."""
        ours = self.setups[KVGOV].workload
        shape = {"rate_per_min": ours.rate_per_min, "duration_s": ours.duration_s}
        if dataclasses.replace(workload, **shape) != ours:
            return None
        teams = openloop.arrivals(workload)
        planners = [s for s in self.setups[KVGOV].scripts if s.planner]
        if [(s.team, s.tenant) for s in planners] != [
            (i, t.name) for i, (_, t) in enumerate(teams)
        ]:
            return None
        setups = {}
        for handling, setup in self.setups.items():
            scripts = tuple(
                dataclasses.replace(s, arrival_s=teams[s.team][0]) if s.planner else s
                for s in setup.scripts
            )
            shape = dataclasses.replace(
                setup.workload, rate_per_min=workload.rate_per_min, duration_s=workload.duration_s
            )
            setups[handling] = dataclasses.replace(setup, workload=shape, scripts=scripts)
        return Prepared(setups, self.facts, self.num_trimmed_after_edit)


@dataclass(slots=True)
class SeedRuns:
    """One evaluation seed's runs of every system at every rate (the same teams at every
    rate when each rate's window holds the same expected number of teams)."""

    seed: int
    results: dict[tuple[str, float], RunResult] = field(default_factory=dict)  # system, rate
    # (handling, rate) -> each job -> its unloaded time with that handling's prompts, s
    unloaded_s: dict[tuple[str, float], dict[str, float]] = field(default_factory=dict)
    facts: dict[tuple[str, float], FactsKept] = field(default_factory=dict)  # handling, rate
    window_s: dict[float, float] = field(default_factory=dict)
    num_trimmed_after_edit: int = 0  # calls context editing left over the window
    window_tokens: int = 0  # the model's context window
    trigger_tokens: int = 0  # context editing's trigger
    wall_s: float = 0.0  # host seconds

    def slo_s(self, system: str, rate: float) -> dict[str, float]:
        """Each job's SLO at ``rate``: ``stats.SLO_FACTOR`` times the least of its
        unloaded times over the handlings. The job's, whichever ``system`` runs it."""
        by_handling = [t for (_, r), t in self.unloaded_s.items() if r == rate]
        least = {job: min(t[job] for t in by_handling) for job in by_handling[0]}
        return stats.slo_s_by_job(least)

    def goodput(self, system: str, rate: float) -> float:
        """``system``'s jobs a minute within their SLO at ``rate``."""
        result = self.results[(system, rate)]
        return stats.goodput_per_min(
            result.jct_s, len(result.failed), self.window_s[rate], self.slo_s(system, rate)
        )


def run_seed(
    seed: int,
    rates: Sequence[float],
    *,
    window_s: float | Mapping[float, float],
    policies: Sequence[str] = POLICIES,
    trigger_tokens: int = TRIGGER_TOKENS,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    only: Sequence[System] | None = None,
    base: openloop.OpenLoopWorkload = openloop.TWIN,
    window_tokens: int | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> SeedRuns:
    """Every system (``systems(policies)``, or ``only`` those) on the twin of the
    reference card at each of ``rates`` on ``seed``: one cell of the comparison,
    independent of every other (a runner may take seeds in parallel processes).
    ``knobs``: policy -> its settings (``tuned.TUNED`` unless given); ``base``: the
    workload at every rate (its rate, window and seed replaced); ``window_tokens``: the
    model's context window (the reference card's target's unless given)."""
    from kvgov.benchmarks._swarm_twin import TwinDevice, measure_twin_costs, run_twin_policy
    from kvgov.benchmarks.openloop.panel import check_knobs, reference_card
    from kvgov.benchmarks.openloop.tuned import TUNED
    from kvgov.benchmarks.openloop.unloaded import UnloadedTimes
    from kvgov.simulate import stand_in_engine

    began = time.perf_counter()
    knobs = TUNED if knobs is None else knobs
    every = systems(policies) if only is None else tuple(only)
    for system in every:
        check_knobs(system.policy, knobs.get(system.policy, {}))
    panel = reference_card()
    scenario = panel.scenario
    window_tokens = window_tokens or scenario.target.context_tokens
    device = TwinDevice(scenario.profile, scenario.target.shape, forward=False)
    engine = stand_in_engine(scenario)
    costs = measure_twin_costs(engine, device)
    alone = UnloadedTimes(scenario=scenario, device=device, deadline_s=_DEADLINE_S)
    window = window_s if isinstance(window_s, Mapping) else dict.fromkeys(rates, window_s)
    runs = SeedRuns(seed, window_tokens=window_tokens, trigger_tokens=trigger_tokens)
    prepared: Prepared | None = None
    facts: dict[str, FactsKept] = {}
    unloaded: dict[str, dict[str, float]] = {}
    for rate in rates:
        workload = dataclasses.replace(
            base, rate_per_min=rate, duration_s=window[rate], seed=seed, facts=True
        )
        prepared = None if prepared is None else prepared.retimed(workload)
        if prepared is None:
            progress(f"whole system: {rate:g} teams/min, seed {seed}: each handling ...")
            prepared = prepare(
                workload,
                window_tokens=window_tokens,
                trigger_tokens=trigger_tokens,
                block_size=scenario.block_size,
            )
            # A team's facts kept and unloaded time are its own, whenever it arrives.
            for handling, setup in prepared.setups.items():
                facts[handling] = kept(setup.scripts, prepared.facts, _counter())
                unloaded[handling] = alone.of(setup)
        runs.window_s[rate] = window[rate]
        runs.num_trimmed_after_edit += prepared.num_trimmed_after_edit
        for handling in prepared.setups:
            runs.facts[(handling, rate)] = facts[handling]
            runs.unloaded_s[(handling, rate)] = unloaded[handling]
        for system in every:
            setup = prepared.setups[system.handling]
            progress(f"whole system: {system.name} at {rate:g} teams/min, seed {seed} ...")
            runs.results[(system.name, rate)] = run_twin_policy(
                engine,
                device,
                system.policy,
                engine.capacity().num_blocks / max(1, setup.peak_blocks),
                setup.scripts,
                setup.prompts,
                setup.swarm_workload,
                None if system.policy in ("paged", KVGOV) else costs,
                deadline_s=_DEADLINE_S,
                knobs=knobs.get(system.policy, {}),
            ).result
    runs.wall_s = time.perf_counter() - began
    return runs


def prepare(
    workload: openloop.OpenLoopWorkload,
    *,
    window_tokens: int,
    trigger_tokens: int,
    block_size: int,
) -> Prepared:
    """``workload`` (facts planted) as each handling sends it to a model of
    ``window_tokens``, context editing triggered at ``trigger_tokens``; ``block_size``
    for each setup's peak blocks."""
    if not workload.facts:
        raise SystemComparisonError(
            "the whole-system comparison measures facts kept: build it from a workload "
            "with facts=True"
        )
    window, counter, tokenizer = window_tokens, _counter(), _tokenizer()
    scripts, facts = openloop.build_planted(workload, counter)
    raw = dataclasses.replace(workload, tool_output_tokens=None, ceiling_tokens=None)
    raw_scripts, raw_facts = openloop.build_planted(raw, counter)
    if raw_facts != facts or _jobs(raw_scripts) != _jobs(scripts):
        raise SystemComparisonError(
            f"seed {workload.seed} at {workload.rate_per_min:g} teams/min: the jobs (tools, "
            "latencies, replies, facts) differ between raw and reduced tool outputs, so the "
            "systems would not run the same jobs; use another seed or window, and report it"
        )
    trimmed = handle(raw_scripts, ContextHandling(name=TRIM, window_tokens=window), counter)
    edited = handle(
        raw_scripts,
        ContextHandling(name=CONTEXT_EDITING, window_tokens=window, trigger_tokens=trigger_tokens),
        counter,
    )
    setups = {
        KVGOV: _setup(workload, scripts, tokenizer, block_size, window),
        TRIM: _setup(raw, trimmed.scripts, tokenizer, block_size, window),
        CONTEXT_EDITING: _setup(raw, edited.scripts, tokenizer, block_size, window),
    }
    return Prepared(setups, facts, edited.num_trimmed_after_edit)


@functools.cache
def _tokenizer() -> Tokenizer:
    """The stand-in engine's tokenizer: the ids the twin's engine is sent."""
    from engine.presets import PRESETS
    from engine.tokenizer import load_tokenizer

    return load_tokenizer(PRESETS["tiny-random"].tokenizer)


@functools.cache
def _counter() -> TokenCounter:
    return openloop.counter_for(_tokenizer())


def _jobs(scripts: Sequence[AgentScript]) -> list[tuple[Any, ...]]:
    """What makes a job the same job whatever its context: its calls' tools, latencies
    and replies, and when it arrives."""
    return [
        (
            s.name,
            s.arrival_s,
            tuple((t.tool, t.tool_s, t.expected_s, t.reply_tokens) for t in s.turns),
        )
        for s in scripts
    ]


def _setup(
    workload: openloop.OpenLoopWorkload,
    scripts: tuple[AgentScript, ...],
    tokenizer: Tokenizer,
    block_size: int,
    window_tokens: int,
) -> WorkloadSetup:
    """``panel.WorkloadSetup`` of scripts made here (``WorkloadSetup.of`` builds its own),
    every call checked to fit the model's window with its reply."""
    from kvgov.benchmarks.openloop.panel import WorkloadSetup

    prompts = openloop.prompts(scripts, tokenizer)
    peak = 0
    for script in scripts:
        needed = [
            len(prompts[(script.name, i)]) + (t.reply_tokens or 0)
            for i, t in enumerate(script.turns)
        ]
        longest = max(needed)
        assert longest <= window_tokens, f"{script.name}: a call of {longest:,} tokens"
        peak += math.ceil(longest / block_size)
    return WorkloadSetup(workload, scripts, prompts, peak)


def measure(
    seeds: Sequence[int],
    rates: Sequence[float],
    *,
    window_s: float | Mapping[float, float],
    policies: Sequence[str] = POLICIES,
    trigger_tokens: int = TRIGGER_TOKENS,
    progress: Callable[[str], None] = lambda line: None,
) -> Iterator[Measurement]:
    """The whole-system figures on the evaluation ``seeds`` at ``rates`` (``window_s``:
    one arrival window for every rate, or each rate's), every seed run in turn
    (``run_seed``; a parallel runner calls it per seed and passes the results to
    ``figures``)."""
    _check_seeds(seeds)
    began = time.perf_counter()
    runs = [
        run_seed(
            seed,
            rates,
            window_s=window_s,
            policies=policies,
            trigger_tokens=trigger_tokens,
            progress=progress,
        )
        for seed in seeds
    ]
    progress(
        f"whole system: {sum(len(r.results) for r in runs)} runs in "
        f"{time.perf_counter() - began:.0f} s of host time"
    )
    yield from figures(runs, rates, policies=policies)


def _check_seeds(seeds: Sequence[int]) -> None:
    from kvgov.benchmarks.openloop.bench import TUNING_SEED

    if TUNING_SEED in seeds:
        raise SystemComparisonError(
            f"seed {TUNING_SEED} is the tuning seed (context editing's trigger and every "
            "policy's knobs are chosen on it): no reported figure comes from it; evaluate "
            "on other seeds"
        )


def figures(
    runs: Sequence[SeedRuns],
    rates: Sequence[float],
    *,
    policies: Sequence[str] = POLICIES,
) -> Iterator[Measurement]:
    """The figures of ``runs`` (one per evaluation seed, from ``run_seed``), every
    system of ``systems(policies)`` at every one of ``rates``."""
    from kvgov.benchmarks.openloop.panel import reference_card

    _check_seeds([r.seed for r in runs])
    every = systems(policies)
    baselines = [s.name for s in every if s.policy != KVGOV]
    panel = reference_card()
    window, trigger_tokens = runs[0].window_tokens, runs[0].trigger_tokens
    seeds = sorted(r.seed for r in runs)
    what = _what(runs, rates, window, trigger_tokens)
    where = f"{panel.title}; {len(runs)} evaluation seeds ({_span(seeds)}); {what}"
    for rate in rates:
        at = f"{rate:g}/min"
        per_system = {}
        for system in every:
            jct = {r.seed: r.results[(system.name, rate)].jct_mean_s for r in runs}
            per_system[system.name] = good = {r.seed: r.goodput(system.name, rate) for r in runs}
            for figure, values, unit, direction in (
                ("jct_mean_system", jct, "s", _LOWER),
                ("goodput_system", good, "jobs/min", _HIGHER),
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
                    + where,
                )
        yield from _against_best(runs, rate, per_system, baselines, where)
    yield from _facts(runs, rates, every, window, trigger_tokens)
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
    runs: Sequence[SeedRuns],
    rate: float,
    goodput: Mapping[str, Mapping[int, float]],
    baselines: Sequence[str],
    where: str,
) -> Iterator[Measurement]:
    best = stats.best_of({s: goodput[s] for s in baselines}, lower_is_better=False)
    name = f"goodput_kvgov_over_best_system@{rate:g}/min_twin"
    zero = sorted(s for s, v in goodput[best].items() if v <= 0)
    if zero:
        note = (
            f"modelled; no figure: {best} (best by median goodput) finished no job within "
            f"its SLO on seed(s) {', '.join(map(str, zero))}; the goodputs are reported apart"
        )
        yield Measurement(_BENCH, name, math.nan, "ratio", 2.0, _HIGHER, note=note)
        return
    ratio = stats.paired_ratio(goodput[KVGOV], goodput[best])
    yield Measurement(
        _BENCH,
        name,
        ratio.value,
        "ratio",
        2.0,
        _HIGHER,
        note=f"modelled; kvgov over {best} (the best baseline system by median goodput), "
        f"{ratio}; {_slo_note()}; {where}",
    )
    yield Measurement(
        _BENCH,
        name + "_lower95",
        ratio.low,
        "ratio",
        None,
        _HIGHER,
        note=f"the paired interval's lower bound: kvgov over {best}, {ratio}",
    )


def _facts(
    runs: Sequence[SeedRuns],
    rates: Sequence[float],
    every: Sequence[System],
    window: int,
    trigger_tokens: int,
) -> Iterator[Measurement]:
    by_handling: dict[str, dict[int, float]] = {}
    counts: dict[str, FactsKept] = {}
    for handling in (KVGOV, *HANDLINGS):
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
        TRIM: ContextHandling(name=TRIM, window_tokens=window).label,
        CONTEXT_EDITING: ContextHandling(
            name=CONTEXT_EDITING, window_tokens=window, trigger_tokens=trigger_tokens
        ).label,
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
    if all(v > 0 for v in by_handling[best].values()):
        ratio = stats.paired_ratio(by_handling[KVGOV], by_handling[best])
        yield Measurement(
            _BENCH,
            "facts_kept_kvgov_over_best_langchain_twin",
            ratio.value,
            "ratio",
            1.0,
            _HIGHER,
            note=f"whole system; kvgov's facts kept over {labels[best]}'s (the best LangChain "
            f"handling by median), seed by seed: {ratio}",
        )


def _what(
    runs: Sequence[SeedRuns], rates: Sequence[float], window: int, trigger_tokens: int
) -> str:
    windows = runs[0].window_s
    trimmed = sum(r.num_trimmed_after_edit for r in runs)
    return (
        f"teams at {', '.join(f'{r:g}' for r in rates)}/min over "
        f"{', '.join(f'{windows[r]:g}' for r in rates)} s, facts planted in every raw tool "
        f"output; kvgov: outputs reduced to {openloop.TWIN.tool_output_tokens:,}, compacted "
        f"at {openloop.TWIN.ceiling_tokens:,}; the baselines: raw outputs, trim_messages at "
        f"the {window:,}-token window or ClearToolUsesEdit at {trigger_tokens:,} (keep 3; "
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


def run(*, quick: bool = False) -> Iterator[Measurement]:
    """The whole-system comparison at ``bench``'s rates and evaluation seeds; ``quick``:
    2 seeds at one rate, about 1.5 teams a window."""
    from kvgov.benchmarks.openloop import bench

    seeds = _QUICK_SEEDS if quick else bench.EVALUATION_SEEDS
    rates = _QUICK_RATES if quick else bench.RATES
    window = bench.windows(rates, _QUICK_TEAMS if quick else bench.TEAMS_PER_WINDOW)
    yield from measure(seeds, rates, window_s=window, progress=_progress)


def _progress(line: str) -> None:
    print(f"[openloop] {line}", file=sys.stderr, flush=True)
