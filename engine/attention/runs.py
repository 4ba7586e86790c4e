"""Planning a step's paged attention: runs of consecutive blocks, and what to gather.

A run is a maximal stretch of a sequence's block table whose block ids count up by
one, so its K/V occupy consecutive slots of the cache and can be attended as a
zero-copy view. The planner looks at every sequence's runs once per step (vectorized
over the whole batch) and decides, for all layers at once:

- a run of at least ``min_run_tokens`` tokens is attended in place, as a view;
- the blocks of shorter runs (fragments, a lone fresh block) are gathered into a
  small padded batch, where a copy costs less than one more kernel call;
- decodes (one query token) are batched: their gathered blocks go into a few padded
  batches bucketed by length (powers of two, so padding at most doubles a batch);
- prefill chunks are planned per sequence (there are few per step), each query row
  seeing the cached context and causally the chunk's own tokens.

Every query row gets at least one partial result; rows with several are merged by
log-sum-exp (see ``partial``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata

__all__ = [
    "DecodeBatch",
    "DecodeRun",
    "GatheredKeys",
    "PrefillPiece",
    "PrefillPlan",
    "StepPlan",
    "plan_step",
]


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """One decode token's keys in ``num_chunks`` equal, consecutive slot ranges."""

    row: int  # the token's index in the step's batch
    start_slot: int
    chunk_tokens: int
    num_chunks: int  # >1 splits a long run so one call keeps more threads busy


@dataclass(frozen=True, slots=True)
class GatheredKeys:
    """Blocks to copy out of the cache for ``R`` key sets of ``W`` blocks, and their mask."""

    blocks: torch.Tensor  # [R, W] int64; padding repeats a real block, so it holds finite K/V
    mask: torch.Tensor  # [R, 1, Q, W * block_size] float32: 0 where visible, else -inf


@dataclass(frozen=True, slots=True)
class DecodeBatch:
    rows: torch.Tensor  # [R] int64: the decode tokens whose gathered keys these are
    keys: GatheredKeys  # Q = 1


@dataclass(frozen=True, slots=True)
class PrefillPiece:
    """Keys in consecutive slots, attended by query rows ``row_offset:`` of a chunk."""

    row_offset: int
    start_slot: int
    num_tokens: int
    causal: bool  # top-left: the piece starts at the position of query row ``row_offset``


@dataclass(frozen=True, slots=True)
class PrefillPlan:
    first_row: int  # the chunk's first token in the step's batch
    num_queries: int
    pieces: tuple[PrefillPiece, ...]
    gathered: GatheredKeys | None  # R = 1, Q = num_queries - gathered_row_offset
    gathered_row_offset: int  # the first query row that sees any gathered key


@dataclass(frozen=True, slots=True)
class StepPlan:
    num_tokens: int
    decode_runs: tuple[DecodeRun, ...]
    decode_batches: tuple[DecodeBatch, ...]
    prefills: tuple[PrefillPlan, ...]
    # The output row of each partial, in the order the backend produces them: decode
    # runs, decode batches, then each prefill's pieces and gathered keys.
    partial_rows: torch.Tensor  # [P] int64
    one_partial_per_row: bool
    num_gathered_blocks: int  # over all decode batches and prefills, padding included


