"""A CPU matmul with the weight prepacked for oneDNN, for the output projection.

On CPU the logits GEMM of a large vocabulary dominates a decode step, and its shape
(a few rows against a very wide weight) is the worst case for a plain GEMM: with 8 rows
against a 100k x 256 head, MKL reaches about 16 ms on two cores where oneDNN with a
prepacked weight takes about 4 ms. This is what ``torch.compile``'s CPU freezing does
for linears; here it is done directly, without a compile step.

The packed copy is remade whenever the weight changes in place (its ``_version``
moves), so loading weights after the first call is safe. It costs one extra copy of
the weight in memory. Results differ from ``F.linear`` by float rounding only (another
summation order). Where the private oneDNN ops are missing or disagree with
``F.linear`` on a probe, ``F.linear`` is used.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = ["PackedLinear", "onednn_packing_works"]

# Packing for a batch of 64 rows serves 1 to 64 rows about as well as exact-size packing.
_BATCH_HINT = 64


@functools.cache
def onednn_packing_works() -> bool:
    """Whether this torch build packs linear weights for oneDNN, and gets them right."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(48, 32, generator=generator)
        x = torch.randn(3, 32, generator=generator)
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT)
        out = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return torch.allclose(out, F.linear(x, weight), rtol=1e-4, atol=1e-4)


class PackedLinear:
    """``y = x @ weight.T`` for a CPU weight in float32 or bfloat16 (else ``F.linear``)."""

    __slots__ = ("_packed", "_source", "_version")

    def __init__(self) -> None:
        self._packed: torch.Tensor | None = None
        self._source: torch.Tensor | None = None
        self._version = -1

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        usable = (
            weight.device.type == "cpu"
            and weight.dtype in (torch.float32, torch.bfloat16)
            and x.dtype == weight.dtype
            and onednn_packing_works()
        )
        if not usable:
            return F.linear(x, weight)
        if self._source is not weight or self._version != weight._version:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _BATCH_HINT)
            self._source, self._version = weight, weight._version
        rows = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(rows, self._packed, None, "none", [], "")
        return out.reshape(*x.shape[:-1], out.shape[-1])
