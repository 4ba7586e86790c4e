"""Every policy's knobs tuned on the tuning seed by one rule (issue 34): the rule picks the
least geometric mean of mean job times, ties to the paper's default, failed jobs out; the
tuning never runs on an evaluation seed; the benchmark gives each policy its own tuned
knobs; every tuned knob is a real one. The runs are the real twin on a small card with
the CPU workload (as ``test_openloop_panel``), kept to one rate and a short window."""

from __future__ import annotations

import dataclasses

import pytest

from governor import GovernorConfig
from governor.errors import ConfigError
from kvgov.benchmarks.baselines import Costs, UnknownKnobError, make_baseline
from kvgov.benchmarks.openloop import bench, tuning
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.panel import PanelRuns, check_knobs, run_panel
from kvgov.benchmarks.openloop.tuned import TUNED
from kvgov.benchmarks.openloop.tuning import (
    GRIDS,
    Grid,
    GridError,
    PointRun,
    Tuning,
    TuningSeedError,
    choose,
    tune,
)
from kvgov.cli import BENCHMARKS
from tests.kvgov.test_openloop_panel import small_card

RATE = 6.0
WINDOW_S = 20.0  # two or three teams: enough to share the small card
# kvgov with one lease active at a time (a planner parked while its workers run, or a
# worker parked on a tool, does not count) against no cap: its jobs wait clearly longer
# with it (4-10% here), on the small card and with room for every context alike.
WORSE, BETTER = {"max_concurrent": 1}, {"max_concurrent": None}


def tiny(seed: int) -> openloop.OpenLoopWorkload:
    return dataclasses.replace(openloop.CPU, rate_per_min=RATE, duration_s=WINDOW_S, seed=seed)


# -- the rule -------------------------------------------------------------------------
GRID = Grid(default={"k": 1}, values={"k": (1, 2, 3)}, why="a test's")


def point(k: int, *jct_s: float, num_failed: int = 0) -> PointRun:
    return PointRun("p", {"k": k}, dict(zip((1.0, 3.0), jct_s, strict=True)), num_failed)


def test_the_rule_is_the_least_geometric_mean_over_rates() -> None:
    # Point 2's arithmetic mean is the least (400 s against 550 s), its geometric mean
    # is not (346 s against 316 s): the slow rate must not outweigh the fast one.
    runs = [point(1, 400.0, 900.0), point(2, 200.0, 600.0), point(3, 100.0, 1000.0)]
    assert [r.objective_s for r in runs] == pytest.approx([600.0, 346.41, 316.23], rel=1e-4)
    assert choose(GRID, runs) == {"k": 3}


def test_ties_within_one_percent_go_to_the_default() -> None:
    within = [point(1, 100.9, 100.9), point(2, 100.0, 100.0)]
    assert choose(GRID, within) == {"k": 1}
    beyond = [point(1, 101.1, 101.1), point(2, 100.0, 100.0)]
    assert choose(GRID, beyond) == {"k": 2}


def test_a_failed_job_disqualifies_a_point() -> None:
    runs = [point(1, 500.0, 500.0), point(2, 100.0, 100.0, num_failed=1), point(3, 300.0, 300.0)]
    assert runs[1].objective_s is None
    assert choose(GRID, runs) == {"k": 3}
    # No point qualified: the paper's default stands.
    assert choose(GRID, [dataclasses.replace(r, num_failed=1) for r in runs]) == {"k": 1}


# -- the tuning run -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tuned() -> Tuning:
    grids = {
        "kvgov": Grid(default=WORSE, values={"max_concurrent": (1, None)}, why="a test's"),
        "paged": GRIDS["paged"],
    }
    return tune(small_card(), [tiny(bench.TUNING_SEED)], grids)


