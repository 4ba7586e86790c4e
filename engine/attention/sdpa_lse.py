"""Attention with its log-sum-exp on torch's SDPA kernels, so parts can be merged.

``F.scaled_dot_product_attention`` returns no log-sum-exp, so the fused kernels are
called through the aten ops it dispatches to, which do:

- ``FLASH``: ``aten._scaled_dot_product_flash_attention`` (CUDA sm80+; ROCm through
  AOTriton), LSE ``[B, H, Lq]``;
- ``EFFICIENT``: ``aten._scaled_dot_product_efficient_attention`` (CUDA sm50+, ROCm),
  LSE ``[B, H, >= Lq]`` (padded to a multiple of 32 on some builds);
- ``CPU``: torch's CPU flash kernel (``partial.attend``);
- ``MATH``: plain torch, tiled over query rows so that no score tile exceeds
  ``math_budget_bytes``: a 2,048-token chunk after 8k cached tokens with 32 heads
  would otherwise materialize 2.7 GB of float32 scores.

Inputs are ``[B, H, L, D]`` with equal head counts for the fused GPU kernels (callers
fold or repeat grouped heads); causal is top-left (query row ``i`` sees keys ``0..i``).
The LSE is float32, natural log.
"""

from __future__ import annotations

import math
from enum import Enum

import torch

from engine.attention.partial import attend as attend_cpu

__all__ = ["SdpaKernel", "attend_lse", "math_tile_rows"]

_MIB = 1 << 20
# Score tiles of the math path hold about three float32 copies (scores, their exponent,
# the mask) at once.
_MATH_COPIES = 3


class SdpaKernel(Enum):
    FLASH = "flash"
    EFFICIENT = "efficient"
    CPU = "cpu"
    MATH = "math"


def math_tile_rows(
    *, batch: int, heads: int, num_queries: int, num_keys: int, budget_bytes: int
) -> int:
    """Query rows per tile of the math path: the most whose scores fit the budget."""
    row_bytes = _MATH_COPIES * 4 * batch * heads * max(num_keys, 1)
    return max(1, min(num_queries, budget_bytes // row_bytes))


def attend_lse(
    q: torch.Tensor,  # [B, H, Lq, D]
    k: torch.Tensor,  # [B, H or Hkv, Lk, D]
    v: torch.Tensor,  # [B, H or Hkv, Lk, D]
    *,
    scale: float,
    causal: bool,
    kernel: SdpaKernel,
    math_budget_bytes: int = 256 * _MIB,
) -> tuple[torch.Tensor, torch.Tensor]:  # [B, H, Lq, D] in q's dtype, [B, H, Lq] float32
    if kernel is SdpaKernel.FLASH:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, causal, False, scale=scale
        )[:2]
        return out, lse.float()
    if kernel is SdpaKernel.EFFICIENT:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, causal, scale=scale
        )[:2]
        return out, lse[..., : q.shape[2]].float()
    if kernel is SdpaKernel.CPU:
        return attend_cpu(q, k, v, scale=scale, causal=causal)
    return _math_tiled(q, k, v, scale=scale, causal=causal, budget_bytes=math_budget_bytes)


def _math_tiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    causal: bool,
    budget_bytes: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, num_queries, _ = q.shape
    num_keys = k.shape[2]
    group = heads // k.shape[1]
    if group > 1:  # keys are a small part of the memory next to the scores
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    keys, values = k.float(), v.float()
    rows = math_tile_rows(
        batch=batch,
        heads=heads,
        num_queries=num_queries,
        num_keys=num_keys,
        budget_bytes=budget_bytes,
    )
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    for start in range(0, num_queries, rows):
        stop = min(start + rows, num_queries)
        scores = q[:, :, start:stop].float() @ keys.transpose(-1, -2) * scale  # [B, H, r, Lk]
        if causal:
            position = torch.arange(start, stop, device=q.device)[:, None]
            hidden = torch.arange(num_keys, device=q.device)[None, :] > position
            scores.masked_fill_(hidden, -math.inf)
        tile_lse = scores.logsumexp(dim=-1)  # [B, H, r]
        scores.sub_(tile_lse[..., None]).exp_()
        out[:, :, start:stop] = (scores @ values).to(q.dtype)
        lse[:, :, start:stop] = tile_lse
    return out, lse
