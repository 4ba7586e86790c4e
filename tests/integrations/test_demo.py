"""``kvgov demo``: both runs on the bundled engine (tiny-random), in a small size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from governor import MemoryMap
from governor.cli import app
from integrations.demo import DemoOptions, parse_size, run_demo

runner = CliRunner()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    args = ["demo", "--agents", "3", "--turns", "3", "--kv-budget", "24MiB", "--out", str(out)]
    result = runner.invoke(app, args, env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    (out / "stdout.txt").write_text(result.stdout)
    return out


def test_the_table_compares_the_two_runs(small: Path) -> None:
    stdout = (small / "stdout.txt").read_text()
    assert "model calls" in stdout and "scripted" in stdout
    for row in ("agents active at once", "KV reserved", "waste", "admission waits",
                "compactions", "tokens saved by summarization", "context overflow",
                "out-of-memory failures"):  # fmt: skip
        assert row in stdout, row
    assert "reserve-for-max" in stdout and "kvgov" in stdout


def test_the_run_leaves_traces_a_report_and_a_map(small: Path) -> None:
    for scheme in ("baseline", "kvgov"):
        trace = small / f"trace-{scheme}.jsonl"
        assert trace.stat().st_size > 0
        report = runner.invoke(app, ["report", str(trace)], env={"COLUMNS": "160"})
        assert report.exit_code == 0, report.output
        assert "worker" in report.stdout
    memory = MemoryMap.load(small / "memory.json")
    assert memory.agents and memory.kv_budget_bytes > 0
    assert (small / "memory-map.svg").read_text().startswith("<?xml")
    assert (small / "memory-map.png").stat().st_size > 0


def test_kvgov_keeps_every_worker_that_reserve_for_max_loses(tmp_path: Path) -> None:
    result = run_demo(DemoOptions(agents=2, turns=2, kv_budget_bytes=24 << 20, out=tmp_path))
    assert not result.kvgov.failures and result.kvgov.tokens_summarized > 0
    assert result.baseline.failures  # whole tool outputs overflow 4,096-token contexts
    assert result.kvgov.waste < result.baseline.waste
    assert result.kvgov.model_calls == 2 * 3 + 2  # every turn of every worker, and the planner's


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-budget", "lots"], "cannot read a size"),
        (["--model", "/no/such/checkpoint"], "cannot build the engine"),
        (["--agents", "0"], "agents"),
        (["--kv-budget", "1KB"], "KV"),
    ],
)
def test_bad_input_is_one_line_and_exit_two(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_a_missing_device_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["demo", "--device", "cuda", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Error:" in result.stderr


def test_sizes() -> None:
    assert parse_size("48MiB") == 48 << 20 and parse_size("50MB") == 50_000_000
    assert parse_size("1.5GiB") == 3 << 29 and parse_size("64") == 64 << 20
