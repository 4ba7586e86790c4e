"""Partial attention with log-sum-exp, its merge, and the torch feature checks."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.attention.partial import MergeLayout, attend, merge_partials
from engine.attention.torch_features import (
    flash_cpu_op,
    flash_cpu_shares_kv_heads,
    sdpa_enable_gqa,
)


def textbook(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * scale  # [B, H, Lq, Lk]
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:]).triu(1).bool(), -math.inf)
    return scores.softmax(-1) @ v, scores.logsumexp(-1)


def test_this_torch_has_the_cpu_flash_kernel_with_lse() -> None:
    # torch >= 2.4 ships it; losing it (a torch upgrade) would silently fall back to math.
    assert flash_cpu_op() is not None
    assert isinstance(flash_cpu_shares_kv_heads(), bool)
    assert isinstance(sdpa_enable_gqa(), bool)


@pytest.mark.parametrize("kernel", ["flash", "math"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_attend_returns_the_output_and_the_natural_log_sum_exp(
    kernel: str, causal: bool, group: int
) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2 * group, 5, 16, generator=gen)
    k, v = (torch.randn(2, 2, 9, 16, generator=gen) for _ in range(2))
    flash = flash_cpu_op() if kernel == "flash" else None
    with mock.patch("engine.attention.partial.flash_cpu_op", return_value=flash):
        out, lse = attend(q, k, v, scale=0.3, causal=causal)
    want_out, want_lse = textbook(q, k, v, scale=0.3, causal=causal)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernel", ["flash", "math"])
def test_attend_applies_an_additive_mask_broadcast_over_heads_and_rows(kernel: str) -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 4, 1, 8, generator=gen)
    k, v = (torch.randn(3, 2, 6, 8, generator=gen) for _ in range(2))
    mask = torch.zeros(3, 1, 1, 6)
    mask[0, ..., 4:] = -math.inf
    mask[2, ..., :1] = -math.inf
    flash = flash_cpu_op() if kernel == "flash" else None
    with mock.patch("engine.attention.partial.flash_cpu_op", return_value=flash):
        out, lse = attend(q, k, v, scale=0.5, mask=mask)
    for b, keep in enumerate([slice(0, 4), slice(0, 6), slice(1, 6)]):
        want_out, want_lse = textbook(
            q[b : b + 1], k[b : b + 1, :, keep], v[b : b + 1, :, keep], scale=0.5
        )
        torch.testing.assert_close(out[b : b + 1], want_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse[b : b + 1], want_lse, atol=1e-5, rtol=1e-5)


@settings(max_examples=60, deadline=None)
@given(
    num_rows=st.integers(1, 6),
    data=st.data(),
)
def test_merging_the_parts_of_a_split_equals_attending_the_whole(
    num_rows: int, data: st.DataObject
) -> None:
    """Each row's keys split at random into parts, the parts shuffled: merge == whole."""
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    lengths = data.draw(st.lists(st.integers(1, 12), min_size=num_rows, max_size=num_rows))
    heads, dim = 4, 8
    outs, lses, rows, want = [], [], [], []
    for row, length in enumerate(lengths):
        q = torch.randn(1, heads, 1, dim, generator=gen) * 3
        k, v = (torch.randn(1, heads, length, dim, generator=gen) * 3 for _ in range(2))
        want.append(textbook(q, k, v, scale=1.0)[0][0, :, 0])
        cuts = (
            sorted(data.draw(st.sets(st.integers(1, length - 1), max_size=3))) if length > 1 else []
        )
        for lo, hi in zip([0, *cuts], [*cuts, length], strict=True):
            out, lse = textbook(q, k[:, :, lo:hi], v[:, :, lo:hi], scale=1.0)
            outs.append(out[0, :, 0])
            lses.append(lse[0, :, 0])
            rows.append(row)
    order = data.draw(st.permutations(range(len(rows))))
    parts = torch.stack([outs[i] for i in order])  # [P, H, D]
    part_lses = torch.stack([lses[i] for i in order])  # [P, H]
    part_rows = torch.tensor([rows[i] for i in order])
    layout = MergeLayout.build(part_rows, num_rows=num_rows)
    sparse = MergeLayout(
        rows=part_rows, slots=None, num_rows=num_rows, width=layout.width, one_per_row=False
    )
    for merge in (layout, sparse):
        merged = merge_partials(parts, part_lses, merge)
        torch.testing.assert_close(merged, torch.stack(want), atol=1e-5, rtol=1e-5)


def test_merge_layout_is_dense_unless_it_would_mostly_pad() -> None:
    even = MergeLayout.build(torch.tensor([2, 0, 1, 0, 1, 2]), num_rows=3)
    assert even.slots is not None and even.width == 2 and not even.one_per_row
    assert sorted(even.slots.tolist()) == list(range(6))
    skewed = MergeLayout.build(torch.tensor([0, 0, 0, 0, 0, 1, 2, 3]), num_rows=4)
    assert skewed.slots is None and skewed.width == 5
    single = MergeLayout.build(torch.tensor([1, 0, 2]), num_rows=3)
    assert single.one_per_row


def test_a_merge_without_holes_gathers_its_grid_instead_of_filling_and_scattering() -> None:
    """Sequences decoding side by side split alike: every row has as many partials, and
    the grid is two gathers (no fill, no scatter into it: two ops fewer per layer)."""
    from torch.profiler import ProfilerActivity, profile

    rows = torch.tensor([1, 0, 2, 0, 2, 1])  # two partials per row
    layout = MergeLayout.build(rows, num_rows=3)
    assert layout.cells is not None and layout.slots is not None
    assert layout.cells[layout.slots].tolist() == list(range(6))
    gen = torch.Generator().manual_seed(0)
    outs, lses = torch.randn(6, 4, 8, generator=gen), torch.randn(6, 4, generator=gen)
    sparse = MergeLayout(rows=rows, slots=None, num_rows=3, width=2, one_per_row=False)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        merged = merge_partials(outs, lses, layout)
    torch.testing.assert_close(merged, merge_partials(outs, lses, sparse))
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::index_copy_", "aten::full", "aten::zeros"}
    holes = MergeLayout.build(torch.tensor([0, 0, 1, 2]), num_rows=3)
    assert holes.slots is not None and holes.cells is None
