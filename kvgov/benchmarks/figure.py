"""One benchmark figure as ``kvgov bench`` prints it: a row of its table, a line of ``--json``."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["figure"]


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
