"""Gather-then-SDPA paged attention: the GPU path, and the baseline the fast one beats.

Each step copies every sequence's blocks out of the cache into a padded batch and runs
``torch.nn.functional.scaled_dot_product_attention`` over it with a boolean mask, so
whichever fused kernel torch picks for the device (efficient attention on CUDA and
ROCm, flash on CPU) does the work. On a GPU the copy is cheap next to the memory
bandwidth it has; on a CPU it costs about as much as the attention (see
``kvgov bench attention``).

- Decodes (one query token each) are batched, bucketed by block count in powers of
  two so that padding at most doubles a bucket; grouped-query heads fold into the
  query axis, ``[R, Hkv, Hq / Hkv, D]``, so no kv head is repeated.
- Prefill chunks run one sequence at a time (few per step), bottom-right causal
  (query ``i`` of a chunk after ``C`` cached tokens sees positions ``0..C + i``) through
  torch's ``causal_lower_right`` bias, which fused kernels apply without a mask tensor;
  kv heads are repeated for it, as its fused paths want equal head counts. On ROCm a
  chunk after cached tokens gets an explicit boolean mask instead: there torch's
  lower-right bias reaches fused kernels that reject it ("Unsupported mask type on
  ROCM") or may align the diagonal top-left.

All index and mask tensors are built on the device in ``prepare``, without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, causal_lower_right

from engine.attention.metadata import AttentionMetadata
from engine.attention.reference import write_kv

__all__ = ["GatherAttention"]


@dataclass(frozen=True, slots=True)
class _Decodes:
    rows: torch.Tensor  # [R] int64: token indices
    blocks: torch.Tensor  # [R, W] int64, padded with block ids that hold finite K/V
    mask: torch.Tensor  # [R, 1, 1, W * block_size] bool: True where the key is visible


@dataclass(frozen=True, slots=True)
class _Prefill:
    first_row: int
    num_queries: int
    seq_len: int
    blocks: torch.Tensor  # [W] int64
    mask: torch.Tensor | CausalBias  # [Q, L] bool (True: visible) or lower-right causal


class GatherAttention:
    name = "gather"

    __slots__ = ("_decodes", "_planned_for", "_prefills")

    def __init__(self) -> None:
        self._decodes: tuple[_Decodes, ...] = ()
        self._prefills: tuple[_Prefill, ...] = ()
        self._planned_for: AttentionMetadata | None = None

    def prepare(self, metadata: AttentionMetadata) -> None:
        block_size = metadata.block_size
        device = metadata.seq_lens.device
        first_rows = [0]
        for n in metadata.query_lens_cpu:
            first_rows.append(first_rows[-1] + n)
        buckets: dict[int, list[int]] = {}
        prefills = []
        for s, (q_len, s_len) in enumerate(
            zip(metadata.query_lens_cpu, metadata.seq_lens_cpu, strict=True)
        ):
            num_blocks = -(-s_len // block_size)
            if q_len == 1:
                buckets.setdefault(1 << (num_blocks - 1).bit_length(), []).append(s)
                continue
            prefills.append(
                _Prefill(
                    first_row=first_rows[s],
                    num_queries=q_len,
                    seq_len=s_len,
                    blocks=metadata.block_tables[s, :num_blocks],
                    mask=_prefill_mask(q_len, s_len, device),
                )
            )
        decodes = []
        for members in buckets.values():
            width = max(-(-metadata.seq_lens_cpu[s] // block_size) for s in members)
            seqs = torch.tensor(members, dtype=torch.int64).to(device, non_blocking=True)
            seq_lens = metadata.seq_lens.index_select(0, seqs)  # [R]
            tables = metadata.block_tables.index_select(0, seqs)[:, :width]  # [R, W]
            real = torch.arange(width, device=device)[None, :] * block_size < seq_lens[:, None]
            positions = torch.arange(width * block_size, device=device)
            visible = positions[None, :] < seq_lens[:, None]
            rows = torch.tensor([first_rows[s] for s in members], dtype=torch.int64)
            decodes.append(
                _Decodes(
                    rows=rows.to(device, non_blocking=True),
                    blocks=torch.where(real, tables, tables[:, :1]),
                    mask=visible[:, None, None, :],
                )
            )
        self._decodes, self._prefills = tuple(decodes), tuple(prefills)
        self._planned_for = metadata

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
    ) -> torch.Tensor:  # [T, Hq, D]
        if self._planned_for is not metadata:
            self.prepare(metadata)
        write_kv(k, v, key_cache, value_cache, metadata.slot_mapping)
        kv_heads, head_dim = key_cache.shape[2:]
        out = torch.empty_like(q)
        q = q.to(key_cache.dtype)  # SDPA wants one dtype
        folded = q.view(q.shape[0], kv_heads, -1, head_dim)  # [T, Hkv, G, D]
        for batch in self._decodes:
            rows = batch.blocks.shape[0]
            ids = batch.blocks.flatten()
            keys = key_cache.index_select(0, ids).view(rows, -1, kv_heads, head_dim)
            values = value_cache.index_select(0, ids).view(rows, -1, kv_heads, head_dim)
            attended = F.scaled_dot_product_attention(
                folded.index_select(0, batch.rows),
                keys.transpose(1, 2),  # [R, Hkv, W * B, D]
                values.transpose(1, 2),
                attn_mask=batch.mask,
                scale=scale,
            )  # [R, Hkv, G, D]
            out.index_copy_(0, batch.rows, attended.flatten(1, 2).to(out.dtype))
        for prefill in self._prefills:
            keys = key_cache.index_select(0, prefill.blocks).flatten(0, 1)[: prefill.seq_len]
            values = value_cache.index_select(0, prefill.blocks).flatten(0, 1)[: prefill.seq_len]
            group = q.shape[1] // kv_heads
            rows = slice(prefill.first_row, prefill.first_row + prefill.num_queries)
            out[rows] = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1)[None],  # [1, Hq, Q, D]
                keys.repeat_interleave(group, dim=1).transpose(0, 1)[None],  # [1, Hq, L, D]
                values.repeat_interleave(group, dim=1).transpose(0, 1)[None],
                attn_mask=prefill.mask,
                scale=scale,
            )[0].transpose(0, 1)
        return out


def _explicit_causal_mask(device: torch.device) -> bool:
    """Whether lower-right causal attention needs a mask tensor on ``device``: on ROCm
    (torch 2.4 and some later releases) ``causal_lower_right`` dispatches to fused
    kernels that raise "Unsupported mask type on ROCM" or may align the diagonal top-left."""
    return device.type == "cuda" and bool(torch.version.hip)


def _prefill_mask(
    num_queries: int, seq_len: int, device: torch.device
) -> torch.Tensor | CausalBias:
    """Query ``i`` of a chunk after ``seq_len - num_queries`` cached tokens sees keys
    ``0..seq_len - num_queries + i``; a square chunk is plain (top-left) causal."""
    if num_queries == seq_len or not _explicit_causal_mask(device):
        return causal_lower_right(num_queries, seq_len)
    visible = torch.ones(num_queries, seq_len, dtype=torch.bool, device=device)
    return visible.tril_(seq_len - num_queries)  # [Q, L], built on the device: no copy
