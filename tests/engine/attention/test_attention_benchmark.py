"""``kvgov bench attention --quick`` runs and reports every figure."""

from __future__ import annotations

import importlib

from engine.benchmarks import Direction
from engine.benchmarks.attention import run
from kvgov import cli


def test_quick_run_reports_the_ratios_and_the_times_behind_them() -> None:
    figures = {m.metric: m for m in run(quick=True)}
    ratio = figures["paged_over_contiguous"]
    assert ratio.target == 1.15 and ratio.direction is Direction.LOWER_IS_BETTER
    for name in ("fragmented_over_contiguous", "naive_gather_over_contiguous"):
        assert figures[name].value > 0
    for name in ("contiguous", "paged", "fragmented", "naive_gather", "prepare"):
        assert figures[f"{name}_ms"].unit == "ms" and figures[f"{name}_ms"].value > 0


def test_the_cli_knows_the_attention_benchmark() -> None:
    assert importlib.import_module(cli.BENCHMARKS["attention"]).run is run
