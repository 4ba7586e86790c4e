"""Context editing's trigger in the whole-system comparison (``system``), chosen on the
tuning seed by one rule, never on a reported seed.

``ClearToolUsesEdit`` clears every tool result but the latest ``keep`` once the history
passes ``trigger`` tokens (LangChain's default, 100,000, is past Qwen3-8B's 32,768-token
window, so a user must set one). The rule: on ``bench.TUNING_SEED`` only, every trigger
of ``TRIGGERS`` runs each baseline with context editing at the tuning rates; the trigger
with the least geometric mean over those runs of the mean job time is chosen, and a
trigger within 1% of the least goes to the largest such (it clears later, so its agents
keep more). ``TRIGGER_TOKENS`` is what the rule chose (``tune`` reruns it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kvgov.benchmarks.openloop import stats

__all__ = ["TRIGGERS", "TRIGGER_TOKENS", "choose", "tune"]

# From a quarter of the window to just under it, less the longest reply (300 tokens).
TRIGGERS = (8_000, 16_000, 24_000, 32_000)
_TIE = 0.01

# Chosen by ``tune`` on seed 0 (started at commit 5a1f234, 2026-12-07 02:07 UTC, 1,072 s of
# host time), twin-rx9070xt, each rate's window holding 1.5 teams on average (the quick
# form's: 900, 450, 225, 90 s). Each baseline with context editing, keep 3; mean job time,
# s, at 0.1, 0.2, 0.4 and 1 teams/min (paged, paged+offload, ttl-pin, intercept), and
# the objective, their geometric mean (* chosen):
#
# | trigger | objective | 0.1/min | 0.2/min | 0.4/min | 1/min |
# |---|---|---|---|---|---|
# | 8,000 | 354* | 302 301 301 301 | 349 347 353 348 | 376 375 384 374 | 394 391 408 392 |
# | 16,000 | 364 | 302 301 301 301 | 385 356 366 355 | 402 379 401 380 | 411 395 428 396 |
# | 24,000 | 438 | 413 329 335 330 | 516 396 425 398 | 607 438 465 431 | 640 461 481 460 |
# | 32,000 | 558 | 610 414 439 409 | 739 500 517 492 | 834 534 534 536 | 906 563 574 554 |
#
# The least is the grid's smallest trigger: one below it was not tried. Run again at
# commit 8ade560 (2026-12-07 12:21 UTC, 326 s), after kvgov's compaction changed: every
# figure the same to the second (context editing's prompts do not pass through it).
TRIGGER_TOKENS = 8_000

K = TypeVar("K", bound=Any)  # a grid point: ordered, the greatest keeping the most


def choose(objective: Mapping[K, float]) -> K:
    """The trigger of least ``objective`` (trigger -> geometric mean job time), a trigger
    within 1% of it going to the largest: the one that clears latest. The same rule
    chooses kvgov's context (``kvgov_context``), its points ordered by what they keep."""
    least = min(objective.values())
    return max(t for t, v in objective.items() if v <= least * (1 + _TIE))


def tune(
    rates: Sequence[float],
    *,
    window_s: dict[float, float],
    policies: Sequence[str],
    triggers: Sequence[int] = TRIGGERS,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[int, dict[int, dict[str, float]]]:
    """The chosen trigger, and each trigger's mean job time by ``policy@rate``, all on the
    tuning seed."""
    from kvgov.benchmarks.openloop import bench
    from kvgov.benchmarks.openloop.langchain_context import CONTEXT_EDITING
    from kvgov.benchmarks.openloop.system import System, run_seed

    table: dict[int, dict[str, float]] = {}
    began = time.perf_counter()
    for trigger in triggers:
        runs = run_seed(
            bench.TUNING_SEED,
            rates,
            window_s=window_s,
            policies=policies,
            trigger_tokens=trigger,
            only=[System(p, CONTEXT_EDITING) for p in policies],
            progress=progress,
        )
        table[trigger] = {
            f"{name.rsplit('+', 1)[0]}@{rate:g}": result.jct_mean_s
            for (name, rate), result in runs.results.items()
        }
        progress(f"trigger {trigger:,}: {table[trigger]} ({time.perf_counter() - began:.0f} s)")
    objective = {t: stats.tuning_objective(row.values()) for t, row in table.items()}
    return choose(objective), table
