"""``kvgov bench governor --quick`` runs end to end and reports the figures the issue names."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from governor.cli import app


def test_bench_governor_quick_json() -> None:
    result = CliRunner().invoke(app, ["bench", "governor", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["metric"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert set(rows) == {
        "lease_overhead_us",
        "overcommit_admitted_ratio",
        "count_us_per_1k_chars",
        "recount_us_per_1k_chars",
        "queued_lease_us",
        "capped_lease_us",
    }
    assert rows["lease_overhead_us"]["value"] > 0
    assert rows["overcommit_admitted_ratio"]["value"] >= 1
    assert "0 lost" in rows["overcommit_admitted_ratio"]["note"]
    assert rows["count_us_per_1k_chars"]["value"] > 0
    assert "counts equal" in rows["count_us_per_1k_chars"]["note"]
    # a conversation counted again is looked up, not counted: far below its first count
    assert 0 < rows["recount_us_per_1k_chars"]["value"] < rows["count_us_per_1k_chars"]["value"] / 5
    assert rows["queued_lease_us"]["value"] > 0
    assert "ordering the whole queue on every pass" in rows["queued_lease_us"]["note"]
    assert rows["capped_lease_us"]["value"] > 0
    assert "max_per_tenant=30" in rows["capped_lease_us"]["note"]
