"""One panel of the open-loop benchmark: every policy on one modelled device, over
arrival rates and evaluation seeds, each run beside the same policy's unconstrained run.

A panel is a ``kvgov.simulate.Scenario`` (the device profile, the target model, the KV
memory the card holds after the weights, the host memory bounded at ``host_ratio`` times
the device's KV) and the stand-in engine the twin times at the target's size (the
``tiny-random`` engine's decisions without its forward pass, as ``kvgov plan
--simulate`` runs it). Every figure is modelled, in virtual seconds.

For each (rate, seed) the workload is built once, so every policy sends the same
prompts; each policy runs on the panel's engine (its KV budget) and on an unconstrained
one (room for every agent's peak context at once, and as much host memory), so each
policy is divided by its own unconstrained run: what memory policy costs it, apart from
the compute every policy shares. Each policy runs with its knobs (``knobs``: policy ->
its settings, the tuned ones in ``tuned.TUNED``), the same in both runs, and checked
before any run (``check_knobs``). Runs start from a cold prefix cache (checked by
``run_twin_policy``), and the research policies price their choices with costs measured
on the same twin (``measure_twin_costs``). Each job's unloaded time, what its goodput
SLO is a multiple of, comes from its team run alone (``unloaded``), once per seed for
every rate.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvgov.benchmarks.openloop.processes import in_processes
from kvgov.benchmarks.openloop.unloaded import UnloadedTimes
from kvgov.benchmarks.openloop.workload import OpenLoopWorkload
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup
from kvgov.benchmarks.swarm.result import RunResult
from kvgov.simulate import Scenario, stand_in_engine

if TYPE_CHECKING:
    from engine import Engine
    from kvgov.benchmarks.baselines import Costs
    from kvgov.benchmarks.swarm.twin import TwinDevice

__all__ = [
    "Cell",
    "Panel",
    "PanelRuns",
    "check_knobs",
    "policy_knobs",
    "reference_card",
    "run_panel",
]

_DEADLINE_S = 24 * 3600.0  # virtual: a run past it is a livelock, not a slow swarm


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    name: str
    scenario: Scenario  # the device, the target model, device KV and host memory

    @property
    def title(self) -> str:
        s = self.scenario
        return (
            f"{s.target.label} on {s.profile.name}: {_size(s.kv_bytes)} of KV "
            f"({s.kv_blocks:,} blocks), {_size(s.host_bytes)} of host memory for KV"
        )


def _size(num_bytes: int) -> str:
    """GB for a card's memory, MB for the tiny model's (0.0 GB would say nothing)."""
    return f"{num_bytes / 1e9:.1f} GB" if num_bytes >= 1e9 else f"{num_bytes / 1e6:.1f} MB"


def reference_card(*, host_ratio: float = 3.0) -> Panel:
    """The seed's case: an RX 9070 XT (16 GB, PCIe 5.0 x16) with Qwen3-8B in int4, host
    memory for KV at ``host_ratio`` times the device's (the issue asks 2-4x)."""
    from engine.twin import get_profile
    from engine.twin.targets import target_model

    profile, target = get_profile("rx9070xt"), target_model("qwen3-8b", quantize="int4")
    sized = Scenario(profile=profile, target=target)
    host = int(host_ratio * sized.kv_bytes)
    return Panel(
        name="twin-rx9070xt", scenario=Scenario(profile=profile, target=target, host_bytes=host)
    )


@dataclass(frozen=True, slots=True)
class Cell:
    policy: str
    rate_per_min: float
    seed: int
    unconstrained: bool


@dataclass(slots=True)
class PanelRuns:
    panel: Panel
    results: dict[Cell, RunResult] = field(default_factory=dict)
    # (rate, seed) -> each job (agent) of that workload -> its unloaded time, seconds
    unloaded_s: dict[tuple[float, int], dict[str, float]] = field(default_factory=dict)
    wall_s: float = 0.0  # wall seconds, every run (in one process or several)

    def result(
        self, policy: str, rate_per_min: float, seed: int, *, unconstrained: bool = False
    ) -> RunResult:
        return self.results[Cell(policy, rate_per_min, seed, unconstrained)]

    def merge(self, other: PanelRuns) -> None:
        """Takes ``other``'s runs (of other workloads of the same panel) into these."""
        if other.panel != self.panel:
            raise ValueError(f"cannot merge runs of {other.panel.name} into {self.panel.name}")
        self.results.update(other.results)
        self.unloaded_s.update(other.unloaded_s)

    def unloaded(self, rate_per_min: float, seed: int) -> dict[str, float]:
        """Each job of the (rate, seed) workload -> its time run alone (``unloaded``)."""
        return self.unloaded_s[(rate_per_min, seed)]


def policy_knobs(policy: str) -> tuple[str, ...]:
    """What ``policy`` may be tuned by: a baseline's ``KNOBS``, kvgov's ``GovernorConfig``
    fields (each replacing ``KVGOV_CONFIG``'s, as ``run_twin_policy`` applies them)."""
    from governor import GovernorConfig
    from kvgov.benchmarks.baselines import baseline_knobs

    if policy == "kvgov":
        return tuple(f.name for f in dataclasses.fields(GovernorConfig))
    return baseline_knobs(policy)


def check_knobs(policy: str, knobs: Mapping[str, Any]) -> None:
    """Builds ``policy`` with ``knobs`` as a run would, so a wrong name
    (``UnknownKnobError``) or value (the policy's own error) stops the panel before its
    first run, not an hour into it."""
    from kvgov.benchmarks.baselines import Costs, UnknownKnobError, make_baseline
    from kvgov.benchmarks.swarm.kvgov import KVGOV_CONFIG

    known = policy_knobs(policy)
    for knob in knobs:
        if knob not in known:
            raise UnknownKnobError(policy, knob, known)
    if policy == "kvgov":
        dataclasses.replace(KVGOV_CONFIG, **knobs)
    else:
        make_baseline(policy, Costs(prefill_s_per_token=1e-4, swap_s_per_block=1e-4), **knobs)


