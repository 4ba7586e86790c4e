"""BlockManager: pinned prefixes."""

from __future__ import annotations

import pytest

from engine.block_results import Allocation, Fit, PinnedPrefix, Shortfall
from engine.errors import (
    InvalidRequestError,
    SequenceStateError,
    UnknownPinError,
)
from tests.engine.block_manager_helpers import computed, manager, snapshot, toks


# -- pins ---------------------------------------------------------------------------------
def test_pin_returns_the_pinned_prefix() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(10))
    assert m.pin("a") == PinnedPrefix(pin_id=0, block_ids=(0, 1), num_tokens=8)
    assert [(b.ref_cnt, b.num_pins) for b in m.pool.blocks[:3]] == [(2, 1), (2, 1), (1, 0)]
    assert m.stats().num_pinned == 2


def test_pin_a_shorter_prefix() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(10))
    assert m.pin("a", 7) == PinnedPrefix(pin_id=0, block_ids=(0,), num_tokens=4)


def test_pin_ids_are_distinct() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(8))
    assert (m.pin("a").pin_id, m.pin("a").pin_id) == (0, 1)
    assert m.pool.blocks[0].num_pins == 2


def test_pin_requires_mark_computed() -> None:
    m = manager(num_blocks=4)
    m.allocate("a", toks(8))
    with pytest.raises(SequenceStateError, match=r"call mark_computed\(\) once its K/V is written"):
        m.pin("a")
    assert m.stats().num_pinned == 0


def test_pin_beyond_the_computed_blocks_is_refused() -> None:
    m = manager(num_blocks=4)
    m.allocate("a", toks(8))
    m.mark_computed("a", 4)
    with pytest.raises(SequenceStateError):
        m.pin("a")
    assert m.pin("a", 4).block_ids == (0,)


@pytest.mark.parametrize(("num_tokens", "pin_tokens"), [(8, 3), (8, 0), (3, None)])
def test_pinning_less_than_one_block_is_refused(num_tokens: int, pin_tokens: int | None) -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(num_tokens))
    with pytest.raises(InvalidRequestError, match="at least one full block of 4 tokens"):
        m.pin("a", pin_tokens)
    assert m.stats().num_pinned == 0


def test_pinned_blocks_survive_freeing_the_sequence() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(10))
    m.pin("a")
    m.free("a")
    stats = m.stats()
    assert (stats.num_in_use, stats.num_pinned, stats.num_cached) == (2, 2, 0)
    assert m.longest_cached_prefix(toks(10)) == 8


def test_pinned_blocks_are_never_handed_out_under_pressure() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(10))
    m.pin("a")
    m.free("a")
    assert m.allocate("b", toks(8, start=100)).block_ids == (2, 3)
    assert m.num_free_blocks == 0
    assert m.can_allocate([1]) == Fit(Shortfall.POOL, needed=1, available=0)
    assert m.longest_cached_prefix(toks(10)) == 8


def test_a_new_sequence_hits_the_pinned_blocks() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(10))
    m.pin("a")
    m.free("a")
    assert m.allocate("c", [*toks(8), 100]) == Allocation((0, 1, 2), num_cached_tokens=8)
    assert [m.pool.blocks[i].ref_cnt for i in range(2)] == [2, 2]


def test_unpin_returns_the_blocks_to_the_cache() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(10))
    prefix = m.pin("a")
    m.free("a")
    m.unpin(prefix)
    stats = m.stats()
    assert (stats.num_in_use, stats.num_pinned, stats.num_cached) == (0, 0, 2)
    assert m.longest_cached_prefix(toks(10)) == 8


def test_unpinning_twice_raises() -> None:
    m = manager(num_blocks=4)
    computed(m, "a", toks(8))
    prefix = m.pin("a")
    m.unpin(prefix)
    before = snapshot(m, "a")
    with pytest.raises(UnknownPinError, match="already unpinned") as err:
        m.unpin(prefix)
    assert err.value.pin_id == 0
    assert snapshot(m, "a") == before


def test_a_pinned_prefix_keeps_hitting_even_when_computed_twice() -> None:
    m = manager(num_blocks=4)
    m.allocate("a", toks(8))
    m.allocate("b", toks(8))  # before "a" is computed: no hit, its own blocks 2 and 3
    m.mark_computed("a", 8)
    m.mark_computed("b", 8)
    m.pin("b")
    m.free("a")
    m.free("b")
    m.allocate("c", toks(8, start=100))  # pool pressure evicts the unpinned cached blocks
    assert m.longest_cached_prefix(toks(8)) == 8
