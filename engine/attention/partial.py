"""Partial attention: attend over one slice of the keys, keep the log-sum-exp, merge.

Split-KV, as flash-decoding does it: softmax attention over keys split into disjoint
parts ``K1, K2, ...`` equals the partial results over each part merged by their
log-sum-exps,

    lse = log Σ_i exp(lse_i)        out = Σ_i exp(lse_i - lse) · out_i

so a sequence's keys can be attended in parts wherever they lie in the paged cache
(a zero-copy run, a staged copy of some blocks), and many sequences' parts batched
into one kernel call, with no contiguous copy of any whole sequence.

Invariant for callers: every query row handed to ``attend`` sees at least one key
(torch's CPU kernel returns an LSE of 0, not -inf, for a fully masked row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.attention.torch_features import flash_cpu_op, flash_cpu_shares_kv_heads
from engine.host_staging import stage_tensor

__all__ = ["MergeLayout", "attend", "merge_partials"]


def attend(
    q: torch.Tensor,  # [B, Hq, Lq, D], any strides with a unit last stride
    k: torch.Tensor,  # [B, Hkv, Lk, D]
    v: torch.Tensor,  # [B, Hkv, Lk, D]
    *,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,  # additive, q's dtype, broadcastable to [B, 1, Lq, Lk]
) -> tuple[torch.Tensor, torch.Tensor]:  # [B, Hq, Lq, D] in q's dtype, [B, Hq, Lq] float32
    """Attention of ``q`` over ``k``/``v`` and its natural-log LSE.

    ``causal`` is top-left aligned: query row ``i`` sees keys ``0..i``. Query head ``h``
    reads key head ``h // (Hq // Hkv)``.
    """
    op = flash_cpu_op() if q.device.type == "cpu" else None
    if op is None:
        return _attend_math(q, k, v, scale=scale, causal=causal, mask=mask)
    group = q.shape[1] // k.shape[1]
    if group > 1 and not flash_cpu_shares_kv_heads():
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return op(q, k, v, 0.0, causal, attn_mask=mask, scale=scale)


def _attend_math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    scores = q.float() @ keys.transpose(-1, -2) * scale  # [B, Hq, Lq, Lk]
    if causal:
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(hidden, -math.inf)
    if mask is not None:
        scores = scores + mask.float()
    lse = scores.logsumexp(dim=-1)
    out = (scores - lse[..., None]).exp() @ values
    return out.to(q.dtype), lse


@dataclass(frozen=True, slots=True)
class MergeLayout:
    """Where each of ``P`` partial results goes, computed once per step.

    Merging is dense when little padding is needed: partials scattered into a
    ``[num_rows, width]`` grid (``width`` = the most partials of any row, holes at -inf)
    and combined with one softmax, half the kernel calls of the sparse scatter merge.
    """

    rows: torch.Tensor  # [P] int64: the output row of each partial
    slots: torch.Tensor | None  # [P] int64: row * width + rank in the row; None: sparse
    num_rows: int
    width: int
    one_per_row: bool  # each row has exactly one partial: placement, no arithmetic
    # [num_rows * width] int64: the partial in each cell, where every row has ``width``
    # partials (dense, no holes): the grid is gathered in one op per tensor instead of filled
    # and scattered into (two each). Sequences decoding side by side split alike.
    cells: torch.Tensor | None = None
    in_order: bool = False  # one partial per row, partial ``i`` for row ``i``

    @classmethod
    def build(cls, rows: torch.Tensor, *, num_rows: int) -> MergeLayout:
        """``rows`` on the CPU; every row in ``0..num_rows - 1`` must have a partial."""
        if rows.numel() == num_rows:  # so each row has exactly one: placement only
            in_order = bool(rows.equal(torch.arange(num_rows)))
            return cls(
                rows=rows,
                slots=None,
                num_rows=num_rows,
                width=1,
                one_per_row=True,
                in_order=in_order,
            )
        counts = torch.bincount(rows, minlength=num_rows)
        width = int(counts.max()) if rows.numel() else 0
        slots = None
        if num_rows * width <= 2 * rows.numel():
            order = torch.sort(rows, stable=True).indices
            first = torch.cumsum(counts, 0) - counts  # [num_rows]
            rank = torch.empty_like(rows)
            rank[order] = torch.arange(rows.numel()) - first[rows[order]]
            slots = rows * width + rank
        cells = None
        if slots is not None and num_rows * width == rows.numel():
            cells = torch.empty_like(slots)
            cells[slots] = torch.arange(rows.numel())
        return cls(
            rows=rows,
            slots=slots,
            num_rows=num_rows,
            width=width,
            one_per_row=width == 1,
            cells=cells,
        )

    def to(self, device: torch.device) -> MergeLayout:
        slots = None if self.slots is None else stage_tensor(self.slots, device)
        cells = None if self.cells is None else stage_tensor(self.cells, device)
        return MergeLayout(
            rows=stage_tensor(self.rows, device),
            slots=slots,
            num_rows=self.num_rows,
            width=self.width,
            one_per_row=self.one_per_row,
            cells=cells,
            in_order=self.in_order,
        )


def merge_partials(
    outs: torch.Tensor,  # [P, H, D]: partial outputs, any dtype
    lses: torch.Tensor,  # [P, H] float32
    layout: MergeLayout,
) -> torch.Tensor:  # [num_rows, H, D] float32
    """Combine the partials of each row by their log-sum-exps."""
    num_rows, num_heads = layout.num_rows, lses.shape[1]
    if layout.slots is not None:
        if layout.cells is not None:  # no holes: gather
            grid_lse = lses.index_select(0, layout.cells)  # [num_rows * width, H]
            grid_out = outs.float().index_select(0, layout.cells)
        else:
            cells = num_rows * layout.width
            grid_lse = torch.full((cells, num_heads), -math.inf, device=lses.device)
            grid_lse.index_copy_(0, layout.slots, lses)
            grid_out = torch.zeros((cells, *outs.shape[1:]), device=outs.device)
            grid_out.index_copy_(0, layout.slots, outs.float())
        # Softmax over the last axis: torch's CPU softmax over another axis opens a
        # parallel region even for a few hundred numbers, and each region waits up to a
        # scheduler tick (4 ms) for a worker thread when other processes hold the cores.
        weights = grid_lse.view(num_rows, layout.width, num_heads).transpose(1, 2).softmax(-1)
        grid = grid_out.view(num_rows, layout.width, *outs.shape[1:])
        return (grid * weights.transpose(1, 2)[..., None]).sum(dim=1)
    rows = layout.rows
    index = rows[:, None].expand(-1, num_heads)
    peak = torch.full((num_rows, num_heads), -math.inf, device=lses.device)
    peak.scatter_reduce_(0, index, lses, "amax")
    weights = (lses - peak.index_select(0, rows)).exp()  # [P, H], each in (0, 1]
    total = torch.zeros_like(peak).index_add_(0, rows, weights)
    weighted = outs.float() * weights[..., None]
    merged = torch.zeros((num_rows, *outs.shape[1:]), device=outs.device).index_add_(
        0, rows, weighted
    )
    return merged / total[..., None]