def plan_step(metadata: AttentionMetadata, *, min_run_tokens: int, kv_splits: int) -> StepPlan:
    block_size = metadata.block_size
    device = metadata.seq_lens.device
    tables = _cpu_block_tables(metadata)  # [S, W]
    seq_lens = torch.tensor(metadata.seq_lens_cpu, dtype=torch.int64)
    query_lens = metadata.query_lens_cpu
    first_rows = [0]
    for n in query_lens:
        first_rows.append(first_rows[-1] + n)
    num_seqs, width = tables.shape

    num_blocks = (seq_lens + block_size - 1) // block_size  # [S]
    valid = torch.arange(width)[None, :] < num_blocks[:, None]  # [S, W]
    starts = valid.clone()
    starts[:, 1:] &= tables[:, 1:] != tables[:, :-1] + 1
    run_seq, run_col = starts.nonzero(as_tuple=True)  # row-major: runs in position order
    next_seq = torch.cat([run_seq[1:], run_seq.new_full((1,), -1)])
    next_col = torch.cat([run_col[1:], run_col.new_zeros(1)])
    end_col = torch.where(next_seq == run_seq, next_col, num_blocks[run_seq])
    run_pos = run_col * block_size
    run_tokens = torch.minimum(end_col * block_size, seq_lens[run_seq]) - run_pos
    run_slot = tables[run_seq, run_col] * block_size
    direct = run_tokens >= min_run_tokens
    # A long decode run is cut into `splits` equal chunks of whole blocks, attended in one
    # call as a strided batch: more threads share it, and each chunk streams through
    # memory alone. Its last few blocks (fewer than `splits`, plus a partial one) are
    # gathered instead.
    is_decode = torch.tensor([n == 1 for n in query_lens], dtype=torch.bool)
    full_blocks = run_tokens // block_size
    splits = torch.minimum(full_blocks * block_size // min_run_tokens, full_blocks)
    splits = splits.clamp(min=1, max=kv_splits)
    splits = torch.where(direct & is_decode[run_seq], splits, 1)
    chunk_blocks = full_blocks // splits
    covered = torch.where(splits > 1, splits * chunk_blocks, end_col - run_col)  # blocks
    covered = torch.where(direct, covered, 0)
    chunk_tokens = torch.where(splits > 1, chunk_blocks * block_size, run_tokens)

    run_of_block = (starts.flatten().cumsum(0) - 1).clamp(min=0).view(num_seqs, width)
    in_run = torch.arange(width)[None, :] - run_col[run_of_block]  # block index within its run
    gathered = valid & (in_run >= covered[run_of_block]) if direct.numel() else valid
    num_gathered = gathered.sum(dim=1)  # [S]
    # Stable sort puts each row's gathered columns first, in position order.
    gather_cols = torch.sort((~gathered).to(torch.int8), dim=1, stable=True).indices

    decode_runs: list[DecodeRun] = []
    direct_by_seq: dict[int, list[tuple[int, int, int]]] = {}
    picked = (run_seq, run_pos, run_tokens, run_slot, chunk_tokens, splits)
    for seq, pos, tokens, slot, size, chunks in zip(
        *(t[direct].tolist() for t in picked), strict=True
    ):
        if query_lens[seq] == 1:
            run = DecodeRun(
                row=first_rows[seq], start_slot=slot, chunk_tokens=size, num_chunks=chunks
            )
            decode_runs.append(run)
        else:
            direct_by_seq.setdefault(seq, []).append((pos, tokens, slot))

    decoding = [s for s in range(num_seqs) if query_lens[s] == 1 and num_gathered[s] > 0]
    decode_batches = _decode_batches(
        decoding, first_rows, tables, gather_cols, num_gathered, seq_lens, block_size
    )
    prefills = tuple(
        _prefill_plan(
            first_row=first_rows[s],
            num_queries=query_lens[s],
            seq_len=int(seq_lens[s]),
            runs=direct_by_seq.get(s, []),
            blocks=tables[s, gather_cols[s, : int(num_gathered[s])]],
            cols=gather_cols[s, : int(num_gathered[s])],
            block_size=block_size,
        )
        for s in range(num_seqs)
        if query_lens[s] > 1
    )

    rows: list[torch.Tensor] = [
        torch.tensor([r.row for r in decode_runs for _ in range(r.num_chunks)], dtype=torch.int64)
    ]
    rows += [batch.rows for batch in decode_batches]
    for prefill in prefills:
        end = prefill.first_row + prefill.num_queries
        rows += [torch.arange(prefill.first_row + p.row_offset, end) for p in prefill.pieces]
        if prefill.gathered is not None:
            rows.append(torch.arange(prefill.first_row + prefill.gathered_row_offset, end))
    partial_rows = torch.cat(rows)
    return StepPlan(
        num_tokens=first_rows[-1],
        decode_runs=tuple(decode_runs),
        decode_batches=tuple(_batch_to(b, device) for b in decode_batches),
        prefills=tuple(_prefill_to(p, device) for p in prefills),
        partial_rows=partial_rows.to(device, non_blocking=True),
        one_partial_per_row=partial_rows.numel() == first_rows[-1],
        num_gathered_blocks=sum(b.keys.blocks.numel() for b in decode_batches)
        + sum(p.gathered.blocks.numel() for p in prefills if p.gathered is not None),
    )


def _cpu_block_tables(metadata: AttentionMetadata) -> torch.Tensor:
    if metadata.block_tables.device.type == "cpu":
        return metadata.block_tables
    width = max((len(t) for t in metadata.block_tables_cpu), default=0)
    padded = [list(t) + [0] * (width - len(t)) for t in metadata.block_tables_cpu]
    return torch.tensor(padded, dtype=torch.int64).reshape(len(padded), width)


def _decode_batches(
    seqs: list[int],
    first_rows: list[int],
    tables: torch.Tensor,  # [S, W]
    gather_cols: torch.Tensor,  # [S, W]
    num_gathered: torch.Tensor,  # [S]
    seq_lens: torch.Tensor,  # [S]
    block_size: int,
) -> list[DecodeBatch]:
    buckets: dict[int, list[int]] = {}
    for s in seqs:
        buckets.setdefault(1 << (int(num_gathered[s]) - 1).bit_length(), []).append(s)
    batches = []
    for members in buckets.values():
        sel = torch.tensor(members, dtype=torch.int64)
        counts = num_gathered[sel]  # [R]
        width = int(counts.max())
        cols = gather_cols[sel, :width]  # [R, W]
        is_real = torch.arange(width)[None, :] < counts[:, None]
        cols = torch.where(is_real, cols, cols[:, :1])  # pad with a real, finite block
        pos = cols[..., None] * block_size + torch.arange(block_size)  # [R, W, B]
        visible = is_real[..., None] & (pos < seq_lens[sel, None, None])
        keys = GatheredKeys(
            blocks=tables[sel].gather(1, cols),
            mask=_additive(visible.view(len(members), 1, 1, width * block_size)),
        )
        rows = torch.tensor([first_rows[s] for s in members], dtype=torch.int64)
        batches.append(DecodeBatch(rows=rows, keys=keys))
    return batches


def _prefill_plan(
    *,
    first_row: int,
    num_queries: int,
    seq_len: int,
    runs: list[tuple[int, int, int]],  # (first position, tokens, first slot) of direct runs
    blocks: torch.Tensor,  # [G] gathered block ids, in position order
    cols: torch.Tensor,  # [G] their logical block indices
    block_size: int,
) -> PrefillPlan:
    context = seq_len - num_queries  # tokens cached before this chunk
    pieces = []
    for pos, tokens, slot in runs:
        cached = min(max(context - pos, 0), tokens)
        if cached:  # every query row sees the whole cached part
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
    gathered, row_offset = None, 0
    if blocks.numel():
        row_offset = max(int(cols[0]) * block_size - context, 0)
        pos = (cols[:, None] * block_size + torch.arange(block_size)).flatten()  # [G * B]
        query_pos = torch.arange(context + row_offset, seq_len)  # [Q']
        visible = (pos[None, :] <= query_pos[:, None]) & (pos < seq_len)[None, :]
        gathered = GatheredKeys(blocks=blocks[None], mask=_additive(visible[None, None]))
    return PrefillPlan(
        first_row=first_row,
        num_queries=num_queries,
        pieces=tuple(pieces),
        gathered=gathered,
        gathered_row_offset=row_offset,
    )


def _additive(visible: torch.Tensor) -> torch.Tensor:
    return torch.zeros(visible.shape).masked_fill_(~visible, -math.inf)


def _keys_to(keys: GatheredKeys, device: torch.device) -> GatheredKeys:
    return GatheredKeys(
        blocks=keys.blocks.to(device, non_blocking=True),
        mask=keys.mask.to(device, non_blocking=True),
    )


def _batch_to(batch: DecodeBatch, device: torch.device) -> DecodeBatch:
    return DecodeBatch(
        rows=batch.rows.to(device, non_blocking=True), keys=_keys_to(batch.keys, device)
    )


def _prefill_to(plan: PrefillPlan, device: torch.device) -> PrefillPlan:
    if plan.gathered is None:
        return plan
    return PrefillPlan(
        first_row=plan.first_row,
        num_queries=plan.num_queries,
        pieces=plan.pieces,
        gathered=_keys_to(plan.gathered, device),
        gathered_row_offset=plan.gathered_row_offset,
    )
