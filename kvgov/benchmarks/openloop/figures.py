"""The figures of one panel's runs: job times against arrival rate, each policy over its
own unconstrained run, goodput, and kvgov against the best baseline, every one a median
over the evaluation seeds with its paired 95% bootstrap interval (``stats``).

Goodput is per job (``stats.goodput_per_min``): jobs a minute of the arrival window
that finished within their own SLO, ``stats.SLO_FACTOR`` (2) times the job's own unloaded
time; a failed job never counts. A job's unloaded time is its time with the machine to
itself (``unloaded``): its team run alone under paged with room for every context and
its system prompt cached, so neither memory nor another team slows it. It depends on the
job alone, never on the rates swept, and is the same for every policy, so goodputs
compare; a short job is held to its own size, not to a threshold set by the longest. The
best baseline is picked once, on its median over the evaluation seeds
(``stats.best_of``), then compared with kvgov seed by seed.

Where job time goes (``jct_mean_<part>``, ``swarm.breakdown.PARTS``): each run's mean
over its jobs of each part (tools, a planner's wait on its workers, admission, the
engine's queue, prefill, recompute, swap stall, decode), averaged over the seeds, so the
parts of one policy at one rate add up to its mean job time averaged over the seeds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from engine.benchmarks import Direction, Measurement
from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop.panel import PanelRuns
from kvgov.benchmarks.swarm.breakdown import PARTS
from kvgov.benchmarks.swarm.result import RunResult, percentile

__all__ = ["PanelFigures"]

_BENCH = "swarm"
_LOWER, _HIGHER = Direction.LOWER_IS_BETTER, Direction.HIGHER_IS_BETTER


@dataclass(slots=True)
class PanelFigures:
    """The figures of ``runs`` over ``rates`` and ``seeds``, in the panel's ``suffix``
    (``twin`` for the reference card's twin, ``cpu`` for the CPU panel)."""

    runs: PanelRuns
    rates: Sequence[float]
    seeds: Sequence[int]
    policies: Sequence[str]
    # The arrival window, for jobs per minute: one for every rate, or each rate's.
    window_s: float | Mapping[float, float]
    suffix: str
    what: str = ""  # the workload, for the notes
    # What every note begins with: how the figures came to be (the twin's: modelled; the
    # real engine's: measured, and on what).
    label: str = "modelled"

    def goodput(self, result: RunResult, rate: float, seed: int) -> float:
        """Jobs a minute within ``SLO_FACTOR`` times their own unloaded time."""
        slo_s = stats.slo_s_by_job(self.runs.unloaded(rate, seed))
        return stats.goodput_per_min(result.jct_s, len(result.failed), self.window(rate), slo_s)

    def window(self, rate: float) -> float:
        """The arrival window of the runs at ``rate``, seconds."""
        return self.window_s if isinstance(self.window_s, (int, float)) else self.window_s[rate]

    def saturation_per_min(self) -> float | None:
        """The paged engine's saturation load, teams a minute: at the highest rate swept,
        the teams it finished per minute from the run's start to its last job's end
        (the engine busy throughout, as it is past saturation), the median over the
        seeds. None without paged."""
        if "paged" not in self.policies:
            return None
        top = max(self.rates)
        per_seed = {}
        for seed in self.seeds:
            result = self.runs.result("paged", top, seed)
            teams = sum(1 for job in result.jct_s if job.endswith("-planner"))
            per_seed[seed] = 60.0 * teams / result.makespan_s if result.makespan_s else 0.0
        return stats.median_interval(per_seed).value

    def rate_near(self, share: float) -> float | None:
        """The rate swept nearest ``share`` of the paged engine's saturation load (the
        lower of two as near); None where saturation is not known."""
        saturation = self.saturation_per_min()
        if saturation is None or not saturation > 0:
            return None
        target = share * saturation
        return min(self.rates, key=lambda r: (abs(r - target), r))

    def per_seed(self, policy: str, rate: float, figure: str) -> dict[int, float]:
        """``figure`` (``jct_mean``, ``jct_p99``, ``goodput``, ``recomputed``, ``failed``,
        ``jct_mean_unconstrained``) of ``policy`` at ``rate``, by seed."""
        out = {}
        for seed in self.seeds:
            unconstrained = figure == "jct_mean_unconstrained"
            result = self.runs.result(policy, rate, seed, unconstrained=unconstrained)
            out[seed] = _FIGURES[figure](self, result, rate, seed)
        return out

    def best_baseline(self, rate: float, figure: str, *, lower_is_better: bool) -> str:
        baselines = [p for p in self.policies if p != "kvgov"]
        return stats.best_of(
            {p: self.per_seed(p, rate, figure) for p in baselines},
            lower_is_better=lower_is_better,
        )

    def measurements(self) -> Iterator[Measurement]:
        panel = self.runs.panel
        n = len(self.seeds)
        where = f"{panel.title}; {n} evaluation seeds ({_span(self.seeds)})"
        if self.what:
            where += f"; {self.what}"
        for rate in self.rates:
            at = f"{rate:g}/min"
            for policy in self.policies:
                for figure, unit, direction in (
                    ("jct_mean", "s", _LOWER),
                    ("jct_p99", "s", _LOWER),
                    ("goodput", "jobs/min", _HIGHER),
                ):
                    interval = stats.median_interval(self.per_seed(policy, rate, figure))
                    yield Measurement(
                        _BENCH,
                        f"{figure}[{policy}]@{at}_{self.suffix}",
                        interval.value,
                        unit,
                        None,
                        direction,
                        note=f"{self.label}; median and 95% band {interval}; "
                        + (f"{_GOODPUT_NOTE}; " if figure == "goodput" else "")
                        + where,
                    )
                own = stats.paired_ratio(
                    self.per_seed(policy, rate, "jct_mean"),
                    self.per_seed(policy, rate, "jct_mean_unconstrained"),
                )
                yield from self._breakdown(policy, rate)
                yield Measurement(
                    _BENCH,
                    f"jct_mean_over_unconstrained[{policy}]@{at}_{self.suffix}",
                    own.value,
                    "ratio",
                    None,
                    _LOWER,
                    note=f"{self.label}; its own run with room for every context, seed by "
                    f"seed: {own}",
                )
            if "kvgov" in self.policies and len(self.policies) > 1:
                yield from self._against_best(rate, where)
        yield from self._at_saturation()
        yield Measurement(
            _BENCH,
            f"jobs_failed_{self.suffix}",
            float(
                sum(
                    sum(self.per_seed(p, r, "failed").values())
                    for p in self.policies
                    for r in self.rates
                )
            ),
            "jobs",
            0.0,
            _LOWER,
            note=f"{self.label}; every policy, rate and seed: "
            + ", ".join(
                f"{p} {sum(sum(self.per_seed(p, r, 'failed').values()) for r in self.rates):g}"
                for p in self.policies
            ),
        )

    def breakdown(self, policy: str, rate: float) -> dict[str, float]:
        """Each part of ``PARTS`` -> its mean seconds a job of ``policy`` at ``rate``,
        averaged over the seeds (their sum: the mean job time, averaged likewise)."""
        sums = dict.fromkeys(PARTS, 0.0)
        for seed in self.seeds:
            jobs = self.runs.result(policy, rate, seed).breakdown.values()
            for part in PARTS:
                sums[part] += sum(job.part(part) for job in jobs) / max(1, len(jobs))
        return {part: total / len(self.seeds) for part, total in sums.items()}

    def _breakdown(self, policy: str, rate: float) -> Iterator[Measurement]:
        if not any(self.runs.result(policy, rate, s).breakdown for s in self.seeds):
            return  # a run with no ledger of its time (the real engine's): no zeros
        parts = self.breakdown(policy, rate)
        total = sum(parts.values())
        for part, seconds in parts.items():
            yield Measurement(
                _BENCH,
                f"jct_mean_{part}[{policy}]@{rate:g}/min_{self.suffix}",
                seconds,
                "s",
                None,
                _LOWER,
                note=f"{self.label}; {_PART_NOTES[part]}; mean over jobs and seeds; the parts "
                f"add up to {total:.1f} s, the mean job time averaged over the seeds",
            )

    def paged_over_kvgov(self, rate: float) -> stats.Interval:
        """paged's mean job time over kvgov's at ``rate``, seed by seed."""
        return stats.paired_ratio(
            self.per_seed("paged", rate, "jct_mean"), self.per_seed("kvgov", rate, "jct_mean")
        )

    def _at_saturation(self) -> Iterator[Measurement]:
        saturation = self.saturation_per_min()
        if saturation is None or not saturation > 0:
            return
        top = max(self.rates)
        yield Measurement(
            _BENCH,
            f"saturation_paged_{self.suffix}",
            saturation,
            "teams/min",
            None,
            _HIGHER,
            note=f"{self.label}; the teams paged finished a minute at {top:g}/min, from the run's "
            "start to its last job's end (median of seeds): the load it saturates at",
        )
        if "kvgov" not in self.policies:
            return
        target = 0.8 * saturation
        rate = self.rate_near(0.8)
        assert rate is not None  # saturation is known
        paged = self.paged_over_kvgov(rate)
        yield Measurement(
            _BENCH,
            f"jct_mean_paged_over_kvgov_{self.suffix}_at_0.8",
            paged.value,
            "ratio",
            2.0,
            _HIGHER,
            note=f"{self.label}; at {rate:g} teams/min, the rate swept nearest 0.8x paged's "
            f"saturation ({target:.2f}/min); {paged}",
        )
        # The most any memory policy can gain over paged at that load: a policy whose
        # memory costs nothing runs as paged does with room for every context, and the
        # compute and the tools are every policy's.
        ceiling = stats.paired_ratio(
            self.per_seed("paged", rate, "jct_mean"),
            self.per_seed("paged", rate, "jct_mean_unconstrained"),
        )
        yield Measurement(
            _BENCH,
            f"jct_mean_paged_over_unconstrained_{self.suffix}_at_0.8",
            ceiling.value,
            "ratio",
            None,
            _LOWER,
            note=f"{self.label}; at {rate:g} teams/min, paged over its own run with room for "
            "every context: the most any memory policy could gain over paged there, "
            f"the bound on jct_mean_paged_over_kvgov; {ceiling}",
        )

    def _against_best(self, rate: float, where: str) -> Iterator[Measurement]:
        at = f"{rate:g}/min"
        best = self.best_baseline(rate, "goodput", lower_is_better=False)
        ratio = (
            stats.paired_ratio(
                self.per_seed("kvgov", rate, "goodput"), self.per_seed(best, rate, "goodput")
            )
            if _positive(self.per_seed(best, rate, "goodput"))
            else None
        )
        name = f"goodput_kvgov_over_best@{at}_{self.suffix}"
        if ratio is not None:
            yield Measurement(
                _BENCH,
                name,
                ratio.value,
                "ratio",
                None,
                _HIGHER,
                note=f"{self.label}; kvgov over {best} (best by goodput), {ratio}; "
                f"{_GOODPUT_NOTE}; {where}",
            )
            yield Measurement(
                _BENCH,
                name + "_lower95",
                ratio.low,
                "ratio",
                None,
                _HIGHER,
                note=f"the paired interval's lower bound: {ratio}",
            )
        if "paged" in self.policies:
            paged = self.paged_over_kvgov(rate)
            yield Measurement(
                _BENCH,
                f"jct_mean_paged_over_kvgov@{at}_{self.suffix}",
                paged.value,
                "ratio",
                None,
                _HIGHER,
                note=f"{self.label}; {paged}",
            )
            recomputed = self.per_seed("paged", rate, "recomputed")
            if _positive(recomputed):
                share = stats.paired_ratio(self.per_seed("kvgov", rate, "recomputed"), recomputed)
                yield Measurement(
                    _BENCH,
                    f"recomputed_tokens_kvgov_over_paged@{at}_{self.suffix}",
                    share.value,
                    "ratio",
                    0.25,
                    _LOWER,
                    note=f"{self.label}; {share}",
                )


def _positive(values: dict[int, float]) -> bool:
    return all(v > 0 for v in values.values())


def _span(seeds: Sequence[int]) -> str:
    return f"{min(seeds)}-{max(seeds)}" if len(seeds) > 1 else str(seeds[0])


_GOODPUT_NOTE = (
    f"goodput counts the jobs a minute that finished within {stats.SLO_FACTOR:g}x their own "
    "unloaded time (their team run alone under paged, room for every context, its system "
    "prompt cached)"
)
_PART_NOTES = {
    "tool": "an agent waiting on its tools, for their drawn durations",
    "workers": "a planner waiting on its team's workers",
    "admission": "waiting before a call reached the engine: admission by the policy, or "
    "the runtime",
    "queue": "in the engine, not in the step being computed",
    "prefill": "in steps computing its prompt's new tokens",
    "recompute": "in steps computing tokens computed before and thrown away",
    "swap": "steps waiting on host-link copies beyond their compute",
    "decode": "in steps computing its next token",
}
# Each takes the figures, a run's result, its rate and its seed.
_FIGURES = {
    "jct_mean": lambda f, r, rate, s: r.jct_mean_s,
    "jct_mean_unconstrained": lambda f, r, rate, s: r.jct_mean_s,
    "jct_p99": lambda f, r, rate, s: percentile(list(r.jct_s.values()), 99),
    "goodput": lambda f, r, rate, s: f.goodput(r, rate, s),
    "recomputed": lambda f, r, rate, s: float(r.counters.recomputed_tokens),
    "failed": lambda f, r, rate, s: float(len(r.failed)),
}