def test_the_tuning_picks_the_better_point_by_the_rule(tuned: Tuning) -> None:
    runs = {tuple(p.knobs.items()): p for p in tuned.points if p.policy == "kvgov"}
    worse, better = runs[tuple(WORSE.items())], runs[tuple(BETTER.items())]
    assert worse.num_failed == better.num_failed == 0
    # One rate: the objective is that rate's mean job time, clearly apart.
    assert worse.objective_s == pytest.approx(worse.jct_mean_s[RATE])
    assert worse.objective_s > better.objective_s * (1 + tuning.TIE_SHARE)
    assert tuned.chosen == {"kvgov": BETTER, "paged": {}}
    assert [p.policy for p in tuned.points] == ["kvgov", "kvgov"]  # one point: not run


def test_the_tuning_writes_a_tuned_module_that_holds_its_choice(tuned: Tuning) -> None:
    text = tuned.literal(command="kvgov bench openloop-tune", commit="abc1234", date="today")
    space: dict[str, object] = {}
    exec(compile(text, "tuned.py", "exec"), space)
    assert space["TUNED"] == tuned.chosen
    assert "kvgov bench openloop-tune" in text and "abc1234" in text
    for p in tuned.points:  # every point's objective is in the header's table
        assert f"{p.objective_s:,.0f}" in text


def test_the_tuning_runs_on_the_tuning_seed_only() -> None:
    for seed in (*bench.EVALUATION_SEEDS, 7):
        with pytest.raises(TuningSeedError, match=f"seed {bench.TUNING_SEED} only"):
            tune(small_card(), [tiny(bench.TUNING_SEED), tiny(seed)], {"paged": GRIDS["paged"]})


def test_every_figure_the_tuning_reports_says_it_is_the_tuning_seed(tuned: Tuning) -> None:
    figures = list(tuned.measurements())
    assert {m.bench for m in figures} == {"openloop-tune"}
    measured = [m for m in figures if m.value == m.value]  # NaN: a grid of one, not run
    assert len(measured) == 2
    assert all(f"tuning seed {bench.TUNING_SEED} only" in m.note for m in measured)
    assert BENCHMARKS["openloop-tune"] == "kvgov.benchmarks.openloop.tuning"


# -- the benchmark runs each policy with its own knobs ---------------------------------
def test_run_panel_gives_a_policy_its_knobs_and_no_other_policy_them() -> None:
    workloads = [tiny(1)]
    plain = run_panel(small_card(), workloads, ("paged", "kvgov"))
    knobbed = run_panel(small_card(), workloads, ("paged", "kvgov"), knobs={"kvgov": WORSE})

    def seen(runs: PanelRuns, policy: str, unconstrained: bool) -> tuple[object, ...]:
        r = runs.result(policy, RATE, 1, unconstrained=unconstrained)
        return r.jct_s, r.prompts, r.counters

    for unconstrained in (False, True):
        assert seen(knobbed, "paged", unconstrained) == seen(plain, "paged", unconstrained)
    # kvgov's leases wait for the one place, on the card's KV and with room for all.
    tight_plain = plain.result("kvgov", RATE, 1).jct_mean_s
    tight_knobbed = knobbed.result("kvgov", RATE, 1).jct_mean_s
    assert tight_knobbed > tight_plain * (1 + tuning.TIE_SHARE)
    roomy_plain = plain.result("kvgov", RATE, 1, unconstrained=True).jct_mean_s
    roomy_knobbed = knobbed.result("kvgov", RATE, 1, unconstrained=True).jct_mean_s
    assert roomy_knobbed > roomy_plain * (1 + tuning.TIE_SHARE)


class _Stop(Exception):
    """Stops the benchmark once it has called run_panel: the spy has seen the knobs."""


def test_the_benchmark_runs_every_policy_with_its_tuned_knobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A spy in place of run_panel: the full panel takes minutes; what is checked is what
    # the benchmark hands it (run_panel applying knobs is checked above, for real).
    handed: dict[str, object] = {}

    def spy(panel: object, workloads: object, policies: object, **kwargs: object) -> PanelRuns:
        handed.update(kwargs)
        raise _Stop

    monkeypatch.setattr(bench, "run_panel", spy)
    with pytest.raises(_Stop):
        next(bench.measure([1], [1.0], bench.POLICIES, window_s=10.0))
    assert handed["knobs"] == TUNED
    assert set(TUNED) == set(bench.POLICIES)
    # And every figure's note says so.
    what = bench._what([dataclasses.replace(openloop.TWIN, seed=1)], [1.0, 2.0])
    assert f"each policy with its knobs tuned on seed {bench.TUNING_SEED}" in what


