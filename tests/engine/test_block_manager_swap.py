"""BlockManager: swapping sequences to the host pool and back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.block_manager import BlockManager
from engine.block_results import Fit, Shortfall
from engine.block_table import SequenceState
from engine.budget import BudgetInfo
from engine.errors import (
    OutOfBlocksError,
    OutOfSwapSpaceError,
    SequenceStateError,
)
from tests.engine.block_manager_helpers import computed, manager, snapshot, toks


# -- swap ---------------------------------------------------------------------------------
def test_swap_out_moves_every_block_to_the_host_and_frees_the_device() -> None:
    m = manager(num_blocks=6, num_host_blocks=4)
    m.allocate("x", toks(4, start=100))
    m.allocate("a", toks(10))
    assert m.swap_out("a") == ((1, 0), (2, 1), (3, 2))
    assert m.sequence_state("a") is SequenceState.SWAPPED
    assert m.block_ids("a") == [0, 1, 2]
    assert m.num_tokens("a") == 10
    stats = m.stats()
    assert (stats.num_in_use, stats.num_swapped) == (1, 3)


def test_swap_outs_count_sequences_and_their_blocks_apart() -> None:
    m = manager(num_blocks=8, num_host_blocks=6)
    m.allocate("a", toks(10))
    m.allocate("b", toks(4, start=100))
    m.swap_out("a")
    m.swap_out("b")
    swaps = m.swap_space
    assert (swaps.num_swap_outs, swaps.num_blocks_swapped_out) == (2, 4)
    m.swap_in("a")
    m.swap_out("a")  # the same sequence again: another offload
    assert (swaps.num_swap_outs, swaps.num_blocks_swapped_out) == (3, 7)


def test_swap_in_copies_back_blocks_that_were_never_cached() -> None:
    m = manager(num_blocks=6, num_host_blocks=4)
    m.allocate("a", toks(10))
    m.swap_out("a")
    m.allocate("y", toks(4, start=100))  # takes device block 0
    assert m.swap_in("a") == ((0, 1), (1, 2), (2, 3))
    assert m.sequence_state("a") is SequenceState.RESIDENT
    assert m.block_ids("a") == [1, 2, 3]
    assert m.stats().num_swapped == 0


def test_swap_in_reuses_full_blocks_still_in_the_prefix_cache() -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    computed(m, "a", toks(10))
    assert m.swap_out("a") == ((0, 0), (1, 1), (2, 2))
    assert m.stats().num_cached == 2
    # Blocks 0 and 1 are found by hash; only the partial block 2 is copied back.
    assert m.swap_in("a") == ((2, 2),)
    assert m.block_ids("a") == [0, 1, 2]
    assert (m.stats().num_cached, m.stats().num_in_use) == (0, 3)


def test_swap_in_after_eviction_copies_back_and_caches_again() -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    computed(m, "a", toks(10))
    m.swap_out("a")
    assert m.allocate("b", toks(16, start=100)).block_ids == (2, 3, 1, 0)
    m.free("b")
    assert m.longest_cached_prefix(toks(10)) == 0
    assert m.swap_in("a") == ((0, 2), (1, 3), (2, 1))
    assert m.block_ids("a") == [2, 3, 1]
    assert m.longest_cached_prefix(toks(10)) == 8
    assert m.allocate("c", [*toks(8), 100]).num_cached_tokens == 8


def test_swap_in_shares_blocks_another_sequence_cached_meanwhile() -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    computed(m, "a", toks(10))
    m.swap_out("a")
    m.allocate("b", [*toks(8), 100])  # hits device blocks 0 and 1
    assert m.swap_in("a") == ((2, 3),)
    assert m.block_ids("a") == [0, 1, 3]
    assert [m.pool.blocks[i].ref_cnt for i in range(4)] == [2, 2, 1, 1]


def test_swap_out_without_host_space_raises_and_changes_nothing() -> None:
    m = manager(num_blocks=4, num_host_blocks=2)
    m.allocate("a", toks(10))
    assert m.can_swap_out("a") == Fit(Shortfall.HOST_POOL, needed=3, available=2)
    before = snapshot(m, "a")
    with pytest.raises(OutOfSwapSpaceError, match="raise the swap space") as err:
        m.swap_out("a")
    assert (err.value.needed, err.value.available) == (3, 2)
    assert snapshot(m, "a") == before


def test_swap_out_with_no_host_pool_is_refused() -> None:
    m = manager()
    m.allocate("a", toks(1))
    assert m.can_swap_out("a") == Fit(Shortfall.HOST_POOL, needed=1, available=0)


def test_swap_in_without_device_space_raises_and_changes_nothing() -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", toks(10))
    m.swap_out("a")
    m.allocate("b", toks(16, start=100))
    assert m.can_swap_in("a") == Fit(Shortfall.POOL, needed=3, available=0)
    before = snapshot(m, "a", "b")
    with pytest.raises(OutOfBlocksError) as err:
        m.swap_in("a")
    assert (err.value.needed, err.value.available) == (3, 0)
    assert snapshot(m, "a", "b") == before


def test_freeing_a_swapped_sequence_returns_its_host_blocks() -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", toks(10))
    m.swap_out("a")
    m.free("a")
    assert m.stats().num_swapped == 0
    assert m.host_pool.num_free_blocks == 4
    assert "a" not in m


def test_a_swapped_sequence_stays_charged_to_its_budget() -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", toks(10), budget="t")
    m.swap_out("a")
    assert m.budgets.get("t").info() == BudgetInfo("t", max_blocks=3, num_blocks=3, num_sequences=1)
    m.swap_in("a")
    assert m.budgets.get("t").info().num_blocks == 3


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.append("a", [1]),
        lambda m: m.can_append("a", 1),
        lambda m: m.fork("a", "b"),
        lambda m: m.swap_out("a"),
        lambda m: m.mark_computed("a", 4),
        lambda m: m.pin("a"),
    ],
)
def test_a_swapped_sequence_refuses_resident_only_calls(
    call: Callable[[BlockManager], object],
) -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", toks(10))
    m.swap_out("a")
    before = snapshot(m, "a")
    with pytest.raises(SequenceStateError, match="while it is swapped out; swap it in first"):
        call(m)
    assert snapshot(m, "a") == before


def test_swap_in_of_a_resident_sequence_is_refused() -> None:
    m = manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", toks(10))
    with pytest.raises(SequenceStateError, match="while it is resident; swap it out first") as err:
        m.swap_in("a")
    assert (err.value.seq_id, err.value.action) == ("a", "swap in")


def test_a_refused_swap_in_is_asked_again_once_blocks_are_freed() -> None:
    # A refusal is kept until the pool's room changes (a context waiting to come back
    # is asked at every step); a free changes it.
    m = manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", toks(10))
    m.swap_out("a")
    m.allocate("b", toks(16, start=100))
    assert not m.can_swap_in("a")
    assert not m.can_swap_in("a")  # asked again with nothing changed: still no
    m.free("b")
    assert m.can_swap_in("a")


def test_a_refused_swap_in_is_asked_again_once_its_content_is_cached() -> None:
    # Another sequence computes the swapped context's first blocks: they are hits now,
    # and the swap-in needs only its partial block, though no block was freed.
    m = manager(num_blocks=6, num_host_blocks=4)
    computed(m, "a", toks(10))
    m.swap_out("a")
    m.allocate("x", toks(24, start=100))  # evicts a's cached blocks
    m.free("x")
    m.allocate("d", toks(8))  # a's first two blocks' content, not computed yet
    m.allocate("y", toks(12, start=200))
    assert m.can_swap_in("a") == Fit(Shortfall.POOL, needed=3, available=1)
    m.mark_computed("d", 8)
    assert m.can_swap_in("a")
