"""BlockManager: budgets, ceilings and pool exhaustion: refused calls change nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.block_manager import BlockManager
from engine.block_results import Allocation, AppendResult, Fit, Shortfall
from engine.budget import BudgetInfo
from engine.errors import (
    BudgetExceededError,
    BudgetInUseError,
    CeilingExceededError,
    DuplicateBudgetError,
    InvalidRequestError,
    OutOfBlocksError,
    UnknownBudgetError,
)
from tests.engine.block_manager_helpers import computed, manager, snapshot, toks


# -- budgets ------------------------------------------------------------------------------
def test_open_budget_returns_its_info() -> None:
    m = manager()
    info = m.budgets.open("t", max_blocks=4)
    assert info == BudgetInfo(name="t", max_blocks=4, num_blocks=0, num_sequences=0)
    assert m.budgets.get("t").info() == info


def test_allocate_charges_its_budget() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(6), budget="t")
    assert m.budgets.get("t").info() == BudgetInfo("t", max_blocks=4, num_blocks=2, num_sequences=1)


def test_a_prefix_hit_is_charged_like_any_block() -> None:
    m = manager()
    computed(m, "a", toks(8))
    m.budgets.open("t", max_blocks=4)
    assert m.allocate("b", [*toks(8), 100], budget="t").num_cached_tokens == 8
    assert m.budgets.get("t").info().num_blocks == 3


def test_free_returns_blocks_to_the_budget() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(6), budget="t")
    m.free("a")
    assert m.budgets.get("t").info() == BudgetInfo("t", max_blocks=4, num_blocks=0, num_sequences=0)


def test_append_charges_only_new_blocks() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(4), budget="t")
    m.append("a", [4])
    assert m.budgets.get("t").info().num_blocks == 2
    m.append("a", [5, 6, 7])
    assert m.budgets.get("t").info().num_blocks == 2


def test_fork_charges_the_shared_blocks_to_the_child_too() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(6), budget="t")
    m.fork("a", "b")
    assert m.budgets.get("t").info() == BudgetInfo("t", max_blocks=4, num_blocks=4, num_sequences=2)


def test_copy_on_write_does_not_change_the_charge() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(6), budget="t")
    m.fork("a", "b")
    m.append("b", [6])
    assert m.budgets.get("t").info().num_blocks == 4


def test_can_allocate_over_budget_reports_the_numbers() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", toks(5), budget="t")
    fit = m.can_allocate(toks(8), budget="t")
    assert not fit
    assert fit == Fit(Shortfall.BUDGET, needed=2, available=1)


def test_allocate_over_budget_raises_and_changes_nothing() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", toks(5), budget="t")
    before = snapshot(m, "a")
    with pytest.raises(BudgetExceededError, match="open a larger budget") as err:
        m.allocate("b", toks(8), budget="t")
    assert (err.value.name, err.value.needed, err.value.available) == ("t", 2, 1)
    assert err.value.max_blocks == 3
    assert snapshot(m, "a") == before
    assert "b" not in m


def test_append_over_budget_is_refused_and_changes_nothing() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=2)
    m.allocate("a", toks(8), budget="t")
    assert m.can_append("a", 1) == Fit(Shortfall.BUDGET, needed=1, available=0)
    before = snapshot(m, "a")
    with pytest.raises(BudgetExceededError) as err:
        m.append("a", [8])
    assert (err.value.needed, err.value.available) == (1, 0)
    assert snapshot(m, "a") == before


def test_fork_over_budget_is_refused_and_changes_nothing() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=3)
    m.allocate("a", toks(8), budget="t")
    assert m.can_fork("a") == Fit(Shortfall.BUDGET, needed=2, available=1)
    before = snapshot(m, "a")
    with pytest.raises(BudgetExceededError) as err:
        m.fork("a", "b")
    assert (err.value.needed, err.value.available) == (2, 1)
    assert snapshot(m, "a") == before
    assert "b" not in m


def test_a_budget_can_grow() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=1)
    m.allocate("a", toks(4), budget="t")
    assert m.budgets.resize("t", max_blocks=3) == BudgetInfo("t", 3, 1, 1)
    assert m.allocate("b", toks(8), budget="t").block_ids == (1, 2)


def test_a_budget_can_shrink_to_its_usage() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(8), budget="t")
    assert m.budgets.resize("t", max_blocks=2) == BudgetInfo("t", 2, 2, 1)


def test_a_budget_cannot_shrink_below_its_usage() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(8), budget="t")
    with pytest.raises(InvalidRequestError, match="cannot shrink to 1 until its sequences free"):
        m.budgets.resize("t", max_blocks=1)
    assert m.budgets.get("t").info() == BudgetInfo("t", 4, 2, 1)


def test_closing_a_budget_in_use_raises() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(8), budget="t")
    with pytest.raises(BudgetInUseError, match="free them before closing it") as err:
        m.budgets.close("t")
    assert (err.value.name, err.value.num_sequences) == ("t", 1)
    assert m.budgets.get("t").info() == BudgetInfo("t", 4, 2, 1)


def test_a_budget_closes_once_its_sequences_are_freed() -> None:
    m = manager()
    m.budgets.open("t", max_blocks=4)
    m.allocate("a", toks(8), budget="t")
    m.free("a")
    m.budgets.close("t")
    assert len(m.budgets) == 0
    with pytest.raises(UnknownBudgetError):
        m.budgets.get("t")


def test_opening_a_budget_twice_raises() -> None:
    m = manager()
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
        lambda m: m.allocate("a", toks(4), budget="nope"),
        lambda m: m.can_allocate(toks(4), budget="nope"),
    ],
)
def test_an_unknown_budget_raises(call: Callable[[BlockManager], object]) -> None:
    m = manager()
    with pytest.raises(UnknownBudgetError) as err:
        call(m)
    assert str(err.value) == "no budget named 'nope'; open it with open_budget() first"
    assert m.stats().num_in_use == 0


@pytest.mark.parametrize("bad", [-1, True, 1.0])
def test_max_blocks_must_be_a_non_negative_int(bad: object) -> None:
    m = manager()
    with pytest.raises(InvalidRequestError, match="max_blocks must be an int >= 0"):
        m.budgets.open("t", max_blocks=bad)  # type: ignore[arg-type]
    assert len(m.budgets) == 0


# -- ceilings -----------------------------------------------------------------------------
def test_allocate_beyond_the_ceiling_is_refused() -> None:
    m = manager()
    assert m.can_allocate(toks(9), ceiling_tokens=8) == Fit(Shortfall.CEILING, 9, 8)
    before = snapshot(m)
    with pytest.raises(CeilingExceededError, match="compact its context or raise") as err:
        m.allocate("a", toks(9), ceiling_tokens=8)
    assert (err.value.seq_id, err.value.needed, err.value.available) == ("a", 9, 8)
    assert err.value.ceiling_tokens == 8
    assert snapshot(m) == before


def test_allocate_up_to_the_ceiling_fits() -> None:
    m = manager()
    assert m.can_allocate(toks(8), ceiling_tokens=8)
    assert m.allocate("a", toks(8), ceiling_tokens=8).block_ids == (0, 1)


def test_append_to_exactly_the_ceiling_fits_and_one_more_is_refused() -> None:
    m = manager()
    m.allocate("a", toks(6), ceiling_tokens=8)
    assert m.append("a", [6, 7]) == AppendResult(new_block_ids=(), copies=())
    assert m.can_append("a", 1) == Fit(Shortfall.CEILING, needed=9, available=8)
    before = snapshot(m, "a")
    with pytest.raises(CeilingExceededError) as err:
        m.append("a", [8])
    assert (err.value.needed, err.value.ceiling_tokens) == (9, 8)
    assert snapshot(m, "a") == before


def test_a_fork_inherits_the_ceiling() -> None:
    m = manager()
    m.allocate("a", toks(8), ceiling_tokens=8)
    m.fork("a", "b")
    assert m.can_append("b", 1) == Fit(Shortfall.CEILING, needed=9, available=8)


# -- pool exhaustion ----------------------------------------------------------------------
def test_a_fitting_request_gives_a_truthy_fit() -> None:
    m = manager(num_blocks=2)
    fit = m.can_allocate(toks(8))
    assert fit
    assert fit == Fit()


def test_allocate_beyond_the_pool_raises_and_allocates_nothing() -> None:
    m = manager(num_blocks=2)
    assert m.can_allocate(toks(12)) == Fit(Shortfall.POOL, needed=3, available=2)
    before = snapshot(m)
    with pytest.raises(OutOfBlocksError, match="free or swap out sequences") as err:
        m.allocate("a", toks(12))
    assert (err.value.needed, err.value.available) == (3, 2)
    assert snapshot(m) == before
    assert m.stats().num_in_use == 0


def test_append_beyond_the_pool_raises_and_changes_nothing() -> None:
    m = manager(num_blocks=2)
    m.allocate("a", toks(8))
    assert m.can_append("a", 1) == Fit(Shortfall.POOL, needed=1, available=0)
    before = snapshot(m, "a")
    with pytest.raises(OutOfBlocksError) as err:
        m.append("a", [8])
    assert (err.value.needed, err.value.available) == (1, 0)
    assert snapshot(m, "a") == before


def test_free_cached_hits_count_against_the_pool() -> None:
    m = manager(num_blocks=2)
    computed(m, "a", toks(8))
    m.free("a")
    # Two hits that are free themselves plus one new block: 3 of the 2 free blocks.
    assert m.can_allocate([*toks(8), 100]) == Fit(Shortfall.POOL, needed=3, available=2)
    assert m.allocate("b", toks(8)) == Allocation(block_ids=(0, 1), num_cached_tokens=4)


def test_hits_on_blocks_in_use_need_no_free_block() -> None:
    m = manager(num_blocks=3)
    computed(m, "a", toks(8))
    assert m.allocate("b", [*toks(8), 100]) == Allocation((0, 1, 2), num_cached_tokens=8)
    assert m.num_free_blocks == 0
