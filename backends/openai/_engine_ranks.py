"""Per-rank figures of a data-parallel engine, added up into one ``EngineReading``.

vLLM labels every engine-core metric with ``engine`` (its data-parallel rank) and SGLang
with ``dp_rank`` when it runs more than one. Each rank holds its own KV pool and queue, so
the engine's capacity, requests and counters are sums over ranks, and its KV usage is the
mean weighted by each rank's capacity (used tokens over total tokens). A family with no
rank label is one rank, ``"0"``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from backends.http.prometheus_text import Exposition

__all__ = ["by_rank", "int_or_none", "sum_or_none", "weighted_usage"]


def by_rank(
    exposition: Exposition, name: str, *, rank_label: str, where: Mapping[str, str] | None = None
) -> dict[str, float]:
    """``name``'s value per rank; samples of one rank that differ in other labels (a
    counter split by ``is_streaming`` or ``cache_source``) are added up. ``where``: only
    samples whose labels match it."""
    values: dict[str, float] = {}
    for sample in exposition.named(name):
        if where and any(sample.labels.get(key) != value for key, value in where.items()):
            continue
        rank = sample.labels.get(rank_label, "0")
        values[rank] = values.get(rank, 0.0) + sample.value
    return values


def sum_or_none(values: Iterable[float | int | None]) -> int | None:
    """The sum as an int; ``None`` when there is nothing to add or a part is unknown."""
    parts = list(values)
    known = [part for part in parts if part is not None]
    if not parts or len(known) < len(parts):
        return None
    return round(sum(known))


def weighted_usage(usage: Mapping[str, float], capacity: Mapping[str, int | None]) -> float | None:
    """The fraction of KV in use over all ranks: weighted by capacity where every rank's
    is known, else the plain mean (ranks of one engine are sized alike)."""
    if not usage:
        return None
    weights = {rank: weight for rank in usage if (weight := capacity.get(rank))}
    if len(weights) == len(usage):
        return sum(usage[rank] * weights[rank] for rank in usage) / sum(weights.values())
    return sum(usage.values()) / len(usage)


def int_or_none(value: object) -> int | None:
    """An int from an engine's field (``"27910"``, ``27910``, ``27910.0``); ``None`` for
    ``"None"``, missing or anything that is not a whole number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
        return int(number) if number.is_integer() else None
    return None
