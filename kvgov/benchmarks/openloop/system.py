"""The whole-system comparison of ``kvgov bench openloop`` (issue 34): each memory policy
with the context handling its users have, kvgov with its own, job time and goodput
beside the facts each agent still has at its last call.

The memory-policy comparison (``panel``) sends every policy the same prompts. Here each
system sends what its users' stack sends, on the same jobs (the same workload, with
facts planted in every raw tool output, ``OpenLoopWorkload.facts``):

- ``kvgov``: kvgov's policy with its tool-output reducer, ceiling and compaction: outputs
  reduced by ``ExtractiveSummarizer``, histories compacted by ``SummarizeOldest``, at
  the budget and ceiling tuned on the tuning seed (``kvgov_context``), as context
  editing's knobs are;
- ``<baseline>+trim_messages``: each baseline (``POLICIES``) with raw tool outputs, the
  history brought under the target model's context window (Qwen3-8B: 32,768) by
  LangChain's ``trim_messages`` (``langchain_context``);
- ``<baseline>+context_editing``: each baseline with LangChain's
  ``ContextEditingMiddleware`` and ``ClearToolUsesEdit``, its trigger and ``keep``
  chosen on the tuning seed (``editing_knobs``);
- ``kvgov@<ceiling>`` (``also``): kvgov at another of its contexts, beside the chosen one,
  so the trade between job time and facts kept shows.

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

Each handling's workload is built by ``handled``, the systems and a seed's runs of them
are ``system_runs``'s, the figures made by ``system_figures``.

Errors: ``SystemComparisonError`` (a ``ValueError``) when the tuning seed is among the
seeds to report; ``handled.HandledWorkloadError`` for a workload the comparison cannot
use. Their messages say what to change.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.editing_knobs import EDITING_KNOBS, EditingKnobs
from kvgov.benchmarks.openloop.facts import FactsKept, kept
from kvgov.benchmarks.openloop.handled import KVGOV, Prepared, counter, prepare, prepare_kvgov
from kvgov.benchmarks.openloop.kvgov_context import KVGOV_CONTEXT, KvgovContext
from kvgov.benchmarks.openloop.panel import check_knobs, reference_card
from kvgov.benchmarks.openloop.processes import in_processes
from kvgov.benchmarks.openloop.system_figures import figures
from kvgov.benchmarks.openloop.system_runs import (
    POLICIES,
    SeedRuns,
    System,
    SystemComparisonError,
    check_seeds,
    systems,
)
from kvgov.benchmarks.openloop.tuned import TUNED
from kvgov.benchmarks.openloop.unloaded import UnloadedTimes

if TYPE_CHECKING:
    from engine.benchmarks import Measurement

__all__ = [
    "KVGOV",
    "POLICIES",
    "SeedRuns",
    "System",
    "SystemComparisonError",
    "check_seeds",
    "measure",
    "run_seed",
    "systems",
]

_DEADLINE_S = 24 * 3600.0  # virtual: a run past it is a livelock, not a slow swarm


def run_seed(
    seed: int,
    rates: Sequence[float],
    *,
    window_s: float | Mapping[float, float],
    policies: Sequence[str] = POLICIES,
    editing: EditingKnobs = EDITING_KNOBS,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    only: Sequence[System] | None = None,
    base: openloop.OpenLoopWorkload = openloop.TWIN,
    window_tokens: int | None = None,
    kvgov_context: KvgovContext | None = None,
    also: Sequence[KvgovContext] = (),
    progress: Callable[[str], None] = lambda line: None,
) -> SeedRuns:
    """Every system (``systems(policies)``, or ``only`` those) on the twin of the
    reference card at each of ``rates`` on ``seed``: one cell of the comparison,
    independent of every other (a runner may take seeds in parallel processes).
    ``knobs``: policy -> its settings (``tuned.TUNED`` unless given); ``editing``:
    context editing's trigger and keep (as tuned unless given); ``base``: the
    workload at every rate (its rate, window and seed replaced); ``window_tokens``: the
    model's context window (the reference card's target's unless given);
    ``kvgov_context``: kvgov's ceiling and tool-output budget (None: ``base``'s own);
    ``also``: kvgov's other contexts, each run as a system of its own (``KvgovContext.
    system``) on the same jobs and SLOs (the SLOs are the three handlings')."""
    from kvgov.benchmarks.swarm.twin import TwinDevice, measure_twin_costs, run_twin_policy
    from kvgov.simulate import stand_in_engine

    began = time.perf_counter()
    knobs = TUNED if knobs is None else knobs
    every = (*(systems(policies, also) if only is None else only),)
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
    if kvgov_context is not None:
        base = kvgov_context.apply(base)
    assert base.ceiling_tokens is not None and base.tool_output_tokens is not None, (
        "kvgov's handling reduces tool outputs and compacts histories"
    )
    runs = SeedRuns(
        seed,
        window_tokens=window_tokens,
        editing=editing,
        kvgov_context=KvgovContext(
            base.ceiling_tokens, base.tool_output_tokens, base.summary_share, base.compact_to
        ),
        also=tuple(also),
    )
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
                editing=editing,
                block_size=scenario.block_size,
            )
            # A team's facts kept and unloaded time are its own, whenever it arrives.
            for handling, setup in prepared.setups.items():
                facts[handling] = kept(setup.scripts, prepared.facts, counter())
                unloaded[handling] = alone.of(setup)
        runs.window_s[rate] = window[rate]
        runs.num_trimmed_after_edit += prepared.num_trimmed_after_edit
        for handling in prepared.setups:
            runs.facts[(handling, rate)] = facts[handling]
            runs.unloaded_s[(handling, rate)] = unloaded[handling]
        setups = dict(prepared.setups)
        for context in also:
            setups[context.system] = prepare_kvgov(
                context.apply(workload),
                prepared,
                window_tokens=window_tokens,
                block_size=scenario.block_size,
            )
            runs.facts[(context.system, rate)] = kept(
                setups[context.system].scripts, prepared.facts, counter()
            )
        for system in every:
            setup = setups[system.handling]
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


