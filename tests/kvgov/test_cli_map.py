"""``kvgov map``: the memory map renders to SVG and PNG from plan inputs or a record."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvgov.cli import app
from kvgov.memory_map import AgentMemory, MemoryMap

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_design_map_renders(tmp_path: Path) -> None:
    out = tmp_path / "maps" / "design"
    args = ["map", "--card-gb", "16", "--weights-gb", "5.5", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "4 of 8 agents admitted" in result.stdout and "8 of 8 hold" in result.stdout
    svg = (tmp_path / "maps" / "design.svg").read_text()
    assert "<svg" in svg and "admission wall" in svg and "paged (kvgov)" in svg
    assert (tmp_path / "maps" / "design.png").read_bytes().startswith(PNG_MAGIC)


def test_a_recorded_run_renders(tmp_path: Path) -> None:
    memory = MemoryMap(
        title="demo: 3 agents",
        card_bytes=1_000,
        weights_bytes=300,
        overhead_bytes=100,
        agents=(
            AgentMemory("planner", 120, 300),
            AgentMemory("worker 1", 90, 250),
            AgentMemory("worker 2", 60, 250),
        ),
    )
    assert memory.contiguous_admitted() == 2  # 300 + 250 of 600; the third does not fit
    assert "2 of 3 agents admitted" in memory.caption()
    record = memory.save(tmp_path / "run.json")
    assert MemoryMap.load(record) == memory
    result = runner.invoke(app, ["map", "--record", str(record), "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m.png").read_bytes().startswith(PNG_MAGIC)


def test_a_bad_record_is_one_line_and_exit_two(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"title": "x"}))
    for path in (bad, tmp_path / "missing.json"):
        result = runner.invoke(app, ["map", "--record", str(path)])
        assert result.exit_code == 2, result.output
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
