"""``ToolDurations``: how long each tool's calls take, which retention decisions read.

A tool call that ended without an error adds its seconds; the mean of all of them and
the median of the last ``window`` are what ``Governor.tool_call`` expects of a tool given
no ``expected_s``. With a shared store every process's calls go into one history
(``on_record`` sends each on; ``share`` brings the store's back).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque
from collections.abc import Callable, Sequence

__all__ = ["ToolDurations"]


class ToolDurations:
    """The durations of each tool's calls that ended without an error, by tool name: the
    mean of all of them, and the median of the last ``window``. Its lock is a leaf:
    nothing is called under it."""

    def __init__(self, window: int = 64) -> None:
        self._lock = threading.Lock()
        self.window = window
        # Told of each call recorded, outside the lock: a shared store sends it on, so
        # every process's history has it (``share`` brings theirs back).
        self.on_record: Callable[[str, float], None] | None = None
        self._seen: dict[str, tuple[int, float]] = {}  # tool -> (calls, mean seconds)
        self._recent: dict[str, deque[float]] = {}  # tool -> the last calls' seconds

    def __repr__(self) -> str:
        return f"<ToolDurations of {len(self._seen)} tools>"

    def record(self, tool: str, elapsed_s: float) -> None:
        with self._lock:
            count, mean = self._seen.get(tool, (0, 0.0))
            self._seen[tool] = (count + 1, mean + (elapsed_s - mean) / (count + 1))
            self._recent.setdefault(tool, deque(maxlen=self.window)).append(elapsed_s)
        if self.on_record is not None:
            self.on_record(tool, elapsed_s)

    def share(self, tool: str, calls: int, mean: float, recent: Sequence[float]) -> None:
        """``tool``'s history as a shared store holds it (every process's calls, this
        one's included once sent), in place of what this process saw alone."""
        with self._lock:
            self._seen[tool] = (calls, mean)
            self._recent[tool] = deque(recent, maxlen=self.window)

    def mean(self, tool: str) -> float | None:
        """Seconds a call of ``tool`` took on average; None before one has ended."""
        with self._lock:
            seen = self._seen.get(tool)
        return None if seen is None else seen[1]

    def median(self, tool: str) -> float | None:
        """The median seconds of ``tool``'s last calls; None before one has ended."""
        with self._lock:
            recent = tuple(self._recent.get(tool, ()))
        return statistics.median(recent) if recent else None
