"""Checks of caller arguments, shared by the engine's public entry points."""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Callable, Sequence

from engine.errors import InvalidRequestError

__all__ = ["monotonic_or_now", "require_int", "require_token_ids"]


def require_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` as an int >= ``minimum``, else an error naming the argument."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidRequestError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def monotonic_or_now(
    name: str, value: object, *, now: Callable[[], float] = time.monotonic
) -> float:
    """``value`` as a reading of the clock ``now`` (``time.monotonic`` unless given; ``now()``
    itself if None), else an error naming the argument."""
    if value is None:
        return now()
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidRequestError(
            f"{name} must be a finite time.monotonic() reading, got {value!r}; leave it out for now"
        )
    return float(value)


def require_token_ids(token_ids: Sequence[int], *, allow_empty: bool) -> None:
    if not token_ids:
        if allow_empty:
            return
        raise InvalidRequestError("token_ids is empty; a sequence needs at least one token")
    try:
        array("q", token_ids)
    except (TypeError, OverflowError):
        raise InvalidRequestError("token_ids must be a sequence of ints in 0..2**63-1") from None
    if bool in set(map(type, token_ids)):  # in C: a 16k-token prompt is checked often
        raise InvalidRequestError("token ids must be ints, not bools")
    if min(token_ids) < 0:
        raise InvalidRequestError(f"token ids must be non-negative, got {min(token_ids)}")
