"""A policy's knobs: the settings a user of that system would tune, and the error for a
name that is none of them.

    ValueError
    └── UnknownKnobError  (policy, knob, knobs)

Each baseline class names its knobs in ``KNOBS`` (its keyword fields a user of that
system sets; counters and what the device decides are not knobs); kvgov's are
``GovernorConfig``'s fields. A knob outside that list is refused before any run, so a
typo in a tuned setting cannot run silently as the default.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["UnknownKnobError"]


class UnknownKnobError(ValueError):
    """``policy`` was given ``knob``, which is not one of its ``knobs``."""

    def __init__(self, policy: str, knob: str, knobs: Sequence[str]) -> None:
        self.policy, self.knob, self.knobs = policy, knob, tuple(knobs)
        has = ", ".join(self.knobs) if self.knobs else "none: it has nothing to tune"
        super().__init__(
            f"{policy} has no knob {knob!r}; its knobs are {has}. Fix the name in the "
            "policy's knobs (kvgov.benchmarks.openloop.tuned.TUNED or the tuning grid)"
        )
