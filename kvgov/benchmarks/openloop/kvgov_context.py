"""kvgov's context knobs in the whole-system comparison (``system``): the ceiling at which
an agent's history is compacted, the share of it its running summary may take, how far
under it a compaction goes, and the budget each tool output is reduced to, chosen on the
tuning seed, never on a reported seed.

Context editing's trigger and keep are tuned for its users' stack, and kvgov's own
handling with the same effort: on ``sweep.TUNING_SEED`` only, kvgov runs with every point
of ``CEILINGS`` x ``TOOL_OUTPUTS`` x ``SUMMARY_SHARES`` x ``COMPACT_TOS`` at the rates
context editing was tuned at. The rule (``choose_keeping``) is context editing's
(``editing_knobs.choose``: the least geometric mean over the rates of the mean job time,
a point within 1% of the least going to the one that keeps most) among the points whose
agents keep at least as many of the planted facts as the best LangChain handling's on
the same seed: the comparison asks for kvgov's speed with no fewer facts kept. Where no
point keeps as many, the one that keeps most is chosen. Facts kept are reported beside
job time for every system.

``KVGOV_CONTEXT`` is what the rule chose (``context_tuning.tune_kvgov_context`` reruns it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from kvgov.benchmarks.context import SUMMARY_SHARE
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.editing_knobs import choose

__all__ = [
    "CEILINGS",
    "COMPACT_TOS",
    "KVGOV_CONTEXT",
    "KVGOV_FASTEST",
    "SUMMARY_SHARES",
    "TOOL_OUTPUTS",
    "KvgovContext",
    "choose_keeping",
]


@dataclass(frozen=True, slots=True, order=True)
class KvgovContext:
    """How kvgov bounds an agent's context: histories compacted at ``ceiling_tokens``
    (``SummarizeOldest``) with a running summary of up to ``summary_share`` of it, down
    to ``compact_to`` of it where they can, each tool output reduced to
    ``tool_output_tokens`` (``ExtractiveSummarizer``). Ordered by how much context it
    keeps."""

    ceiling_tokens: int
    tool_output_tokens: int
    summary_share: float = SUMMARY_SHARE
    compact_to: float = 1.0

    def apply(self, workload: openloop.OpenLoopWorkload) -> openloop.OpenLoopWorkload:
        """``workload`` with kvgov's context bounded so."""
        return dataclasses.replace(
            workload,
            ceiling_tokens=self.ceiling_tokens,
            tool_output_tokens=self.tool_output_tokens,
            summary_share=self.summary_share,
            compact_to=self.compact_to,
        )

    @property
    def system(self) -> str:
        """Its name as a system of the comparison beside the chosen one's (``kvgov``):
        ``kvgov@<ceiling>``, then ``/<share>`` where the summary's share is not the
        default quarter and ``/to<compact_to>`` where compaction goes under the ceiling."""
        share = "" if self.summary_share == SUMMARY_SHARE else f"/{self.summary_share:g}"
        to = "" if self.compact_to == 1 else f"/to{self.compact_to:g}"
        return f"kvgov@{self.ceiling_tokens}{share}{to}"

    def describe(self) -> str:
        return (
            f"outputs reduced to {self.tool_output_tokens:,}, compacted at "
            f"{self.ceiling_tokens:,} with a summary of up to {self.summary_share:g} of it"
            + ("" if self.compact_to == 1 else f", down to {self.compact_to:g} of it")
        )


# From 8,000 (a quarter of the model's window) to 24,000, where kvgov keeps more of the
# facts than trim_messages keeps at the window.
# Tool outputs at the panel's 2,048 only: the workload draws an agent's words around the
# lines it quotes of its last result, so outputs cut to 1,024 draw other jobs on seed 0
# (``handled.prepare`` refuses them).
CEILINGS = (8_000, 12_000, 16_000, 20_000, 24_000)
TOOL_OUTPUTS = (2_048,)
# The running summary's share of the ceiling: the benchmarks' quarter, and half (the
# folded results' gists get twice the room, the latest turns kept whole less).
SUMMARY_SHARES = (SUMMARY_SHARE, 0.5)
# How far under the ceiling a compaction goes: to the ceiling (every call past it folds a
# turn and rewrites the summary, so the prompt is computed again whole), or to 0.8 or 0.6
# of it (the next calls append to the prompt the engine has cached).
COMPACT_TOS = (1.0, 0.8, 0.6)

