"""``kvgov bench governor --quick`` runs end to end and reports the figures the issue names."""

from __future__ import annotations

import json
import math
import re

from typer.testing import CliRunner

from governor import DEFAULT_SAFETY_FACTOR
from kvgov.cli import app


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
    ratio = rows["overcommit_admitted_ratio"]
    found = re.search(
        r"peak active: (\d+) overcommit vs (\d+) guaranteed; (\d+) agents", ratio["note"]
    )
    assert found, ratio["note"]
    overcommit, guaranteed, agents = map(int, found.groups())
    # guaranteed admits what fits at every ceiling: floor(900 blocks x 0.9 / 100 per lease)
    assert guaranteed == math.floor(900 * DEFAULT_SAFETY_FACTOR / math.ceil(1_600 / 16)) == 8
    assert guaranteed < overcommit <= agents
    assert ratio["value"] == overcommit / guaranteed
    assert "0 lost" in ratio["note"]
    assert rows["count_us_per_1k_chars"]["value"] > 0
    assert "counts equal" in rows["count_us_per_1k_chars"]["note"]
    # a conversation counted again is looked up, not counted: far below its first count
    assert 0 < rows["recount_us_per_1k_chars"]["value"] < rows["count_us_per_1k_chars"]["value"] / 5
    assert rows["queued_lease_us"]["value"] > 0
    assert "ordering the whole queue on every pass" in rows["queued_lease_us"]["note"]
    assert rows["capped_lease_us"]["value"] > 0
    assert "max_per_tenant=30" in rows["capped_lease_us"]["note"]
