"""The open-loop panel's figures read from runs made of job times alone: the paged
engine's saturation load, paged over kvgov at 0.8 of it, and goodput over each rate's
own arrival window."""

from __future__ import annotations

import pytest

from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.openloop.panel import Cell, PanelRuns
from kvgov.benchmarks.swarm.result import RunResult
from tests.kvgov.test_openloop_panel import small_card

RATES = (0.1, 0.2, 0.5, 1.0)
SEEDS = (1, 2, 3)


def made_up_runs() -> PanelRuns:
    """paged's jobs take twice kvgov's; at the top rate paged finishes 6, 8 and 10 teams
    in 40 minutes (0.15, 0.2 and 0.25 a minute)."""
    runs = PanelRuns(small_card())
    for policy, factor in (("paged", 2.0), ("kvgov", 1.0)):
        for rate in RATES:
            for seed in SEEDS:
                teams = 4 + 2 * seed
                jct = {f"t{t}-planner": factor * (100 + t) for t in range(teams)}
                jct |= {f"t{t}-w0": factor * (90 + t) for t in range(teams)}
                for unconstrained in (False, True):
                    result = RunResult(policy, 1.0, 400, 1)
                    result.jct_s = dict(jct)
                    result.makespan_s = 2400.0 if rate == max(RATES) else 600.0
                    runs.results[Cell(policy, rate, seed, unconstrained)] = result
                runs.unloaded_s[(rate, seed)] = dict.fromkeys(jct, 1000.0)
    return runs


def test_saturation_and_paged_over_kvgov_at_its_0_8() -> None:
    windows = {rate: 480 / rate for rate in RATES}  # 8 teams expected at every rate
    figures = PanelFigures(made_up_runs(), RATES, SEEDS, ("paged", "kvgov"), windows, "twin")
    assert figures.saturation_per_min() == pytest.approx(0.2)
    by_name = {m.metric: m for m in figures.measurements()}
    assert by_name["saturation_paged_twin"].value == pytest.approx(0.2)
    at = by_name["jct_mean_paged_over_kvgov_twin_at_0.8"]
    assert at.value == pytest.approx(2.0)
    assert "at 0.2 teams/min" in at.note and "(0.16/min)" in at.note
    # Goodput over each rate's own window: every job within its SLO.
    for rate in RATES:
        jobs = 2 * (4 + 2 * 2)  # the median seed's
        expected = 60 * jobs / windows[rate]
        assert by_name[f"goodput[kvgov]@{rate:g}/min_twin"].value == pytest.approx(expected)


def test_what_any_memory_policy_could_gain_over_paged_at_0_8_is_read_from_its_roomy_run() -> None:
    runs = made_up_runs()
    for seed in SEEDS:  # paged with room for every context: 0.8 of its time at 0.2/min
        roomy = runs.result("paged", 0.2, seed, unconstrained=True)
        roomy.jct_s = {job: 0.8 * t for job, t in roomy.jct_s.items()}
    windows = {rate: 480 / rate for rate in RATES}
    figures = PanelFigures(runs, RATES, SEEDS, ("paged", "kvgov"), windows, "twin")
    by_name = {m.metric: m for m in figures.measurements()}
    ceiling = by_name["jct_mean_paged_over_unconstrained_twin_at_0.8"]
    assert ceiling.value == pytest.approx(1.25)
    assert "at 0.2 teams/min" in ceiling.note and "the most any memory policy" in ceiling.note
