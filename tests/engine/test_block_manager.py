"""BlockManager: allocation, appends, forks with copy on write, frees and stats. What it
refuses (bad sizes, bad token ids, unknown and duplicate sequences) is in
``test_block_manager_validation.py``."""

from __future__ import annotations

import itertools

import pytest

from engine.block_manager import BlockManager
from engine.block_results import Allocation, AppendResult, Fit, Shortfall
from engine.block_table import SequenceState
from engine.errors import (
    DuplicateSequenceError,
    InvalidRequestError,
    OutOfBlocksError,
)
from tests.engine.block_manager_helpers import BS, computed, manager, snapshot, toks


# -- allocate -----------------------------------------------------------------------------
@pytest.mark.parametrize(("num_tokens", "num_blocks"), [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_allocate_takes_ceil_tokens_over_block_size_blocks(
    num_tokens: int, num_blocks: int
) -> None:
    m = manager()
    allocation = m.allocate("a", toks(num_tokens))
    assert allocation == Allocation(block_ids=tuple(range(num_blocks)), num_cached_tokens=0)
    assert m.num_tokens("a") == num_tokens
    assert m.stats().num_in_use == num_blocks


def test_allocate_places_each_sequence_in_one_run() -> None:
    m = manager()
    assert m.allocate("a", toks(10)).block_ids == (0, 1, 2)
    assert m.allocate("b", toks(5)).block_ids == (3, 4)
    assert m.block_ids("a") == [0, 1, 2]
    assert "a" in m
    assert m.sequence_state("a") is SequenceState.RESIDENT


def test_allocate_reuses_a_prefix_computed_by_an_earlier_sequence() -> None:
    m = manager()
    computed(m, "a", toks(8))
    allocation = m.allocate("b", [*toks(8), 100, 101])
    assert allocation == Allocation(block_ids=(0, 1, 2), num_cached_tokens=8)
    assert [m.pool.blocks[i].ref_cnt for i in range(3)] == [2, 2, 1]


def test_no_cache_hit_before_mark_computed() -> None:
    m = manager()
    m.allocate("a", toks(8))
    allocation = m.allocate("b", [*toks(8), 100])
    assert allocation == Allocation(block_ids=(2, 3, 4), num_cached_tokens=0)


def test_mark_computed_caches_only_full_blocks() -> None:
    m = manager()
    m.allocate("a", toks(8))
    m.mark_computed("a", 7)
    assert m.longest_cached_prefix(toks(8)) == 4
    assert m.allocate("b", [*toks(8), 100]).num_cached_tokens == 4


def test_mark_computed_in_steps_extends_the_chain() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.mark_computed("a", 4)
    m.append("a", toks(2, start=6))
    m.mark_computed("a", 8)
    assert m.longest_cached_prefix(toks(8)) == 8
    assert m.allocate("b", [*toks(8), 100]).num_cached_tokens == 8


def test_the_cached_prefix_stops_before_the_last_token() -> None:
    m = BlockManager(num_blocks=8, block_size=16)
    computed(m, "a", toks(32))
    # Both blocks are cached, but the last token must be computed to get logits.
    assert m.allocate("b", toks(32)) == Allocation(block_ids=(0, 2), num_cached_tokens=16)


def test_a_prompt_one_token_past_a_cached_sequence_reuses_all_of_it() -> None:
    m = BlockManager(num_blocks=8, block_size=16)
    computed(m, "a", toks(32))
    assert m.allocate("b", toks(33)) == Allocation(block_ids=(0, 1, 2), num_cached_tokens=32)


def test_a_hit_on_a_freed_cached_block_takes_it_back() -> None:
    m = manager()
    computed(m, "a", toks(8))
    m.free("a")
    assert (m.stats().num_cached, m.stats().num_in_use) == (2, 0)
    assert m.allocate("b", [*toks(8), 100]) == Allocation((0, 1, 2), num_cached_tokens=8)
    assert (m.stats().num_cached, m.stats().num_in_use) == (0, 3)


def test_cache_salt_isolates_tenants() -> None:
    m = manager(num_blocks=16)
    computed(m, "a", toks(8), cache_salt="tenant-1")
    prompt = [*toks(8), 100]
    assert m.allocate("other-tenant", prompt, cache_salt="tenant-2").num_cached_tokens == 0
    assert m.allocate("no-salt", prompt).num_cached_tokens == 0
    assert m.allocate("same-tenant", prompt, cache_salt="tenant-1").num_cached_tokens == 8


def test_extra_keys_isolate_sequences() -> None:
    m = manager(num_blocks=16)
    computed(m, "a", toks(8), extra_keys=("lora-a",))
    prompt = [*toks(8), 100]
    assert m.allocate("b", prompt, extra_keys=("lora-b",)).num_cached_tokens == 0
    assert m.allocate("c", prompt).num_cached_tokens == 0
    assert m.allocate("d", prompt, extra_keys=("lora-a",)).num_cached_tokens == 8


def test_no_unsalted_sequence_ever_hits_a_salted_tenants_blocks() -> None:
    m = BlockManager(num_blocks=8, block_size=1)
    computed(m, "victim", [42, 43], cache_salt="abc")
    token = int.from_bytes(b"salt:abc", "little")  # a valid, non-negative token id
    computed(m, "probe", [token, 0])
    assert m.allocate("attacker", [token, 42, 43, 44]).num_cached_tokens == 1


def test_longest_cached_prefix_counts_cached_full_blocks() -> None:
    m = manager()
    computed(m, "a", toks(10))
    assert m.longest_cached_prefix(toks(10)) == 8
    assert m.longest_cached_prefix(toks(12)) == 8
    assert m.longest_cached_prefix(toks(4)) == 4
    assert m.longest_cached_prefix(toks(3)) == 0
    assert m.longest_cached_prefix([*toks(5), 999, 6, 7]) == 4
    assert m.longest_cached_prefix([999, *toks(9, start=1)]) == 0


def test_longest_cached_prefix_respects_salt_and_extra_keys() -> None:
    m = manager()
    computed(m, "a", toks(8), cache_salt="t", extra_keys=(7,))
    assert m.longest_cached_prefix(toks(8), cache_salt="t", extra_keys=(7,)) == 8
    assert m.longest_cached_prefix(toks(8), cache_salt="t") == 0
    assert m.longest_cached_prefix(toks(8), extra_keys=(7,)) == 0


def test_prefix_caching_off_never_hits() -> None:
    m = manager(enable_prefix_caching=False)
    computed(m, "a", toks(8))
    assert m.longest_cached_prefix(toks(8)) == 0
    assert m.allocate("b", [*toks(8), 100]).num_cached_tokens == 0
    m.free("a")
    assert m.stats().num_cached == 0


def test_bad_extra_keys_are_refused_before_anything_is_allocated_with_caching_off() -> None:
    m = manager(enable_prefix_caching=False)
    before = snapshot(m)
    with pytest.raises((TypeError, InvalidRequestError)):
        m.allocate("a", toks(5), extra_keys=(1.5,))  # type: ignore[arg-type]
    assert snapshot(m) == before


def test_bad_extra_keys_are_refused_before_anything_is_allocated() -> None:
    m = manager()
    before = snapshot(m)
    with pytest.raises(InvalidRequestError, match="extra keys must be str, int or bytes"):
        m.allocate("a", toks(5), extra_keys=(1.5,))  # type: ignore[arg-type]
    assert snapshot(m) == before
    assert "a" not in m


# -- append -------------------------------------------------------------------------------
def _runs(block_ids: list[int]) -> int:
    return 1 + sum(1 for a, b in itertools.pairwise(block_ids) if b != a + 1)


def test_sequences_decoding_side_by_side_each_grow_one_run() -> None:
    """Four prompts back to back, then decoded round-robin with room for 8 blocks each:
    each sequence's new blocks form one run (read in place by attention), not one-block
    runs interleaved with the others' (each copied before it is read)."""
    m = manager(num_blocks=4 * 4 + 4 * 8 + 1)
    for seq in range(4):
        computed(m, seq, toks(4 * BS, start=100 * seq))  # blocks 4 * seq .. 4 * seq + 3
    for step in range(8 * BS):
        for seq in range(4):
            m.append(seq, [1000 + step])
    prompts = [m.block_ids(seq)[:4] for seq in range(4)]
    assert prompts == [list(range(4 * seq, 4 * seq + 4)) for seq in range(4)]
    decoded = [m.block_ids(seq)[4:] for seq in range(4)]
    assert [len(ids) for ids in decoded] == [8] * 4
    assert [_runs(ids) for ids in decoded] == [1] * 4
    assert _runs(m.block_ids(3)) == 1  # the last prompt's run had room to go on


def test_a_new_run_starts_in_the_largest_gap_of_empty_blocks() -> None:
    m = manager(num_blocks=12)
    computed(m, "a", toks(2 * BS))  # 0, 1
    computed(m, "b", toks(2 * BS, start=100))  # 2, 3
    computed(m, "c", toks(BS, start=200))  # 4; blocks 5..11 empty
    m.free("c")  # cached, so not a place to start a run: the gap is 5..11
    m.append("a", [7])  # a's next block (2) is b's: a new run, at the gap's start
    assert m.block_ids("a") == [0, 1, 5]
    m.append("b", [7])  # b's next block (4) is cached: a new run, mid-gap (6..11)
    assert m.block_ids("b") == [2, 3, 9]


def test_append_fills_the_last_block_before_taking_a_new_one() -> None:
    m = manager()
    m.allocate("a", toks(5))
    assert m.append("a", toks(3)) == AppendResult(new_block_ids=(), copies=())
    assert m.num_tokens("a") == 8
    assert m.block_ids("a") == [0, 1]


def test_append_to_a_full_last_block_takes_one_new_block() -> None:
    m = manager()
    m.allocate("a", toks(4))
    assert m.append("a", [4]) == AppendResult(new_block_ids=(1,), copies=())
    assert m.block_ids("a") == [0, 1]


def test_append_across_several_blocks_at_once() -> None:
    m = manager()
    m.allocate("a", toks(3))
    assert m.append("a", toks(10)) == AppendResult(new_block_ids=(1, 2, 3), copies=())
    assert m.num_tokens("a") == 13


def test_append_nothing_changes_nothing() -> None:
    m = manager()
    m.allocate("a", toks(4))
    before = snapshot(m, "a")
    assert m.append("a", []) == AppendResult(new_block_ids=(), copies=())
    assert snapshot(m, "a") == before


def test_append_takes_the_block_right_after_the_sequence_when_empty() -> None:
    m = manager()
    for seq_id in "abc":
        m.allocate(seq_id, toks(4))
    m.free("b")
    m.free("c")  # block 2 is now the head of the free queue, block 1 follows it
    assert m.append("a", [4]).new_block_ids == (1,)


def test_append_with_bad_token_ids_changes_nothing() -> None:
    m = manager()
    m.allocate("a", toks(4))
    before = snapshot(m, "a")
    with pytest.raises(InvalidRequestError, match="non-negative"):
        m.append("a", [5, -1])
    assert snapshot(m, "a") == before


# -- fork and copy on write ---------------------------------------------------------------
def test_fork_shares_every_block() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.fork("a", "b")
    assert m.block_ids("b") == [0, 1]
    assert m.num_tokens("b") == 6
    assert [m.pool.blocks[i].ref_cnt for i in range(3)] == [2, 2, 0]
    assert m.stats().num_in_use == 2


def test_appending_to_a_fork_copies_the_shared_partial_block() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.fork("a", "b")
    assert m.append("b", [6]) == AppendResult(new_block_ids=(), copies=((1, 2),))
    assert m.block_ids("b") == [0, 2]
    assert m.block_ids("a") == [0, 1]
    assert [m.pool.blocks[i].ref_cnt for i in range(3)] == [2, 1, 1]


def test_the_second_writer_writes_in_place_after_copy_on_write() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.fork("a", "b")
    m.append("b", [6])
    assert m.append("a", [60]) == AppendResult(new_block_ids=(), copies=())
    assert m.block_ids("a") == [0, 1]


def test_copy_on_write_then_new_blocks_in_one_append() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.fork("a", "b")
    assert m.append("b", toks(5)) == AppendResult(new_block_ids=(3,), copies=((1, 2),))
    assert m.block_ids("b") == [0, 2, 3]


def test_no_copy_on_write_when_the_shared_last_block_is_full() -> None:
    m = manager()
    m.allocate("a", toks(8))
    m.fork("a", "b")
    assert m.append("b", [8]) == AppendResult(new_block_ids=(2,), copies=())
    assert m.block_ids("b") == [0, 1, 2]
    assert m.block_ids("a") == [0, 1]


def test_copy_on_write_needs_a_free_block() -> None:
    m = manager(num_blocks=2)
    m.allocate("a", toks(6))
    m.fork("a", "b")
    assert m.can_append("b", 1) == Fit(Shortfall.POOL, needed=1, available=0)
    before = snapshot(m, "a", "b")
    with pytest.raises(OutOfBlocksError):
        m.append("b", [6])
    assert snapshot(m, "a", "b") == before


def test_freeing_the_parent_keeps_the_childs_blocks() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.fork("a", "b")
    m.free("a")
    assert m.block_ids("b") == [0, 1]
    assert [m.pool.blocks[i].ref_cnt for i in range(2)] == [1, 1]
    assert m.stats().num_in_use == 2


def test_fork_onto_an_existing_id_is_refused() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.allocate("b", toks(1))
    before = snapshot(m, "a", "b")
    with pytest.raises(DuplicateSequenceError, match="free it first or use a new id"):
        m.fork("a", "b")
    assert snapshot(m, "a", "b") == before


# -- free ---------------------------------------------------------------------------------
def test_free_returns_every_block() -> None:
    m = manager()
    m.allocate("a", toks(10))
    m.free("a")
    stats = m.stats()
    assert (stats.num_in_use, stats.num_empty, stats.num_cached) == (0, 8, 0)
    assert stats.num_sequences == 0
    assert "a" not in m


def test_free_keeps_computed_full_blocks_cached() -> None:
    m = manager()
    computed(m, "a", toks(10))
    m.free("a")
    stats = m.stats()
    assert (stats.num_in_use, stats.num_empty, stats.num_cached) == (0, 6, 2)
    assert m.longest_cached_prefix(toks(10)) == 8


def test_a_freed_sequence_is_evicted_tail_first() -> None:
    m = manager(num_blocks=3)
    computed(m, "a", toks(12))
    m.free("a")
    assert m.longest_cached_prefix(toks(12)) == 12
    assert m.allocate("b", toks(4, start=100)).block_ids == (2,)
    assert m.longest_cached_prefix(toks(12)) == 8
    assert m.allocate("c", toks(4, start=200)).block_ids == (1,)
    assert m.longest_cached_prefix(toks(12)) == 4


def test_a_freed_id_can_be_allocated_again() -> None:
    m = manager()
    m.allocate("a", toks(4))
    m.free("a")
    assert m.allocate("a", toks(8)).block_ids == (0, 1)


# -- stats --------------------------------------------------------------------------------
def test_fragmentation_is_allocated_slots_minus_live_tokens() -> None:
    m = manager()
    m.allocate("a", toks(6))
    m.allocate("b", toks(1))
    stats = m.stats()
    assert (stats.num_allocated_slots, stats.num_tokens) == (12, 7)
    assert stats.fragmentation_tokens == 5


def test_prefix_cache_queries_and_hits_are_counted_in_tokens() -> None:
    m = manager()
    computed(m, "a", toks(6))
    assert (m.stats().prefix_cache_queries, m.stats().prefix_cache_hits) == (6, 0)
    m.allocate("b", toks(6))
    assert (m.stats().prefix_cache_queries, m.stats().prefix_cache_hits) == (12, 4)


def test_stats_describe_the_whole_manager() -> None:
    m = manager(num_blocks=8, num_host_blocks=4)
    computed(m, "a", toks(8))
    m.allocate("b", toks(5))
    m.pin("a", 4)
    m.free("a")
    m.swap_out("b")
    stats = m.stats()
    assert (stats.num_blocks, stats.num_host_blocks) == (8, 4)
    assert (stats.num_in_use, stats.num_cached, stats.num_empty) == (1, 1, 6)
    assert (stats.num_pinned, stats.num_swapped, stats.num_sequences) == (1, 2, 1)
    assert stats.num_free == 7 == m.num_free_blocks
