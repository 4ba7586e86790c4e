"""Launching the Triton dequantize-and-multiply kernel for ``QuantizedLinear``.

Used on CUDA and ROCm when Triton is importable (GPU builds of torch ship it) and the
kernel compiles and runs for the model's layers (``triton_probe``); the CPU keeps the
torch reference path. Under ``TRITON_INTERPRET=1`` the same launcher runs the kernel on
CPU tensors, which is how the test suite checks it without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from engine.quantization.scheme import WeightQuantization

__all__ = ["dequant_matmul", "triton_matmul_available"]

_BLOCK_M = 16  # tl.dot's smallest tile; decode batches are masked into it
_BLOCK_N = 64
_BLOCK_K = 64  # divides every supported group size (even, >= 64 in practice)


@functools.cache
def triton_matmul_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def dequant_matmul(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,  # [N, K] int8 or [N, K // 2] uint8
    scales: torch.Tensor,  # [N, K // G]
    scheme: WeightQuantization,
    group_size: int,
) -> torch.Tensor:  # [..., N] in x's dtype
    from engine.quantization.triton_kernel import dequant_matmul_kernel

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    num_rows, k = rows.shape
    n = qweight.shape[0]
    block_k = _block_k(group_size)
    out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    grid = (-(-num_rows // _BLOCK_M), -(-n // _BLOCK_N))
    dequant_matmul_kernel()[grid](
        rows,
        qweight,
        scales,
        out,
        num_rows,
        n,
        k,
        rows.stride(0),
        qweight.stride(0),
        scales.stride(0),
        out.stride(0),
        GROUP=group_size,
        INT4=scheme is WeightQuantization.INT4,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N,
        BLOCK_K=block_k,
        DOT_FP32=x.dtype == torch.bfloat16 and _interpreting(),
        enable_fp_fusion=True,  # FMA contraction, asked for: Triton 3.9 warns otherwise
    )
    return out.reshape(*x.shape[:-1], n)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _block_k(group_size: int) -> int:
    # A K step must stay inside one group (one scale per row) and, for int4, give
    # tl.dot at least 16 columns per nibble plane.
    for block in (_BLOCK_K, 32):
        if group_size % block == 0:
            return block
    raise ValueError(
        f"the Triton kernel needs a group size that is a multiple of 32, got {group_size}"
    )
