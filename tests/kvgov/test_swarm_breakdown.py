"""Where each job's time went (``swarm.breakdown``), on every policy's open-loop run on
the twin: the parts add up to the job's time, none is negative, a worker's tools are its
drawn durations, a planner's wait is its workers', and recompute time appears exactly
where the engine recomputed."""

from __future__ import annotations

import dataclasses
import math

import pytest

from kvgov.benchmarks.baselines import BASELINES
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup
from kvgov.benchmarks.swarm.breakdown import PARTS, JobTime
from kvgov.benchmarks.swarm.twin import TwinDevice, measure_twin_costs, run_twin_policy
from kvgov.simulate import stand_in_engine
from tests.kvgov.test_openloop_panel import small_card


@pytest.mark.parametrize("policy", [*BASELINES, "kvgov"])
def test_each_jobs_parts_add_up_to_its_time(policy: str) -> None:
    scenario = small_card().scenario
    workload = dataclasses.replace(openloop.CPU, rate_per_min=12.0, duration_s=60.0, seed=1)
    setup = WorkloadSetup.of(workload, block_size=scenario.block_size)
    device = TwinDevice(scenario.profile, scenario.target.shape, forward=False)
    engine = stand_in_engine(scenario)
    costs = None if policy in ("paged", "kvgov") else measure_twin_costs(engine, device)
    result = run_twin_policy(
        engine,
        device,
        policy,
        engine.capacity().num_blocks / setup.peak_blocks,
        setup.scripts,
        setup.prompts,
        setup.swarm_workload,
        costs,
        deadline_s=24 * 3600.0,
    ).result
    assert not result.failed
    assert result.breakdown.keys() == result.jct_s.keys()
    scripts = {s.name: s for s in setup.scripts}
    for name, job in result.breakdown.items():
        assert job.total_s == pytest.approx(result.jct_s[name], abs=1e-6), name
        for part in PARTS:
            assert job.part(part) >= -1e-9, (name, part)
        script = scripts[name]
        if script.planner:
            assert job.tool_s == 0.0 and job.workers_s > 0, name
        else:
            drawn = math.fsum(t.tool_s for t in script.turns if t.tool is not None)
            assert job.tool_s == pytest.approx(drawn, abs=1e-9), name
            assert job.workers_s == 0.0
    jobs = list(result.breakdown.values())
    recomputed = sum(j.recompute_s for j in jobs)
    assert (recomputed > 0) == (result.counters.recomputed_tokens > 0)
    assert sum(j.decode_s for j in jobs) > 0 and sum(j.prefill_s for j in jobs) > 0
    if policy == "paged":  # no admission of its own: it waits in the engine's queue
        assert sum(j.queue_s for j in jobs) > sum(j.admission_s for j in jobs)


def test_a_job_time_has_every_part_and_their_sum() -> None:
    job = JobTime(tool_s=1.0, workers_s=2.0, admission_s=0.5, queue_s=0.25, decode_s=4.0)
    assert PARTS == (
        "tool",
        "workers",
        "admission",
        "queue",
        "prefill",
        "recompute",
        "swap",
        "decode",
    )
    assert job.total_s == 7.75
    assert job.part("workers") == 2.0


def test_the_panels_parts_are_means_over_jobs_and_seeds_adding_up_to_the_mean_job_time() -> None:
    from kvgov.benchmarks.openloop.figures import PanelFigures
    from kvgov.benchmarks.openloop.panel import Cell, PanelRuns
    from kvgov.benchmarks.swarm.result import RunResult

    runs = PanelRuns(small_card())
    jobs_by_seed = {
        1: {"a": JobTime(tool_s=2.0, queue_s=1.0), "b": JobTime(tool_s=4.0, decode_s=3.0)},
        2: {"a": JobTime(tool_s=6.0, recompute_s=2.0)},
    }
    for seed, jobs in jobs_by_seed.items():
        for unconstrained in (False, True):
            result = RunResult("paged", 1.0, 400, 1)
            result.breakdown = jobs
            result.jct_s = {name: job.total_s for name, job in jobs.items()}
            runs.results[Cell("paged", 1.0, seed, unconstrained)] = result
        runs.unloaded_s[(1.0, seed)] = {name: 1.0 for name in jobs}
    figures = PanelFigures(runs, [1.0], [1, 2], ["paged"], 60.0, "twin")
    parts = figures.breakdown("paged", 1.0)
    assert parts["tool"] == pytest.approx(((2 + 4) / 2 + 6) / 2)
    assert parts["queue"] == pytest.approx(0.5 / 2)
    assert parts["decode"] == pytest.approx(1.5 / 2)
    assert parts["recompute"] == pytest.approx(2 / 2)
    mean_jct = (
        runs.result("paged", 1.0, 1).jct_mean_s + runs.result("paged", 1.0, 2).jct_mean_s
    ) / 2
    assert sum(parts.values()) == pytest.approx(mean_jct)
    by_name = {m.metric: m for m in figures.measurements()}
    assert by_name["jct_mean_tool[paged]@1/min_twin"].value == parts["tool"]
    assert f"add up to {mean_jct:.1f} s" in by_name["jct_mean_swap[paged]@1/min_twin"].note
