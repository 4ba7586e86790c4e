"""Goodput against the KV budget (``openloop.budgets``): the card given a share of its
KV and nothing else changed, the whole card's runs taken from the panel, and every figure
read from the runs of its own share."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.budgets import BudgetFigures, run_budgets, with_kv_share
from kvgov.benchmarks.openloop.panel import Cell, PanelRuns, run_panel
from kvgov.benchmarks.openloop.plots import plot_budgets
from kvgov.benchmarks.swarm.result import RunResult
from tests.kvgov.test_openloop_panel import small_card

RATE = 6.0
WINDOW_S = 40.0


def test_a_share_of_the_card_is_that_share_of_its_kv_and_nothing_else() -> None:
    card = small_card()
    half = with_kv_share(card, 0.5)
    assert half.scenario.kv_blocks == pytest.approx(card.scenario.kv_blocks / 2, abs=1)
    assert half.scenario.host_bytes == card.scenario.host_bytes  # the host is not shared
    assert half.scenario.profile == card.scenario.profile
    assert half.scenario.target == card.scenario.target
    assert half.name != card.name
    assert with_kv_share(card, 1.0) is card
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"in \(0, 1\]"):
            with_kv_share(card, bad)


def test_each_share_runs_constrained_and_the_whole_card_is_the_panels_own_runs() -> None:
    card = small_card()
    workloads = [dataclasses.replace(openloop.CPU, rate_per_min=RATE, duration_s=WINDOW_S, seed=1)]
    whole = run_panel(card, workloads, ("paged",))
    # 0.8 of the small card's 400 blocks still holds the CPU workload's 5k ceiling.
    runs = run_budgets(card, whole, workloads, ("paged",), shares=(0.8, 1.0))
    cell = Cell("paged", RATE, 1, False)
    assert runs[1.0].results[cell] is whole.results[cell]
    assert set(runs[0.8].results) == {cell}  # no unconstrained run: goodput needs none
    less, full = runs[0.8].results[cell], runs[1.0].results[cell]
    assert less.num_blocks == pytest.approx(0.8 * full.num_blocks, abs=1)
    assert not less.failed and less.prompts == full.prompts  # the same requests
    # Less memory binds harder: the paged engine throws away and computes more.
    assert less.counters.recomputed_tokens > full.counters.recomputed_tokens
    assert runs[0.8].unloaded_s == whole.unloaded_s  # a job's SLO is not the budget's


def made_up() -> dict[float, PanelRuns]:
    """Runs made of job times alone, kvgov's jobs a second each, paged's 1 s at the
    whole card and 30 s (past the 20 s SLO) on half of it, for one job a seed."""
    card = small_card()
    out = {}
    for share in (0.5, 1.0):
        runs = PanelRuns(with_kv_share(card, share))
        for seed in (1, 2, 3):
            runs.unloaded_s[(RATE, seed)] = {"a": 10.0, "b": 10.0}
            for policy in ("paged", "kvgov"):
                result = RunResult(policy, share, runs.panel.scenario.kv_blocks, 1)
                slow = 30.0 if policy == "paged" and share < 1 else 1.0
                result.jct_s = {"a": 1.0, "b": slow}
                runs.results[Cell(policy, RATE, seed, False)] = result
        out[share] = runs
    return out


def test_every_figure_is_read_from_its_own_shares_runs(tmp_path: Path) -> None:
    figures = BudgetFigures(made_up(), RATE, (1, 2, 3), ("paged", "kvgov"), 60.0, "twin")
    by_name = {m.metric: m for m in figures.measurements()}
    assert by_name["goodput[kvgov]@6/min_kv0.5_twin"].value == pytest.approx(2.0)
    assert by_name["goodput[paged]@6/min_kv0.5_twin"].value == pytest.approx(1.0)
    assert by_name["goodput[paged]@6/min_kv1_twin"].value == pytest.approx(2.0)
    assert by_name["goodput_kvgov_over_best@6/min_kv0.5_twin"].value == pytest.approx(2.0)
    assert by_name["goodput_kvgov_over_best@6/min_kv1_twin"].value == pytest.approx(1.0)
    assert "kvgov over paged" in by_name["goodput_kvgov_over_best@6/min_kv0.5_twin"].note
    assert "of the card's" in by_name["goodput[kvgov]@6/min_kv0.5_twin"].note
    assert by_name["jobs_failed_budgets_twin"].value == 0
    written = plot_budgets(figures, tmp_path, note="modelled: a test's made-up job times")
    assert sorted(p.name for p in written) == [
        "openloop-goodput-budget-twin.png",
        "openloop-goodput-budget-twin.svg",
    ]
    svg = (tmp_path / "openloop-goodput-budget-twin.svg").read_text()
    assert "paged" in svg and "kvgov" in svg and "made-up job times" in svg
