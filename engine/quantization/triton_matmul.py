"""Launching the Triton dequantize-and-multiply kernel for ``QuantizedLinear``.

Used on CUDA and ROCm when Triton is importable (GPU builds of torch ship it) and the
kernel compiles and runs for the model's layers (``triton_probe``); the CPU keeps the
torch reference path. Under ``TRITON_INTERPRET=1`` the same launcher runs the kernel on
CPU tensors, which is how the test suite checks it without a GPU.

Split-K: a decode's few rows make one tile of rows, so a layer of 4,096 outputs is 64
programs, half of an H100's 132 multiprocessors, each walking all of K alone. Where the
tiles are fewer than ``target_programs`` (2 per multiprocessor), K is cut into ranges of
whole groups (``split_k``), one program per tile and range, and the ranges' float32
partial sums are added by ``torch.sum`` over a ``[splits, M, N]`` workspace, then cast.
Not ``tl.atomic_add`` (which Triton's interpreter runs too): the order in which a GPU's
atomics add is not fixed, so the same step could give different tokens, and a zeroed
buffer and a cast would cost the same two small launches as the sum and the cast.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

from engine.device import multiprocessors
from engine.quantization.scheme import WeightQuantization

__all__ = ["dequant_matmul", "split_k", "triton_matmul_available"]

_BLOCK_M = 16  # tl.dot's smallest tile; decode batches are masked into it
_BLOCK_N = 64
_BLOCK_K = 64  # divides every supported group size (even, >= 64 in practice)
# Programs to aim for per multiprocessor before K is split: two, so one can run while
# the other waits on memory; a split past that only adds partial sums to add up. The
# workspace then holds about that many tiles (1 MiB on an H100's 132).
_PROGRAMS_PER_MULTIPROCESSOR = 2


@functools.cache
def triton_matmul_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def split_k(*, num_programs: int, k_groups: int, target_programs: int) -> int:
    """K ranges per output tile: enough for ``num_programs`` tiles to make
    ``target_programs`` programs, each range a whole number of the ``k_groups``
    quantization groups (each a whole number of the kernel's K steps), none empty; 1
    where the tiles alone are enough."""
    if num_programs <= 0 or num_programs >= target_programs or k_groups <= 1:
        return 1
    want = min(-(-target_programs // num_programs), k_groups)
    per_range = -(-k_groups // want)  # groups per range; the last range may have fewer
    return -(-k_groups // per_range)


def dequant_matmul(
    x: torch.Tensor,  # [..., K]
    qweight: torch.Tensor,  # [N, K] int8 or [N, K // 2] uint8
    scales: torch.Tensor,  # [N, K // G]
    scheme: WeightQuantization,
    group_size: int,
    *,
    target_programs: int | None = None,
) -> torch.Tensor:  # [..., N] in x's dtype
    """``x @ dequantize(qweight, scales).T``. ``target_programs``: programs to aim for
    before K is split; ``None`` is 2 per multiprocessor of a GPU, and never split on a
    CPU (under the interpreter, where splitting gains nothing)."""
    from engine.quantization.triton_kernel import dequant_matmul_kernel

    rows = x.reshape(-1, x.shape[-1]).contiguous()
    num_rows, k = rows.shape
    n = qweight.shape[0]
    tiles = (-(-num_rows // _BLOCK_M), -(-n // _BLOCK_N))
    if target_programs is None:
        target_programs = _targets(x.device)
    k_groups = k // group_size
    splits = split_k(
        num_programs=tiles[0] * tiles[1], k_groups=k_groups, target_programs=target_programs
    )
    k_per_split = -(-k_groups // splits) * group_size
    if splits == 1:
        out = torch.empty(num_rows, n, dtype=x.dtype, device=x.device)
    else:  # float32 partial sums, slice s for range s: [splits, M, N]
        out = torch.empty(splits, num_rows, n, dtype=torch.float32, device=x.device)
    dequant_matmul_kernel()[(*tiles, splits)](
        rows,
        qweight,
        scales,
        out,
        num_rows,
        n,
        k,
        k_per_split,
        rows.stride(0),
        qweight.stride(0),
        scales.stride(0),
        out.stride(-2),  # a workspace slice is laid out as the output
        GROUP=group_size,
        INT4=scheme is WeightQuantization.INT4,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=_BLOCK_N,
        BLOCK_K=_block_k(group_size),
        DOT_FP32=x.dtype == torch.bfloat16 and _interpreting(),
        enable_fp_fusion=True,  # FMA contraction, asked for: Triton 3.9 warns otherwise
    )
    if splits > 1:
        out = out.sum(dim=0).to(x.dtype)
    return out.reshape(*x.shape[:-1], n)


def _targets(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return _PROGRAMS_PER_MULTIPROCESSOR * multiprocessors(device.index or 0)


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
