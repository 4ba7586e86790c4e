from __future__ import annotations

from collections.abc import Callable, Hashable

import pytest

from engine.block_manager import BlockManager
from engine.block_results import Allocation, AppendResult, Fit, PinnedPrefix, Shortfall
from engine.block_table import SequenceState
from engine.budget import BudgetInfo
from engine.errors import (
    BudgetExceededError,
    BudgetInUseError,
    CeilingExceededError,
    DuplicateBudgetError,
    DuplicateSequenceError,
    InvalidRequestError,
    OutOfBlocksError,
    OutOfSwapSpaceError,
    SequenceStateError,
    UnknownBudgetError,
    UnknownPinError,
    UnknownSequenceError,
)

BS = 4  # small blocks keep the arithmetic readable


def _toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def _manager(num_blocks: int = 8, **kwargs: object) -> BlockManager:
    return BlockManager(num_blocks=num_blocks, block_size=BS, **kwargs)  # type: ignore[arg-type]


def _computed(m: BlockManager, seq_id: Hashable, token_ids: list[int], **kwargs: object):
    """Allocate a sequence and mark all of its tokens computed."""
    allocation = m.allocate(seq_id, token_ids, **kwargs)  # type: ignore[arg-type]
    m.mark_computed(seq_id, len(token_ids))
    return allocation


def _snapshot(m: BlockManager, *seq_ids: Hashable) -> tuple:
    """Everything a refused call must leave as it was."""
    return (
        m.stats(),
        [budget.info() for budget in m.budgets],
        {s: (m.block_ids(s), m.num_tokens(s), m.sequence_state(s)) for s in seq_ids},
        [(b.ref_cnt, b.num_pins, b.block_hash) for b in m.pool.blocks],
        [b.block_id for b in m.pool._free_queue],
        [(b.ref_cnt, b.block_hash) for b in m.host_pool.blocks],
    )


# -- allocate -----------------------------------------------------------------------------
@pytest.mark.parametrize(("num_tokens", "num_blocks"), [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3)])
def test_allocate_takes_ceil_tokens_over_block_size_blocks(
    num_tokens: int, num_blocks: int
) -> None:
    m = _manager()
    allocation = m.allocate("a", _toks(num_tokens))
    assert allocation == Allocation(block_ids=tuple(range(num_blocks)), num_cached_tokens=0)
    assert m.num_tokens("a") == num_tokens
    assert m.stats().num_in_use == num_blocks


def test_allocate_places_each_sequence_in_one_run() -> None:
    m = _manager()
    assert m.allocate("a", _toks(10)).block_ids == (0, 1, 2)
    assert m.allocate("b", _toks(5)).block_ids == (3, 4)
    assert m.block_ids("a") == [0, 1, 2]
    assert "a" in m
    assert m.sequence_state("a") is SequenceState.RESIDENT


def test_allocate_reuses_a_prefix_computed_by_an_earlier_sequence() -> None:
    m = _manager()
    _computed(m, "a", _toks(8))
    allocation = m.allocate("b", [*_toks(8), 100, 101])
    assert allocation == Allocation(block_ids=(0, 1, 2), num_cached_tokens=8)
    assert [m.pool.blocks[i].ref_cnt for i in range(3)] == [2, 2, 1]


def test_no_cache_hit_before_mark_computed() -> None:
    m = _manager()
    m.allocate("a", _toks(8))
    allocation = m.allocate("b", [*_toks(8), 100])
    assert allocation == Allocation(block_ids=(2, 3, 4), num_cached_tokens=0)


def test_mark_computed_caches_only_full_blocks() -> None:
    m = _manager()
    m.allocate("a", _toks(8))
    m.mark_computed("a", 7)
    assert m.longest_cached_prefix(_toks(8)) == 4
    assert m.allocate("b", [*_toks(8), 100]).num_cached_tokens == 4


def test_mark_computed_in_steps_extends_the_chain() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.mark_computed("a", 4)
    m.append("a", _toks(2, start=6))
    m.mark_computed("a", 8)
    assert m.longest_cached_prefix(_toks(8)) == 8
    assert m.allocate("b", [*_toks(8), 100]).num_cached_tokens == 8


def test_the_cached_prefix_stops_before_the_last_token() -> None:
    m = BlockManager(num_blocks=8, block_size=16)
    _computed(m, "a", _toks(32))
    # Both blocks are cached, but the last token must be computed to get logits.
    assert m.allocate("b", _toks(32)) == Allocation(block_ids=(0, 2), num_cached_tokens=16)


def test_a_prompt_one_token_past_a_cached_sequence_reuses_all_of_it() -> None:
    m = BlockManager(num_blocks=8, block_size=16)
    _computed(m, "a", _toks(32))
    assert m.allocate("b", _toks(33)) == Allocation(block_ids=(0, 1, 2), num_cached_tokens=32)


