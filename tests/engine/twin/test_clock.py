"""The virtual clock: starts at 0.0, moves only forward, by what it is told."""

from __future__ import annotations

import math

import pytest

from engine.errors import InvalidRequestError
from engine.twin.clock import ClockError, VirtualClock


def test_starts_at_zero_and_advances_by_exactly_what_it_is_told() -> None:
    clock = VirtualClock()
    assert clock.now() == 0.0
    assert clock.advance(0.25) == 0.25
    assert clock.advance(0.0) == 0.25
    assert clock.advance(1.5) == 1.75
    assert clock.now() == 1.75
    assert VirtualClock(start=3.0).now() == 3.0


def test_advance_to_only_moves_forward() -> None:
    clock = VirtualClock()
    assert clock.advance_to(2.0) == 2.0
    assert clock.advance_to(1.0) == 2.0  # an event already passed: no time goes back
    assert clock.now() == 2.0


@pytest.mark.parametrize("seconds", [-1e-9, math.inf, math.nan])
def test_time_never_runs_backwards_or_to_no_time(seconds: float) -> None:
    clock = VirtualClock()
    clock.advance(1.0)
    with pytest.raises(ClockError, match="advances by a finite number of seconds >= 0"):
        clock.advance(seconds)
    assert clock.now() == 1.0
    assert issubclass(ClockError, InvalidRequestError)


def test_bad_start_and_target_are_refused_with_what_to_do() -> None:
    with pytest.raises(ClockError, match="starts at a finite time >= 0"):
        VirtualClock(start=-1.0)
    with pytest.raises(ClockError, match="advances to a finite time"):
        VirtualClock().advance_to(math.nan)
    with pytest.raises(TypeError):
        VirtualClock(1.0)  # type: ignore[misc]  # keyword-only
