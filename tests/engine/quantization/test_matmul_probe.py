"""The startup probe of the Triton quantized matmul: the model's shapes, one line on failure.

Under Triton's interpreter the probe runs the kernel on CPU tensors at a model's layer
shapes, unsplit and with K split into one range per group, and finds it agrees with the
torch path; without the interpreter the same kernel cannot run on CPU tensors, a real
failure, which the probe reports on one line, as it does a split kernel that fails. A model
on a CPU keeps the torch path without probing; on a GPU (``gpu``) an int4 engine's
layers take the kernel.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from engine.quantization import QuantizedLinear, WeightQuantization
from engine.quantization.triton_probe import (
    MatmulShape,
    choose_matmul_kernel,
    triton_matmul_runs_on,
)

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="Triton is not installed (pip install 'kvgov[triton]', or a GPU build of torch)",
)
CPU = torch.device("cpu")
# tiny-random's projections: qkv (256 -> 8 x 32 + 2 x 2 x 32), o, gate_up, down
SHAPES = tuple(
    MatmulShape(scheme, 64, n, k)
    for scheme in WeightQuantization
    for n, k in ((384, 256), (256, 256), (2048, 256), (256, 1024))
)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch):
    """The kernel decorated afresh (and the probe's answers forgotten) around a test."""
    from engine.quantization.triton_kernel import dequant_matmul_kernel

    dequant_matmul_kernel.cache_clear()
    triton_matmul_runs_on.cache_clear()
    yield monkeypatch
    dequant_matmul_kernel.cache_clear()
    triton_matmul_runs_on.cache_clear()


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_probe_finds_the_kernel_runs_at_the_models_shapes(
    kernel, matmul_grids, dtype, caplog
) -> None:
    kernel.setenv("TRITON_INTERPRET", "1")
    with caplog.at_level(logging.INFO, logger="engine.quantization.triton_probe"):
        assert triton_matmul_runs_on(CPU, dtype, SHAPES) is True
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    # Each shape's 3 rows as one tile, unsplit and split into one range per group: the
    # two kernels a step can launch, compiled (on a GPU) before the engine serves.
    launched = [
        (1, -(-shape.out_features // 64), ranges)
        for shape in SHAPES
        for ranges in (1, shape.in_features // shape.group_size)
    ]
    assert matmul_grids == launched


@needs_triton
def test_a_split_kernel_that_fails_falls_back_at_startup(kernel, caplog) -> None:
    from engine.quantization import triton_kernel

    class SplitFails:  # the unsplit kernel runs; a launch over K ranges does not compile
        def __getitem__(self, grid: tuple[int, ...]):
            if grid[2] > 1:
                raise RuntimeError("split-K variant: out of shared memory")
            return dequant_matmul_kernel()[grid]

    dequant_matmul_kernel = triton_kernel.dequant_matmul_kernel
    kernel.setenv("TRITON_INTERPRET", "1")
    kernel.setattr(triton_kernel, "dequant_matmul_kernel", SplitFails)
    with caplog.at_level(logging.INFO, logger="engine.quantization.triton_probe"):
        assert triton_matmul_runs_on(CPU, torch.float32, SHAPES[:1]) is False
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and "split-K variant" in record.getMessage()


@needs_triton
def test_a_kernel_that_cannot_run_falls_back_on_one_line(kernel, caplog) -> None:
    kernel.delenv("TRITON_INTERPRET", raising=False)  # compiled: not for CPU tensors
    with caplog.at_level(logging.INFO, logger="engine.quantization.triton_probe"):
        assert triton_matmul_runs_on(CPU, torch.float32, SHAPES[:2]) is False
    (record,) = caplog.records
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "\n" not in message
    assert "using the torch path" in message and "2 layer shape(s), torch.float32" in message


def test_a_model_on_a_cpu_keeps_the_torch_path() -> None:
    model = torch.nn.Sequential(
        QuantizedLinear(256, 128, bias=False, scheme=WeightQuantization.INT4, dtype=torch.float32),
        torch.nn.Linear(128, 8),
    )
    assert choose_matmul_kernel(model, device=CPU) is False
    assert model[0].use_triton is False


@pytest.mark.gpu
def test_an_int4_engine_on_a_gpu_takes_the_kernel() -> None:
    from engine import Engine, EngineConfig

    engine = Engine(EngineConfig(device="cuda", quantize="int4", num_blocks=64))
    layers = [m for m in engine.model.modules() if isinstance(m, QuantizedLinear)]
    assert layers and all(layer.use_triton for layer in layers)
