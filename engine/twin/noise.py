"""Step-time noise: the step-to-step scatter a real device shows around its step-time
model, for twin runs that are to be compared with real rounds as a distribution.

A real device never takes the same time twice for the same batch (other processes, the
kernel's scheduling, clocks). Where a workload's decisions hang on the order of close
events (a pin expiring a step before or after its tool returns, which sequence the
scheduler preempts), the real rounds' outcomes scatter, sometimes between two modes, and a
deterministic twin reproduces one trajectory of many. ``StepNoise`` multiplies each
modelled step by a seeded, mean-one lognormal factor, so the twin's rounds scatter as the
real ones do and the same seed still gives the same figures to the last digit.

``StepNoise.measured`` reads the scatter from real steps timed in order beside their
predicted seconds: the spread of the difference between consecutive steps' log errors,
which is the step-to-step noise and leaves out what is common to neighbouring steps (the
model's error for a kind of batch, the host's speed drifting over minutes).

Errors (caller input)::

    ValueError
    └── NoiseError   a negative or non-finite sigma, fewer than 3 steps to measure it
                     from, or a step that took or was predicted no time
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["NoiseError", "StepNoise"]

_MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma over its median absolute deviation


class NoiseError(ValueError):
    """Step noise that cannot be built or measured as asked."""


@dataclass(slots=True)
class StepNoise:
    """A mean-one lognormal factor per step, ``sigma`` the standard deviation of its log,
    drawn from a generator seeded with ``seed`` (one sequence of draws per instance)."""

    sigma: float
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise NoiseError(f"step noise sigma must be a finite number >= 0, got {self.sigma}")
        self._rng = random.Random(self.seed)

    def factor(self) -> float:
        """The next step's factor on its modelled seconds (1.0 when sigma is 0)."""
        if self.sigma == 0:
            return 1.0
        return self._rng.lognormvariate(-(self.sigma**2) / 2, self.sigma)

    def fresh(self, seed: int) -> StepNoise:
        """The same scatter, drawn anew from ``seed``."""
        return StepNoise(self.sigma, seed)

    @classmethod
    def measured(cls, steps: Sequence[tuple[float, float]], *, seed: int = 0) -> StepNoise:
        """The noise of real ``steps``, each ``(measured_s, predicted_s)`` in the order
        they ran: the robust spread (median absolute deviation) of consecutive steps'
        differences in log error, over the square root of 2 (a difference holds two
        steps' noise)."""
        if len(steps) < 3:
            raise NoiseError(
                f"step noise is measured from at least 3 timed steps, got {len(steps)}; "
                "time a longer run"
            )
        errors = []
        for measured, predicted in steps:
            if not (measured > 0 and predicted > 0):
                raise NoiseError(
                    f"a step measured {measured} s against {predicted} s predicted; "
                    "every step must take and be predicted some time"
                )
            errors.append(math.log(measured / predicted))
        diffs = [b - a for a, b in itertools.pairwise(errors)]
        centre = statistics.median(diffs)
        mad = statistics.median(abs(d - centre) for d in diffs)
        return cls(_MAD_TO_SIGMA * mad / math.sqrt(2), seed)