# -- every knob is a real one -----------------------------------------------------------
def test_every_tuned_knob_is_one_of_its_grid_and_builds_its_policy() -> None:
    for policy, knobs in TUNED.items():
        check_knobs(policy, knobs)  # builds the policy with them
        assert knobs in GRIDS[policy].points(), policy
    costs = Costs(prefill_s_per_token=1e-4, swap_s_per_block=1e-4)
    ttl = make_baseline("ttl-pin", costs, **TUNED["ttl-pin"])
    assert all(getattr(ttl, k) == v for k, v in TUNED["ttl-pin"].items())


def test_an_unknown_knob_names_the_policy_and_its_knobs() -> None:
    costs = Costs(prefill_s_per_token=1e-4, swap_s_per_block=1e-4)
    with pytest.raises(UnknownKnobError, match=r"ttl-pin has no knob 'prior_mean'.*prior_mean_s"):
        make_baseline("ttl-pin", costs, prior_mean=2.0)
    with pytest.raises(UnknownKnobError, match=r"paged\+offload has no knob .*nothing to tune"):
        check_knobs("paged+offload", {"num_evicted": 3})  # a counter, not a knob
    with pytest.raises(UnknownKnobError, match=r"kvgov has no knob 'retain'.*retain_s") as caught:
        check_knobs("kvgov", {"retain": 2.0})
    assert caught.value.knobs == tuple(f.name for f in dataclasses.fields(GovernorConfig))
    # A real knob with a bad value: the policy's own error, before any run too.
    with pytest.raises(ConfigError, match="retain_s must be a number of seconds >= 0"):
        check_knobs("kvgov", {"retain_s": -1.0})
    with pytest.raises(ValueError, match="num_prior_samples must be an int >= 1"):
        check_knobs("ttl-pin", {"num_prior_samples": 0})
    # Refused before the panel's first run.
    began: list[str] = []
    with pytest.raises(UnknownKnobError, match="kvgov has no knob 'retain'"):
        run_panel(
            small_card(),
            [tiny(1)],
            ("kvgov",),
            knobs={"kvgov": {"retain": 2.0}},
            progress=began.append,
        )
    assert began == []


def test_every_grid_holds_its_default_and_kvgov_has_no_more_points_than_a_baseline() -> None:
    assert set(GRIDS) == set(bench.POLICIES)
    for policy, grid in GRIDS.items():
        grid.check(policy)
        points = grid.points()
        assert points[0] == dict(grid.default) and 1 <= len(points) <= 9, policy
        for knobs in points:
            check_knobs(policy, knobs)
    most = max(len(GRIDS[p].points()) for p in bench.POLICIES if p != "kvgov")
    assert len(GRIDS["kvgov"].points()) <= most
    with pytest.raises(GridError, match="its default 4 must be one of"):
        Grid(default={"k": 4}, values={"k": (1, 2)}, why="").check("p")


def test_a_context_grid_point_reports_its_objective_and_whether_it_was_chosen() -> None:
    point = tuning._context_point(
        "kvgov_context 8000 2048", {"0.1": 100.0, "1": 400.0}, True, "tuning seed 0 only"
    )
    assert point.bench == "openloop-tune"
    assert point.metric == "tuning_objective[kvgov_context 8000 2048]"
    assert point.value == pytest.approx(200.0)  # the geometric mean, as the policies' grids
    assert point.note == "mean job 0.1 100 s, 1 400 s; chosen; tuning seed 0 only"
    other = tuning._context_point("context_editing 16000 3", {"a": 9.0}, False, "x")
    assert "chosen" not in other.note and other.value == pytest.approx(9.0)
