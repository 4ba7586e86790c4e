"""A linear layer whose weight is stored quantized: int8 or packed int4 codes plus scales.

``QuantizedLinear`` replaces ``nn.Linear`` in the decoder's projections when the engine
is built with ``quantize``. Its forward picks one of two paths with the same result up
to float rounding:

- the torch reference: dequantize the weight to the input's dtype, then ``F.linear``
  (on CPU, and on GPUs without Triton): one layer's full-precision weight exists at a
  time, for the length of the matmul;
- the Triton kernel (``engine.quantization.triton_kernel``) on CUDA/ROCm where Triton is
  installed and the startup probe found it runs for the model's layers
  (``triton_probe.choose_matmul_kernel`` sets ``use_triton``): codes are dequantized tile
  by tile in registers, never written out. Only for up to ``TRITON_MAX_ROWS`` rows (a
  decode batch): its fixed tiles dequantize each weight tile once per 16 rows, so a
  2,048-token prefill would dequantize it 128 times; past that the weight is dequantized
  once and the matmul is the vendor library's (vLLM's AWQ layer switches the same way, at
  256 rows).

Weights arrive through ``QuantizedRows``, a row range of the layer that quantizes what is
copied into it, so the loader fills a fused projection (q, k and v rows of ``qkv_proj``)
one checkpoint tensor, or one slice of rows, at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.quantization.scheme import (
    DEFAULT_GROUP_SIZE,
    WeightQuantization,
    check_shape,
    dequantize,
    quantize,
)

__all__ = ["TRITON_MAX_ROWS", "QuantizedLinear", "QuantizedRows", "make_linear"]

TRITON_MAX_ROWS = 256  # the most rows (tokens) a step sends through the Triton kernel


class QuantizedLinear(nn.Module):
    """``y = x @ dequantize(W).T + b`` with W held as codes and group-wise scales."""

    qweight: torch.Tensor
    scales: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: bool,
        scheme: WeightQuantization,
        dtype: torch.dtype,
        group_size: int = DEFAULT_GROUP_SIZE,
    ) -> None:
        super().__init__()
        check_shape(scheme, in_features, group_size, what=f"a {out_features} x {in_features} layer")
        self.in_features, self.out_features = in_features, out_features
        self.scheme, self.group_size, self.dtype = scheme, group_size, dtype
        self.register_buffer(
            "qweight",
            torch.empty(
                out_features, scheme.packed_columns(in_features), dtype=scheme.storage_dtype
            ),
        )
        self.register_buffer(
            "scales", torch.empty(out_features, in_features // group_size, dtype=dtype)
        )
        self.bias: nn.Parameter | None = (
            nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        )
        self.use_triton = False  # until the probe finds the kernel runs (on a GPU)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"scheme={self.scheme.value}, group_size={self.group_size}, "
            f"bias={self.bias is not None}"
        )

    def rows(self, start: int = 0, stop: int | None = None) -> QuantizedRows:
        """The rows ``[start, stop)`` as a target the loader can ``copy_`` into."""
        return QuantizedRows(self, start, self.out_features if stop is None else stop)

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:  # [N, K]
        return dequantize(
            self.qweight, self.scales, self.scheme, group_size=self.group_size, dtype=dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        if (
            self.use_triton
            and x.device.type == "cuda"
            and x.numel() <= TRITON_MAX_ROWS * x.shape[-1]
        ):
            from engine.quantization.triton_matmul import dequant_matmul

            out = dequant_matmul(x, self.qweight, self.scales, self.scheme, self.group_size)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)


class QuantizedRows:
    """Rows ``[start, stop)`` of a ``QuantizedLinear``'s weight, seen as a write target.

    It has the ``shape`` of the full-precision rows it stands for, and ``copy_`` (what
    the loader and the preset initializer call on a plain tensor view) quantizes its
    source into the layer's codes and scales. ``copy_rows`` fills part of the range, so
    a checkpoint tensor can be streamed in slices of rows.
    """

    __slots__ = ("layer", "start", "stop")

    def __init__(self, layer: QuantizedLinear, start: int, stop: int) -> None:
        assert 0 <= start <= stop <= layer.out_features
        self.layer, self.start, self.stop = layer, start, stop

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.stop - self.start, self.layer.in_features))

    def split(self, sizes: tuple[int, ...] | list[int], dim: int = 0) -> list[QuantizedRows]:
        """Consecutive row ranges, as ``Tensor.split`` along dim 0 (fused projections)."""
        assert dim == 0 and sum(sizes) == self.stop - self.start
        parts, begin = [], self.start
        for size in sizes:
            parts.append(QuantizedRows(self.layer, begin, begin + size))
            begin += size
        return parts

    def copy_(self, source: torch.Tensor) -> QuantizedRows:
        assert tuple(source.shape) == tuple(self.shape), (source.shape, self.shape)
        self.copy_rows(0, source)
        return self

    @torch.no_grad()
    def copy_rows(self, offset: int, source: torch.Tensor) -> None:
        """Quantize ``source`` [n, K] into rows ``start + offset ...`` of the layer."""
        layer = self.layer
        begin = self.start + offset
        end = begin + source.shape[0]
        assert end <= self.stop and source.shape[1] == layer.in_features
        q = quantize(
            source.to(layer.qweight.device),
            layer.scheme,
            group_size=layer.group_size,
            scale_dtype=layer.scales.dtype,
        )
        layer.qweight[begin:end].copy_(q.qweight)
        layer.scales[begin:end].copy_(q.scales)

    def dequantize(self) -> torch.Tensor:  # [stop - start, K] in the layer's dtype
        layer = self.layer
        return dequantize(
            layer.qweight[self.start : self.stop],
            layer.scales[self.start : self.stop],
            layer.scheme,
            group_size=layer.group_size,
        )


def make_linear(
    in_features: int,
    out_features: int,
    *,
    bias: bool,
    dtype: torch.dtype,
    quantization: WeightQuantization | None,
) -> nn.Linear | QuantizedLinear:
    if quantization is None:
        return nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    return QuantizedLinear(in_features, out_features, bias=bias, scheme=quantization, dtype=dtype)
