"""Partial attention: attend over one slice of the keys, keep the log-sum-exp, merge.

Split-KV, as flash-decoding does it: softmax attention over keys ``K1 ∪ K2 ∪ ...`` equals
the partial results over each slice merged by their log-sum-exps,

    lse = log Σ_i exp(lse_i)        out = Σ_i exp(lse_i - lse) · out_i

so a sequence whose K/V lies in several runs of the paged cache is attended run by
run, each run a zero-copy view, with no contiguous copy of the whole sequence.

Invariant for callers: every query row handed to ``attend`` sees at least one key
(torch's CPU kernel returns an LSE of 0, not -inf, for a fully masked row).
"""

from __future__ import annotations

import math

import torch

from engine.attention.torch_features import flash_cpu_op, flash_cpu_shares_kv_heads

__all__ = ["attend", "merge_partials"]


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


def merge_partials(
    outs: torch.Tensor,  # [P, H, D]: partial outputs, any dtype
    lses: torch.Tensor,  # [P, H] float32
    rows: torch.Tensor,  # [P] int64: the output row each partial belongs to
    *,
    num_rows: int,
) -> torch.Tensor:  # [num_rows, H, D] float32
    """Combine the partials of each row; every row must have at least one."""
    num_heads = lses.shape[1]
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
