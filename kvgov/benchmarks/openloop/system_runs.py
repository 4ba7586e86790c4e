"""The systems of the whole-system comparison (``system``) and one seed's runs of them:
a ``System`` is a memory policy with the context handling its users run it with;
``SeedRuns`` holds every system's run at every rate on one evaluation seed, with each
job's unloaded time and the facts each handling keeps.

Invariant: a job's goodput SLO is the job's, the same whichever system runs it
(``SeedRuns.slo_s``). ``check_seeds`` refuses the tuning seed among the seeds reported.

Errors: ``SystemComparisonError`` (a ``ValueError``) when the tuning seed is among the
seeds to report; its message says what to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvgov.benchmarks.baselines import BASELINES
from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop.editing_knobs import EDITING_KNOBS, EditingKnobs
from kvgov.benchmarks.openloop.facts import FactsKept
from kvgov.benchmarks.openloop.handled import KVGOV
from kvgov.benchmarks.openloop.kvgov_context import KvgovContext
from kvgov.benchmarks.openloop.langchain_context import HANDLINGS
from kvgov.benchmarks.openloop.sweep import TUNING_SEED

if TYPE_CHECKING:
    from kvgov.benchmarks.swarm.result import RunResult

__all__ = [
    "KVGOV",
    "POLICIES",
    "SeedRuns",
    "System",
    "SystemComparisonError",
    "check_seeds",
    "systems",
]

POLICIES = BASELINES  # the baselines run with each LangChain handling


class SystemComparisonError(ValueError):
    """A whole-system comparison that cannot give a sound figure."""


@dataclass(frozen=True, slots=True)
class System:
    """A memory policy and the context handling its users run it with."""

    policy: str
    # KVGOV, another of kvgov's contexts (``KvgovContext.system``), or one of
    # langchain_context.HANDLINGS
    handling: str

    @property
    def name(self) -> str:
        return self.handling if self.policy == KVGOV else f"{self.policy}+{self.handling}"


def systems(
    policies: Sequence[str] = POLICIES, also: Sequence[KvgovContext] = ()
) -> tuple[System, ...]:
    """kvgov, kvgov with each context of ``also``, then each of ``policies`` with each
    LangChain handling."""
    return (
        System(KVGOV, KVGOV),
        *(System(KVGOV, context.system) for context in also),
        *(System(p, h) for p in policies for h in HANDLINGS),
    )


@dataclass(slots=True)
class SeedRuns:
    """One evaluation seed's runs of every system at every rate (the same teams at every
    rate when each rate's window holds the same expected number of teams)."""

    seed: int
    results: dict[tuple[str, float], RunResult] = field(default_factory=dict)  # system, rate
    # (handling, rate) -> each job -> its unloaded time with that handling's prompts, s
    unloaded_s: dict[tuple[str, float], dict[str, float]] = field(default_factory=dict)
    facts: dict[tuple[str, float], FactsKept] = field(default_factory=dict)  # handling, rate
    window_s: dict[float, float] = field(default_factory=dict)
    num_trimmed_after_edit: int = 0  # calls context editing left over the window
    window_tokens: int = 0  # the model's context window
    editing: EditingKnobs = EDITING_KNOBS  # context editing's trigger and keep
    kvgov_context: KvgovContext | None = None  # kvgov's ceiling and tool-output budget
    also: tuple[KvgovContext, ...] = ()  # kvgov's other contexts run beside it
    wall_s: float = 0.0  # host seconds

    def slo_s(self, system: str, rate: float) -> dict[str, float]:
        """Each job's SLO at ``rate``: ``stats.SLO_FACTOR`` times the least of its
        unloaded times over the handlings. The job's, whichever ``system`` runs it."""
        by_handling = [t for (_, r), t in self.unloaded_s.items() if r == rate]
        least = {job: min(t[job] for t in by_handling) for job in by_handling[0]}
        return stats.slo_s_by_job(least)

    def goodput(self, system: str, rate: float) -> float:
        """``system``'s jobs a minute within their SLO at ``rate``."""
        result = self.results[(system, rate)]
        return stats.goodput_per_min(
            result.jct_s, len(result.failed), self.window_s[rate], self.slo_s(system, rate)
        )


def check_seeds(seeds: Sequence[int]) -> None:
    """Refuses the tuning seed among ``seeds``: no reported figure comes from it."""
    if TUNING_SEED in seeds:
        raise SystemComparisonError(
            f"seed {TUNING_SEED} is the tuning seed (context editing's knobs and every "
            "policy's knobs are chosen on it): no reported figure comes from it; evaluate "
            "on other seeds"
        )
