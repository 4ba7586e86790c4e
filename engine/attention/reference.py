"""Reference paged attention: plain torch, one sequence at a time, correct everywhere.

It gathers each sequence's K/V from its blocks into a contiguous copy and runs the
textbook computation in float32. Slow by design; the fast backends are tested against
it.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata

__all__ = ["ReferenceAttention", "write_kv"]


def write_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    key_cache: torch.Tensor,  # [N, B, Hkv, D]
    value_cache: torch.Tensor,  # [N, B, Hkv, D]
    slot_mapping: torch.Tensor,  # [T]
) -> None:
    """Write each new token's K/V straight into its slot."""
    key_cache.view(-1, *key_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(key_cache.dtype))
    value_cache.view(-1, *value_cache.shape[2:]).index_copy_(
        0, slot_mapping, v.to(value_cache.dtype)
    )


class ReferenceAttention:
    name = "reference"

    def prepare(self, metadata: AttentionMetadata) -> None:
        pass  # nothing to plan: every call works from the metadata alone

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        key_cache: torch.Tensor,  # [N, B, Hkv, D]
        value_cache: torch.Tensor,  # [N, B, Hkv, D]
        metadata: AttentionMetadata,
        *,
        scale: float,
    ) -> torch.Tensor:
        write_kv(k, v, key_cache, value_cache, metadata.slot_mapping)
        num_q_heads, num_kv_heads = q.shape[1], k.shape[1]
        group = num_q_heads // num_kv_heads
        block_size = metadata.block_size
        out = torch.empty_like(q)
        start = 0
        for q_len, s_len, table in zip(
            metadata.query_lens_cpu, metadata.seq_lens_cpu, metadata.block_tables_cpu, strict=True
        ):
            blocks = torch.tensor(table[: -(-s_len // block_size)], device=q.device)
            keys = key_cache[blocks].flatten(0, 1)[:s_len]  # [S, Hkv, D]
            values = value_cache[blocks].flatten(0, 1)[:s_len]
            keys = keys.repeat_interleave(group, dim=1).float()  # [S, Hq, D]
            values = values.repeat_interleave(group, dim=1).float()
            query = q[start : start + q_len].float()  # [Q, Hq, D]
            scores = torch.einsum("qhd,shd->hqs", query, keys) * scale  # [Hq, Q, S]
            positions = torch.arange(s_len - q_len, s_len, device=q.device)
            causal = torch.arange(s_len, device=q.device)[None, :] > positions[:, None]
            scores.masked_fill_(causal[None], float("-inf"))
            probs = scores.softmax(dim=-1)
            out[start : start + q_len] = torch.einsum("hqs,shd->qhd", probs, values).to(q.dtype)
            start += q_len
        return out
