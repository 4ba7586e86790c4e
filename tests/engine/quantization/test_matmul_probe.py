"""The startup probe of the Triton quantized matmul: the model's shapes, one line on failure.

Under Triton's interpreter the probe runs the kernel on CPU tensors at a model's layer
shapes and finds it agrees with the torch path; without the interpreter the same kernel
cannot run on CPU tensors, a real failure, which the probe reports on one line. A model
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
def test_the_probe_finds_the_kernel_runs_at_the_models_shapes(kernel, dtype, caplog) -> None:
    kernel.setenv("TRITON_INTERPRET", "1")
    with caplog.at_level(logging.INFO, logger="engine.quantization.triton_probe"):
        assert triton_matmul_runs_on(CPU, dtype, SHAPES) is True
    assert [r.levelno for r in caplog.records] == [logging.INFO]


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
