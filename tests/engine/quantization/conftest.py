"""A recorder of the quantized matmul kernel's launches, shared by its kernel and probe tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def matmul_grids(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The grid of each launch of the dequantize-and-multiply kernel during the test
    (its third dimension the K ranges: 1 unsplit); the kernel itself runs as before."""
    from engine.quantization import triton_kernel

    kernel = triton_kernel.dequant_matmul_kernel  # the launcher looks it up at each call
    grids: list[tuple[int, ...]] = []

    class Recording:
        def __getitem__(self, grid: tuple[int, ...]):
            grids.append(tuple(grid))
            return kernel()[grid]

    monkeypatch.setattr(triton_kernel, "dequant_matmul_kernel", Recording)
    return grids
