"""The open-loop panel's pictures (``openloop.plots``): drawn from the figures' own
numbers, every policy and every part of job time in them."""

from __future__ import annotations

from pathlib import Path

from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.openloop.panel import Cell, PanelRuns
from kvgov.benchmarks.openloop.plots import plot
from kvgov.benchmarks.swarm.breakdown import PARTS, JobTime
from kvgov.benchmarks.swarm.result import RunResult
from tests.kvgov.test_openloop_panel import small_card

POLICIES = ("paged", "kvgov")
RATES = (1.0, 2.0)
SEEDS = (1, 2, 3)


def runs() -> PanelRuns:
    """Runs made of job times alone (the pictures read nothing else)."""
    panel = PanelRuns(small_card())
    for p, policy in enumerate(POLICIES):
        for rate in RATES:
            for seed in SEEDS:
                for unconstrained in (False, True):
                    jobs = {
                        f"job{j}": JobTime(tool_s=10.0 + j, queue_s=rate * (p + 1) * seed + j)
                        for j in range(4)
                    }
                    result = RunResult(policy, 1.0, 400, 1)
                    result.breakdown = jobs
                    result.jct_s = {name: job.total_s for name, job in jobs.items()}
                    panel.results[Cell(policy, rate, seed, unconstrained)] = result
                panel.unloaded_s[(rate, seed)] = dict.fromkeys(jobs, 10.0)
    return panel


def test_the_pictures_are_drawn_with_every_policy_and_part(tmp_path: Path) -> None:
    figures = PanelFigures(runs(), RATES, SEEDS, POLICIES, 60.0, "twin")
    written = plot(figures, tmp_path, note="modelled: a test's made-up job times")
    names = sorted(p.name for p in written)
    assert names == [
        "openloop-breakdown-twin.png",
        "openloop-breakdown-twin.svg",
        "openloop-jct-twin.png",
        "openloop-jct-twin.svg",
    ]
    assert all(p.stat().st_size > 1000 for p in written)
    breakdown = (tmp_path / "openloop-breakdown-twin.svg").read_text()
    jct = (tmp_path / "openloop-jct-twin.svg").read_text()
    for policy in POLICIES:
        assert policy in breakdown and policy in jct
    for part in PARTS:
        assert part in breakdown
    assert "made-up job times" in jct
