"""Whether the Triton dequantize-and-multiply kernel runs for a model, found at startup.

That triton imports says little about the card (its compiler may lack the architecture,
or fail for one group size or dtype), so before a quantized model's layers take the
kernel, each distinct layer shape of the model (its scheme, group size, rows and
columns) runs through it on random codes and is compared with the torch path
(dequantize, then ``F.linear``): once unsplit, and once with K split into one range per
group, the most ``split_k`` cuts (a decode's few rows split where the layer's tiles are
too few to fill the GPU). Every split count runs the same compiled kernel, so the two
runs also compile every variant a step can launch before the engine serves. Any failure
is logged on one line with its reason and every layer keeps the torch path; the engine
never fails at its first real step. The answer is cached per device, dtype and set of
shapes.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.quantization.linear import QuantizedLinear
from engine.quantization.scheme import WeightQuantization, dequantize
from engine.quantization.triton_matmul import dequant_matmul, triton_matmul_available

__all__ = ["MatmulShape", "choose_matmul_kernel", "triton_matmul_runs_on"]

logger = logging.getLogger(__name__)

_ROWS = 3  # a partial tile of rows, as a small decode batch is
# Programs to aim for: 1 never splits K; the other more than any layer's tiles times its
# groups, so every group is a range of its own.
_TARGETS = (1, 2**31 - 1)
# Relative to the largest output: float32 summation order; else the roundings of a
# half-precision output on both paths (2^-8 each for bfloat16), with room for the order.
_TOLERANCE = {torch.float32: 1e-4}


@dataclass(frozen=True, slots=True, order=True)
class MatmulShape:
    """One layer as the kernel sees it."""

    scheme: WeightQuantization
    group_size: int
    out_features: int
    in_features: int

    @classmethod
    def of(cls, layer: QuantizedLinear) -> MatmulShape:
        return cls(layer.scheme, layer.group_size, layer.out_features, layer.in_features)


def choose_matmul_kernel(model: nn.Module, *, device: torch.device) -> bool:
    """Set every ``QuantizedLinear`` of ``model`` to the Triton kernel where it runs for
    all of their shapes (one probe, one log line), else to the torch path. Returns
    whether the kernel was chosen; ``False`` on a CPU, without triton or without
    quantized layers."""
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    use = bool(layers) and device.type == "cuda" and triton_matmul_available()
    if use:
        dtypes = {layer.dtype for layer in layers}
        assert len(dtypes) == 1, dtypes  # a model is built in one dtype
        shapes = tuple(sorted({MatmulShape.of(layer) for layer in layers}))
        use = triton_matmul_runs_on(device, dtypes.pop(), shapes)
    for layer in layers:
        layer.use_triton = use
    return use


@functools.cache
def triton_matmul_runs_on(
    device: torch.device, dtype: torch.dtype, shapes: tuple[MatmulShape, ...]
) -> bool:
    """Probe once per device, dtype and shapes (cached for the process)."""
    described = f"{len(shapes)} layer shape(s), {dtype}"
    try:
        error = max(_relative_error(device, dtype, shape) for shape in shapes)
    except Exception as exc:  # compile errors have many types; any means "not here"
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        logger.warning(
            "The Triton quantized matmul does not run on %s for %s: using the torch path. %s",
            device,
            described,
            reason[:500],
        )
        return False
    if not error <= _TOLERANCE.get(dtype, 1e-2):  # NaN fails too
        logger.warning(
            "The Triton quantized matmul on %s for %s differs from the torch path by up to "
            "%.3g of its largest output: using the torch path",
            device,
            described,
            error,
        )
        return False
    logger.info("The Triton quantized matmul runs on %s for %s", device, described)
    return True


def _relative_error(device: torch.device, dtype: torch.dtype, shape: MatmulShape) -> float:
    scheme, n, k = shape.scheme, shape.out_features, shape.in_features
    gen = torch.Generator(device=device).manual_seed(0)
    # Any byte is a valid code (int4 packs two nibbles); scales of a ~0.02 weight.
    codes = (n, scheme.packed_columns(k))
    qweight = torch.randint(-128, 128, codes, generator=gen, device=device, dtype=torch.int8)
    qweight = qweight.view(scheme.storage_dtype)
    scales = (torch.rand((n, k // shape.group_size), generator=gen, device=device) * 3e-3).to(dtype)
    x = torch.randn((_ROWS, k), generator=gen, device=device).to(dtype)
    # The torch path as a layer takes it: the weight dequantized to the input's dtype.
    weight = dequantize(qweight, scales, scheme, group_size=shape.group_size, dtype=dtype)
    want = F.linear(x, weight).float()
    errors = []
    for target in _TARGETS:
        got = dequant_matmul(x, qweight, scales, scheme, shape.group_size, target_programs=target)
        errors.append((got.float() - want).abs().max() / want.abs().max())
    # NaN as infinity: Python's max over the shapes would drop a NaN it meets second.
    return torch.stack(errors).max().nan_to_num(nan=math.inf).item()
