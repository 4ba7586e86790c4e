"""``ScenarioError``: a scenario that cannot run (``TraceError``, in ``trace``, for a
recorded run that cannot be read)."""

from __future__ import annotations

__all__ = ["ScenarioError"]


class ScenarioError(ValueError):
    """A scenario that cannot run; the message says what to change."""
