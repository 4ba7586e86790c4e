"""``kvgov bench attention``: what it runs, and that it reports every figure."""

from __future__ import annotations

import importlib
from pathlib import Path

from engine.benchmarks import Direction
from engine.benchmarks.attention import (
    LAYER_BYTES,
    last_level_cache_bytes,
    num_layers_for,
    run,
)
from kvgov import cli

MIB = 1 << 20


def fake_cpu_caches(root: Path, caches: list[tuple[str, str]]) -> Path:
    for i, (kind, size) in enumerate(caches):
        index = root / f"index{i}"
        index.mkdir(parents=True)
        (index / "type").write_text(f"{kind}\n")
        (index / "size").write_text(f"{size}\n")
    return root


def test_the_last_level_cache_is_the_largest_data_cache_linux_reports(tmp_path: Path) -> None:
    # The 2-core cloud machine's caches: 48K L1d, 32K L1i, 2 MiB L2, 300 MiB L3.
    caches = [("Data", "48K"), ("Instruction", "32K"), ("Unified", "2048K")]
    root = fake_cpu_caches(tmp_path / "cloud", [*caches, ("Unified", "307200K")])
    assert last_level_cache_bytes(root) == 300 * MIB
    assert last_level_cache_bytes(tmp_path / "none") == 32 * MIB  # not reported: assumed
    # This machine's, read the same way: at least as large as each cache listed.
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        size = (index / "size").read_text().strip()
        assert last_level_cache_bytes() >= int(size.rstrip("K")) << (10 if "K" in size else 0)


def test_each_side_reads_twice_the_last_level_cache_so_every_layer_is_cold() -> None:
    for llc in (8 * MIB, 32 * MIB, 300 * MIB, last_level_cache_bytes()):
        layers = num_layers_for(llc)
        assert layers * LAYER_BYTES >= 2 * llc and layers >= 4
        assert (layers - 1) * LAYER_BYTES < 2 * llc or layers == 4  # and no more than that
    assert LAYER_BYTES == 16 * MIB  # 8 x 4,096 tokens x 2 heads x 32 x fp32, K and V
    assert num_layers_for(300 * MIB) == 38 and num_layers_for(32 * MIB) == 4


def test_quick_run_reports_the_ratios_and_the_times_behind_them() -> None:
    figures = {m.metric: m for m in run(quick=True, num_layers=4)}
    ratio = figures["paged_over_contiguous"]
    assert ratio.target == 1.15 and ratio.direction is Direction.LOWER_IS_BETTER
    assert "4 layers x 16 MiB of K/V = 64 MiB per side" in ratio.note and "threads" in ratio.note
    for name in ("fragmented_over_contiguous", "naive_gather_over_contiguous"):
        assert figures[name].value > 0
    for name in ("contiguous", "paged", "fragmented", "naive_gather", "prepare"):
        assert figures[f"{name}_ms"].unit == "ms" and figures[f"{name}_ms"].value > 0


def test_the_cli_knows_the_attention_benchmark() -> None:
    assert importlib.import_module(cli.BENCHMARKS["attention"]).run is run
