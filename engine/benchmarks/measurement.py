"""One figure measured by a benchmark, with the target it is judged against."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

__all__ = ["Direction", "Measurement"]


class Direction(Enum):
    HIGHER_IS_BETTER = "higher"
    LOWER_IS_BETTER = "lower"


@dataclass(frozen=True, slots=True)
class Measurement:
    bench: str
    metric: str
    value: float
    unit: str
    target: float | None = None
    direction: Direction = Direction.HIGHER_IS_BETTER
    note: str = ""

    @property
    def met(self) -> bool | None:
        """Whether the target is met; ``None`` for figures reported without a target."""
        if self.target is None or math.isnan(self.value):
            return None
        if self.direction is Direction.HIGHER_IS_BETTER:
            return self.value >= self.target
        return self.value <= self.target

    def to_json(self) -> dict[str, object]:
        return {
            "bench": self.bench,
            "metric": self.metric,
            "value": None if math.isnan(self.value) else self.value,  # NaN is not JSON
            "unit": self.unit,
            "target": self.target,
            "direction": self.direction.value,
            "met": self.met,
            "note": self.note,
        }
