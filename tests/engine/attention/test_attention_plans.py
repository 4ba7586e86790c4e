"""The step planner: decode tiles batched across sequences, prefill pieces per run."""

from __future__ import annotations

import torch

from engine.attention.decode_tiles import plan_decode_tiles
from engine.attention.metadata import AttentionMetadata
from engine.attention.prefill_pieces import PrefillPiece, plan_prefill
from engine.attention.step_plan import plan_step


def metadata(
    block_size: int, query_lens: list[int], seq_lens: list[int], tables: list[list[int]]
) -> AttentionMetadata:
    return AttentionMetadata.build(
        block_size=block_size,
        query_lens=query_lens,
        seq_lens=seq_lens,
        block_tables=tables,
        device=torch.device("cpu"),
    )


def test_many_decodes_take_a_few_kernel_calls_not_one_per_sequence() -> None:
    gen = torch.Generator().manual_seed(0)
    block_size, num_seqs = 16, 256
    lens = torch.randint(1, 600, (num_seqs,), generator=gen).tolist()
    tables, next_block = [], 0
    for n in lens:  # fragmented: every other block
        count = -(-n // block_size)
        tables.append(list(range(next_block, next_block + 2 * count, 2)))
        next_block += 2 * count
    plan = plan_step(
        metadata(block_size, [1] * num_seqs, lens, tables),
        min_run_tokens=128,
        chunk_tokens=512,
        stage_tokens=16_384,
    )
    total = sum(tile.keys.blocks.numel() for tile in plan.decode_tiles) * block_size
    assert len(plan.decode_tiles) <= 2 + total // 16_384  # rows packed ~16k tokens per call
    assert total < 1.5 * sum(lens) + num_seqs * block_size  # padding stays small
    assert plan.merge.num_rows == num_seqs and not plan.prefills


def test_decode_rows_cover_each_sequence_once_in_chunks() -> None:
    tables = torch.tensor([[7, 8, 9, 10, 11], [3, 1, 4, 0, 0]])
    tiles = plan_decode_tiles(
        tables=tables,
        seq_lens=torch.tensor([18, 9]),
        seqs=torch.tensor([0, 1]),
        token_rows=torch.tensor([5, 2]),
        block_size=4,
        chunk_blocks=2,
        stage_tokens=8,  # one two-block row per tile
    )
    seen: dict[int, list[int]] = {5: [], 2: []}
    for tile in tiles:
        num_rows, width = tile.keys.blocks.shape
        assert width <= 2 and num_rows * width * 4 <= 8  # a tile holds at most stage_tokens
        mask = tile.keys.mask
        for r in range(num_rows):
            for i, block in enumerate(tile.keys.blocks[r].tolist()):
                if mask is None or bool((mask[r, 0, 0, i * 4 : i * 4 + 4] == 0).any()):
                    seen[int(tile.rows[r])].append(block)
    assert sorted(seen[5]) == [7, 8, 9, 10, 11]  # 18 tokens: 5 blocks, the last partial
    assert sorted(seen[2]) == [1, 3, 4]


def test_prefill_after_a_cached_prefix_splits_runs_at_the_first_new_token() -> None:
    # 20 tokens, 12 cached; blocks of 4: runs [10, 11, 12] and [20, 21].
    plan = plan_prefill(
        table=torch.tensor([10, 11, 12, 20, 21]),
        first_row=3,
        num_queries=8,
        seq_len=20,
        block_size=4,
        min_run_tokens=1,
    )
    assert plan.gathered == ()
    assert plan.pieces == (
        PrefillPiece(row_offset=0, start_slot=40, num_tokens=12, causal=False),  # cached
        PrefillPiece(row_offset=0, start_slot=80, num_tokens=8, causal=True),  # the new ones
    )
    split = plan_prefill(
        table=torch.tensor([10, 11, 12, 13, 30]),
        first_row=0,
        num_queries=8,
        seq_len=18,
        block_size=4,
        min_run_tokens=1,
    )
    assert split.pieces == (
        PrefillPiece(row_offset=0, start_slot=40, num_tokens=10, causal=False),
        PrefillPiece(row_offset=0, start_slot=50, num_tokens=6, causal=True),
        PrefillPiece(row_offset=6, start_slot=120, num_tokens=2, causal=True),
    )


def test_prefill_fragments_are_gathered_for_the_rows_that_see_them() -> None:
    plan = plan_prefill(
        table=torch.tensor([5, 9, 2, 7]),  # four one-block runs
        first_row=0,
        num_queries=6,
        seq_len=14,
        block_size=4,
        min_run_tokens=8,
    )
    assert plan.pieces == ()
    cached, new = plan.gathered
    # Blocks 5 and 9 hold positions 0..7, all before the chunk: every row, no mask.
    assert cached.row_offset == 0 and cached.keys.mask is None
    assert cached.keys.blocks.tolist() == [[5, 9]]
    # Blocks 2 and 7 hold positions 8..15 (13 is the last): row i sits at position 8 + i.
    assert new.row_offset == 0 and new.keys.blocks.tolist() == [[2, 7]]
    mask = new.keys.mask
    assert mask is not None and mask.shape == (1, 1, 6, 8)
    assert (mask[0, 0] == 0).sum(dim=1).tolist() == [1, 2, 3, 4, 5, 6]


def test_decode_runs_are_read_in_place_and_only_the_rest_is_gathered() -> None:
    # Decode 0: a 40-block run, then three scattered blocks, the last 11 tokens full.
    # Decode 1: a 20-block run, then two scattered blocks, all full.
    tables = [[*range(40), 100, 102, 104], [*range(40, 60), 101, 103]]
    lens = [42 * 16 + 11, 22 * 16]
    plan = plan_step(
        metadata(16, [1, 1], lens, tables),
        min_run_tokens=128,
        chunk_tokens=512,
        stage_tokens=16_384,
        min_view_tokens=256,
        view_chunk_tokens=256,  # 16 blocks: 40 -> 3 chunks of 13, 20 -> 2 chunks of 10
        min_view_chunks=1,
    )
    views = [(v.rows.tolist(), v.start_slot, v.chunk_tokens) for v in plan.decode_views]
    assert views == [([0, 0, 0], 0, 13 * 16), ([1, 1], 40 * 16, 10 * 16)]
    # The rest, in position order: block 39 (the run's 40th, no whole chunk), then the
    # scattered ones; the partly written last block is never read in place.
    seen: dict[int, list[int]] = {0: [], 1: []}
    visible: dict[int, int] = {}
    for tile in plan.decode_tiles:
        mask = tile.keys.mask
        for r, row in enumerate(tile.rows.tolist()):
            width = tile.keys.blocks.shape[1] * 16
            visible[row] = width if mask is None else int((mask[r, 0, 0] == 0).sum())
            seen[row] += tile.keys.blocks[r, : -(-visible[row] // 16)].tolist()
    assert seen == {0: [39, 100, 102, 104], 1: [101, 103]}
    assert visible == {0: 3 * 16 + 11, 1: 2 * 16}
    # Every position exactly once: in place plus gathered is the whole context.
    in_place = {rows[0]: len(rows) * tokens for rows, _, tokens in views}
    assert [in_place[row] + visible[row] for row in (0, 1)] == lens
    assert plan.merge.num_rows == 2 and plan.merge.rows.tolist() == [0, 0, 0, 1, 1, 0, 1]


def test_without_long_runs_every_decode_is_gathered() -> None:
    plan = plan_step(
        metadata(4, [1, 1], [14, 8], [[5, 6, 2, 7], [1, 3]]),
        min_run_tokens=128,
        chunk_tokens=512,
        stage_tokens=16_384,
        min_view_tokens=12,  # three blocks: the longest run, [5, 6], is two
        view_chunk_tokens=8,
    )
    assert plan.decode_views == ()
    (tile,) = plan.decode_tiles
    assert tile.rows.tolist() == [0, 1]
    assert tile.keys.blocks.tolist() == [[5, 6, 2, 7], [1, 3, 1, 1]]  # padding repeats


def test_runs_back_to_back_with_one_chunk_size_are_one_kernel_call() -> None:
    # Four prompts of 24 blocks prefilled one after another, then decoded round-robin.
    tables = [[*range(24 * s, 24 * s + 24), 96 + s, 100 + s] for s in range(4)]
    plan = plan_step(
        metadata(16, [1] * 4, [26 * 16] * 4, tables),
        min_run_tokens=128,
        chunk_tokens=512,
        stage_tokens=16_384,
        min_view_tokens=256,
        view_chunk_tokens=128,  # 8 blocks: each prompt is 3 chunks
    )
    (view,) = plan.decode_views
    assert view.start_slot == 0 and view.chunk_tokens == 128
    assert view.rows.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    (tile,) = plan.decode_tiles  # the decoded blocks, one row per sequence
    assert sorted(tile.keys.blocks.tolist()) == [[96 + s, 100 + s] for s in range(4)]


def test_planning_a_step_calls_no_op_that_always_opens_a_parallel_region() -> None:
    """torch's CPU repeat_interleave opens an OpenMP parallel region whatever its size; on
    a busy 2-core host each region waits ~8 ms for its second thread, more than a whole
    decode step. The planner runs every step: it must not call it."""
    from torch.profiler import ProfilerActivity, profile

    tables = [[*range(8 * s, 8 * s + 8), 64 + s] for s in range(8)]
    decode = metadata(16, [1] * 8, [8 * 16 + 5] * 8, tables)
    prefill = metadata(16, [40], [72], [[3, 4, 9, 10, 11]])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for md in (decode, prefill):
            plan_step(md, min_run_tokens=32, chunk_tokens=512, stage_tokens=16_384)
    assert not [e.key for e in prof.key_averages() if "repeat_interleave" in e.key]


def decoded_side_by_side(
    num_seqs: int, prompt_blocks: int, decoded_blocks: int, gap: int
) -> list[list[int]]:
    """Prompts prefilled back to back, then each sequence's decoded blocks in one run,
    the runs ``gap`` blocks apart: the layout ``BlockPool.run_start`` makes when sequences
    decode side by side (the attention bench's, in small)."""
    decoded_at = num_seqs * prompt_blocks + 1
    prompts = [range(s * prompt_blocks, (s + 1) * prompt_blocks) for s in range(num_seqs)]
    decoded = [
        range(decoded_at + s * gap, decoded_at + s * gap + decoded_blocks) for s in range(num_seqs)
    ]
    return [[*p, *d] for p, d in zip(prompts, decoded, strict=True)]


def test_decoded_runs_evenly_spaced_are_one_strided_view() -> None:
    tables = decoded_side_by_side(num_seqs=4, prompt_blocks=24, decoded_blocks=8, gap=9)
    plan = plan_step(
        metadata(16, [1] * 4, [32 * 16] * 4, tables),
        min_run_tokens=128,
        chunk_tokens=512,
        stage_tokens=16_384,
        min_view_tokens=128,
        view_chunk_tokens=128,  # 8 blocks: each prompt is 3 chunks, each decoded run 1
        min_view_chunks=2,  # more than a lone decoded run has: grouped, it is not cut
    )
    prompts, decoded = plan.decode_views
    assert (prompts.start_slot, prompts.chunk_tokens, prompts.chunk_stride) == (0, 128, 128)
    assert prompts.rows.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert decoded.start_slot == 97 * 16 and decoded.rows.tolist() == [0, 1, 2, 3]
    assert (decoded.chunk_tokens, decoded.chunk_stride) == (128, 9 * 16)
    assert plan.decode_tiles == ()  # every block read in place


def test_runs_spaced_unevenly_or_cut_differently_are_separate_views() -> None:
    # One-chunk runs at blocks 0 and 10 (one view, stride 10); a two-chunk run at 30 (gap
    # 20, and its own chunks 8 apart); a run right after it whose chunks are 6 blocks.
    tables = [[*range(0, 8)], [*range(10, 18)], [*range(30, 46)], [*range(46, 52)]]
    lens = [len(t) * 16 for t in tables]
    plan = plan_step(
        metadata(16, [1] * 4, lens, tables),
        min_run_tokens=128,
        chunk_tokens=512,
        stage_tokens=16_384,
        min_view_tokens=96,
        view_chunk_tokens=128,
    )
    views = [
        (v.start_slot // 16, v.rows.tolist(), v.chunk_tokens // 16, v.chunk_stride // 16)
        for v in plan.decode_views
    ]
    assert views == [(0, [0, 1], 8, 10), (30, [2, 2], 8, 8), (46, [3], 6, 6)]
