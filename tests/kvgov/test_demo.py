"""``kvgov demo``: the three runs on the bundled engine (tiny-random), at a small size where
the schemes differ; the table, the footer and the map against the engine."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import kvgov.demo
from kvgov.cli import app
from kvgov.demo import DemoOptions, DemoResult, parse_size, result_table, run_demo
from kvgov.memory_map import MemoryMap

runner = CliRunner()


# A size where the schemes differ: 256 blocks hold two 2,048-token slots (128 blocks each),
# so reserve-for-max runs two of the three workers at once; paged, all three fit.
OPTIONS = {"agents": 3, "turns": 1, "ceiling": 2_048, "kv_budget_bytes": 8 << 20}
SLOT_BLOCKS = 2_048 // 16


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    out = tmp_path_factory.mktemp("demo")
    return run_demo(DemoOptions(**OPTIONS, out=out), console=Console(file=io.StringIO()))


def _table(result: DemoResult) -> dict[str, tuple[str, str, str]]:
    """The printed table, as {row label: (reserve-for-max, paged engine alone, kvgov)}."""
    console = Console(file=io.StringIO(), width=160)
    console.print(result_table(result))
    rows = {}
    for line in console.file.getvalue().splitlines():  # type: ignore[attr-defined]
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 4 and cells[0]:
            rows[cells[0]] = (cells[1], cells[2], cells[3])
    return rows


def test_the_runs_differ_in_memory_governance_alone(demo: DemoResult) -> None:
    base, gov = demo.baseline, demo.kvgov
    assert demo.num_blocks == 256
    # Reserve-for-max admits as many workers as whole slots fit; kvgov runs them all.
    assert base.peak_active == demo.num_blocks // SLOT_BLOCKS == 2
    assert gov.peak_active == OPTIONS["agents"]
    # The same content policies: nobody overflows, every call is made, the same tool
    # outputs are summarized by the same amount.
    calls = OPTIONS["agents"] * (OPTIONS["turns"] + 1) + 2  # every worker turn, the planner's
    assert demo.paged is not None
    for stats in (base, demo.paged, gov):
        assert (stats.failures, stats.oom_failures, stats.model_calls) == ([], 0, calls)
        assert stats.tokens_summarized == gov.tokens_summarized
        # A job per worker: its lease, from its request to its release.
        assert len(stats.jct_s) == OPTIONS["agents"]
        assert 0 < max(stats.jct_s) <= stats.wall_s
    # The paged engine alone holds, offloads and pins nothing, and caps no fan-out.
    assert demo.paged.offloads == 0
    assert demo.paged.peak_blocks <= demo.num_blocks
    # A slot is its ceiling: reserved is whole slots, and what lives in them fits in them.
    per_token = demo.bytes_per_block // 16
    assert base.peak_reserved_bytes == base.peak_active * 2_048 * per_token
    assert 0 < base.peak_live_bytes <= base.peak_reserved_bytes
    # Paged, reserved is the blocks in use, never past the pool.
    assert gov.peak_reserved_bytes == gov.peak_blocks * demo.bytes_per_block
    assert gov.peak_blocks <= demo.num_blocks
    assert gov.waste < base.waste


def test_the_table_shows_the_figures(demo: DemoResult) -> None:
    rows = _table(demo)
    base, gov = demo.baseline, demo.kvgov

    def mib(value: int) -> str:
        return f"{value / (1 << 20):.1f} MiB"

    paged = demo.paged
    assert paged is not None
    runs = (base, paged, gov)
    assert rows["agents active at once (peak)"] == ("2", str(paged.peak_active), "3")
    assert rows["KV reserved (peak)"] == tuple(mib(s.peak_reserved_bytes) for s in runs)
    assert rows["KV live (peak)"] == tuple(mib(s.peak_live_bytes) for s in runs)
    assert rows["peak blocks in use"] == tuple(f"{s.peak_blocks:,}" for s in runs)
    assert rows["model calls"] == ("8", "8", "8")
    assert rows["agents failed (context overflow)"] == ("0", "0", "0")
    assert rows["out-of-memory failures"] == ("0", "0", "0")
    saved = f"{gov.tokens_summarized:,}"
    assert rows["tokens saved by summarization"] == (saved, saved, saved)
    assert rows["wall time"] == tuple(f"{s.wall_s:.1f} s" for s in runs)
    assert rows["job completion time (mean)"] == tuple(
        f"{sum(s.jct_s) / len(s.jct_s):.1f} s" for s in runs
    )
    assert rows["prefill tokens recomputed"] == tuple(f"{s.recomputed_tokens:,}" for s in runs)


def test_the_map_is_the_engine_at_one_instant(demo: DemoResult) -> None:
    assert demo.kvgov.peak is not None
    kv = demo.kvgov.peak.kv
    memory = MemoryMap.load(demo.options.out / "memory.json")
    per_block = demo.bytes_per_block
    budget = demo.num_blocks * per_block
    assert memory.kv_budget_bytes == budget
    # The paged bar is the distinct blocks the budgets and the pinned prefix hold then:
    # all of the pool's blocks in use (every request in the demo has a budget).
    on_device = set(kv.pinned_block_ids).union(*(b.device_block_ids for b in kv.budgets.values()))
    assert memory.paged_bytes() == len(on_device) * per_block == kv.num_blocks_in_use * per_block
    assert memory.paged_bytes() <= budget
    assert kv.num_blocks_in_use == demo.kvgov.peak_blocks  # the table's peak, the same instant
    held = {b: s for b, s in kv.budgets.items() if s.device_block_ids or s.num_host_blocks}
    assert len(memory.agents) == len(held)
    assert sum(a.offloaded_bytes for a in memory.agents) == per_block * sum(
        s.num_host_blocks for s in kv.budgets.values()
    )
    # The paged engine alone's row: its own run, at its own peak, every block held once.
    assert demo.paged is not None and demo.paged.peak is not None
    alone = demo.paged.peak.kv
    assert alone.num_blocks_in_use == demo.paged.peak_blocks
    held_alone = [s for s in alone.budgets.values() if s.device_block_ids or s.num_host_blocks]
    assert len(memory.paged_alone) == len(held_alone)
    on_device = set().union(*(s.device_block_ids for s in alone.budgets.values()))
    own = sum(a.live_bytes - a.shared_bytes for a in memory.paged_alone)
    shared = max([memory.paged_alone_shared_bytes, *(a.shared_bytes for a in memory.paged_alone)])
    assert own + shared == len(on_device) * per_block <= budget
    assert f"at its own peak: {len(held_alone)} agents hold" in demo.memory_caption


def test_the_footer_agrees_with_the_table(demo: DemoResult) -> None:
    rows = _table(demo)
    memory = MemoryMap.load(demo.options.out / "memory.json")
    n = len(memory.agents)
    reserved = rows["KV reserved (peak)"][2]  # kvgov: its blocks in use at the peak
    free = (demo.num_blocks - demo.kvgov.peak_blocks) * demo.bytes_per_block / (1 << 20)
    assert f"Paged: {n} of {n} hold {reserved} of blocks on the device" in demo.memory_caption
    assert f"{free:.1f} MiB free headroom" in demo.memory_caption


def test_the_cli_prints_the_table_the_footer_and_a_report(
    demo: DemoResult, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module's run stands in for a second one: this checks what the CLI prints of it.
    monkeypatch.setattr(kvgov.demo, "run_demo", lambda options, console: demo)
    result = runner.invoke(app, ["demo", "--out", str(demo.options.out)], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout  # nothing cut at 100 columns
    rows = _table(demo)
    for label in ("agents active at once (peak)", "KV reserved (peak)", "model calls"):
        assert " ".join([label, *rows[label]]) in " ".join(result.stdout.replace("│", " ").split())
    assert " ".join(demo.memory_caption.split()) in " ".join(result.stdout.split())
    # The second act: the reference user's scale on the twin, labelled as modelled.
    flat = " ".join(result.stdout.replace("│", " ").split())
    assert "Second act, modelled on the hardware twin" in flat
    assert "8 agents" in flat and "qwen3-8b (int4) on rx9070xt" in flat
    for title in ("reserve-for-max", "paged engine alone", "kvgov"):
        assert title in flat
    for scheme in ("baseline", "paged", "kvgov"):
        trace = demo.traces[scheme]
        report = runner.invoke(app, ["report", str(trace)], env={"COLUMNS": "160"})
        assert report.exit_code == 0, report.output
        assert "worker" in report.stdout
    assert (demo.options.out / "memory-map.svg").read_text().startswith("<?xml")
    assert (demo.options.out / "memory-map.png").stat().st_size > 0


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