def test_a_hit_on_a_freed_cached_block_takes_it_back() -> None:
    m = _manager()
    _computed(m, "a", _toks(8))
    m.free("a")
    assert (m.stats().num_cached, m.stats().num_in_use) == (2, 0)
    assert m.allocate("b", [*_toks(8), 100]) == Allocation((0, 1, 2), num_cached_tokens=8)
    assert (m.stats().num_cached, m.stats().num_in_use) == (0, 3)


def test_cache_salt_isolates_tenants() -> None:
    m = _manager(num_blocks=16)
    _computed(m, "a", _toks(8), cache_salt="tenant-1")
    prompt = [*_toks(8), 100]
    assert m.allocate("other-tenant", prompt, cache_salt="tenant-2").num_cached_tokens == 0
    assert m.allocate("no-salt", prompt).num_cached_tokens == 0
    assert m.allocate("same-tenant", prompt, cache_salt="tenant-1").num_cached_tokens == 8


def test_extra_keys_isolate_sequences() -> None:
    m = _manager(num_blocks=16)
    _computed(m, "a", _toks(8), extra_keys=("lora-a",))
    prompt = [*_toks(8), 100]
    assert m.allocate("b", prompt, extra_keys=("lora-b",)).num_cached_tokens == 0
    assert m.allocate("c", prompt).num_cached_tokens == 0
    assert m.allocate("d", prompt, extra_keys=("lora-a",)).num_cached_tokens == 8


def test_no_unsalted_sequence_ever_hits_a_salted_tenants_blocks() -> None:
    m = BlockManager(num_blocks=8, block_size=1)
    _computed(m, "victim", [42, 43], cache_salt="abc")
    token = int.from_bytes(b"salt:abc", "little")  # a valid, non-negative token id
    _computed(m, "probe", [token, 0])
    assert m.allocate("attacker", [token, 42, 43, 44]).num_cached_tokens == 1


def test_longest_cached_prefix_counts_cached_full_blocks() -> None:
    m = _manager()
    _computed(m, "a", _toks(10))
    assert m.longest_cached_prefix(_toks(10)) == 8
    assert m.longest_cached_prefix(_toks(12)) == 8
    assert m.longest_cached_prefix(_toks(4)) == 4
    assert m.longest_cached_prefix(_toks(3)) == 0
    assert m.longest_cached_prefix([*_toks(5), 999, 6, 7]) == 4
    assert m.longest_cached_prefix([999, *_toks(9, start=1)]) == 0


def test_longest_cached_prefix_respects_salt_and_extra_keys() -> None:
    m = _manager()
    _computed(m, "a", _toks(8), cache_salt="t", extra_keys=(7,))
    assert m.longest_cached_prefix(_toks(8), cache_salt="t", extra_keys=(7,)) == 8
    assert m.longest_cached_prefix(_toks(8), cache_salt="t") == 0
    assert m.longest_cached_prefix(_toks(8), extra_keys=(7,)) == 0


def test_prefix_caching_off_never_hits() -> None:
    m = _manager(enable_prefix_caching=False)
    _computed(m, "a", _toks(8))
    assert m.longest_cached_prefix(_toks(8)) == 0
    assert m.allocate("b", [*_toks(8), 100]).num_cached_tokens == 0
    m.free("a")
    assert m.stats().num_cached == 0


def test_bad_extra_keys_are_refused_before_anything_is_allocated_with_caching_off() -> None:
    m = _manager(enable_prefix_caching=False)
    before = _snapshot(m)
    with pytest.raises((TypeError, InvalidRequestError)):
        m.allocate("a", _toks(5), extra_keys=(1.5,))  # type: ignore[arg-type]
    assert _snapshot(m) == before


def test_bad_extra_keys_are_refused_before_anything_is_allocated() -> None:
    m = _manager()
    before = _snapshot(m)
    with pytest.raises(InvalidRequestError, match="extra keys must be str, int or bytes"):
        m.allocate("a", _toks(5), extra_keys=(1.5,))  # type: ignore[arg-type]
    assert _snapshot(m) == before
    assert "a" not in m


# -- append -------------------------------------------------------------------------------
def test_append_fills_the_last_block_before_taking_a_new_one() -> None:
    m = _manager()
    m.allocate("a", _toks(5))
    assert m.append("a", _toks(3)) == AppendResult(new_block_ids=(), copies=())
    assert m.num_tokens("a") == 8
    assert m.block_ids("a") == [0, 1]


def test_append_to_a_full_last_block_takes_one_new_block() -> None:
    m = _manager()
    m.allocate("a", _toks(4))
    assert m.append("a", [4]) == AppendResult(new_block_ids=(1,), copies=())
    assert m.block_ids("a") == [0, 1]


def test_append_across_several_blocks_at_once() -> None:
    m = _manager()
    m.allocate("a", _toks(3))
    assert m.append("a", _toks(10)) == AppendResult(new_block_ids=(1, 2, 3), copies=())
    assert m.num_tokens("a") == 13


def test_append_nothing_changes_nothing() -> None:
    m = _manager()
    m.allocate("a", _toks(4))
    before = _snapshot(m, "a")
    assert m.append("a", []) == AppendResult(new_block_ids=(), copies=())
    assert _snapshot(m, "a") == before