def measure(
    seeds: Sequence[int],
    rates: Sequence[float],
    *,
    window_s: float | Mapping[float, float],
    policies: Sequence[str] = POLICIES,
    editing: EditingKnobs = EDITING_KNOBS,
    kvgov_context: KvgovContext = KVGOV_CONTEXT,
    also: Sequence[KvgovContext] = (),
    progress: Callable[[str], None] = lambda line: None,
    processes: int = 1,
) -> Iterator[Measurement]:
    """The whole-system figures on the evaluation ``seeds`` at ``rates`` (``window_s``:
    one arrival window for every rate, or each rate's), each seed a cell of its own
    (``run_seed``), ``processes`` of them at once in processes of their own; context
    editing and kvgov's context each as tuned on the tuning seed unless given; ``also``:
    kvgov's other contexts, each reported as a system of its own."""
    check_seeds(seeds)
    began = time.perf_counter()
    cell = functools.partial(
        run_seed,
        rates=rates,
        window_s=window_s,
        policies=policies,
        editing=editing,
        kvgov_context=kvgov_context,
        also=tuple(also),
    )
    if processes == 1 or len(seeds) == 1:
        runs = [cell(seed, progress=progress) for seed in seeds]
    else:
        progress(f"whole system: {len(seeds)} seeds, {min(processes, len(seeds))} at a time ...")
        runs = in_processes(
            [functools.partial(cell, seed) for seed in seeds],
            processes=processes,
            done=lambda index, _: progress(f"whole system: seed {seeds[index]} done"),
        )
    progress(
        f"whole system: {sum(len(r.results) for r in runs)} runs in "
        f"{time.perf_counter() - began:.0f} s"
    )
    yield from figures(runs, rates, policies=policies)
