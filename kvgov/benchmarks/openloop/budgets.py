"""Goodput against the KV budget: every policy at one load, with the engine given a share
of the KV memory the reference card leaves after the weights.

A user's engine rarely holds all of the card: a desktop, a second model or a
``--gpu-memory-utilization`` below one leave it less. ``with_kv_share`` is the same card
with the engine given ``share`` of its KV (the rest counted as overhead), host memory
for KV unchanged (the host does not shrink when the card is shared). At each share of
``SHARES`` every policy runs the same workloads, constrained only: goodput reads each job
against its unloaded time (``unloaded``), which does not depend on the budget. The share
1.0 is the panel itself, so its runs are taken from the panel's, not run again.

The load is the rate where ``jct_mean_paged_over_kvgov_twin_at_0.8`` is read: the rate
swept nearest 0.8 of the paged engine's saturation on the whole card
(``PanelFigures.rate_near``). Below the whole card the same load is past saturation,
which is where memory policy decides how many jobs finish in time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.benchmarks import Direction, Measurement
from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.openloop.panel import Cell, Panel, PanelRuns, run_panel
from kvgov.benchmarks.openloop.workload import OpenLoopWorkload

__all__ = ["SHARES", "BudgetFigures", "run_budgets", "with_kv_share"]

# Half, three quarters and all of the 9.5 GB the reference card leaves for KV: from a
# budget where two agents at the 16k ceiling fill it to the whole card.
SHARES = (0.5, 0.75, 1.0)
_BENCH = "swarm"


def with_kv_share(panel: Panel, share: float) -> Panel:
    """``panel``'s card with the engine given ``share`` (0-1] of its KV memory."""
    if not 0 < share <= 1:
        raise ValueError(f"a KV share is a part of the card's KV memory, in (0, 1]; got {share!r}")
    if share == 1:
        return panel
    scenario = panel.scenario
    withheld = scenario.kv_bytes - int(share * scenario.kv_bytes)
    return Panel(
        name=f"{panel.name}-kv{share:g}",
        scenario=dataclasses.replace(scenario, overhead_bytes=scenario.overhead_bytes + withheld),
    )


def run_budgets(
    panel: Panel,
    whole: PanelRuns,
    workloads: Sequence[OpenLoopWorkload],
    policies: Sequence[str],
    *,
    shares: Sequence[float] = SHARES,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    progress: Callable[[str], None] = lambda line: None,
    processes: int = 1,
) -> dict[float, PanelRuns]:
    """Each share -> every policy's constrained runs of ``workloads`` with that share of
    ``panel``'s KV; the share 1.0 read from ``whole`` (the panel's own runs)."""
    out: dict[float, PanelRuns] = {}
    for share in shares:
        if share == 1:
            out[share] = _constrained(whole, workloads, policies)
            continue
        progress(f"{panel.name}: {share:g} of the card's KV ...")
        out[share] = run_panel(
            with_kv_share(panel, share),
            workloads,
            policies,
            knobs=knobs,
            progress=progress,
            processes=processes,
            unconstrained=False,
        )
    return out


def _constrained(
    whole: PanelRuns, workloads: Sequence[OpenLoopWorkload], policies: Sequence[str]
) -> PanelRuns:
    runs = PanelRuns(whole.panel)
    for w in workloads:
        key = (w.rate_per_min, w.seed)
        runs.unloaded_s[key] = whole.unloaded_s[key]
        for policy in policies:
            cell = Cell(policy, w.rate_per_min, w.seed, False)
            runs.results[cell] = whole.results[cell]
    return runs


@dataclass(slots=True)
class BudgetFigures:
    """Goodput of every policy at ``rate`` against the share of the card's KV, the
    median over ``seeds`` with its paired 95% interval, and kvgov over the best
    baseline at each share."""

    runs: Mapping[float, PanelRuns]  # share -> runs
    rate: float
    seeds: Sequence[int]
    policies: Sequence[str]
    window_s: float
    suffix: str
    what: str = ""

    def at(self, share: float) -> PanelFigures:
        return PanelFigures(
            self.runs[share], [self.rate], self.seeds, self.policies, self.window_s, self.suffix
        )

    def goodput(self, policy: str, share: float) -> dict[int, float]:
        """``policy``'s goodput at ``share`` of the KV, by seed."""
        return self.at(share).per_seed(policy, self.rate, "goodput")

    def kv_gb(self, share: float) -> float:
        return self.runs[share].panel.scenario.kv_bytes / 1e9

    def measurements(self) -> Iterator[Measurement]:
        at = f"{self.rate:g}/min"
        for share in sorted(self.runs):
            kv = f"{self.kv_gb(share):.1f} GB of KV ({share:g} of the card's)"
            where = f"{kv}; {len(self.seeds)} evaluation seeds"
            if self.what:
                where += f"; {self.what}"
            for policy in self.policies:
                interval = stats.median_interval(self.goodput(policy, share))
                yield Measurement(
                    _BENCH,
                    f"goodput[{policy}]@{at}_kv{share:g}_{self.suffix}",
                    interval.value,
                    "jobs/min",
                    None,
                    Direction.HIGHER_IS_BETTER,
                    note=f"modelled; median and 95% band {interval}; {where}",
                )
            if "kvgov" not in self.policies or len(self.policies) < 2:
                continue
            best = self.at(share).best_baseline(self.rate, "goodput", lower_is_better=False)
            theirs = self.goodput(best, share)
            if not all(v > 0 for v in theirs.values()):
                continue  # no ratio to a baseline that finished no job in time
            ratio = stats.paired_ratio(self.goodput("kvgov", share), theirs)
            yield Measurement(
                _BENCH,
                f"goodput_kvgov_over_best@{at}_kv{share:g}_{self.suffix}",
                ratio.value,
                "ratio",
                None,
                Direction.HIGHER_IS_BETTER,
                note=f"modelled; kvgov over {best} (best by goodput at this budget), {ratio}; "
                f"{where}",
            )
        failed = {
            policy: sum(
                sum(self.at(share).per_seed(policy, self.rate, "failed").values())
                for share in self.runs
            )
            for policy in self.policies
        }
        yield Measurement(
            _BENCH,
            f"jobs_failed_budgets_{self.suffix}",
            float(sum(failed.values())),
            "jobs",
            0.0,
            Direction.LOWER_IS_BETTER,
            note="every policy, share and seed at "
            + at
            + ": "
            + ", ".join(f"{p} {n:g}" for p, n in failed.items()),
        )
