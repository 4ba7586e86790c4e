"""The host link fitted from timed copies: the fit recovers a known line, the measurement
times real swaps on the engine and gives back every block, and a grid file carries its
link samples so that a refit fits the same link."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.presets import PRESETS
from engine.twin.grid import load_grid, write_grid
from engine.twin.link_fit import LinkSample, fit_link
from engine.twin.measure import measure_link
from engine.twin.shapes import ModelShape, SequenceWork, StepBatch, StepSample


def test_the_fit_recovers_latency_and_bandwidth() -> None:
    samples = [LinkSample(n, 40e-6 + n / 8e9) for n in (2**18, 2**20, 2**22, 2**22)]
    fitted = fit_link(samples)
    assert fitted.latency_s == pytest.approx(40e-6, rel=1e-6)
    assert fitted.bandwidth_bytes_s == pytest.approx(8e9, rel=1e-6)
    # A negative intercept (noise at small sizes) is held at 0: no copy is free.
    noisy = fit_link([LinkSample(100, 1e-9), LinkSample(1000, 1e-6)])
    assert noisy.latency_s == 0.0 and noisy.bandwidth_bytes_s > 0
    with pytest.raises(ValueError, match="two sizes"):
        fit_link([LinkSample(100, 1e-6), LinkSample(100, 2e-6)])


def test_swaps_are_timed_on_the_engine_and_every_block_comes_back(tmp_path) -> None:
    engine = Engine(
        EngineConfig(model="tiny-random", device="cpu", num_blocks=96, swap_space_blocks=64)
    )
    samples = measure_link(engine, repeats=2)
    per_block = engine.capacity().bytes_per_block
    assert {s.num_bytes for s in samples} == {8 * per_block, 32 * per_block}  # 128 has no room
    assert all(s.seconds > 0 for s in samples)
    assert engine.block_manager.pool.num_in_use == 0
    assert engine.block_manager.host_pool.num_free_blocks == 64

    shape = ModelShape.from_config(
        PRESETS["tiny-random"].config, name="tiny-random", activation_bits=32
    )
    step = StepSample(
        device="cpu-here", model=shape, batch=StepBatch((SequenceWork(1, 16),)), seconds=0.01
    )
    path = write_grid(tmp_path / "grid.json", [step], link=samples)
    assert load_grid(path).link == tuple(samples)
    assert load_grid(write_grid(tmp_path / "bare.json", [step])).link == ()