def test_append_takes_the_block_right_after_the_sequence_when_empty() -> None:
    m = _manager()
    for seq_id in "abc":
        m.allocate(seq_id, _toks(4))
    m.free("b")
    m.free("c")  # block 2 is now the head of the free queue, block 1 follows it
    assert m.append("a", [4]).new_block_ids == (1,)


def test_append_with_bad_token_ids_changes_nothing() -> None:
    m = _manager()
    m.allocate("a", _toks(4))
    before = _snapshot(m, "a")
    with pytest.raises(InvalidRequestError, match="non-negative"):
        m.append("a", [5, -1])
    assert _snapshot(m, "a") == before


# -- fork and copy on write ---------------------------------------------------------------
def test_fork_shares_every_block() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.fork("a", "b")
    assert m.block_ids("b") == [0, 1]
    assert m.num_tokens("b") == 6
    assert [m.pool.blocks[i].ref_cnt for i in range(3)] == [2, 2, 0]
    assert m.stats().num_in_use == 2


def test_appending_to_a_fork_copies_the_shared_partial_block() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.fork("a", "b")
    assert m.append("b", [6]) == AppendResult(new_block_ids=(), copies=((1, 2),))
    assert m.block_ids("b") == [0, 2]
    assert m.block_ids("a") == [0, 1]
    assert [m.pool.blocks[i].ref_cnt for i in range(3)] == [2, 1, 1]


def test_the_second_writer_writes_in_place_after_copy_on_write() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.fork("a", "b")
    m.append("b", [6])
    assert m.append("a", [60]) == AppendResult(new_block_ids=(), copies=())
    assert m.block_ids("a") == [0, 1]


def test_copy_on_write_then_new_blocks_in_one_append() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.fork("a", "b")
    assert m.append("b", _toks(5)) == AppendResult(new_block_ids=(3,), copies=((1, 2),))
    assert m.block_ids("b") == [0, 2, 3]


def test_no_copy_on_write_when_the_shared_last_block_is_full() -> None:
    m = _manager()
    m.allocate("a", _toks(8))
    m.fork("a", "b")
    assert m.append("b", [8]) == AppendResult(new_block_ids=(2,), copies=())
    assert m.block_ids("b") == [0, 1, 2]
    assert m.block_ids("a") == [0, 1]


def test_copy_on_write_needs_a_free_block() -> None:
    m = _manager(num_blocks=2)
    m.allocate("a", _toks(6))
    m.fork("a", "b")
    assert m.can_append("b", 1) == Fit(Shortfall.POOL, needed=1, available=0)
    before = _snapshot(m, "a", "b")
    with pytest.raises(OutOfBlocksError):
        m.append("b", [6])
    assert _snapshot(m, "a", "b") == before


def test_freeing_the_parent_keeps_the_childs_blocks() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.fork("a", "b")
    m.free("a")
    assert m.block_ids("b") == [0, 1]
    assert [m.pool.blocks[i].ref_cnt for i in range(2)] == [1, 1]
    assert m.stats().num_in_use == 2


def test_fork_onto_an_existing_id_is_refused() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.allocate("b", _toks(1))
    before = _snapshot(m, "a", "b")
    with pytest.raises(DuplicateSequenceError, match="free it first or use a new id"):
        m.fork("a", "b")
    assert _snapshot(m, "a", "b") == before


# -- free ---------------------------------------------------------------------------------
def test_free_returns_every_block() -> None:
    m = _manager()
    m.allocate("a", _toks(10))
    m.free("a")
    stats = m.stats()
    assert (stats.num_in_use, stats.num_empty, stats.num_cached) == (0, 8, 0)
    assert stats.num_sequences == 0
    assert "a" not in m


def test_free_keeps_computed_full_blocks_cached() -> None:
    m = _manager()
    _computed(m, "a", _toks(10))
    m.free("a")
    stats = m.stats()
    assert (stats.num_in_use, stats.num_empty, stats.num_cached) == (0, 6, 2)
    assert m.longest_cached_prefix(_toks(10)) == 8


def test_a_freed_sequence_is_evicted_tail_first() -> None:
    m = _manager(num_blocks=3)
    _computed(m, "a", _toks(12))
    m.free("a")
    assert m.longest_cached_prefix(_toks(12)) == 12
    assert m.allocate("b", _toks(4, start=100)).block_ids == (2,)
    assert m.longest_cached_prefix(_toks(12)) == 8
    assert m.allocate("c", _toks(4, start=200)).block_ids == (1,)
    assert m.longest_cached_prefix(_toks(12)) == 4


def test_a_freed_id_can_be_allocated_again() -> None:
    m = _manager()
    m.allocate("a", _toks(4))
    m.free("a")
    assert m.allocate("a", _toks(8)).block_ids == (0, 1)


# -- budgets ------------------------------------------------------------------------------
def test_open_budget_returns_its_info() -> None:
    m = _manager()
    info = m.budgets.open("t", max_blocks=4)
    assert info == BudgetInfo(name="t", max_blocks=4, num_blocks=0, num_sequences=0)
    assert m.budgets.get("t").info() == info


