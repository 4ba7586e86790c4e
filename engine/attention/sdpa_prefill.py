"""A prefill chunk on the SDPA path: cached keys and new keys apart, merged by LSE.

A chunk of ``Q`` new tokens after ``C`` cached ones: query row ``i`` sees positions
``0..C + i``. In one SDPA call that is a bottom-right causal mask over ``C + Q`` keys,
which the fused kernels take only on some devices (on ROCm it means an explicit mask
tensor, so the math kernel, which materializes every score). Split instead:

- the cached part: every row sees all ``C`` keys, so no mask at all. Grouped query
  heads fold into the query axis (``[1, Hkv, Q * G, D]``): each kv head is read once,
  none repeated;
- the new part: ``Q x Q``, square, plain (top-left) causal: flash-eligible everywhere.
  Its kv heads are repeated (``Q`` tokens, as many as the queries);

and the two merged by their log-sum-exps (``partial``). A chunk with no cached tokens
is the new part alone, one plain SDPA call with ``enable_gqa`` where torch has it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.attention.sdpa_lse import SdpaKernel, attend_lse
from engine.attention.sdpa_probe import SdpaSupport

__all__ = ["attend_chunk"]


def attend_chunk(
    query: torch.Tensor,  # [Q, Hq, D]
    keys: torch.Tensor,  # [C + Q, Hkv, D]: the sequence's keys, the chunk's last
    values: torch.Tensor,  # [C + Q, Hkv, D]
    *,
    scale: float,
    support: SdpaSupport,
) -> torch.Tensor:  # [Q, Hq, D]
    num_queries, num_heads, head_dim = query.shape
    kv_heads = keys.shape[1]
    group = num_heads // kv_heads
    cached = keys.shape[0] - num_queries
    kernel = support.kernel_for(query.dtype, head_dim)
    q = query.transpose(0, 1)[None]  # [1, Hq, Q, D]
    new_k = keys[cached:].transpose(0, 1)[None]  # [1, Hkv, Q, D]
    new_v = values[cached:].transpose(0, 1)[None]
    if cached == 0 and kernel is not SdpaKernel.MATH:
        if group > 1 and not support.gqa:
            new_k = new_k.repeat_interleave(group, dim=1)
            new_v = new_v.repeat_interleave(group, dim=1)
        gqa: dict[str, Any] = {"enable_gqa": True} if group > 1 and support.gqa else {}
        out = F.scaled_dot_product_attention(q, new_k, new_v, is_causal=True, scale=scale, **gqa)
        return out[0].transpose(0, 1)

    if group > 1 and kernel is not SdpaKernel.CPU:  # the fused GPU ops want equal heads
        new_k = new_k.repeat_interleave(group, dim=1)
        new_v = new_v.repeat_interleave(group, dim=1)
    budget = support.math_budget_bytes
    out_new, lse_new = attend_lse(
        q, new_k, new_v, scale=scale, causal=True, kernel=kernel, math_budget_bytes=budget
    )  # [1, Hq, Q, D], [1, Hq, Q]
    if cached == 0:
        return out_new[0].transpose(0, 1)

    folded = query.view(num_queries, kv_heads, group, head_dim).permute(1, 0, 2, 3)
    folded = folded.reshape(1, kv_heads, num_queries * group, head_dim)  # [1, Hkv, Q*G, D]
    out_old, lse_old = attend_lse(
        folded,
        keys[:cached].transpose(0, 1)[None],  # [1, Hkv, C, D]
        values[:cached].transpose(0, 1)[None],
        scale=scale,
        causal=False,
        kernel=kernel,
        math_budget_bytes=budget,
    )
    # Back to [1, Hq, Q, ...]: head h = kv head h // G, member h % G.
    out_old = out_old.view(kv_heads, num_queries, group, head_dim).transpose(1, 2)
    out_old = out_old.reshape(1, num_heads, num_queries, head_dim)
    lse_old = lse_old.view(kv_heads, num_queries, group).transpose(1, 2)
    lse_old = lse_old.reshape(1, num_heads, num_queries)

    peak = torch.maximum(lse_old, lse_new)  # finite: row i sees key i among the new ones
    w_old = (lse_old - peak).exp()[..., None]
    w_new = (lse_new - peak).exp()[..., None]
    merged = (out_old.float() * w_old + out_new.float() * w_new) / (w_old + w_new)
    return merged[0].transpose(0, 1).to(query.dtype)
