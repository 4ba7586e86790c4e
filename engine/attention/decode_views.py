"""Decode attention over long runs of the cache read in place, the rest left to gathers.

A decode reads its whole context once per layer, a stream through memory. Gathering
that context into a workspace first (``decode_tiles``) adds a second pass: the copy
streams the keys from memory while the kernel waits, then the kernel computes on the
copy while memory idles. How much that costs depends on the machine's balance of
memory bandwidth to arithmetic: on 2-core x86 CPUs the copy of 16 MiB of K/V cost
about 0.3x the attention on one machine and 0.9-1.0x on another of the same kind
(8 x 4,096 tokens), so paged decode read 1.11-1.15x contiguous SDPA on the first and
1.4-1.8x on the second. Read in place, the keys stream once and the kernel's
arithmetic overlaps the memory traffic as it does for contiguous K/V.

A run (a stretch of a block table whose ids count up by one) is a strided view of the
cache: with ``[N, B, Hkv, D]`` per layer, a run of ``n`` tokens from slot ``s`` is
``[Hkv, n, D]`` with strides ``(D, Hkv * D, 1)``. One kernel call attends one run, cut
into ``num_chunks`` equal chunks of whole blocks as the batch axis of one strided view
(zero-copy), so the kernel has ``num_chunks x Hkv`` independent work items to share out
among its threads. The chunks' partials merge by log-sum-exp like any others. Runs
whose chunks have one size and start evenly spaced in the cache are one view (the chunk
axis strided by their spacing), each chunk with its own query: one kernel call for all
of them. Prompts prefilled one after another lie back to back; runs decoded side by
side, each begun mid-way through a gap of empty blocks (``BlockPool.run_start``), lie
one gap apart. A call costs ~20-30 us on one thread before it reads anything, and on a
busy host each extra call measured 2-5% of a layer; it also opens an OpenMP parallel
region. Chunks default to 512 tokens, the key block torch's CPU kernel splits into
anyway, so that runs of many lengths share a chunk size.

A run is read in place when it holds at least ``min_view_tokens`` whole blocks' worth
of tokens; the blocks of shorter runs, the run's last few blocks that do not fill a
whole chunk, and a sequence's partly written last block are gathered into tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.host_staging import stage_tensor

__all__ = ["DecodeView", "Leftover", "plan_decode_views"]


@dataclass(frozen=True, slots=True)
class DecodeView:
    """``num_chunks`` chunks of ``chunk_tokens`` consecutive slots, chunk ``i`` from slot
    ``start_slot + i * chunk_stride``, attended in place by the query of token ``rows[i]``."""

    rows: torch.Tensor  # [num_chunks] int64
    start_slot: int
    num_chunks: int
    chunk_tokens: int
    chunk_stride: int  # slots from one chunk's start to the next (>= chunk_tokens)

    def to(self, device: torch.device) -> DecodeView:
        return DecodeView(
            rows=stage_tensor(self.rows, device),
            start_slot=self.start_slot,
            num_chunks=self.num_chunks,
            chunk_tokens=self.chunk_tokens,
            chunk_stride=self.chunk_stride,
        )


@dataclass(frozen=True, slots=True)
class Leftover:
    """What the views leave to gathered tiles: per decode, its other blocks in order."""

    tables: torch.Tensor  # [Sl, W] int64: each decode's remaining blocks first, in order
    visible_tokens: torch.Tensor  # [Sl] int64: tokens of those blocks it sees (a prefix)
    token_rows: torch.Tensor  # [Sl] int64: the decode's token in the step's batch


def plan_decode_views(
    *,
    tables: torch.Tensor,  # [Sd, W] int64: the decodes' block tables (CPU)
    seq_lens: torch.Tensor,  # [Sd] int64
    token_rows: torch.Tensor,  # [Sd] int64
    block_size: int,
    min_view_tokens: int,
    chunk_tokens: int,
    min_chunks: int,
) -> tuple[list[DecodeView], Leftover]:
    """Views over each decode's runs of at least ``min_view_tokens`` tokens, cut in at
    least ``min_chunks`` chunks of about ``chunk_tokens``; the rest as a ``Leftover``."""
    num_seqs, width = tables.shape
    if num_seqs == 0 or max(seq_lens.tolist()) < min_view_tokens:
        # No run can be long enough: every block is left, in order (a decode step of
        # short contexts skips the ~20 small tensor ops below).
        return [], Leftover(tables=tables, visible_tokens=seq_lens, token_rows=token_rows)
    num_blocks = (seq_lens + block_size - 1) // block_size  # [Sd]
    cols = torch.arange(width)
    used = cols[None, :] < num_blocks[:, None]  # [Sd, W]
    # Only whole blocks are read in place: a partly written last block needs a mask.
    whole = cols[None, :] < (seq_lens // block_size)[:, None]
    starts = torch.ones_like(whole)
    starts[:, 1:] = tables[:, 1:] != tables[:, :-1] + 1
    starts &= whole
    run_of = torch.cumsum(starts.flatten(), 0).view(num_seqs, width) - 1  # [Sd, W]
    run_len = torch.bincount(run_of[whole], minlength=int(starts.sum()))  # blocks per run
    seq_of_run, first_col = starts.nonzero(as_tuple=True)

    min_blocks = -(-min_view_tokens // block_size)
    chunk_blocks = max(1, chunk_tokens // block_size)
    runs = [  # (start slot, blocks, seq, first col) of each long run, in cache order
        (int(tables[seq, first]) * block_size, int(run_len[run]), seq, first)
        for run in (run_len >= min_blocks).nonzero().flatten().tolist()
        for seq, first in [(int(seq_of_run[run]), int(first_col[run]))]
    ]
    runs.sort()
    pieces = [
        _Piece.cut(start, blocks, -(-blocks // chunk_blocks), block_size)
        for start, blocks, _, _ in runs
    ]
    groups = _group(pieces)
    for first_piece, end_piece, _ in groups:
        start, blocks, _, _ = runs[first_piece]
        if end_piece - first_piece == 1 and pieces[first_piece].chunks < min_chunks:
            # A run alone in its view: cut finer so that every thread has a chunk.
            pieces[first_piece] = _Piece.cut(start, blocks, min(blocks, min_chunks), block_size)
    in_place = torch.zeros_like(whole)
    views = []
    for first_piece, end_piece, stride in groups:
        if end_piece - first_piece == 1:
            stride = pieces[first_piece].tokens  # a lone piece's chunks are back to back
        rows = []
        for i in range(first_piece, end_piece):
            piece, (_, _, seq, first) = pieces[i], runs[i]
            in_place[seq, first : first + piece.chunks * piece.tokens // block_size] = True
            rows += [int(token_rows[seq])] * piece.chunks
        views.append(
            DecodeView(
                rows=torch.tensor(rows, dtype=torch.int64),
                start_slot=pieces[first_piece].start,
                num_chunks=len(rows),
                chunk_tokens=pieces[first_piece].tokens,
                chunk_stride=stride,
            )
        )

    rest = used & ~in_place  # [Sd, W]
    count = rest.sum(dim=1)
    # Move each decode's remaining blocks to the front, in order (a stable sort).
    order = torch.sort((~rest).to(torch.int8), dim=1, stable=True).indices
    remaining = tables.gather(1, order)
    # Views hold whole blocks only: a partly written last block is always in the rest, and
    # last there, so the rest's tokens are a prefix of its blocks.
    visible = count * block_size - (num_blocks * block_size - seq_lens)
    keep = count > 0
    return views, Leftover(
        tables=remaining[keep], visible_tokens=visible[keep], token_rows=token_rows[keep]
    )


@dataclass(frozen=True, slots=True)
class _Piece:
    """A run cut in ``chunks`` equal chunks of ``tokens`` from slot ``start``, back to back
    (its last ``blocks % chunks`` blocks are left to the gathers)."""

    start: int
    chunks: int
    tokens: int

    @classmethod
    def cut(cls, start: int, blocks: int, chunks: int, block_size: int) -> _Piece:
        return cls(start=start, chunks=chunks, tokens=blocks // chunks * block_size)


def _group(pieces: list[_Piece]) -> list[tuple[int, int, int]]:
    """``(first, end, chunk stride)`` of each view: consecutive pieces (in cache order)
    whose chunks have one size and start evenly spaced, so one strided view holds them
    all. Runs back to back (prompts prefilled one after another) are spaced by their
    chunk size; runs decoded side by side, each grown mid-way through a gap of empty
    blocks (``BlockPool.run_start``), are spaced by the gap they started in."""
    groups: list[tuple[int, int, int]] = []
    i = 0
    while i < len(pieces):
        tokens = pieces[i].tokens
        # None until two chunks fix it. Any stride reads correctly, 0 included (decodes
        # sharing a prefix's blocks): the view is only read.
        stride = tokens if pieces[i].chunks > 1 else None
        last = pieces[i].start + (pieces[i].chunks - 1) * tokens  # the last chunk's start
        j = i + 1
        while j < len(pieces) and pieces[j].tokens == tokens:
            gap = pieces[j].start - last
            if (stride is not None and gap != stride) or (pieces[j].chunks > 1 and gap != tokens):
                break
            stride = gap
            last = pieces[j].start + (pieces[j].chunks - 1) * tokens
            j += 1
        groups.append((i, j, tokens if stride is None else stride))
        i = j
    return groups
