"""One benchmark figure as ``kvgov bench`` prints it: a row of its table, a line of ``--json``;
and the spread its note gives."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

__all__ = ["figure", "spread"]


def spread(values: Sequence[float]) -> float:
    """How far one sample (a paired run's ratio) scatters: the standard deviation, 0 for
    fewer than two."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def figure(
    bench: str,
    metric: str,
    value: float,
    unit: str,
    *,
    target: float | None = None,
    direction: str = "higher",
    note: str,
) -> Mapping[str, object]:
    """``metric`` of ``bench``; ``direction`` says which way is better against ``target``
    (None: reported, no target); ``note`` says what ran."""
    return {
        "bench": bench,
        "metric": metric,
        "value": float(value),
        "unit": unit,
        "target": target,
        "direction": direction,
        "note": note,
    }
