"""``kvgov bench attention --device``: the option reaches the benchmark, and on a GPU
the decode microbenchmark reports Triton and gather against contiguous SDPA."""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from typer.testing import CliRunner

from engine.benchmarks import Measurement
from kvgov import cli

runner = CliRunner()


class DeviceBench(ModuleType):
    """A benchmark module (fake: the real ones run for minutes) that takes a device."""

    def __init__(self) -> None:
        super().__init__("device_bench")
        self.devices: list[torch.device | None] = []

    def run(
        self, *, quick: bool = False, device: torch.device | None = None
    ) -> Iterator[Measurement]:
        self.devices.append(device)
        yield Measurement("dev", "ms", 1.0, "ms")


class HostBench(ModuleType):
    def __init__(self) -> None:
        super().__init__("host_bench")

    def run(self, *, quick: bool = False) -> Iterator[Measurement]:
        yield Measurement("host", "ms", 1.0, "ms")


@pytest.fixture
def benches(monkeypatch: pytest.MonkeyPatch) -> DeviceBench:
    device_bench = DeviceBench()
    monkeypatch.setitem(sys.modules, "device_bench", device_bench)
    monkeypatch.setitem(sys.modules, "host_bench", HostBench())
    monkeypatch.setattr(cli.benchmarks, "BENCHMARKS", {"dev": "device_bench", "host": "host_bench"})
    return device_bench


def test_device_reaches_the_benchmark_resolved(benches: DeviceBench) -> None:
    result = runner.invoke(cli.app, ["bench", "dev", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    assert benches.devices == ["cpu"]  # resolved, as the engine's config takes it
    result = runner.invoke(cli.app, ["bench", "dev", "--json"])
    assert result.exit_code == 0 and benches.devices[-1] is None  # its own default


def test_a_benchmark_without_a_device_refuses_the_option(benches: DeviceBench) -> None:
    result = runner.invoke(cli.app, ["bench", "host", "--device", "cpu"])
    assert result.exit_code == 2
    assert result.stderr == "Error: kvgov bench host takes no --device: it runs on the host.\n"
    # "all" runs those that take it.
    result = runner.invoke(cli.app, ["bench", "all", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count('"bench": "dev"') == 1 and '"host"' not in result.stdout


def test_the_benchmarks_that_run_on_a_gpu_take_the_option() -> None:
    for name in ("engine", "attention"):
        run = importlib.import_module(f"engine.benchmarks.{name}").run
        assert "device" in inspect.signature(run).parameters, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_a_gpu_that_is_not_there_is_a_one_line_error(benches: DeviceBench) -> None:
    result = runner.invoke(cli.app, ["bench", "dev", "--device", "cuda"])
    assert result.exit_code == 2 and benches.devices == []
    assert result.stderr.startswith("Error: device 'cuda' was requested but no CUDA/ROCm GPU")


def test_the_attention_benchmark_takes_a_device() -> None:
    from inspect import signature

    from engine.benchmarks.attention import run

    assert "device" in signature(run).parameters


@pytest.mark.gpu
def test_the_gpu_decode_benchmark_reports_triton_gather_and_contiguous() -> None:
    from engine.benchmarks.attention import run

    figures = {m.metric: m for m in run(quick=True, device="cuda")}
    ratio = figures["paged_over_contiguous"]
    assert ratio.target == 1.10 and torch.cuda.get_device_name() in ratio.note
    assert math.isfinite(figures["gather_over_contiguous"].value)
    for name in ("contiguous", "gather"):
        assert math.isfinite(figures[f"{name}_ms"].value)