def test_allocate_charges_its_budget() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(6), budget="t")
    assert m.budgets.get("t").info() == BudgetInfo("t", max_blocks=4, num_blocks=2, num_sequences=1)


def test_a_prefix_hit_is_charged_like_any_block() -> None:
    m = _manager()
    _computed(m, "a", _toks(8))
    m.budgets.open("t", max_blocks=4)
    assert m.allocate("b", [*_toks(8), 100], budget="t").num_cached_tokens == 8
    assert m.budgets.get("t").info().num_blocks == 3


def test_free_returns_blocks_to_the_budget() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(6), budget="t")
    m.free("a")
    assert m.budgets.get("t").info() == BudgetInfo("t", max_blocks=4, num_blocks=0, num_sequences=0)


def test_append_charges_only_new_blocks() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(4), budget="t")
    m.append("a", [4])
    assert m.budgets.get("t").info().num_blocks == 2
    m.append("a", [5, 6, 7])
    assert m.budgets.get("t").info().num_blocks == 2


def test_fork_charges_the_shared_blocks_to_the_child_too() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(6), budget="t")
    m.fork("a", "b")
    assert m.budgets.get("t").info() == BudgetInfo("t", max_blocks=4, num_blocks=4, num_sequences=2)


def test_copy_on_write_does_not_change_the_charge() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(6), budget="t")
    m.fork("a", "b")
    m.append("b", [6])
    assert m.budgets.get("t").info().num_blocks == 4


def test_can_allocate_over_budget_reports_the_numbers() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", _toks(5), budget="t")
    fit = m.can_allocate(_toks(8), budget="t")
    assert not fit
    assert fit == Fit(Shortfall.BUDGET, needed=2, available=1)


def test_allocate_over_budget_raises_and_changes_nothing() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", _toks(5), budget="t")
    before = _snapshot(m, "a")
    with pytest.raises(BudgetExceededError, match="open a larger budget") as err:
        m.allocate("b", _toks(8), budget="t")
    assert (err.value.name, err.value.needed, err.value.available) == ("t", 2, 1)
    assert err.value.max_blocks == 3
    assert _snapshot(m, "a") == before
    assert "b" not in m


def test_append_over_budget_is_refused_and_changes_nothing() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=2)
    m.allocate("a", _toks(8), budget="t")
    assert m.can_append("a", 1) == Fit(Shortfall.BUDGET, needed=1, available=0)
    before = _snapshot(m, "a")
    with pytest.raises(BudgetExceededError) as err:
        m.append("a", [8])
    assert (err.value.needed, err.value.available) == (1, 0)
    assert _snapshot(m, "a") == before


def test_fork_over_budget_is_refused_and_changes_nothing() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", _toks(8), budget="t")
    assert m.can_fork("a") == Fit(Shortfall.BUDGET, needed=2, available=1)
    before = _snapshot(m, "a")
    with pytest.raises(BudgetExceededError) as err:
        m.fork("a", "b")
    assert (err.value.needed, err.value.available) == (2, 1)
    assert _snapshot(m, "a") == before
    assert "b" not in m


def test_a_budget_can_grow() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=1)
    m.allocate("a", _toks(4), budget="t")
    assert m.budgets.resize("t", max_blocks=3) == BudgetInfo("t", 3, 1, 1)
    assert m.allocate("b", _toks(8), budget="t").block_ids == (1, 2)


def test_a_budget_can_shrink_to_its_usage() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(8), budget="t")
    assert m.budgets.resize("t", max_blocks=2) == BudgetInfo("t", 2, 2, 1)


def test_a_budget_cannot_shrink_below_its_usage() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(8), budget="t")
    with pytest.raises(InvalidRequestError, match="cannot shrink to 1 until its sequences free"):
        m.budgets.resize("t", max_blocks=1)
    assert m.budgets.get("t").info() == BudgetInfo("t", 4, 2, 1)


def test_closing_a_budget_in_use_raises() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(8), budget="t")
    with pytest.raises(BudgetInUseError, match="free them before closing it") as err:
        m.budgets.close("t")
    assert (err.value.name, err.value.num_sequences) == ("t", 1)
    assert m.budgets.get("t").info() == BudgetInfo("t", 4, 2, 1)


def test_a_budget_closes_once_its_sequences_are_freed() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", _toks(8), budget="t")
    m.free("a")
    m.budgets.close("t")
    assert len(m.budgets) == 0
    with pytest.raises(UnknownBudgetError):
        m.budgets.get("t")


def test_opening_a_budget_twice_raises() -> None:
    m = _manager()
    m.budgets.open("t", max_blocks=4)
    with pytest.raises(DuplicateBudgetError, match="already open") as err:
        m.budgets.open("t", max_blocks=8)
    assert err.value.name == "t"
    assert m.budgets.get("t").info().max_blocks == 4


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.budgets.get("nope"),
        lambda m: m.budgets.resize("nope", max_blocks=1),
        lambda m: m.budgets.close("nope"),
        lambda m: m.allocate("a", _toks(4), budget="nope"),
        lambda m: m.can_allocate(_toks(4), budget="nope"),
    ],
)
def test_an_unknown_budget_raises(call: Callable[[BlockManager], object]) -> None:
    m = _manager()
    with pytest.raises(UnknownBudgetError) as err:
        call(m)
    assert str(err.value) == "no budget named 'nope'; open it with open_budget() first"
    assert m.stats().num_in_use == 0


