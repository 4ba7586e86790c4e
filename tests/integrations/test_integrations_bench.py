"""``kvgov bench integrations``: the figure it reports, and its row through the CLI."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from integrations.benchmarks.integrations import MODEL_LATENCY_S, NUM_AGENTS
from kvgov.cli import BENCHMARKS, app


def test_the_cli_prints_the_quick_runs_row_as_json() -> None:
    # One quick run serves both: the row through the CLI is the row ``run`` yields.
    assert BENCHMARKS["integrations"] == "integrations.benchmarks.integrations"
    result = CliRunner().invoke(app, ["bench", "integrations", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = map(json.loads, result.stdout.splitlines())
    assert row["bench"] == "integrations"
    assert row["metric"] == "governed_over_plain"
    assert row["unit"] == "x" and row["target"] == 1.05 and row["direction"] == "lower"
    assert isinstance(row["value"], float) and row["value"] > 0.5
    note = str(row["note"])
    assert f"{NUM_AGENTS} ReAct workers" in note
    assert f"sleeps {MODEL_LATENCY_S * 1e3:g} ms per call" in note  # the fake model says so
    assert "left held" not in note
