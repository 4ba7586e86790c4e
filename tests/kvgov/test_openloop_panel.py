"""The open-loop panel on the twin (issue 34): every policy sends the same requests on a
seed, each is divided by its own unconstrained run, and that run has room for every
context. A small card (its KV cut to about 400 blocks by the overhead) keeps it short."""

from __future__ import annotations

import dataclasses

import pytest

from engine.twin import get_profile
from engine.twin.targets import target_model
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.openloop.panel import Panel, PanelRuns, reference_card, run_panel
from kvgov.simulate import Scenario

POLICIES = ("paged", "paged+offload", "kvgov")
SEEDS = (1, 2)
RATE = 6.0
WINDOW_S = 40.0


def small_card() -> Panel:
    profile, target = get_profile("rx9070xt"), target_model("qwen3-8b", quantize="int4")
    full = Scenario(profile=profile, target=target)
    block_bytes = full.block_bytes
    overhead = full.overhead_bytes + full.kv_bytes - 400 * block_bytes
    scenario = Scenario(
        profile=profile, target=target, overhead_bytes=overhead, host_bytes=3 * 400 * block_bytes
    )
    return Panel(name="twin-small", scenario=scenario)


@pytest.fixture(scope="module")
def runs() -> PanelRuns:
    workloads = [
        dataclasses.replace(openloop.CPU, rate_per_min=RATE, duration_s=WINDOW_S, seed=seed)
        for seed in SEEDS
    ]
    # Each workload (a seed here) in a spawned process, as the benchmark runs them
    # (test_seeds_run_in_processes_give_the_runs_of_one_process holds them equal).
    return run_panel(small_card(), workloads, POLICIES, processes=2)


def test_every_policy_sends_the_same_requests_on_a_seed(runs: PanelRuns) -> None:
    for seed in SEEDS:
        sent = {
            (policy, unconstrained): runs.result(
                policy, RATE, seed, unconstrained=unconstrained
            ).prompts
            for policy in POLICIES
            for unconstrained in (False, True)
        }
        first = next(iter(sent.values()))
        assert first and all(prompts == first for prompts in sent.values()), seed
        assert all(not r.failed for r in runs.results.values())
    # Another seed is another workload.
    assert runs.result("paged", RATE, 1).prompts != runs.result("paged", RATE, 2).prompts


def test_the_unconstrained_run_has_room_for_every_context(runs: PanelRuns) -> None:
    for policy in POLICIES:
        for seed in SEEDS:
            roomy = runs.result(policy, RATE, seed, unconstrained=True)
            tight = runs.result(policy, RATE, seed)
            # Room for every agent's peak context at once: nothing is preempted. (What
            # is still computed again is stale history a compaction left in the cache;
            # paged+offload writes every context through to host memory, as vLLM's
            # offloading connector does, room or not.)
            assert roomy.counters.preemptions == 0
            assert roomy.counters.recomputed_tokens <= tight.counters.recomputed_tokens
            if policy == "paged":  # no host tier: what it evicts it computes again
                assert roomy.counters.recomputed_tokens < tight.counters.recomputed_tokens
            assert roomy.num_blocks > tight.num_blocks == 400
    # Memory binds on the small card: the paged engine computes tokens again.
    assert all(runs.result("paged", RATE, s).counters.recomputed_tokens > 0 for s in SEEDS)


def test_each_policy_is_divided_by_its_own_unconstrained_run(runs: PanelRuns) -> None:
    figures = PanelFigures(runs, [RATE], list(SEEDS), POLICIES, WINDOW_S, "twin")
    by_name = {m.metric: m for m in figures.measurements()}
    for policy in POLICIES:
        own = sorted(
            runs.result(policy, RATE, s).jct_mean_s
            / runs.result(policy, RATE, s, unconstrained=True).jct_mean_s
            for s in SEEDS
        )
        figure = by_name[f"jct_mean_over_unconstrained[{policy}]@{RATE:g}/min_twin"]
        assert figure.value == pytest.approx(sum(own) / 2)  # the median of two
    assert by_name["jobs_failed_twin"].value == 0
    best = by_name[f"goodput_kvgov_over_best@{RATE:g}/min_twin"]
    assert "modelled" in best.note and "2 evaluation seeds" in best.note