@pytest.mark.parametrize("bad", [-1, True, 1.0])
def test_max_blocks_must_be_a_non_negative_int(bad: object) -> None:
    m = _manager()
    with pytest.raises(InvalidRequestError, match="max_blocks must be an int >= 0"):
        m.budgets.open("t", max_blocks=bad)  # type: ignore[arg-type]
    assert len(m.budgets) == 0


# -- ceilings -----------------------------------------------------------------------------
def test_allocate_beyond_the_ceiling_is_refused() -> None:
    m = _manager()
    assert m.can_allocate(_toks(9), ceiling_tokens=8) == Fit(Shortfall.CEILING, 9, 8)
    before = _snapshot(m)
    with pytest.raises(CeilingExceededError, match="compact its context or raise") as err:
        m.allocate("a", _toks(9), ceiling_tokens=8)
    assert (err.value.seq_id, err.value.needed, err.value.available) == ("a", 9, 8)
    assert err.value.ceiling_tokens == 8
    assert _snapshot(m) == before


def test_allocate_up_to_the_ceiling_fits() -> None:
    m = _manager()
    assert m.can_allocate(_toks(8), ceiling_tokens=8)
    assert m.allocate("a", _toks(8), ceiling_tokens=8).block_ids == (0, 1)


def test_append_to_exactly_the_ceiling_fits_and_one_more_is_refused() -> None:
    m = _manager()
    m.allocate("a", _toks(6), ceiling_tokens=8)
    assert m.append("a", [6, 7]) == AppendResult(new_block_ids=(), copies=())
    assert m.can_append("a", 1) == Fit(Shortfall.CEILING, needed=9, available=8)
    before = _snapshot(m, "a")
    with pytest.raises(CeilingExceededError) as err:
        m.append("a", [8])
    assert (err.value.needed, err.value.ceiling_tokens) == (9, 8)
    assert _snapshot(m, "a") == before


def test_a_fork_inherits_the_ceiling() -> None:
    m = _manager()
    m.allocate("a", _toks(8), ceiling_tokens=8)
    m.fork("a", "b")
    assert m.can_append("b", 1) == Fit(Shortfall.CEILING, needed=9, available=8)


# -- pool exhaustion ----------------------------------------------------------------------
def test_a_fitting_request_gives_a_truthy_fit() -> None:
    m = _manager(num_blocks=2)
    fit = m.can_allocate(_toks(8))
    assert fit
    assert fit == Fit()


def test_allocate_beyond_the_pool_raises_and_allocates_nothing() -> None:
    m = _manager(num_blocks=2)
    assert m.can_allocate(_toks(12)) == Fit(Shortfall.POOL, needed=3, available=2)
    before = _snapshot(m)
    with pytest.raises(OutOfBlocksError, match="free or swap out sequences") as err:
        m.allocate("a", _toks(12))
    assert (err.value.needed, err.value.available) == (3, 2)
    assert _snapshot(m) == before
    assert m.stats().num_in_use == 0


def test_append_beyond_the_pool_raises_and_changes_nothing() -> None:
    m = _manager(num_blocks=2)
    m.allocate("a", _toks(8))
    assert m.can_append("a", 1) == Fit(Shortfall.POOL, needed=1, available=0)
    before = _snapshot(m, "a")
    with pytest.raises(OutOfBlocksError) as err:
        m.append("a", [8])
    assert (err.value.needed, err.value.available) == (1, 0)
    assert _snapshot(m, "a") == before


def test_free_cached_hits_count_against_the_pool() -> None:
    m = _manager(num_blocks=2)
    _computed(m, "a", _toks(8))
    m.free("a")
    # Two hits that are free themselves plus one new block: 3 of the 2 free blocks.
    assert m.can_allocate([*_toks(8), 100]) == Fit(Shortfall.POOL, needed=3, available=2)
    assert m.allocate("b", _toks(8)) == Allocation(block_ids=(0, 1), num_cached_tokens=4)


def test_hits_on_blocks_in_use_need_no_free_block() -> None:
    m = _manager(num_blocks=3)
    _computed(m, "a", _toks(8))
    assert m.allocate("b", [*_toks(8), 100]) == Allocation((0, 1, 2), num_cached_tokens=8)
    assert m.num_free_blocks == 0


