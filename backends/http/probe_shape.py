"""How a probe reads an engine it does not trust with its numbers or its shapes.

A number that is NaN, infinite, negative where a count is meant, or not a number at all
is absent (``None``), as a field the engine does not expose is: the backend falls back to
what was declared, and never does arithmetic on it. An answer of a shape the probe cannot
read (``/props`` as a list, a string where a list was) raises ``BackendError`` that names
the engine and its address (``read_checked``), never a bare ``ValueError``,
``OverflowError`` or ``AttributeError``: a backend's ``health()`` reports it as unhealthy,
and a call that needs the reading fails with a typed error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

from governor import BackendError

__all__ = ["count_or_none", "finite_or_none", "read_checked"]

T = TypeVar("T")

# What reading a value of the wrong type or size raises in a probe's arithmetic.
_SHAPE_ERRORS = (AttributeError, IndexError, KeyError, OverflowError, TypeError, ValueError)


def read_checked(engine: str, http: Any, read: Callable[[], T]) -> T:
    """``read()``, with any error of the answer's shape raised as ``BackendError``."""
    try:
        return read()
    except _SHAPE_ERRORS as exc:
        where = getattr(http, "base_url", "the engine")
        raise BackendError(
            f"{engine} at {where} answered in a shape kvgov cannot read "
            f"({type(exc).__name__}: {str(exc)[:200]}); check that base_url points at "
            f"{engine}, of a version kvgov supports",
            backend=engine,
        ) from exc


def finite_or_none(value: object) -> float | None:
    """A finite number as a float; ``None`` for NaN, an infinity, a bool or a non-number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value) if isinstance(value, float) or abs(value) < 2**1023 else math.inf
    return number if math.isfinite(number) else None


def count_or_none(value: object) -> int | None:
    """A count: a finite number of 0 or more, truncated to an int; ``None`` otherwise."""
    number = finite_or_none(value)
    if number is None or number < 0:
        return None
    return int(value) if isinstance(value, int) else int(number)
