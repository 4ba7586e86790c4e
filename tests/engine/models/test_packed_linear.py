"""The oneDNN-prepacked logits matmul agrees with F.linear and follows weight changes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.packed_linear import PackedLinear, onednn_packing_works


@pytest.mark.parametrize("rows", [1, 3, 8, 65])
def test_matches_f_linear(rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(1000, 64, generator=g)
    x = torch.randn(rows, 64, generator=g)
    out = PackedLinear()(x, weight)
    assert out.shape == (rows, 1000)
    torch.testing.assert_close(out, F.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_repacks_when_the_weight_changes_in_place() -> None:
    weight = torch.randn(300, 32)
    x = torch.randn(2, 32)
    matmul = PackedLinear()
    matmul(x, weight)
    with torch.no_grad():
        weight.mul_(-2.0)  # e.g. weights loaded after the first call
    torch.testing.assert_close(matmul(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-4)


def test_keeps_leading_dimensions_and_falls_back_for_other_dtypes() -> None:
    weight = torch.randn(50, 16)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(PackedLinear()(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-4)
    half_w, half_x = weight.half(), x.half()
    assert torch.equal(PackedLinear()(half_x, half_w), F.linear(half_x, half_w))


def test_probe_answers_the_same_every_time() -> None:
    assert onednn_packing_works() is onednn_packing_works()
