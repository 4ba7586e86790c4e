"""BlockManager: input validation. Bad pool sizes, empty, negative, non-int and bool token
ids, ``mark_computed`` out of range, unknown sequences and duplicate ids are refused with
errors that say what was wrong, and a refused call changes nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.block_manager import BlockManager
from engine.errors import DuplicateSequenceError, InvalidRequestError, UnknownSequenceError
from tests.engine.block_manager_helpers import computed, manager, snapshot, toks


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
    m = manager()
    with pytest.raises(InvalidRequestError, match="a sequence needs at least one token"):
        m.allocate("a", [])
    assert "a" not in m


def test_negative_token_ids_are_refused() -> None:
    m = manager()
    with pytest.raises(InvalidRequestError, match="token ids must be non-negative, got -3"):
        m.allocate("a", [1, -3, 2])
    assert m.stats().num_in_use == 0


@pytest.mark.parametrize("bad", [[1.5], ["a"], [None], [2**63]])
def test_non_int_token_ids_are_refused(bad: list) -> None:
    m = manager()
    with pytest.raises(InvalidRequestError, match="must be a sequence of ints"):
        m.allocate("a", [1, *bad])
    assert m.stats().num_in_use == 0


def test_bool_token_ids_are_refused() -> None:
    m = manager()
    with pytest.raises(InvalidRequestError):
        m.allocate("a", [1, True])


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.allocate("x", toks(4), ceiling_tokens=True),
        lambda m: m.can_append("a", True),
        lambda m: m.pin("a", True),
        lambda m: m.budgets.open("t", max_blocks=True),
    ],
)
def test_a_bool_is_not_taken_as_an_int(call: Callable[[BlockManager], object]) -> None:
    m = manager()
    computed(m, "a", toks(8))
    before = snapshot(m, "a")
    with pytest.raises(InvalidRequestError, match="must be an int >= "):
        call(m)
    assert snapshot(m, "a") == before


@pytest.mark.parametrize("bad", [-1, 9])
def test_mark_computed_out_of_range_is_refused(bad: int) -> None:
    m = manager()
    m.allocate("a", toks(8))
    with pytest.raises(InvalidRequestError, match=r"num_tokens must be"):
        m.mark_computed("a", bad)


@pytest.mark.parametrize("bad", [True, 4.0])
def test_mark_computed_refuses_a_non_int(bad: object) -> None:
    m = manager()
    m.allocate("a", toks(8))
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
    m = manager(num_host_blocks=2)
    with pytest.raises(UnknownSequenceError) as err:
        call(m)
    assert err.value.seq_id == "ghost"
    assert "child" not in m


def test_unknown_sequence_error_reads_well() -> None:
    m = manager()
    with pytest.raises(UnknownSequenceError) as err:
        m.free("ghost")
    assert str(err.value) == (
        "no sequence 'ghost': it was never allocated or was already freed; "
        "allocate it first or check the id"
    )
    assert isinstance(err.value, KeyError)
    assert isinstance(err.value, InvalidRequestError)


def test_a_duplicate_sequence_id_is_refused() -> None:
    m = manager()
    m.allocate("a", toks(4))
    before = snapshot(m, "a")
    with pytest.raises(DuplicateSequenceError, match="already exists; free it first") as err:
        m.allocate("a", toks(8))
    assert err.value.seq_id == "a"
    assert snapshot(m, "a") == before
