"""A prefill chunk's attention, planned as pieces of its sequence's keys.

A chunk of ``Q`` new tokens after ``C`` cached ones: query row ``i`` sits at position
``C + i`` and sees positions ``0..C + i``. Prefill does ``Q`` times the arithmetic of a
decode per key, so it is compute-bound and its keys are attended where they lie:

- a run (a stretch of the block table whose ids count up by one, so its K/V occupy
  consecutive slots) of at least ``min_run_tokens`` tokens is a zero-copy view. Its
  cached part is seen whole by every row; the part among the new tokens is top-left
  causal for the rows from its first position on, which is exactly the rule above;
- the blocks of shorter runs are gathered: those before the chunk with no mask, those
  among its new tokens masked by position.

A chunk is planned per sequence: a step holds few of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.gathered_keys import GatheredKeys

__all__ = ["GatheredPiece", "PrefillPiece", "PrefillPlan", "plan_prefill"]


@dataclass(frozen=True, slots=True)
class PrefillPiece:
    """Keys in consecutive slots, attended by the chunk's query rows ``row_offset:``."""

    row_offset: int
    start_slot: int
    num_tokens: int
    causal: bool  # top-left: the piece starts at the position of row ``row_offset``


@dataclass(frozen=True, slots=True)
class GatheredPiece:
    """Gathered blocks, attended by the chunk's query rows ``row_offset:``."""

    row_offset: int  # the first row that sees any of them
    keys: GatheredKeys  # [1, G] blocks; mask [1, 1, num_queries - row_offset, G * B] or None


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    first_row: int  # the chunk's first token in the step's batch
    num_queries: int
    pieces: tuple[PrefillPiece, ...]
    gathered: tuple[GatheredPiece, ...]  # cached fragments (no mask), then new ones

    def to(self, device: torch.device) -> PrefillPlan:
        return PrefillPlan(
            first_row=self.first_row,
            num_queries=self.num_queries,
            pieces=self.pieces,
            gathered=tuple(GatheredPiece(g.row_offset, g.keys.to(device)) for g in self.gathered),
        )


def plan_prefill(
    *,
    table: torch.Tensor,  # [nb] int64: the sequence's blocks up to seq_len
    first_row: int,
    num_queries: int,
    seq_len: int,
    block_size: int,
    min_run_tokens: int,
) -> PrefillPlan:
    context = seq_len - num_queries
    starts = torch.ones(table.numel(), dtype=torch.bool)
    starts[1:] = table[1:] != table[:-1] + 1
    first_col = starts.nonzero().flatten()  # [runs]
    end_col = torch.cat([first_col[1:], torch.tensor([table.numel()])])
    run_tokens = torch.clamp(end_col * block_size, max=seq_len) - first_col * block_size
    long = run_tokens >= min_run_tokens
    pieces: list[PrefillPiece] = []
    for begin, tokens in zip(first_col[long].tolist(), run_tokens[long].tolist(), strict=True):
        pos = begin * block_size
        slot = int(table[begin]) * block_size
        cached = min(max(context - pos, 0), tokens)
        if cached:
            pieces.append(
                PrefillPiece(row_offset=0, start_slot=slot, num_tokens=cached, causal=False)
            )
        if tokens > cached:
            pieces.append(
                PrefillPiece(
                    row_offset=pos + cached - context,
                    start_slot=slot + cached,
                    num_tokens=tokens - cached,
                    causal=True,
                )
            )
    run_of_col = torch.cumsum(starts, 0) - 1  # [nb]; not repeat_interleave (decode_tiles)
    cols = (~long)[run_of_col].nonzero().flatten()  # the columns of short runs
    gathered = []
    if cols.numel():  # blocks of short runs, in position order
        # Fragments wholly before the chunk are seen by every row: no mask, whatever their
        # size. Only those among the new tokens need one, at most [Q, Q + B].
        num_cached = int(((cols + 1) * block_size <= context).sum())
        if num_cached:
            keys = GatheredKeys(blocks=table[cols[:num_cached]][None], mask=None)
            gathered.append(GatheredPiece(row_offset=0, keys=keys))
        if num_cached < cols.numel():
            cols = cols[num_cached:]
            row_offset = max(int(cols[0]) * block_size - context, 0)
            positions = (cols[:, None] * block_size + torch.arange(block_size)).flatten()
            query_pos = torch.arange(context + row_offset, seq_len)  # [Q']
            visible = (positions[None, :] <= query_pos[:, None]) & (positions < seq_len)
            keys = GatheredKeys.build(table[cols][None], visible[None, None])
            gathered.append(GatheredPiece(row_offset=row_offset, keys=keys))
    return PrefillPlan(
        first_row=first_row,
        num_queries=num_queries,
        pieces=tuple(pieces),
        gathered=tuple(gathered),
    )
