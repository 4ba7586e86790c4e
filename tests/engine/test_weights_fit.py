"""Weights that cannot fit where they would go are refused before anything is allocated:
``engine.loader.check_weights_fit``, through ``Engine`` (a preset or a folder) and ``kvgov serve``.

The free memory is replaced by a fixed figure where a test needs one (``free_bytes``
monkeypatched): the refusal must not depend on how much memory the machine running the
suite has, and a machine with room would otherwise start building a 31 GB model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import (
    Engine,
    EngineConfig,
    InvalidRequestError,
    ModelError,
    WeightsDoNotFitError,
    export_preset,
    loader,
)
from engine.model_config import ModelConfig
from engine.presets import get_preset
from engine.quantization.scheme import WeightQuantization

GB = 10**9
EIGHT_B = get_preset("llama-8b-random").config


def test_the_bound_is_the_parameters_at_their_width(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, fp32, bf16 = torch.device("cpu"), torch.float32, torch.bfloat16
    total, projections = EIGHT_B.num_parameters(), EIGHT_B.num_projection_weights()
    assert 0 < projections < total
    cases = [
        (fp32, None, total * 4),  # 31.2 GB
        (bf16, None, total * 2),  # 15.6 GB
        (bf16, WeightQuantization.INT8, (total - projections) * 2 + projections),
        (bf16, WeightQuantization.INT4, (total - projections) * 2 + projections // 2),
    ]
    for dtype, scheme, needed in cases:
        monkeypatch.setattr(loader, "free_bytes", lambda _device, free=needed - 1: free)
        with pytest.raises(WeightsDoNotFitError) as refused:
            loader.check_weights_fit("llama-8b-random", EIGHT_B, cpu, dtype, scheme)
        assert refused.value.needed == needed and refused.value.available == needed - 1
        monkeypatch.setattr(loader, "free_bytes", lambda _device, free=needed: free)
        loader.check_weights_fit("llama-8b-random", EIGHT_B, cpu, dtype, scheme)  # just fits


def test_the_engine_refuses_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "free_bytes", lambda _device: 8 * GB)
    built: list[str] = []
    monkeypatch.setattr(loader, "build_preset_model", lambda name, **_: built.append(name))
    with pytest.raises(WeightsDoNotFitError) as refused:
        Engine(EngineConfig(model="llama-8b-random", device="cpu"))
    assert built == []  # nothing was allocated
    assert isinstance(refused.value, ModelError)
    message = str(refused.value)
    assert message.startswith("'llama-8b-random' needs at least 31.2 GB for its weights in ")
    assert "float32 and cpu has 8.0 GB free" in message and "quantize='int4'" in message


def test_the_host_reports_what_it_has_free() -> None:
    free = loader.free_bytes(torch.device("cpu"))
    total = 0
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    assert 0 < free <= total


def test_a_model_that_fits_builds_as_before() -> None:
    engine = Engine(EngineConfig(num_blocks=16, device="cpu"))
    assert engine.model_config.num_parameters() == 29_474_304


def test_kvgov_serve_says_why_it_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's own error path, in process (the server would start otherwise)."""
    from typer.testing import CliRunner

    from kvgov import cli

    monkeypatch.setattr(loader, "free_bytes", lambda _device: 8 * GB)
    from tests.kvgov.serve.api_support import kept_logging

    with kept_logging():  # the command configures uvicorn's loggers on the runner's streams
        result = CliRunner().invoke(
            cli.app, ["serve", "--model", "llama-8b-random", "--device", "cpu"]
        )
    assert result.exit_code == 2, result.output
    assert "needs at least 31.2 GB" in result.stderr and "Traceback" not in result.output


def test_a_folder_that_cannot_fit_is_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's ``--model /models/...`` case: a Hugging Face folder (tiny-random
    written out as one) is checked from its config before a weight is read."""
    folder = export_preset(tmp_path / "tiny-random")
    model_config = ModelConfig.from_pretrained(folder)
    needed = model_config.num_parameters() * 4  # float32 on a CPU
    loaded: list[str] = []
    load_model = loader.load_model

    def recorded(path: str, **kwargs: Any) -> Any:
        loaded.append(path)
        return load_model(path, **kwargs)

    monkeypatch.setattr(loader, "load_model", recorded)
    monkeypatch.setattr(loader, "free_bytes", lambda _device: needed - 1)
    with pytest.raises(WeightsDoNotFitError) as refused:
        Engine(EngineConfig(model=str(folder), device="cpu", num_blocks=16))
    assert loaded == []  # nothing was read, let alone allocated
    assert (refused.value.needed, refused.value.available) == (needed, needed - 1)
    assert str(refused.value).startswith(f"{str(folder)!r} needs at least ")
    monkeypatch.setattr(loader, "free_bytes", lambda _device: needed)
    engine = Engine(EngineConfig(model=str(folder), device="cpu", num_blocks=16))
    assert loaded == [str(folder)]  # just fits: loaded, once
    assert engine.model_config.num_parameters() == model_config.num_parameters()


def test_the_host_has_free_what_meminfo_calls_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MemAvailable``, not ``MemFree``: the page cache the kernel gives back on demand
    counts, as it does for every allocation on Linux."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       16303344 kB\n"
        "MemFree:          512000 kB\n"
        "MemAvailable:    9123456 kB\n"
        "Buffers:          204800 kB\n"
        "Cached:          8000000 kB\n"
    )
    cpu = torch.device("cpu")
    assert loader.free_bytes(cpu, meminfo=str(meminfo)) == 9_123_456 * 1024
    # no MemAvailable (a kernel before 3.14) or no file at all: the free pages, which the
    # host's own count would make a moving figure, so sysconf is a stand-in here
    sysconf = {"SC_AVPHYS_PAGES": 1_000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(os, "sysconf", sysconf.__getitem__)
    meminfo.write_text("MemTotal:       16303344 kB\nMemFree:          512000 kB\n")
    for path in (meminfo, tmp_path / "missing"):
        assert loader.free_bytes(cpu, meminfo=str(path)) == 1_000 * 4096


def test_a_kv_cache_over_the_free_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kv_cache_bytes`` (``kvgov serve --kv-budget``) past what the device has free is
    refused with the sizes, not left to the allocator (a bare ``--kv-budget 3158073``
    is 3.3 TB: torch's ``can't allocate memory`` otherwise)."""
    monkeypatch.setattr(loader, "free_bytes", lambda _device: GB)
    with pytest.raises(InvalidRequestError) as refused:
        Engine(EngineConfig(kv_cache_bytes=GB + 1, device="cpu"))
    assert "asked for 1.0 GB" in str(refused.value) and "cpu has 1.0 GB free" in str(refused.value)
    engine = Engine(EngineConfig(kv_cache_bytes=2**20, device="cpu"))  # well within
    assert engine.capacity().num_blocks * engine.capacity().bytes_per_block <= 2**20
