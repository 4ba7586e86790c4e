"""The virtual clock a twin run reads: seconds since the run began, moved only by the twin.

Nothing waits on it: the twin charges each engine step and each KV copy their modelled
durations and moves the clock forward by them, so a run's times depend on its work alone,
never on the host it runs on (the same run gives the same times, to the last bit).

Errors (caller input)::

    InvalidRequestError (engine.errors)
    └── ClockError   a negative, infinite or NaN advance (time never runs backwards)

Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.errors import InvalidRequestError

__all__ = ["ClockError", "VirtualClock"]


class ClockError(InvalidRequestError):
    """An advance the clock cannot take."""


@dataclass(slots=True, kw_only=True)
class VirtualClock:
    """Monotonic virtual seconds, starting at ``start`` (0.0 unless given)."""

    start: float = 0.0
    _now: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and self.start >= 0):
            raise ClockError(
                f"a virtual clock starts at a finite time >= 0 seconds, got {self.start!r}"
            )
        self._now = self.start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0) and return the new time."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ClockError(
                f"a virtual clock advances by a finite number of seconds >= 0, got "
                f"{seconds!r}; to go back, start a new clock"
            )
        self._now += seconds
        return self._now

    def advance_to(self, time: float) -> float:
        """Move forward to ``time`` when it is later than now; an earlier time is a no-op
        (an event that finished while the clock was already past it)."""
        if not math.isfinite(time):
            raise ClockError(f"a virtual clock advances to a finite time, got {time!r}")
        self._now = max(self._now, time)
        return self._now
