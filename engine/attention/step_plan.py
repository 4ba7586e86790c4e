"""One engine step's attention plan, made once in ``prepare`` and used by every layer.

The step's query rows (tokens) get their attention as partial results over disjoint
parts of their keys, each with its log-sum-exp, merged per row (see ``partial``):

- decodes: long runs of the cache read in place (``decode_views``), the rest in staged
  tiles of gathered keys, batched across sequences (``decode_tiles``);
- prefill chunks: one sequence at a time, long runs in place, fragments gathered
  (``prefill_pieces``).

``merge`` places every partial by its row, in the order the backend produces them:
decode views' chunks first, then decode tiles, then each prefill's pieces and its
gathered fragments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.attention.decode_tiles import DecodeTile, plan_decode_tiles
from engine.attention.decode_views import DecodeView, plan_decode_views
from engine.attention.metadata import AttentionMetadata
from engine.attention.partial import MergeLayout
from engine.attention.prefill_pieces import GatheredPiece, PrefillPiece, PrefillPlan, plan_prefill

__all__ = ["StepPlan", "plan_step"]


@dataclass(frozen=True, slots=True)
class StepPlan:
    num_tokens: int
    decode_views: tuple[DecodeView, ...]
    decode_tiles: tuple[DecodeTile, ...]
    prefills: tuple[PrefillPlan, ...]
    merge: MergeLayout  # where each partial goes, in the order the backend makes them
    max_gathered_blocks: int  # the most blocks any one gather copies (workspace size)


def plan_step(
    metadata: AttentionMetadata,
    *,
    min_run_tokens: int,
    chunk_tokens: int,
    stage_tokens: int,
    min_view_tokens: int | None = None,
    view_chunk_tokens: int | None = None,
    min_view_chunks: int = 1,
) -> StepPlan:
    """Plan the step: ``min_run_tokens`` for prefill runs attended in place,
    ``min_view_tokens``/``view_chunk_tokens``/``min_view_chunks`` for decode runs read
    in place (``decode_views``; ``None``: none are), ``chunk_tokens``/``stage_tokens`` for
    the decode rows and tiles of gathered keys (``decode_tiles``)."""
    block_size = metadata.block_size
    device = metadata.seq_lens.device
    tables = _cpu_block_tables(metadata)  # [S, W]
    seq_lens = torch.tensor(metadata.seq_lens_cpu, dtype=torch.int64)
    query_lens = metadata.query_lens_cpu
    first_rows = [0]
    for n in query_lens:
        first_rows.append(first_rows[-1] + n)

    decoding = [s for s, n in enumerate(query_lens) if n == 1]
    if len(decoding) == len(query_lens):  # decodes only: every sequence, in order
        decode_tables, decode_lens = tables, seq_lens
    else:
        index = torch.tensor(decoding, dtype=torch.int64)
        decode_tables, decode_lens = tables[index], seq_lens[index]
    views, rest = plan_decode_views(
        tables=decode_tables,
        seq_lens=decode_lens,
        token_rows=torch.tensor([first_rows[s] for s in decoding], dtype=torch.int64),
        block_size=block_size,
        min_view_tokens=min_view_tokens if min_view_tokens is not None else 1 << 62,
        chunk_tokens=view_chunk_tokens or chunk_tokens,
        min_chunks=min_view_chunks,
    )
    tiles = plan_decode_tiles(
        tables=rest.tables,
        seq_lens=rest.visible_tokens,
        seqs=torch.arange(rest.token_rows.numel()),
        token_rows=rest.token_rows,
        block_size=block_size,
        chunk_blocks=max(1, chunk_tokens // block_size),
        stage_tokens=stage_tokens,
    )
    if len(tiles) == 1 and tiles[0].rows.equal(torch.arange(first_rows[-1])):
        tiles = [dataclasses.replace(tiles[0], every_token=True)]  # a decode step's usual
    prefills = [
        plan_prefill(
            table=tables[s, : -(-metadata.seq_lens_cpu[s] // block_size)],
            first_row=first_rows[s],
            num_queries=n,
            seq_len=metadata.seq_lens_cpu[s],
            block_size=block_size,
            min_run_tokens=min_run_tokens,
        )
        for s, n in enumerate(query_lens)
        if n > 1
    ]

    rows = [v.rows for v in views]
    rows += [tile.rows for tile in tiles]
    for prefill in prefills:
        end = prefill.first_row + prefill.num_queries
        parts: tuple[PrefillPiece | GatheredPiece, ...] = (*prefill.pieces, *prefill.gathered)
        for part in parts:
            rows.append(torch.arange(prefill.first_row + part.row_offset, end))
    partial_rows = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    gathers = [t.keys for t in tiles] + [g.keys for p in prefills for g in p.gathered]
    return StepPlan(
        num_tokens=first_rows[-1],
        decode_views=tuple(v.to(device) for v in views),
        decode_tiles=tuple(t.to(device) for t in tiles),
        prefills=tuple(p.to(device) for p in prefills),
        merge=MergeLayout.build(partial_rows, num_rows=first_rows[-1]).to(device),
        max_gathered_blocks=max((g.blocks.numel() for g in gathers), default=0),
    )


def _cpu_block_tables(metadata: AttentionMetadata) -> torch.Tensor:
    if metadata.block_tables.device.type == "cpu":
        return metadata.block_tables
    width = max((len(t) for t in metadata.block_tables_cpu), default=0)
    padded = [list(t) + [0] * (width - len(t)) for t in metadata.block_tables_cpu]
    return torch.tensor(padded, dtype=torch.int64).reshape(len(padded), width)
