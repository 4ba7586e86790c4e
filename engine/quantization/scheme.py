"""Weight-only quantization: which scheme, and round-to-nearest with group-wise scales.

A weight ``W [N, K]`` (N output rows, K input columns) is cut into groups of ``G``
consecutive input columns. Each group of each row gets one scale, its largest magnitude
over the largest code, and each weight becomes the nearest code ``round(w / scale)``:

    int8  codes -127..127, one per byte                       qweight [N, K]      int8
    int4  codes -7..7 stored as code + 8 in a nibble, two per  qweight [N, K // 2] uint8
          byte (column 2j in the low nibble, 2j + 1 in the high)
          scales [N, K // G] in the model's dtype (what the matmul multiplies by)

Symmetric (no zero point), so a group's error is at most half a scale step per weight.
The scale is rounded to its storage dtype *before* the codes are computed, so codes and
stored scales agree. Nothing here calibrates or claims quality: the error it introduces
is measured (``engine.benchmarks.quantization``) and reported, never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from engine.errors import InvalidRequestError

__all__ = [
    "DEFAULT_GROUP_SIZE",
    "QuantizedWeight",
    "WeightQuantization",
    "check_shape",
    "dequantize",
    "parse_quantization",
    "quantize",
    "unpack_codes",
]

DEFAULT_GROUP_SIZE = 128


class WeightQuantization(Enum):
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bits(self) -> int:
        return 8 if self is WeightQuantization.INT8 else 4

    @property
    def max_code(self) -> int:
        return 127 if self is WeightQuantization.INT8 else 7

    def packed_columns(self, in_features: int) -> int:
        return in_features if self is WeightQuantization.INT8 else in_features // 2

    @property
    def storage_dtype(self) -> torch.dtype:
        return torch.int8 if self is WeightQuantization.INT8 else torch.uint8


def parse_quantization(value: object) -> WeightQuantization | None:
    """``None``, "int8" or "int4" (any case) -> the scheme; anything else is refused."""
    if value is None or isinstance(value, WeightQuantization):
        return value
    if isinstance(value, str):
        try:
            return WeightQuantization(value.strip().lower())
        except ValueError:
            pass
    raise InvalidRequestError(
        f"quantize must be 'int8', 'int4' or None (full-precision weights), got {value!r}; "
        "int4 takes about a quarter of bf16's weight memory, int8 about half"
    )


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    qweight: torch.Tensor  # [N, K] int8, or [N, K // 2] uint8 for int4
    scales: torch.Tensor  # [N, K // G], the model dtype
    scheme: WeightQuantization
    group_size: int


def check_shape(
    scheme: WeightQuantization, in_features: int, group_size: int, *, what: str = "weight"
) -> None:
    """Refuse a shape the layout cannot hold, naming what to change."""
    if group_size < 2 or group_size % 2:
        raise InvalidRequestError(f"group_size must be an even int >= 2, got {group_size!r}")
    if in_features % group_size:
        raise InvalidRequestError(
            f"{what} has {in_features} input columns, not a multiple of the {scheme.value} "
            f"group size {group_size}; load this model without quantize (or with a group "
            "size that divides every layer's input size)"
        )


def quantize(
    weight: torch.Tensor,  # [N, K], any float dtype
    scheme: WeightQuantization,
    *,
    group_size: int = DEFAULT_GROUP_SIZE,
    scale_dtype: torch.dtype,
) -> QuantizedWeight:
    """Round-to-nearest with one scale per ``group_size`` input columns of each row.

    Works on ``weight``'s device in float32; the caller bounds the transient memory by
    passing row slices (the loader does), since the float32 copy is 2-4x the slice.
    """
    rows, cols = weight.shape
    check_shape(scheme, cols, group_size)
    # A float32 copy the rounding may overwrite (the caller's tensor is never written).
    work = weight.to(torch.float32, copy=True).view(rows, cols // group_size, group_size)
    # The largest magnitude per group, without a |w| temporary (and 15x faster on a CPU
    # than vector_norm(ord=inf)).
    absmax = torch.maximum(work.amax(dim=-1), work.amin(dim=-1).neg_())  # [N, Gs]
    scales = (absmax / scheme.max_code).to(scale_dtype)
    # An all-zero group (or a scale that underflows its dtype) divides by the smallest
    # normal float32 and encodes as zeros.
    divisor = scales.to(torch.float32).clamp_min_(torch.finfo(torch.float32).tiny)
    codes = work.div_(divisor.unsqueeze(-1)).round_().clamp_(-scheme.max_code, scheme.max_code)
    codes = codes.view(rows, cols)
    if scheme is WeightQuantization.INT8:
        qweight = codes.to(torch.int8)
    else:  # (even + 8) | (odd + 8) << 4
        pairs = codes.add_(8).to(torch.uint8).view(rows, cols // 2, 2)
        qweight = pairs[..., 0] | (pairs[..., 1] << 4)
    return QuantizedWeight(qweight.contiguous(), scales, scheme, group_size)


def unpack_codes(qweight: torch.Tensor, scheme: WeightQuantization) -> torch.Tensor:
    """The signed codes [N, K] as int8, whichever the packing."""
    if scheme is WeightQuantization.INT8:
        return qweight
    low = (qweight & 0x0F).to(torch.int8) - 8
    high = (qweight >> 4).to(torch.int8) - 8
    return torch.stack((low, high), dim=-1).view(qweight.shape[0], -1)


def dequantize(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    scheme: WeightQuantization,
    *,
    group_size: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:  # [N, K] in ``dtype`` (default: the scales' dtype)
    dtype = scales.dtype if dtype is None else dtype
    codes = unpack_codes(qweight, scheme)
    rows, cols = codes.shape
    grouped = codes.view(rows, cols // group_size, group_size).to(dtype)
    return (grouped * scales.to(dtype).unsqueeze(-1)).view(rows, cols)