# -- swap ---------------------------------------------------------------------------------
def test_swap_out_moves_every_block_to_the_host_and_frees_the_device() -> None:
    m = _manager(num_blocks=6, num_host_blocks=4)
    m.allocate("x", _toks(4, start=100))
    m.allocate("a", _toks(10))
    assert m.swap_out("a") == ((1, 0), (2, 1), (3, 2))
    assert m.sequence_state("a") is SequenceState.SWAPPED
    assert m.block_ids("a") == [0, 1, 2]
    assert m.num_tokens("a") == 10
    stats = m.stats()
    assert (stats.num_in_use, stats.num_swapped) == (1, 3)


def test_swap_in_copies_back_blocks_that_were_never_cached() -> None:
    m = _manager(num_blocks=6, num_host_blocks=4)
    m.allocate("a", _toks(10))
    m.swap_out("a")
    m.allocate("y", _toks(4, start=100))  # takes device block 0
    assert m.swap_in("a") == ((0, 1), (1, 2), (2, 3))
    assert m.sequence_state("a") is SequenceState.RESIDENT
    assert m.block_ids("a") == [1, 2, 3]
    assert m.stats().num_swapped == 0


def test_swap_in_reuses_full_blocks_still_in_the_prefix_cache() -> None:
    m = _manager(num_blocks=4, num_host_blocks=4)
    _computed(m, "a", _toks(10))
    assert m.swap_out("a") == ((0, 0), (1, 1), (2, 2))
    assert m.stats().num_cached == 2
    # Blocks 0 and 1 are found by hash; only the partial block 2 is copied back.
    assert m.swap_in("a") == ((2, 2),)
    assert m.block_ids("a") == [0, 1, 2]
    assert (m.stats().num_cached, m.stats().num_in_use) == (0, 3)


def test_swap_in_after_eviction_copies_back_and_caches_again() -> None:
    m = _manager(num_blocks=4, num_host_blocks=4)
    _computed(m, "a", _toks(10))
    m.swap_out("a")
    assert m.allocate("b", _toks(16, start=100)).block_ids == (2, 3, 1, 0)
    m.free("b")
    assert m.longest_cached_prefix(_toks(10)) == 0
    assert m.swap_in("a") == ((0, 2), (1, 3), (2, 1))
    assert m.block_ids("a") == [2, 3, 1]
    assert m.longest_cached_prefix(_toks(10)) == 8
    assert m.allocate("c", [*_toks(8), 100]).num_cached_tokens == 8


def test_swap_in_shares_blocks_another_sequence_cached_meanwhile() -> None:
    m = _manager(num_blocks=4, num_host_blocks=4)
    _computed(m, "a", _toks(10))
    m.swap_out("a")
    m.allocate("b", [*_toks(8), 100])  # hits device blocks 0 and 1
    assert m.swap_in("a") == ((2, 3),)
    assert m.block_ids("a") == [0, 1, 3]
    assert [m.pool.blocks[i].ref_cnt for i in range(4)] == [2, 2, 1, 1]


def test_swap_out_without_host_space_raises_and_changes_nothing() -> None:
    m = _manager(num_blocks=4, num_host_blocks=2)
    m.allocate("a", _toks(10))
    assert m.can_swap_out("a") == Fit(Shortfall.HOST_POOL, needed=3, available=2)
    before = _snapshot(m, "a")
    with pytest.raises(OutOfSwapSpaceError, match="raise the swap space") as err:
        m.swap_out("a")
    assert (err.value.needed, err.value.available) == (3, 2)
    assert _snapshot(m, "a") == before


def test_swap_out_with_no_host_pool_is_refused() -> None:
    m = _manager()
    m.allocate("a", _toks(1))
    assert m.can_swap_out("a") == Fit(Shortfall.HOST_POOL, needed=1, available=0)


def test_swap_in_without_device_space_raises_and_changes_nothing() -> None:
    m = _manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", _toks(10))
    m.swap_out("a")
    m.allocate("b", _toks(16, start=100))
    assert m.can_swap_in("a") == Fit(Shortfall.POOL, needed=3, available=0)
    before = _snapshot(m, "a", "b")
    with pytest.raises(OutOfBlocksError) as err:
        m.swap_in("a")
    assert (err.value.needed, err.value.available) == (3, 0)
    assert _snapshot(m, "a", "b") == before


def test_freeing_a_swapped_sequence_returns_its_host_blocks() -> None:
    m = _manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", _toks(10))
    m.swap_out("a")
    m.free("a")
    assert m.stats().num_swapped == 0
    assert m.host_pool.num_free_blocks == 4
    assert "a" not in m


def test_a_swapped_sequence_stays_charged_to_its_budget() -> None:
    m = _manager(num_blocks=4, num_host_blocks=4)
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", _toks(10), budget="t")
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
    m = _manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", _toks(10))
    m.swap_out("a")
    before = _snapshot(m, "a")
    with pytest.raises(SequenceStateError, match="while it is swapped out; swap it in first"):
        call(m)
    assert _snapshot(m, "a") == before


def test_swap_in_of_a_resident_sequence_is_refused() -> None:
    m = _manager(num_blocks=4, num_host_blocks=4)
    m.allocate("a", _toks(10))
    with pytest.raises(SequenceStateError, match="while it is resident; swap it out first") as err:
        m.swap_in("a")
    assert (err.value.seq_id, err.value.action) == ("a", "swap in")


