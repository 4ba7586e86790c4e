"""A device's host link fitted from timed copies: ``fit_link(samples)`` fits
``latency + bytes / bandwidth``, the model ``HostLink`` charges, to copies timed on the
real engine (``engine.twin.measure.measure_link``) by least squares. On a CPU the link is
a memcpy plus the engine's own bookkeeping of a swap, which no specification publishes:
the ``cpu-here`` profile's link figures are fitted so (``kvgov twin fit``, ``kvgov twin
check``). Torch-free.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LinkFit", "LinkSample", "fit_link"]


@dataclass(frozen=True, slots=True)
class LinkSample:
    num_bytes: int
    seconds: float  # the median copy of this size

    def to_json(self) -> dict[str, Any]:
        return {"num_bytes": self.num_bytes, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkSample:
        return cls(int(data["num_bytes"]), float(data["seconds"]))


@dataclass(frozen=True, slots=True)
class LinkFit:
    bandwidth_bytes_s: float
    latency_s: float


def fit_link(samples: Sequence[LinkSample]) -> LinkFit:
    """``seconds = latency + bytes / bandwidth`` by least squares over ``samples`` (at least
    two sizes); a negative intercept is held at 0 and the slope refitted through it."""
    sizes = {s.num_bytes for s in samples}
    if len(sizes) < 2:
        raise ValueError("fitting a link takes copies of at least two sizes")
    mean_x = statistics.fmean(s.num_bytes for s in samples)
    mean_y = statistics.fmean(s.seconds for s in samples)
    sxx = sum((s.num_bytes - mean_x) ** 2 for s in samples)
    slope = sum((s.num_bytes - mean_x) * (s.seconds - mean_y) for s in samples) / sxx
    latency = mean_y - slope * mean_x
    if latency < 0 or slope <= 0:
        latency = 0.0
        slope = sum(s.num_bytes * s.seconds for s in samples) / sum(s.num_bytes**2 for s in samples)
    return LinkFit(bandwidth_bytes_s=1.0 / slope, latency_s=latency)
