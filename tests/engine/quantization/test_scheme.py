"""Round-to-nearest with group-wise scales: the error bound, the int4 layout, bad input."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, InvalidRequestError
from engine.quantization import WeightQuantization, dequantize, parse_quantization, quantize
from engine.quantization.scheme import unpack_codes


@pytest.mark.parametrize("scheme", list(WeightQuantization))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_each_weight_is_within_half_a_step_of_its_group_scale(scheme, dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 256, generator=generator) * torch.rand(24, 1, generator=generator)
    q = quantize(weight, scheme, group_size=64, scale_dtype=dtype)
    assert q.qweight.dtype == scheme.storage_dtype
    assert q.qweight.shape == (24, 256 if scheme is WeightQuantization.INT8 else 128)
    assert q.scales.shape == (24, 4) and q.scales.dtype == dtype
    back = dequantize(q.qweight, q.scales, scheme, group_size=64, dtype=torch.float32)
    step = q.scales.float().repeat_interleave(64, dim=1)  # each weight's own group scale
    # Rounding to nearest moves a weight by at most half a step (plus float slack).
    assert ((back - weight).abs() <= step / 2 + 1e-6 * weight.abs()).all()
    # The largest weight of each group is exactly representable: it sets the scale.
    codes = unpack_codes(q.qweight, scheme).view(24, 4, 64)
    assert (codes.abs().amax(-1) == scheme.max_code).all()


def test_int4_packs_even_columns_low_and_odd_columns_high() -> None:
    # One group of 8 columns with scale 1 (max |w| = 7): codes are the weights themselves.
    weight = torch.tensor([[7.0, -7.0, 0.0, 1.0, -1.0, 3.0, 2.0, -2.0]])
    q = quantize(weight, WeightQuantization.INT4, group_size=8, scale_dtype=torch.float32)
    assert q.scales.tolist() == [[1.0]]
    # bytes: (w[2j] + 8) | (w[2j + 1] + 8) << 4
    assert q.qweight.tolist() == [[15 | 1 << 4, 8 | 9 << 4, 7 | 11 << 4, 10 | 6 << 4]]


def test_an_all_zero_group_encodes_as_zeros() -> None:
    for scheme in WeightQuantization:
        weight = torch.zeros(2, 16)
        weight[1, 8:] = scheme.max_code / 16  # scale 1/16, exact in every dtype
        q = quantize(weight, scheme, group_size=8, scale_dtype=torch.float16)
        back = dequantize(q.qweight, q.scales, scheme, group_size=8, dtype=torch.float32)
        assert torch.equal(back, weight)


def test_bad_settings_say_what_to_do() -> None:
    with pytest.raises(InvalidRequestError, match="'int8', 'int4' or None"):
        EngineConfig(quantize="int3")
    with pytest.raises(InvalidRequestError, match="'int8', 'int4' or None"):
        parse_quantization(4)
    assert parse_quantization(" INT4 ") is WeightQuantization.INT4
    with pytest.raises(InvalidRequestError, match="not a multiple of the int4 group size 128"):
        quantize(torch.ones(2, 96), WeightQuantization.INT4, scale_dtype=torch.float32)
