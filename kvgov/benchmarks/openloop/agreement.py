"""How far the twin's CPU panel is from the real engine's runs of the same workloads: per
policy, the relative error of the mean job time and of the prefill tokens the engine
computed (the recomputed ones included), held to ``kvgov twin check``'s targets.

Each error is taken workload by workload: the twin's run of one (policy, rate, seed)
against the real run of that same workload and policy, on the constrained budget (where
policies differ), with ``twin_check.PolicyCheck``'s relative error. A policy's error is
the median over its workloads, so one noisy real run (a shared host's, whose speed
drifts by more than the tolerance over minutes) does not decide it; the headline is the
largest over the policies (``cpu_twin_jct_error_max``, target ``JCT_ERROR_TARGET``;
``cpu_twin_prefill_error_max``, target ``PREFILL_ERROR_TARGET``). Runs missing on either
side raise ``AgreementError`` rather than compare what is there.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from engine.benchmarks import Direction, Measurement
from kvgov.benchmarks.openloop.panel import Cell, PanelRuns

__all__ = ["Agreement", "AgreementError"]

_BENCH = "swarm"
# The figures compared, named as twin_check names them.
_COMPARED = ("jct_mean", "prefill_tokens")


class AgreementError(ValueError):
    """The real and twin runs do not cover the same workloads; the message says which."""


@dataclass(slots=True)
class Agreement:
    """Per policy and figure of ``_COMPARED``: the relative error of each workload's twin
    run against its real run, by (rate, seed)."""

    policies: Sequence[str]
    errors: dict[tuple[str, str], dict[tuple[float, int], float]] = field(default_factory=dict)
    # The medians compared, for the notes: (policy, figure) -> (twin, real) over workloads.
    medians: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, real: PanelRuns, twin: PanelRuns, policies: Sequence[str]) -> Agreement:
        """The errors of ``twin``'s constrained runs against ``real``'s, workload by
        workload; every constrained run of ``policies`` must be in both."""
        from kvgov.twin_check import FIGURES, PolicyCheck

        cells = sorted(
            (c for c in real.results if c.policy in policies and not c.unconstrained),
            key=lambda c: (c.policy, c.rate_per_min, c.seed),
        )
        missing = [c for c in cells if c not in twin.results]
        extra = [
            c
            for c in twin.results
            if c.policy in policies and not c.unconstrained and c not in real.results
        ]
        if missing or extra or not cells:
            raise AgreementError(
                "the twin's and the real runs must cover the same workloads and policies: "
                f"missing on the twin {_cells(missing)}, missing on the real engine "
                f"{_cells(extra)}; run both panels on the same workloads"
            )
        agreement = cls(tuple(policies))
        for cell in cells:
            check = PolicyCheck(cell.policy, [twin.results[cell]], [real.results[cell]], 0.0)
            for name in _COMPARED:
                errors = agreement.errors.setdefault((cell.policy, name), {})
                errors[(cell.rate_per_min, cell.seed)] = check.error(FIGURES[name])
        for policy in policies:
            for name in _COMPARED:
                keys = [
                    Cell(policy, rate, seed, False)
                    for rate, seed in agreement.errors[(policy, name)]
                ]
                figure = FIGURES[name]
                agreement.medians[(policy, name)] = (
                    statistics.median(figure(twin.results[k]) for k in keys),
                    statistics.median(figure(real.results[k]) for k in keys),
                )
        return agreement

    def error(self, policy: str, name: str) -> float:
        """``policy``'s error of figure ``name``: the median over its workloads."""
        return statistics.median(self.errors[(policy, name)].values())

    def error_max(self, name: str) -> float:
        return max(self.error(policy, name) for policy in self.policies)

    def measurements(self, *, note: str = "") -> Iterator[Measurement]:
        from kvgov.twin_check import JCT_ERROR_TARGET, PREFILL_ERROR_TARGET

        lower = Direction.LOWER_IS_BETTER
        targets = {"jct_mean": JCT_ERROR_TARGET, "prefill_tokens": PREFILL_ERROR_TARGET}
        for policy in self.policies:
            for name in _COMPARED:
                twin, real = self.medians[(policy, name)]
                each = self.errors[(policy, name)]
                yield Measurement(
                    _BENCH,
                    f"cpu_twin_{name}_error[{policy}]",
                    self.error(policy, name),
                    "ratio",
                    None,
                    lower,
                    note=f"median over {len(each)} workloads of |twin - real| / real, each "
                    "workload's twin run against its real run ("
                    + ", ".join(
                        f"seed {s} at {r:g}/min {e:.3f}" for (r, s), e in sorted(each.items())
                    )
                    + f"); medians: twin {twin:.4g}, real {real:.4g}",
                )
        for name in _COMPARED:
            yield Measurement(
                _BENCH,
                f"cpu_twin_{'jct' if name == 'jct_mean' else 'prefill'}_error_max",
                self.error_max(name),
                "ratio",
                targets[name],
                lower,
                note=f"largest over the policies of the twin's CPU panel's error in {name} "
                "against the real engine's runs of the same workloads ("
                + ", ".join(f"{p} {self.error(p, name):.3f}" for p in self.policies)
                + f"), as kvgov twin check holds it; {note}",
            )


def _cells(cells: Sequence[Cell]) -> str:
    if not cells:
        return "none"
    return ", ".join(f"{c.policy} at {c.rate_per_min:g}/min seed {c.seed}" for c in cells[:6]) + (
        f" and {len(cells) - 6} more" if len(cells) > 6 else ""
    )