# Chosen by ``tune`` on seed 0 (at commit 0ac595a, 2026-12-07 17:45 UTC, 376 s in two
# processes), twin-rx9070xt, each rate's window holding 1.5 teams on average as for
# context editing's knobs (900, 450, 225, 90 s). kvgov's mean job time, s, at 0.1, 0.2,
# 0.4 and 1 teams/min, the objective (their geometric mean) and the facts its agents keep
# (the best LangChain handling, trim_messages, keeps 67.2% on the same jobs) (* chosen):
#
# | ceiling | summary | compact to | objective | 0.1/min | 0.2/min | 0.4/min | 1/min | facts kept |
# |---|---|---|---|---|---|---|---|---|
# | 8,000 | 0.25 | 0.6 | 256 | 230 | 253 | 267 | 276 | 25.5% |
# | 8,000 | 0.25 | 0.8 | 273 | 243 | 270 | 286 | 296 | 39.9% |
# | 8,000 | 0.25 | 1.0 | 314 | 276 | 311 | 330 | 342 | 46.9% |
# | 8,000 | 0.5 | 0.6 | 258 | 232 | 255 | 270 | 279 | 26.6% |
# | 8,000 | 0.5 | 0.8 | 284 | 252 | 281 | 299 | 309 | 25.1% |
# | 8,000 | 0.5 | 1.0 | 327 | 288 | 325 | 343 | 355 | 55.0% |
# | 12,000 | 0.25 | 0.6 | 294 | 258 | 290 | 309 | 322 | 45.8% |
# | 12,000 | 0.25 | 0.8 | 329 | 287 | 324 | 346 | 362 | 55.0% |
# | 12,000 | 0.25 | 1.0 | 423 | 368 | 418 | 446 | 468 | 62.7% |
# | 12,000 | 0.5 | 0.6 | 304 | 267 | 300 | 319 | 333 | 42.4% |
# | 12,000 | 0.5 | 0.8 | 329* | 288 | 324 | 347 | 360 | 67.5% |
# | 12,000 | 0.5 | 1.0 | 413 | 359 | 412 | 433 | 453 | 69.0% |
# | 16,000 | 0.25 | 0.6 | 341 | 295 | 337 | 362 | 378 | 58.7% |
# | 16,000 | 0.25 | 0.8 | 388 | 330 | 385 | 415 | 432 | 66.1% |
# | 16,000 | 0.25 | 1.0 | 556 | 486 | 549 | 591 | 606 | 69.4% |
# | 16,000 | 0.5 | 0.6 | 339 | 294 | 334 | 359 | 375 | 70.1% |
# | 16,000 | 0.5 | 0.8 | 400 | 344 | 395 | 427 | 441 | 76.8% |
# | 16,000 | 0.5 | 1.0 | 540 | 479 | 544 | 564 | 578 | 76.4% |
# | 20,000 | 0.25 | 0.6 | 404 | 343 | 406 | 434 | 442 | 65.3% |
# | 20,000 | 0.25 | 0.8 | 467 | 410 | 465 | 497 | 504 | 73.1% |
# | 20,000 | 0.25 | 1.0 | 628 | 561 | 625 | 656 | 675 | 77.1% |
# | 20,000 | 0.5 | 0.6 | 398 | 347 | 394 | 421 | 436 | 74.9% |
# | 20,000 | 0.5 | 0.8 | 456 | 397 | 457 | 479 | 498 | 79.7% |
# | 20,000 | 0.5 | 1.0 | 627 | 561 | 621 | 658 | 673 | 79.7% |
# | 24,000 | 0.25 | 0.6 | 446 | 386 | 441 | 471 | 491 | 72.7% |
# | 24,000 | 0.25 | 0.8 | 499 | 427 | 503 | 537 | 537 | 80.8% |
# | 24,000 | 0.25 | 1.0 | 696 | 628 | 700 | 718 | 744 | 82.3% |
# | 24,000 | 0.5 | 0.6 | 444 | 391 | 438 | 469 | 484 | 80.4% |
# | 24,000 | 0.5 | 0.8 | 495 | 446 | 486 | 520 | 534 | 84.5% |
# | 24,000 | 0.5 | 1.0 | 686 | 640 | 666 | 707 | 737 | 85.2% |
#
# Compacting to the ceiling (1.0) is the slowest at every ceiling: each call past it folds
# one turn and rewrites the summary, so the whole prompt is computed again. Under it, the
# next calls append to a cached prompt: at 12,000 with half for the summary, 0.8 takes 329
# s against 413 s and keeps 67.5% of the facts against 69.0%, the fastest point that keeps
# as many as trim_messages. (Compacting to the ceiling alone, at 167da54, 12,000 with half
# was chosen; with the quarter alone, at 8ade560, 16,000.)
KVGOV_CONTEXT = KvgovContext(
    ceiling_tokens=12_000, tool_output_tokens=2_048, summary_share=0.5, compact_to=0.8
)
# The grid's fastest point on the same runs, whatever it keeps: reported beside the chosen
# one (``system.measure``'s ``also``), so the trade between speed and facts kept shows.
KVGOV_FASTEST = KvgovContext(ceiling_tokens=8_000, tool_output_tokens=2_048, compact_to=0.6)


def choose_keeping(
    objective: Mapping[KvgovContext, float],
    facts_kept_pct: Mapping[KvgovContext, float],
    floor: float,
) -> KvgovContext:
    """The point ``editing_knobs.choose`` picks among those that keep at least
    ``floor`` percent of the facts; where none does, the one that keeps most (the one
    that keeps more context on a tie)."""
    enough = {p: v for p, v in objective.items() if facts_kept_pct[p] >= floor}
    if not enough:
        return max(facts_kept_pct, key=lambda p: (facts_kept_pct[p], p))
    return choose(enough)
