"""What this torch build offers the attention kernels, checked once per process.

torch >= 2.4 must work. The checks below run tiny computations instead of parsing
version strings, because what matters is behaviour: torch 2.4's CPU flash kernel, for
one, accepts fewer key heads than query heads but then reads past the key tensor
instead of sharing heads. Each answer is cached by ``functools.cache`` and never
changes after it is first computed.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["FlashCpuOp", "flash_cpu_op", "flash_cpu_shares_kv_heads", "sdpa_enable_gqa"]


class FlashCpuOp(Protocol):
    """``aten::_scaled_dot_product_flash_attention_for_cpu``: output and log-sum-exp."""

    def __call__(
        self,
        query: torch.Tensor,  # [B, Hq, Lq, D]
        key: torch.Tensor,  # [B, Hkv, Lk, D]
        value: torch.Tensor,  # [B, Hkv, Lk, D]
        dropout_p: float = 0.0,
        is_causal: bool = False,
        *,
        attn_mask: torch.Tensor | None = None,  # additive, q's dtype, broadcast to [B, H, Lq, Lk]
        scale: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...  # [B, Hq, Lq, D], [B, Hq, Lq] float32


def _math_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = q @ k.transpose(-1, -2) * scale  # [B, H, Lq, Lk]
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()  # top-left aligned
        scores = scores.masked_fill(~keep, -math.inf)
    if mask is not None:
        scores = scores + mask
    lse = scores.logsumexp(-1)
    return (scores - lse[..., None]).exp() @ v, lse


@functools.cache
def flash_cpu_op() -> FlashCpuOp | None:
    """torch's CPU flash kernel when it exists, takes a mask, and returns the natural-log LSE
    with top-left causal alignment; ``None`` otherwise (callers fall back to plain math)."""
    packet = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if packet is None:
        return None
    op = packet.default
    if not {"attn_mask", "scale"} <= {arg.name for arg in op._schema.arguments}:
        return None
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=gen) for n in (3, 5, 5))
    mask = torch.zeros(2, 1, 1, 5)
    mask[0, ..., 1] = -math.inf
    for causal, attn_mask in ((True, None), (False, mask)):
        try:
            out, lse = op(q, k, v, 0.0, causal, attn_mask=attn_mask, scale=0.3)
        except RuntimeError:
            return None
        want_out, want_lse = _math_reference(q, k, v, causal=causal, scale=0.3, mask=attn_mask)
        if not (
            torch.allclose(out, want_out, atol=1e-5) and torch.allclose(lse, want_lse, atol=1e-5)
        ):
            return None
    return op


@functools.cache
def flash_cpu_shares_kv_heads() -> bool:
    """Whether the CPU flash kernel maps query head ``h`` to key head ``h // (Hq // Hkv)``."""
    op = flash_cpu_op()
    if op is None:
        return False
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 2, 8, generator=gen)
    # Keys and values are views into 4-head buffers: a kernel that ignores the head
    # count reads the extra heads (in bounds) and gives a different answer.
    k = torch.randn(1, 4, 3, 8, generator=gen)[:, :2]
    v = torch.randn(1, 4, 3, 8, generator=gen)[:, :2]
    try:
        out, _ = op(q, k, v, 0.0, False, scale=0.3)
    except RuntimeError:
        return False
    want, _ = _math_reference(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), causal=False, scale=0.3
    )
    return bool(torch.allclose(out, want, atol=1e-5))


@functools.cache
def sdpa_enable_gqa() -> bool:
    """Whether ``F.scaled_dot_product_attention`` takes ``enable_gqa`` (torch 2.5+)."""
    q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True