# -- pins ---------------------------------------------------------------------------------
def test_pin_returns_the_pinned_prefix() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(10))
    assert m.pin("a") == PinnedPrefix(pin_id=0, block_ids=(0, 1), num_tokens=8)
    assert [(b.ref_cnt, b.num_pins) for b in m.pool.blocks[:3]] == [(2, 1), (2, 1), (1, 0)]
    assert m.stats().num_pinned == 2


def test_pin_a_shorter_prefix() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(10))
    assert m.pin("a", 7) == PinnedPrefix(pin_id=0, block_ids=(0,), num_tokens=4)


def test_pin_ids_are_distinct() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(8))
    assert (m.pin("a").pin_id, m.pin("a").pin_id) == (0, 1)
    assert m.pool.blocks[0].num_pins == 2


def test_pin_requires_mark_computed() -> None:
    m = _manager(num_blocks=4)
    m.allocate("a", _toks(8))
    with pytest.raises(SequenceStateError, match=r"call mark_computed\(\) once its K/V is written"):
        m.pin("a")
    assert m.stats().num_pinned == 0


def test_pin_beyond_the_computed_blocks_is_refused() -> None:
    m = _manager(num_blocks=4)
    m.allocate("a", _toks(8))
    m.mark_computed("a", 4)
    with pytest.raises(SequenceStateError):
        m.pin("a")
    assert m.pin("a", 4).block_ids == (0,)


@pytest.mark.parametrize(("num_tokens", "pin_tokens"), [(8, 3), (8, 0), (3, None)])
def test_pinning_less_than_one_block_is_refused(num_tokens: int, pin_tokens: int | None) -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(num_tokens))
    with pytest.raises(InvalidRequestError, match="at least one full block of 4 tokens"):
        m.pin("a", pin_tokens)
    assert m.stats().num_pinned == 0


def test_pinned_blocks_survive_freeing_the_sequence() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(10))
    m.pin("a")
    m.free("a")
    stats = m.stats()
    assert (stats.num_in_use, stats.num_pinned, stats.num_cached) == (2, 2, 0)
    assert m.longest_cached_prefix(_toks(10)) == 8


def test_pinned_blocks_are_never_handed_out_under_pressure() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(10))
    m.pin("a")
    m.free("a")
    assert m.allocate("b", _toks(8, start=100)).block_ids == (2, 3)
    assert m.num_free_blocks == 0
    assert m.can_allocate([1]) == Fit(Shortfall.POOL, needed=1, available=0)
    assert m.longest_cached_prefix(_toks(10)) == 8


def test_a_new_sequence_hits_the_pinned_blocks() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(10))
    m.pin("a")
    m.free("a")
    assert m.allocate("c", [*_toks(8), 100]) == Allocation((0, 1, 2), num_cached_tokens=8)
    assert [m.pool.blocks[i].ref_cnt for i in range(2)] == [2, 2]


def test_unpin_returns_the_blocks_to_the_cache() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(10))
    prefix = m.pin("a")
    m.free("a")
    m.unpin(prefix)
    stats = m.stats()
    assert (stats.num_in_use, stats.num_pinned, stats.num_cached) == (0, 0, 2)
    assert m.longest_cached_prefix(_toks(10)) == 8


def test_unpinning_twice_raises() -> None:
    m = _manager(num_blocks=4)
    _computed(m, "a", _toks(8))
    prefix = m.pin("a")
    m.unpin(prefix)
    before = _snapshot(m, "a")
    with pytest.raises(UnknownPinError, match="already unpinned") as err:
        m.unpin(prefix)
    assert err.value.pin_id == 0
    assert _snapshot(m, "a") == before


def test_a_pinned_prefix_keeps_hitting_even_when_computed_twice() -> None:
    m = _manager(num_blocks=4)
    m.allocate("a", _toks(8))
    m.allocate("b", _toks(8))  # before "a" is computed: no hit, its own blocks 2 and 3
    m.mark_computed("a", 8)
    m.mark_computed("b", 8)
    m.pin("b")
    m.free("a")
    m.free("b")
    m.allocate("c", _toks(8, start=100))  # pool pressure evicts the unpinned cached blocks
    assert m.longest_cached_prefix(_toks(8)) == 8


# -- stats --------------------------------------------------------------------------------
def test_fragmentation_is_allocated_slots_minus_live_tokens() -> None:
    m = _manager()
    m.allocate("a", _toks(6))
    m.allocate("b", _toks(1))
    stats = m.stats()
    assert (stats.num_allocated_slots, stats.num_tokens) == (12, 7)
    assert stats.fragmentation_tokens == 5


def test_prefix_cache_queries_and_hits_are_counted_in_tokens() -> None:
    m = _manager()
    _computed(m, "a", _toks(6))
    assert (m.stats().prefix_cache_queries, m.stats().prefix_cache_hits) == (6, 0)
    m.allocate("b", _toks(6))
    assert (m.stats().prefix_cache_queries, m.stats().prefix_cache_hits) == (12, 4)


