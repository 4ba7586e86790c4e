"""What ``kvgov bench openloop`` sweeps: the policies it compares, the seed every knob is
tuned on and the seeds its figures come from, the arrival rates and each rate's window.

Invariant: ``TUNING_SEED`` is not among ``EVALUATION_SEEDS``; every runner refuses it
among the seeds it reports on.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgov.benchmarks.baselines import BASELINES

__all__ = [
    "EVALUATION_SEEDS",
    "POLICIES",
    "RATES",
    "TEAMS_PER_WINDOW",
    "TUNING_SEED",
    "windows",
]

TUNING_SEED = 0
EVALUATION_SEEDS = tuple(range(1, 11))
# Teams a minute: the paged engine saturates near 0.25 on the reference card (each
# run reports it: saturation_paged), so the sweep runs from below it (0.1, and 0.2 at
# 0.8 of it) to four times past it.
RATES = (0.1, 0.2, 0.4, 1.0)
TEAMS_PER_WINDOW = 6.0  # teams expected to arrive in a run's window, at every rate
POLICIES = (*BASELINES, "kvgov")


def windows(rates: Sequence[float], teams: float = TEAMS_PER_WINDOW) -> dict[float, float]:
    """Each rate's arrival window, seconds: long enough for ``teams`` teams to arrive
    on average, so a low rate is measured over as many jobs as a high one."""
    return {rate: 60.0 * teams / rate for rate in rates}
