"""Weight-only int8/int4 quantization: round-to-nearest at load time, group-wise scales."""

from engine.quantization.linear import QuantizedLinear, QuantizedRows, make_linear
from engine.quantization.scheme import (
    DEFAULT_GROUP_SIZE,
    QuantizedWeight,
    WeightQuantization,
    dequantize,
    parse_quantization,
    quantize,
)

__all__ = [
    "DEFAULT_GROUP_SIZE",
    "QuantizedLinear",
    "QuantizedRows",
    "QuantizedWeight",
    "WeightQuantization",
    "dequantize",
    "make_linear",
    "parse_quantization",
    "quantize",
]
