"""Decode attention planned as staged tiles of gathered keys, batched across sequences.

A decode token reads its whole context once per layer, so decode attention is a
stream through memory, and torch's CPU flash kernel streams cold memory poorly.
Measured on a 2-core x86 CPU (8 x 4,096 tokens, K/V of 4 layers so every read is cold):
SDPA over contiguous K/V, 1.3-1.5 ms per layer; the kernel over the cache's runs in
place (one call per run; ``[N, B, Hkv, D]`` interleaves the heads), 1.5-1.7x that;
copying the same keys a few MiB at a time into a workspace that stays in the CPU
caches and attending the copy, 1.1-1.3x. So every decode is planned as:

- rows: each sequence cut into pieces of at most ``chunk_blocks`` blocks; a row is one
  (sequence, position range) pair whose query is the sequence's token;
- tiles: rows sorted by width and packed into tiles of about ``stage_tokens``
  positions, padded to the tile's widest row and masked; one tile is one gather into
  the workspace and one batched kernel call, and the rows' partial results merge by
  log-sum-exp.

Kernel calls per layer: about the step's decode tokens over ``stage_tokens``, however
many sequences there are and however fragmented their blocks. Rows give the kernel
``rows x kv_heads`` independent work items, so long sequences use every thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.gathered_keys import GatheredKeys

__all__ = ["DecodeTile", "plan_decode_tiles"]


@dataclass(frozen=True, slots=True)
class DecodeTile:
    rows: torch.Tensor  # [R] int64: the token (query) of each row
    keys: GatheredKeys  # [R, W] blocks; mask [R, 1, 1, W * block_size]

    def to(self, device: torch.device) -> DecodeTile:
        return DecodeTile(rows=self.rows.to(device, non_blocking=True), keys=self.keys.to(device))


def plan_decode_tiles(
    *,
    tables: torch.Tensor,  # [S, W] int64 block tables (CPU)
    seq_lens: torch.Tensor,  # [S] int64 (CPU)
    seqs: torch.Tensor,  # [Sd] int64: the decoding sequences
    token_rows: torch.Tensor,  # [Sd] int64: each one's token in the step's batch
    block_size: int,
    chunk_blocks: int,
    stage_tokens: int,
) -> list[DecodeTile]:
    if seqs.numel() == 0:
        return []
    lens = seq_lens[seqs]  # [Sd]
    num_blocks = (lens + block_size - 1) // block_size
    per_seq = (num_blocks + chunk_blocks - 1) // chunk_blocks
    owner = torch.repeat_interleave(torch.arange(seqs.numel()), per_seq)  # [rows] -> decode
    first_of_owner = torch.cumsum(per_seq, 0) - per_seq
    start = (torch.arange(owner.numel()) - first_of_owner[owner]) * chunk_blocks  # first block
    width = torch.clamp(num_blocks[owner] - start, max=chunk_blocks)  # blocks in the row
    order = torch.sort(width, descending=True, stable=True).indices
    owner, start, width = owner[order], start[order], width[order]  # rows, widest first

    widths = width.tolist()
    offsets = torch.arange(widths[0])
    real = offsets[None, :] < width[:, None]  # [rows, W]
    cols = start[:, None] + torch.where(real, offsets, 0)  # padding repeats the first block
    seq = seqs[owner]  # [rows]
    # A row covers consecutive positions from its first block on: a prefix is visible.
    visible_tokens = torch.clamp(seq_lens[seq] - start * block_size, max=width * block_size)
    blocks = tables[seq[:, None], cols]  # [rows, W]
    rows = token_rows[owner]

    tiles = []
    first = 0
    while first < len(widths):
        tile_width = widths[first]
        end = first + max(1, stage_tokens // (tile_width * block_size))
        keys = GatheredKeys.with_prefixes(
            blocks[first:end, :tile_width].contiguous(), visible_tokens[first:end], block_size
        )
        tiles.append(DecodeTile(rows=rows[first:end], keys=keys))
        first = end
    return tiles
