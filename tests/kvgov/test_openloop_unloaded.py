"""Each job's unloaded time (issue 34's "2x unloaded"): its team run alone on the twin,
under paged, with room for every context. Real engine decisions, real policies and the
real governor on the small card of ``test_openloop_panel``; a few teams over 30 s."""

from __future__ import annotations

import dataclasses

import pytest

from kvgov.benchmarks.openloop import unloaded as unloaded_module
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.openloop.panel import PanelRuns, run_panel
from kvgov.benchmarks.openloop.unloaded import UnloadedRunError, UnloadedTimes
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup
from kvgov.benchmarks.swarm.twin import TwinDevice
from tests.kvgov.test_openloop_panel import small_card

POLICIES = ("paged", "paged+offload", "intercept", "ttl-pin", "kvgov")
# Seed 6 draws 1 team at the lower rate and 3 at the higher. At the higher its first
# team (bfcl, at 11 s) finishes before the next arrives (17 s): alone even under load,
# where kvgov has pinned its system prompt since the run began, so a job's unloaded time
# must not pay that prompt's prefill either.
SEED = 6
LOW, HIGH = 3.0, 6.0  # teams a minute
WINDOW_S = 30.0
# Twin times are sums of modelled step times; a team alone starts at another offset on
# the virtual clock than under load, so equal times may differ in their last bits.
ROUNDING = 1e-9


def _workloads(rates: tuple[float, ...]) -> list[openloop.OpenLoopWorkload]:
    return [
        dataclasses.replace(openloop.CPU, rate_per_min=rate, duration_s=WINDOW_S, seed=SEED)
        for rate in rates
    ]


@pytest.fixture(scope="module")
def high() -> PanelRuns:
    """Every policy at the higher rate alone."""
    return run_panel(small_card(), _workloads((HIGH,)), POLICIES)


@pytest.fixture(scope="module")
def both() -> PanelRuns:
    """paged at both rates: the lower rate added to the sweep."""
    return run_panel(small_card(), _workloads((LOW, HIGH)), ("paged",))


def test_a_jobs_slo_does_not_change_with_the_rates_swept(high: PanelRuns, both: PanelRuns) -> None:
    unloaded = high.unloaded(HIGH, SEED)
    assert both.unloaded(HIGH, SEED) == unloaded
    low = both.unloaded(LOW, SEED)
    assert set(low) < set(unloaded)  # the higher rate draws the lower one's teams, and more
    assert {job: unloaded[job] for job in low} == low
    # Every job of a run has its own unloaded time, and the SLOs differ by job.
    assert set(unloaded) == set(high.result("paged", HIGH, SEED).jct_s)
    assert len(set(unloaded.values())) == len(unloaded)
    # So paged's goodput at the higher rate reads the same with or without the lower rate.
    alone = PanelFigures(high, [HIGH], [SEED], POLICIES, WINDOW_S, "twin")
    swept = PanelFigures(both, [LOW, HIGH], [SEED], ("paged",), WINDOW_S, "twin")
    assert swept.per_seed("paged", HIGH, "goodput") == alone.per_seed("paged", HIGH, "goodput")


def test_a_job_alone_is_no_slower_than_under_any_load_and_policy(
    high: PanelRuns, both: PanelRuns
) -> None:
    slower = 0
    cells = [(high, HIGH, policy) for policy in POLICIES] + [(both, LOW, "paged")]
    for runs, rate, policy in cells:
        unloaded = runs.unloaded(rate, SEED)
        for unconstrained in (False, True):
            result = runs.result(policy, rate, SEED, unconstrained=unconstrained)
            assert not result.failed and set(result.jct_s) == set(unloaded)
            for job, t in result.jct_s.items():
                assert unloaded[job] <= t * (1 + ROUNDING), (policy, rate, unconstrained, job)
                slower += t > 1.01 * unloaded[job]
    assert slower > 0  # load slows some jobs down: the comparison is not vacuous


def _unloaded_times() -> UnloadedTimes:
    scenario = small_card().scenario
    device = TwinDevice(scenario.profile, scenario.target.shape, forward=False)
    return UnloadedTimes(scenario=scenario, device=device, deadline_s=3600.0)


def _setup(workload: openloop.OpenLoopWorkload) -> WorkloadSetup:
    return WorkloadSetup.of(workload, block_size=small_card().scenario.block_size)


def test_a_team_is_run_alone_once_a_seed_and_after_its_warm_up_however_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    low, high = (_setup(w) for w in _workloads((LOW, HIGH)))
    unloaded = _unloaded_times()
    at_low = unloaded.of(low)
    assert unloaded.num_team_runs == 1
    at_high = unloaded.of(high)
    assert unloaded.num_team_runs == 3  # the lower rate's team is not run again
    assert {job: at_high[job] for job in at_low} == at_low
    # A team whose scripts differ from the one run under its name is run anew.
    worker = next(s for s in high.scripts if not s.planner)
    first = dataclasses.replace(worker.turns[0], tool_s=worker.turns[0].tool_s + 5.0)
    slower = dataclasses.replace(worker, turns=(first, *worker.turns[1:]))
    scripts = tuple(slower if s is worker else s for s in high.scripts)
    changed = unloaded.of(dataclasses.replace(high, scripts=scripts))
    assert unloaded.num_team_runs == 4
    assert changed[worker.name] == pytest.approx(at_high[worker.name] + 5.0, rel=ROUNDING)
    # A device too slow for the warm-up's first gap: the team is run again, later.
    monkeypatch.setattr(unloaded_module, "_WARM_UP_S", 1e-6)
    assert _unloaded_times().of(high) == pytest.approx(at_high, rel=ROUNDING)


def test_a_job_that_fails_even_alone_has_no_slo() -> None:
    workload = dataclasses.replace(openloop.CPU, rate_per_min=1.0, duration_s=1.0, seed=SEED)
    setup = _setup(workload)  # one team
    worker = next(s for s in setup.scripts if not s.planner)
    # A prompt past the model's context: the engine refuses it, as it would a real one.
    too_long = [1] * (small_card().scenario.target.context_tokens + 1)
    setup.prompts[(worker.name, 1)] = too_long
    unloaded = _unloaded_times()
    with pytest.raises(UnloadedRunError, match="ceiling_tokens") as raised:
        unloaded.of(setup)
    assert raised.value.jobs and raised.value.jobs[0].startswith(worker.name)