def run_panel(
    panel: Panel,
    workloads: Iterable[OpenLoopWorkload],
    policies: Iterable[str],
    *,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Callable[[str], None] = lambda line: None,
    processes: int = 1,
    unconstrained: bool = True,
) -> PanelRuns:
    """Every policy on every workload (one per rate and seed), constrained and (with
    ``unconstrained``) not, and every job's unloaded time; ``knobs``: policy -> its
    settings (a policy not named runs with its defaults); ``processes``: how many
    workloads run at once, each in a process of its own (``processes.default_processes``).

    Every run is in virtual time and decided by the engine, the policies and the
    workload alone, so the figures are the same whichever process runs a workload and
    in whichever order (a test holds that): processes change the wall time, nothing
    else. In one process a seed's teams run alone once for all its rates
    (``UnloadedTimes``); a process of a pool runs them for its own workload, a few
    percent of its runs' time, so that the pool can use a core for every workload."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    began = time.perf_counter()
    workloads = list(workloads)
    policies = tuple(policies)
    knobs = {policy: dict(knobs.get(policy, {})) for policy in policies} if knobs else {}
    for policy in policies:
        check_knobs(policy, knobs.get(policy, {}))
    runs = PanelRuns(panel)
    if processes == 1 or len(workloads) == 1:
        runs.merge(_run_seeds(panel, workloads, policies, knobs, unconstrained, progress))
    else:
        _run_in_processes(runs, workloads, policies, knobs, unconstrained, progress, processes)
    runs.wall_s = time.perf_counter() - began
    return runs


def _run_in_processes(
    runs: PanelRuns,
    workloads: Sequence[OpenLoopWorkload],
    policies: tuple[str, ...],
    knobs: Mapping[str, Mapping[str, Any]],
    unconstrained: bool,
    progress: Callable[[str], None],
    processes: int,
) -> None:
    """Each workload's runs in a process of a pool of ``processes`` (``in_processes``),
    merged as they finish, the highest rates (the longest runs) first."""
    ordered = sorted(workloads, key=lambda w: -w.rate_per_min)
    progress(
        f"{runs.panel.name}: {len(ordered)} workloads, {min(processes, len(ordered))} at a time ..."
    )

    def merge(index: int, part: PanelRuns) -> None:
        runs.merge(part)
        w = ordered[index]
        progress(
            f"{runs.panel.name}: {w.rate_per_min:g} teams/min, seed {w.seed} done, "
            f"{len(part.results)} runs in {part.wall_s:.0f} s"
        )

    jobs = [
        functools.partial(_run_seeds, runs.panel, [w], policies, knobs, unconstrained)
        for w in ordered
    ]
    in_processes(jobs, processes=processes, done=merge)


def _run_seeds(
    panel: Panel,
    workloads: Sequence[OpenLoopWorkload],
    policies: tuple[str, ...],
    knobs: Mapping[str, Mapping[str, Any]],
    unconstrained: bool,
    progress: Callable[[str], None] = lambda line: None,
) -> PanelRuns:
    """``run_panel``'s runs of ``workloads`` in this process, on engines of its own."""
    from kvgov.benchmarks.swarm.twin import TwinDevice, measure_twin_costs

    began = time.perf_counter()
    runs = PanelRuns(panel)
    scenario = panel.scenario
    device = TwinDevice(scenario.profile, scenario.target.shape, forward=False)
    constrained = stand_in_engine(scenario)
    costs = measure_twin_costs(constrained, device)
    unloaded = UnloadedTimes(scenario=scenario, device=device, deadline_s=_DEADLINE_S)
    for workload in workloads:
        setup = WorkloadSetup.of(workload, block_size=scenario.block_size)
        progress(
            f"{panel.name}: each team alone at {workload.rate_per_min:g} teams/min, seed "
            f"{workload.seed} ..."
        )
        runs.unloaded_s[(workload.rate_per_min, workload.seed)] = unloaded.of(setup)
        engines = {False: (constrained, costs)}
        if unconstrained:
            room = max(setup.peak_blocks, scenario.kv_blocks)
            roomy = stand_in_engine(scenario, num_blocks=room, host_blocks=room)
            engines[True] = (roomy, measure_twin_costs(roomy, device))
        for policy in policies:
            for roomy_run, (engine, engine_costs) in engines.items():
                progress(
                    f"{panel.name}: {policy} at {workload.rate_per_min:g} teams/min, seed "
                    f"{workload.seed}{' (unconstrained)' if roomy_run else ''} ..."
                )
                result = _run(
                    engine,
                    device,
                    policy,
                    setup,
                    engine_costs,
                    fraction=engine.capacity().num_blocks / max(1, setup.peak_blocks),
                    knobs=knobs.get(policy, {}),
                )
                cell = Cell(policy, workload.rate_per_min, workload.seed, roomy_run)
                runs.results[cell] = result
    runs.wall_s = time.perf_counter() - began
    return runs


def _run(
    engine: Engine,
    device: TwinDevice,
    policy: str,
    setup: WorkloadSetup,
    costs: Costs,
    *,
    fraction: float,
    knobs: Mapping[str, Any] | None = None,
) -> RunResult:
    from kvgov.benchmarks.swarm.twin import run_twin_policy

    return run_twin_policy(
        engine,
        device,
        policy,
        fraction,
        setup.scripts,
        setup.prompts,
        setup.swarm_workload,
        None if policy in ("paged", "kvgov") else costs,
        deadline_s=_DEADLINE_S,
        knobs=knobs,
    ).result