def test_stats_describe_the_whole_manager() -> None:
    m = _manager(num_blocks=8, num_host_blocks=4)
    _computed(m, "a", _toks(8))
    m.allocate("b", _toks(5))
    m.pin("a", 4)
    m.free("a")
    m.swap_out("b")
    stats = m.stats()
    assert (stats.num_blocks, stats.num_host_blocks) == (8, 4)
    assert (stats.num_in_use, stats.num_cached, stats.num_empty) == (1, 1, 6)
    assert (stats.num_pinned, stats.num_swapped, stats.num_sequences) == (1, 2, 1)
    assert stats.num_free == 7 == m.num_free_blocks


# -- validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_blocks": -1}, "num_blocks"),
        ({"num_blocks": True}, "num_blocks"),
        ({"num_blocks": 2.0}, "num_blocks"),
        ({"num_blocks": 4, "block_size": 0}, "block_size"),
        ({"num_blocks": 4, "block_size": -16}, "block_size"),
        ({"num_blocks": 4, "block_size": True}, "block_size"),
        ({"num_blocks": 4, "num_host_blocks": -1}, "num_host_blocks"),
    ],
)
def test_bad_sizes_are_refused(kwargs: dict, name: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"{name} must be an int >= "):
        BlockManager(**kwargs)


def test_empty_token_ids_are_refused() -> None:
    m = _manager()
    with pytest.raises(InvalidRequestError, match="a sequence needs at least one token"):
        m.allocate("a", [])
    assert "a" not in m


def test_negative_token_ids_are_refused() -> None:
    m = _manager()
    with pytest.raises(InvalidRequestError, match="token ids must be non-negative, got -3"):
        m.allocate("a", [1, -3, 2])
    assert m.stats().num_in_use == 0


@pytest.mark.parametrize("bad", [[1.5], ["a"], [None], [2**63]])
def test_non_int_token_ids_are_refused(bad: list) -> None:
    m = _manager()
    with pytest.raises(InvalidRequestError, match="must be a sequence of ints"):
        m.allocate("a", [1, *bad])
    assert m.stats().num_in_use == 0


def test_bool_token_ids_are_refused() -> None:
    m = _manager()
    with pytest.raises(InvalidRequestError):
        m.allocate("a", [1, True])


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.allocate("x", _toks(4), ceiling_tokens=True),
        lambda m: m.can_append("a", True),
        lambda m: m.pin("a", True),
        lambda m: m.budgets.open("t", max_blocks=True),
    ],
)
def test_a_bool_is_not_taken_as_an_int(call: Callable[[BlockManager], object]) -> None:
    m = _manager()
    _computed(m, "a", _toks(8))
    before = _snapshot(m, "a")
    with pytest.raises(InvalidRequestError, match="must be an int >= "):
        call(m)
    assert _snapshot(m, "a") == before


@pytest.mark.parametrize("bad", [-1, 9])
def test_mark_computed_out_of_range_is_refused(bad: int) -> None:
    m = _manager()
    m.allocate("a", _toks(8))
    with pytest.raises(InvalidRequestError, match=r"num_tokens must be"):
        m.mark_computed("a", bad)


@pytest.mark.parametrize("bad", [True, 4.0])
def test_mark_computed_refuses_a_non_int(bad: object) -> None:
    m = _manager()
    m.allocate("a", _toks(8))
    with pytest.raises(InvalidRequestError):
        m.mark_computed("a", bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.free("ghost"),
        lambda m: m.append("ghost", [1]),
        lambda m: m.can_append("ghost"),
        lambda m: m.fork("ghost", "child"),
        lambda m: m.can_fork("ghost"),
        lambda m: m.swap_out("ghost"),
        lambda m: m.swap_in("ghost"),
        lambda m: m.mark_computed("ghost", 1),
        lambda m: m.pin("ghost"),
        lambda m: m.block_ids("ghost"),
        lambda m: m.num_tokens("ghost"),
        lambda m: m.sequence_state("ghost"),
    ],
)
def test_an_unknown_sequence_raises(call: Callable[[BlockManager], object]) -> None:
    m = _manager(num_host_blocks=2)
    with pytest.raises(UnknownSequenceError) as err:
        call(m)
    assert err.value.seq_id == "ghost"
    assert "child" not in m


def test_unknown_sequence_error_reads_well() -> None:
    m = _manager()
    with pytest.raises(UnknownSequenceError) as err:
        m.free("ghost")
    assert str(err.value) == (
        "no sequence 'ghost': it was never allocated or was already freed; "
        "allocate it first or check the id"
    )
    assert isinstance(err.value, KeyError)
    assert isinstance(err.value, InvalidRequestError)


def test_a_duplicate_sequence_id_is_refused() -> None:
    m = _manager()
    m.allocate("a", _toks(4))
    before = _snapshot(m, "a")
    with pytest.raises(DuplicateSequenceError, match="already exists; free it first") as err:
        m.allocate("a", _toks(8))
    assert err.value.seq_id == "a"
    assert _snapshot(m, "a") == before
