"""Decode attention over gathered keys: staged tiles, batched across sequences.

What ``decode_views`` does not read in place (short runs, scattered blocks, a run's last
blocks short of a whole chunk, a partly written last block) is copied a few MiB at a
time into a workspace and attended there. The copy is a second pass over those keys
before the kernel reads them, so it costs most where memory is slow against the
arithmetic: about 0.3x of the attention where this was written (a copy at ~40 GB/s, the
kernel reading at 7-12 GB/s), 0.9-1.0x on another 2-core x86 machine of the same kind.
The rest is planned as:

- rows: each sequence's remaining blocks cut into pieces of at most ``chunk_blocks``; a
  row is one (sequence, position range) pair whose query is the sequence's token;
- tiles: rows sorted by width and packed into tiles of about ``stage_tokens``
  positions, padded to the tile's widest row and masked; one tile is one gather into
  the workspace and one batched kernel call, and the rows' partial results merge by
  log-sum-exp.

Kernel calls: about the gathered tokens over ``stage_tokens``, however many sequences
there are and however fragmented their blocks. Rows give the kernel
``rows x kv_heads`` independent work items, so long sequences use every thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.gathered_keys import GatheredKeys
from engine.host_staging import stage_tensor

__all__ = ["DecodeTile", "plan_decode_tiles"]


@dataclass(frozen=True, slots=True)
class DecodeTile:
    rows: torch.Tensor  # [R] int64: the token (query) of each row
    keys: GatheredKeys  # [R, W] blocks; mask [R, 1, 1, W * block_size]
    every_token: bool = False  # rows are the step's tokens 0..R-1: no query gather

    def to(self, device: torch.device) -> DecodeTile:
        return DecodeTile(
            rows=stage_tensor(self.rows, device),
            keys=self.keys.to(device),
            every_token=self.every_token,
        )


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
    # Rows are planned on Python lists: a step has a few rows per sequence, and on a
    # 2-core host each small tensor op costs ~10 us (~20 of them were half a decode
    # step's planning). Only the block ids are gathered as a tensor.
    lens = seq_lens[seqs].tolist()
    pieces = []  # (blocks in the row, its decode, its first block)
    for decode, length in enumerate(lens):
        num_blocks = -(-length // block_size)
        for first in range(0, num_blocks, chunk_blocks):
            pieces.append((min(chunk_blocks, num_blocks - first), decode, first))
    pieces.sort(key=lambda piece: -piece[0])  # widest first, stable
    widths = [width for width, _, _ in pieces]
    owners = [decode for _, decode, _ in pieces]
    # A row covers consecutive positions from its first block on: a prefix is visible.
    visible = [
        min(lens[decode] - first * block_size, width * block_size)
        for width, decode, first in pieces
    ]
    width = torch.tensor(widths)
    offsets = torch.arange(widths[0])
    real = offsets[None, :] < width[:, None]  # [rows, W]
    starts = torch.tensor([first for _, _, first in pieces])
    cols = starts[:, None] + torch.where(real, offsets, 0)  # padding repeats the first block
    blocks = tables[seqs[owners][:, None], cols]  # [rows, W]
    rows = token_rows[owners]

    tiles = []
    first = 0
    while first < len(widths):
        tile_width = widths[first]
        end = first + max(1, stage_tokens // (tile_width * block_size))
        keys = GatheredKeys.with_prefixes(
            blocks[first:end, :tile_width].contiguous(), visible[first:end], block_size
        )
        tiles.append(DecodeTile(rows=rows[first:end], keys=keys))
        first = end
    return tiles
