"""The real engine's runs of a panel's workloads: every policy on the bundled engine with
the ``tiny-random`` model computing every token, on the wall clock, each tool sleeping
its drawn latency, collected as the twin's panel collects its runs (``PanelRuns``), so
``PanelFigures`` computes the same figures from either.

The engine is the panel's device: its KV blocks and host blocks, recompute on
preemption and prefix caching, as ``stand_in_engine`` builds the twin's, with the
forward pass run. For each workload (one per rate and seed) each policy runs on that
engine and on an unconstrained one (room for every agent's peak context at once, and as
much host memory), back to back, so each is divided by its own unconstrained run taken
minutes apart at most. The policies run in another order on each workload, a rotation
(``kvgov bench swarm``'s), and the two runs of a pair swap places from one workload to
the next, so no policy always runs first on a fresh engine or last on a warm host.

The baselines run through ``SwarmRunner`` on the ``WallClock``, kvgov through the governor
(``run_kvgov``), with the knobs the twin's panel gives them; the research policies price
their choices with costs measured on the same engine (``measure_costs``). Torch
computes on one thread throughout (``kvgov.twin.one_device_thread``, the engine keeping
it: ``adapt_cpu_threads=False``), as ``kvgov twin fit`` measured the profile the twin of
this machine runs on; the agents' runtime takes the other core.

Each run's ``RunResult`` holds no breakdown of where job time went: that is the twin's
ledger, which a real run does not keep.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvgov.benchmarks.openloop.panel import Cell, Panel, PanelRuns, check_knobs
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup
from kvgov.benchmarks.swarm.result import RunResult

if TYPE_CHECKING:
    from engine import Engine
    from kvgov.benchmarks.baselines import Costs

__all__ = ["DEADLINE_S", "real_engine", "run_real", "run_real_policy"]

DEADLINE_S = 1800.0  # wall seconds: a run past it is far slower than the workload assumes


def real_engine(
    panel: Panel, *, num_blocks: int | None = None, host_blocks: int | None = None
) -> Engine:
    """The real engine of ``panel``'s device (``num_blocks`` and ``host_blocks`` for the
    unconstrained run's), with torch's thread count left as the caller set it."""
    from kvgov.simulate import scenario_engine

    return scenario_engine(
        panel.scenario,
        panel.scenario.target.shape.name,
        num_blocks=num_blocks,
        host_blocks=host_blocks,
        adapt_cpu_threads=False,
    )


def run_real(
    panel: Panel,
    setups: Sequence[WorkloadSetup],
    policies: Sequence[str],
    *,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    deadline_s: float = DEADLINE_S,
    progress: Callable[[str], None] = lambda line: None,
) -> PanelRuns:
    """Every policy on every workload of ``setups`` on the real engine, constrained and
    not (see the module docstring); ``knobs``: policy -> its settings. The runs' unloaded
    times are left to the caller (``PanelRuns.unloaded_s``)."""
    from kvgov.benchmarks.baselines import measure_costs
    from kvgov.benchmarks.swarm.bench import on_own_thread
    from kvgov.twin import one_device_thread

    knobs = knobs or {}
    for policy in policies:
        check_knobs(policy, knobs.get(policy, {}))
    began = time.perf_counter()
    runs = PanelRuns(panel)
    with one_device_thread():
        constrained = real_engine(panel)
        costs = on_own_thread(functools.partial(measure_costs, constrained))  # and warms it up
        for index, setup in enumerate(setups):
            workload = setup.workload
            room = max(setup.peak_blocks, panel.scenario.kv_blocks)
            roomy = real_engine(panel, num_blocks=room, host_blocks=room)
            roomy_costs = on_own_thread(functools.partial(measure_costs, roomy))
            shift = index % len(policies)
            pair = (False, True) if index % 2 == 0 else (True, False)
            for policy in (*policies[shift:], *policies[:shift]):
                for unconstrained in pair:
                    engine = roomy if unconstrained else constrained
                    progress(
                        f"{panel.name}, real: {policy} at {workload.rate_per_min:g} teams/min, "
                        f"seed {workload.seed}{' (unconstrained)' if unconstrained else ''} ..."
                    )
                    result = run_real_policy(
                        engine,
                        policy,
                        setup,
                        roomy_costs if unconstrained else costs,
                        fraction=engine.capacity().num_blocks / max(1, setup.peak_blocks),
                        knobs=knobs.get(policy, {}),
                        deadline_s=deadline_s,
                    )
                    progress(
                        f"  {policy}: mean job {result.jct_mean_s:.2f} s, "
                        f"{len(result.failed)} failed"
                    )
                    cell = Cell(policy, workload.rate_per_min, workload.seed, unconstrained)
                    runs.results[cell] = result
            del roomy
    runs.wall_s = time.perf_counter() - began
    return runs


def run_real_policy(
    engine: Engine,
    policy: str,
    setup: WorkloadSetup,
    costs: Costs,
    *,
    fraction: float,
    knobs: Mapping[str, Any],
    deadline_s: float,
) -> RunResult:
    """``policy`` with ``knobs`` on ``engine`` in real time, from a cold prefix cache, as
    ``kvgov bench swarm`` runs it (``swarm.run_policy``)."""
    from kvgov.benchmarks.swarm.bench import run_policy

    return run_policy(
        engine,
        policy,
        fraction,
        setup.scripts,
        setup.prompts,
        setup.swarm_workload,
        costs,
        deadline_s,
        knobs=knobs,
    )
