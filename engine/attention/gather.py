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
- Prefill chunks run one sequence at a time (few per step) through ``sdpa_prefill``:
  the cached keys (no mask) and the chunk's own keys (square, causal) attended apart,
  on the fused kernels ``sdpa_probe`` found, and merged by log-sum-exp; no mask
  tensor and no materialized scores on any device. A sequence whose blocks form one
  run (consecutive ids) is read as a zero-copy view of the cache; others are gathered.

All index and mask tensors are built on the device in ``prepare``, without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata
from engine.attention.reference import write_kv
from engine.attention.sdpa_prefill import attend_chunk
from engine.attention.sdpa_probe import probe_sdpa
from engine.host_staging import stage_values

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
    start_slot: int | None  # the first slot of a sequence whose blocks form one run


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
            table = metadata.block_tables_cpu[s][:num_blocks]
            one_run = all(b == table[0] + i for i, b in enumerate(table))
            prefills.append(
                _Prefill(
                    first_row=first_rows[s],
                    num_queries=q_len,
                    seq_len=s_len,
                    blocks=metadata.block_tables[s, :num_blocks],
                    start_slot=table[0] * block_size if one_run else None,
                )
            )
        decodes = []
        for members in buckets.values():
            width = max(-(-metadata.seq_lens_cpu[s] // block_size) for s in members)
            seqs = stage_values(members, dtype=torch.int64, device=device)
            seq_lens = metadata.seq_lens.index_select(0, seqs)  # [R]
            tables = metadata.block_tables.index_select(0, seqs)[:, :width]  # [R, W]
            rows = [first_rows[s] for s in members]
            real = torch.arange(width, device=device)[None, :] * block_size < seq_lens[:, None]
            positions = torch.arange(width * block_size, device=device)
            visible = positions[None, :] < seq_lens[:, None]
            decodes.append(
                _Decodes(
                    rows=stage_values(rows, dtype=torch.int64, device=device),
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
            num_rows = batch.blocks.shape[0]
            ids = batch.blocks.flatten()
            keys = key_cache.index_select(0, ids).view(num_rows, -1, kv_heads, head_dim)
            values = value_cache.index_select(0, ids).view(num_rows, -1, kv_heads, head_dim)
            attended = F.scaled_dot_product_attention(
                folded.index_select(0, batch.rows),
                keys.transpose(1, 2),  # [R, Hkv, W * B, D]
                values.transpose(1, 2),
                attn_mask=batch.mask,
                scale=scale,
            )  # [R, Hkv, G, D]
            out.index_copy_(0, batch.rows, attended.flatten(1, 2).to(out.dtype))
        if self._prefills:
            support = probe_sdpa(q.device)
            slots_k = key_cache.view(-1, kv_heads, head_dim)  # [N * B, Hkv, D]
            slots_v = value_cache.view(-1, kv_heads, head_dim)
        for prefill in self._prefills:
            if prefill.start_slot is not None:  # one run: a view, no copy
                span = slice(prefill.start_slot, prefill.start_slot + prefill.seq_len)
                keys, values = slots_k[span], slots_v[span]
            else:
                keys = key_cache.index_select(0, prefill.blocks).flatten(0, 1)[: prefill.seq_len]
                values = value_cache.index_select(0, prefill.blocks).flatten(0, 1)
                values = values[: prefill.seq_len]
            rows = slice(prefill.first_row, prefill.first_row + prefill.num_queries)
            out[rows] = attend_chunk(q[rows], keys, values, scale=scale, support=support)
        return out
