"""The ``kvgov`` command line, driven through typer's CliRunner."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from typer.testing import CliRunner

import governor
from engine.benchmarks import Direction, Measurement
from kvgov import cli

runner = CliRunner()


class FakeBench(ModuleType):
    """A benchmark module with fixed figures that records how it was run."""

    def __init__(self) -> None:
        super().__init__("fake_bench")
        self.calls: list[bool] = []

    def run(self, *, quick: bool = False) -> Iterator[Measurement]:
        self.calls.append(quick)
        yield Measurement("fake", "ops_per_s", 1_234_567.8, "ops/s", target=1_000_000)
        yield Measurement(
            "fake", "waste_pct", 0.75, "%", target=0.5, direction=Direction.LOWER_IS_BETTER
        )
        yield Measurement("fake", "baseline_pct", 63.2, "%", note="reported, not judged")


@pytest.fixture
def fake_bench(monkeypatch: pytest.MonkeyPatch) -> FakeBench:
    module = FakeBench()
    monkeypatch.setitem(sys.modules, "fake_bench", module)
    monkeypatch.setattr(cli.benchmarks, "BENCHMARKS", {"fake": "fake_bench"})
    return module


def test_version() -> None:
    result = runner.invoke(cli.app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"kvgov {governor.__version__}\n"


def test_unknown_benchmark_is_a_one_line_error() -> None:
    result = runner.invoke(cli.app, ["bench", "nope"])
    assert result.exit_code == 2
    assert result.stdout == ""
    choices = ", ".join([*cli.BENCHMARKS, "all"])
    assert result.stderr == f"Error: unknown benchmark 'nope'; choose one of: {choices}.\n"


def test_json_prints_one_object_per_line_and_nothing_else(fake_bench: FakeBench) -> None:
    result = runner.invoke(cli.app, ["bench", "fake", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    # Each figure, and beside it what else the host ran: its load and its CPUs.
    assert [{k: v for k, v in line.items() if k not in ("load_1m", "cpus")} for line in lines] == [
        m.to_json() for m in fake_bench.run()
    ]
    for line in lines:
        assert line["load_1m"] == pytest.approx(os.getloadavg()[0], abs=4.0)
        assert line["cpus"] == os.cpu_count()
    assert fake_bench.calls == [False, False]


def test_quick_reaches_the_benchmark(fake_bench: FakeBench) -> None:
    result = runner.invoke(cli.app, ["bench", "fake", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    assert fake_bench.calls == [True]


def test_table_shows_each_figure_against_its_target(fake_bench: FakeBench) -> None:
    result = runner.invoke(cli.app, ["bench", "fake"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    cells = [line.split() for line in result.stdout.splitlines()]
    rows = {c[1]: " ".join(c) for c in cells if c[:1] == ["fake"]}
    assert "1,234,568" in rows["ops_per_s"] and ">= 1,000,000" in rows["ops_per_s"]
    assert "✓" in rows["ops_per_s"]
    assert "0.75" in rows["waste_pct"] and "<= 0.5" in rows["waste_pct"]
    assert "✗" in rows["waste_pct"]
    assert "63.2" in rows["baseline_pct"] and "reported, not judged" in rows["baseline_pct"]
    assert "✓" not in rows["baseline_pct"] and "✗" not in rows["baseline_pct"]


@pytest.mark.parametrize("columns", ["80", "60"])
def test_the_table_is_whole_at_80_columns_and_piped(
    monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    module = ModuleType("fake_wide_bench")
    note = "10,000-block pool, prefix caching on, 50% cached, batches of 64 across the pool"
    module.run = lambda *, quick=False: iter(  # type: ignore[attr-defined]
        [
            Measurement("integrations", "governed_over_ungoverned_wall", 1.0234, "x",
                        target=1.1, direction=Direction.LOWER_IS_BETTER, note=note),
            Measurement("allocator", "alloc_free_blocks_per_s", 1_234_567.8, "blocks/s",
                        target=1_000_000, note=note),
        ]
    )  # fmt: skip
    monkeypatch.setitem(sys.modules, "fake_wide_bench", module)
    monkeypatch.setattr(cli.benchmarks, "BENCHMARKS", {"wide": "fake_wide_bench"})
    result = runner.invoke(cli.app, ["bench", "wide"], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout
    assert max(len(line.rstrip()) for line in lines) <= int(columns)
    for whole in ("integrations", "governed_over_ungoverned_wall", "alloc_free_blocks_per_s",
                  "1,234,568", ">= 1,000,000", "<= 1.1", "blocks/s"):  # fmt: skip
        assert any(whole in line for line in lines), whole
    words = " ".join(result.stdout.split())
    assert note in words  # the note wraps between words, never inside one


def test_every_benchmark_module_is_listed() -> None:
    """A benchmark module that ``kvgov bench`` cannot reach, or a listed one that is
    gone, fails here rather than being skipped. A module with a ``run`` of its own is
    listed, or run by a listed one (``yield from offload.run(...)``)."""
    root = Path(__file__).resolve().parents[2]
    sources = {
        ".".join(path.relative_to(root).with_suffix("").parts): path.read_text(encoding="utf-8")
        for path in root.glob("*/benchmarks/**/*.py")
        if path.name != "__init__.py"
    }
    listed = set(cli.BENCHMARKS.values())
    assert listed <= set(sources)
    for module, source in sources.items():
        if "def run(" in source and module not in listed:
            stem = module.rpartition(".")[2]
            runners = [name for name in listed if f"{stem}.run(" in sources[name]]
            assert runners, f"{module} has a run() that no listed benchmark runs"
    for module in listed:
        assert importlib.util.find_spec(module) is not None, module


def test_allocator_benchmark_quick_json() -> None:
    result = runner.invoke(cli.app, ["bench", "allocator", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines
    for line in lines:
        record = json.loads(line)
        assert {"bench", "metric", "value"} <= record.keys()
        assert record["bench"] == "allocator"


def test_a_skipped_figure_prints_as_null_json_and_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    module = ModuleType("fake_skip_bench")
    module.run = lambda *, quick=False: iter(  # type: ignore[attr-defined]
        [Measurement(bench="x", metric="m", value=float("nan"), unit="x", target=3.0)]
    )
    monkeypatch.setitem(sys.modules, "fake_skip_bench", module)
    monkeypatch.setattr(cli.benchmarks, "BENCHMARKS", {"x": "fake_skip_bench"})
    runner = CliRunner()
    line = runner.invoke(cli.app, ["bench", "x", "--json"]).stdout.strip()
    assert json.loads(line)["value"] is None and json.loads(line)["met"] is None
    assert "—" in runner.invoke(cli.app, ["bench", "x"]).stdout


def fake_benchmarks(monkeypatch: pytest.MonkeyPatch, modules: dict[str, str]) -> None:
    """``cli.BENCHMARKS`` as ``modules`` (name -> module), each module one figure whose
    ``bench`` is the module's name."""
    for name in modules.values():
        module = ModuleType(name)
        module.run = lambda *, quick=False, name=name: iter(  # type: ignore[attr-defined]
            [{"bench": name, "metric": "m", "value": 1.0, "unit": "x"}]
        )
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(cli.benchmarks, "BENCHMARKS", modules)


def test_all_runs_every_benchmark_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_benchmarks(monkeypatch, {"a": "first_fake", "b": "second_fake"})
    result = runner.invoke(cli.app, ["bench", "all", "--json"])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["bench"] for line in result.stdout.splitlines()] == [
        "first_fake",
        "second_fake",
    ]


def test_all_leaves_out_the_tuning_run(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_benchmarks(monkeypatch, {"openloop": "bench_fake", "openloop-tune": "tune_fake"})
    result = runner.invoke(cli.app, ["bench", "all", "--json"])
    assert [json.loads(line)["bench"] for line in result.stdout.splitlines()] == ["bench_fake"]
    result = runner.invoke(cli.app, ["bench", "openloop-tune", "--json"])
    assert [json.loads(line)["bench"] for line in result.stdout.splitlines()] == ["tune_fake"]
