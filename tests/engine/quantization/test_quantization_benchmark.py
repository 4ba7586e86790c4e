"""``kvgov bench quantization``: its twins share their weights, so only quantization moves
the figures. An unquantized twin must measure exactly zero; one drawn from other weights
(the wrong figure) would not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.benchmarks.quantization import LLAMA_8B_LAYER, layer_errors, tiny_errors
from engine.quantization import WeightQuantization

SMALL_LAYER = replace(
    LLAMA_8B_LAYER, hidden_size=256, intermediate_size=512, num_heads=8, num_kv_heads=2, head_dim=32
)


def test_tiny_twins_differ_by_quantization_alone() -> None:
    errors = tiny_errors((None, WeightQuantization.INT8), num_tokens=8)
    assert errors[None] == (0.0, [0.0, 0.0, 0.0, 0.0])
    logits, layers = errors[WeightQuantization.INT8]
    assert len(layers) == 4 and 0 < logits < 1


@pytest.mark.parametrize("seed", [0, 1])
def test_layer_twins_differ_by_quantization_alone(seed: int) -> None:
    errors = layer_errors(
        (None, WeightQuantization.INT4), num_tokens=4, seed=seed, config=SMALL_LAYER
    )
    assert errors[None] == 0.0
    assert 0 < errors[WeightQuantization.INT4] < 1


def test_kvgov_bench_runs_it() -> None:
    import importlib

    from engine.benchmarks import quantization
    from kvgov import cli

    assert importlib.import_module(cli.BENCHMARKS["quantization"]).run is quantization.run