def test_goodput_judges_each_job_by_twice_its_own_unloaded_time(runs: PanelRuns) -> None:
    # On the small card no job is slowed to twice its unloaded time, so every job would
    # count under any SLO. Halving each planner's unloaded time sets its SLO at its real
    # unloaded time: a planner the load slowed at all misses it while its workers meet
    # theirs, though it finished well within twice a worker's time (a threshold shared
    # by every job would count it).
    tight = {
        key: {job: t / 2 if job.endswith("-planner") else t for job, t in unloaded.items()}
        for key, unloaded in runs.unloaded_s.items()
    }
    figures = PanelFigures(
        dataclasses.replace(runs, unloaded_s=tight), [RATE], list(SEEDS), POLICIES, WINDOW_S, "twin"
    )
    by_name = {m.metric: m for m in figures.measurements()}
    for policy in POLICIES:
        own, shared = [], []
        for seed in SEEDS:
            slo = {job: 2 * t for job, t in tight[(RATE, seed)].items()}
            jct = runs.result(policy, RATE, seed).jct_s
            own.append(60 * sum(t <= slo[job] for job, t in jct.items()) / WINDOW_S)
            shared.append(60 * sum(t <= max(slo.values()) for t in jct.values()) / WINDOW_S)
        assert all(0 < a < b for a, b in zip(own, shared, strict=True)), (policy, own, shared)
        figure = by_name[f"goodput[{policy}]@{RATE:g}/min_twin"]
        assert figure.value == pytest.approx(sum(own) / 2)  # the median of two
        assert "within 2x their own unloaded time" in figure.note


def test_seeds_run_in_processes_give_the_runs_of_one_process(runs: PanelRuns) -> None:
    # The fixture ran each seed in a spawned process: every figure is in virtual time,
    # so a seed's runs must equal those of this process, whichever seed finished first.
    workload = dataclasses.replace(
        openloop.CPU, rate_per_min=RATE, duration_s=WINDOW_S, seed=SEEDS[-1]
    )
    here = run_panel(small_card(), [workload], ("kvgov",))
    assert set(here.results) == {
        c for c in runs.results if c.policy == "kvgov" and c.seed == SEEDS[-1]
    }
    for cell, result in here.results.items():
        apart = runs.results[cell]
        assert result.jct_s == apart.jct_s, cell
        assert result.prompts == apart.prompts and result.counters == apart.counters, cell
        assert result.breakdown == apart.breakdown, cell
    assert here.unloaded_s[(RATE, SEEDS[-1])] == runs.unloaded_s[(RATE, SEEDS[-1])]
    assert len(runs.unloaded_s) == len(SEEDS)
    with pytest.raises(ValueError, match="processes must be at least 1"):
        run_panel(small_card(), [workload], ("kvgov",), processes=0)


def test_the_reference_card_holds_host_memory_at_three_times_its_kv() -> None:
    scenario = reference_card().scenario
    assert scenario.host_bytes == pytest.approx(3 * scenario.kv_bytes, rel=1e-9)
    assert 9e9 < scenario.kv_bytes < 10e9  # 16 GB less Qwen3-8B in int4 and overhead


def test_the_tuning_seed_is_never_an_evaluation_seed() -> None:
    from kvgov.benchmarks.openloop import bench
    from kvgov.cli import BENCHMARKS

    assert bench.TUNING_SEED not in bench.EVALUATION_SEEDS
    assert bench.TUNING_SEED not in bench._QUICK_SEEDS
    with pytest.raises(ValueError, match="seed 0 is the tuning seed"):
        next(bench.measure([0, 1], [1.0], ("paged",), window_s=10.0))
    assert BENCHMARKS["openloop"] == "kvgov.benchmarks.openloop.bench"


def test_one_process_runs_the_jobs_here_in_order() -> None:
    import functools
    import os

    from kvgov.benchmarks.openloop.processes import in_processes

    heard: list[tuple[int, int]] = []
    pids = in_processes(
        [functools.partial(os.getpid)] * 2, processes=1, done=lambda i, r: heard.append((i, r))
    )
    assert pids == [os.getpid()] * 2  # no pool: the caller's own process
    assert heard == [(0, os.getpid()), (1, os.getpid())]
