"""The CPU panel of ``kvgov bench openloop`` (issue 34): the twin of this machine and the
real engine's short form beside it, on the same workloads and seeds.

- The panel (``cpu_here``): the ``cpu-here`` profile as ``kvgov twin fit`` fitted it
  here, read from its file (never the shipped placeholder: ``ProfileNotFittedError`` says
  to run ``kvgov twin fit``), with the ``tiny-random`` model as the target at the
  precision the engine runs it here (float32); KV where the CPU workload is scarce
  (``kv_blocks_for``: one agent and a half at its ceiling, below every agent's peak at
  once on every evaluation seed), host memory for KV at ``HOST_RATIO`` times that, and
  the fitted link: a swap here is a memcpy.
- The real engine's short form (``real``): every policy on the engine computing every
  token, in real time, each beside its own unconstrained run, in a rotating order, on
  ``SHORT`` (the CPU workload's teams arriving three times as fast) or ``QUICK``.
- The twin's CPU panel (``panel.run_panel``) on the same workloads, and its agreement
  with the real runs (``agreement``), held to ``kvgov twin check``'s tolerance.

Figures (``cpu_figures``): the real runs' through ``PanelFigures`` with the suffix
``cpu``, noted "measured" (wall seconds on this CPU); the twin's with ``cpu_twin``, noted
"modelled"; ``jct_mean_kvgov_over_best_cpu`` with its paired 95% interval
(``_lower95``, ``_upper95``), ``recomputed_tokens_kvgov_over_paged_cpu``,
``jobs_failed[<policy>]_cpu`` and ``cpu_twin_jct_error_max``. Every policy runs with its
knobs as tuned on the tuning seed (``tuned.TUNED``), which no figure here comes from.

Errors, all raised before any run::

    ValueError
     └── CpuPanelError              options of the CPU panel that cannot work
          └── ProfileNotFittedError  no fitted cpu-here profile to run the twin on
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.benchmarks import Direction, Measurement
from kvgov.benchmarks.openloop import stats
from kvgov.benchmarks.openloop import workload as openloop
from kvgov.benchmarks.openloop.agreement import Agreement
from kvgov.benchmarks.openloop.figures import PanelFigures
from kvgov.benchmarks.openloop.panel import Panel, PanelRuns, run_panel
from kvgov.benchmarks.openloop.real import DEADLINE_S, run_real
from kvgov.benchmarks.openloop.sweep import POLICIES, TUNING_SEED
from kvgov.benchmarks.openloop.tuned import TUNED
from kvgov.benchmarks.openloop.workload_setup import WorkloadSetup

if TYPE_CHECKING:
    from engine.twin import DeviceProfile
    from engine.twin.targets import TargetModel

__all__ = [
    "BLOCK_SIZE",
    "HOST_RATIO",
    "KV_BLOCKS",
    "QUICK",
    "QUICK_SEEDS",
    "SEEDS",
    "SHORT",
    "CpuPanelError",
    "CpuPanelRuns",
    "ProfileNotFittedError",
    "cpu_figures",
    "cpu_here",
    "fitted_profile",
    "kv_blocks_for",
    "measure",
    "run_cpu_panel",
    "tiny_target",
]

_BENCH = "swarm"
_MODEL = "tiny-random"
HOST_RATIO = 3.0  # host memory for KV over device KV (the issue asks 2-4x)
BLOCK_SIZE = 16
# Five: the real engine's mean job moves a few percent from run to run on a shared host,
# and on seeds 1-3 alone that read as kvgov 6% behind; on 1-5, parity (docs/benchmarks.md).
SEEDS = (1, 2, 3, 4, 5)
QUICK_SEEDS = (1, 2)
# The short form: the CPU workload's four teams expected (three tenants, 6-10 tool calls
# a worker, contexts to its 5,000-token ceiling) arriving three times as fast, so they
# overlap: at the CPU workload's own 2 teams a minute every policy ran as unconstrained.
SHORT = dataclasses.replace(openloop.CPU, rate_per_min=6.0, duration_s=40.0)
# The quick form: the CPU workload's bfcl tenant alone (API calls of 0.2-0.3 s), teams of
# a planner and two workers arriving within seconds (3 and 5 on the quick seeds), 3-4
# calls a worker, tool outputs reduced to 256 tokens and histories compacted at 2,000:
# ten real runs a seed of a few seconds each.
QUICK = dataclasses.replace(
    openloop.CPU,
    rate_per_min=40.0,
    duration_s=5.0,
    tenants=(
        openloop.Tenant(name="bfcl", weight=1.0, workers_per_team=2, turns=(3, 4), mix="bfcl"),
    ),
    tool_output_tokens=256,
    ceiling_tokens=2_000,
)


def kv_blocks_for(workload: openloop.OpenLoopWorkload) -> int:
    """The panel's KV for ``workload``: room for one agent and a half at its ceiling with
    their longest replies. Any agent fits alone; two at their peaks do not, so contexts
    compete as soon as two teams overlap. (On the twin, seeds 1-3: ``SHORT`` at these 471
    blocks, paged's mean job took 1.22x its own unconstrained run's; the quick workload
    at 180 blocks 1.27x, and at room for two agents, 254 blocks, 1.06x.)"""
    assert workload.ceiling_tokens is not None, "the CPU workloads compact at a ceiling"
    agent = math.ceil((workload.ceiling_tokens + workload.reply_tokens[1]) / BLOCK_SIZE)
    return math.ceil(1.5 * agent)


KV_BLOCKS = kv_blocks_for(SHORT)
_MEASURED = "measured (wall seconds on this CPU, the tiny model computing every token)"


class CpuPanelError(ValueError):
    """Options of the CPU panel that cannot work; the message says what to change."""


class ProfileNotFittedError(CpuPanelError):
    """No fitted ``cpu-here`` profile where the panel looked: the twin of this machine
    cannot run on placeholder figures."""

    def __init__(self, *, path: Path, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(
            f"the CPU panel needs a fitted cpu-here profile, and {path} {why}: run "
            f"`kvgov twin fit --out {path}` on this machine first"
        )


def fitted_profile(path: Path | None = None) -> DeviceProfile:
    """The ``cpu-here`` profile fitted by ``kvgov twin fit``, read from ``path`` (None:
    where ``kvgov twin fit`` writes it, ``kvgov.twin.default_profile_path``)."""
    from engine.twin import ProfileError, get_profile, load_profile
    from engine.twin.profiles import FACTOR_FIELDS
    from kvgov.twin import default_profile_path

    path = Path(path) if path is not None else default_profile_path("cpu-here")
    if not path.is_file():
        raise ProfileNotFittedError(path=path, why="is no file")
    try:
        profile = load_profile(path)
    except ProfileError as exc:
        raise ProfileNotFittedError(path=path, why=f"is no profile ({exc})") from None
    if profile.name != "cpu-here":
        raise ProfileNotFittedError(path=path, why=f"is {profile.name}'s profile, not cpu-here's")
    placeholder = {s.field: s for s in get_profile("cpu-here").sources}
    unfitted = sorted(
        s.field for s in profile.sources if s.field in FACTOR_FIELDS and s == placeholder[s.field]
    )
    if unfitted:
        raise ProfileNotFittedError(
            path=path, why=f"holds the shipped placeholders for {', '.join(unfitted)}"
        )
    return profile


def tiny_target() -> TargetModel:
    """The ``tiny-random`` model as the real engine runs it on a CPU: float32 activations,
    weights and KV, its preset's context."""
    from engine.presets import PRESETS
    from engine.twin import ModelShape
    from engine.twin.targets import TargetModel

    config = PRESETS[_MODEL].config
    shape = ModelShape.from_config(config, name=_MODEL, activation_bits=32)
    return TargetModel(
        _MODEL,
        shape,
        config.max_position_embeddings,
        f"the engine's {_MODEL} preset, float32 as the engine runs it on a CPU",
    )


def cpu_here(
    *, profile: Path | None = None, kv_blocks: int = KV_BLOCKS, host_ratio: float = HOST_RATIO
) -> Panel:
    """The CPU panel's device: this machine's fitted twin (``fitted_profile(profile)``)
    with ``kv_blocks`` of KV for the tiny model, and host memory for KV at ``host_ratio``
    (2-4) times it."""
    from kvgov.simulate import Scenario

    if isinstance(kv_blocks, bool) or not isinstance(kv_blocks, int) or kv_blocks < 1:
        raise CpuPanelError(
            f"kv_blocks must be an int >= 1, such as {KV_BLOCKS}, got {kv_blocks!r}"
        )
    if not (isinstance(host_ratio, (int, float)) and 2.0 <= host_ratio <= 4.0):
        raise CpuPanelError(
            f"host_ratio is host memory for KV over device KV, 2-4 as issue 34 asks (such as "
            f"{HOST_RATIO:g}), got {host_ratio!r}"
        )
    fitted, target = fitted_profile(profile), tiny_target()
    kv_bytes = kv_blocks * BLOCK_SIZE * target.shape.kv_bytes_per_token
    # The device's memory is its weights and the KV budget: the panel's card.
    device = dataclasses.replace(fitted, memory_bytes=target.weights_bytes + kv_bytes)
    scenario = Scenario(
        profile=device,
        target=target,
        overhead_bytes=0,
        host_bytes=int(host_ratio * kv_bytes),
        block_size=BLOCK_SIZE,
    )
    assert scenario.kv_blocks == kv_blocks, (scenario.kv_blocks, kv_blocks)
    return Panel(name="cpu-here", scenario=scenario)


@dataclass(slots=True)
class CpuPanelRuns:
    """The real engine's runs and the twin's, of the same workloads."""

    real: PanelRuns
    twin: PanelRuns


def run_cpu_panel(
    panel: Panel,
    workloads: Sequence[openloop.OpenLoopWorkload],
    policies: Sequence[str],
    *,
    knobs: Mapping[str, Mapping[str, Any]] | None = None,
    deadline_s: float | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> CpuPanelRuns:
    """Every policy on every workload on the twin of ``panel`` (``run_panel``), then on
    the real engine (``real.run_real``); the real runs' goodput SLOs are the twin's
    unloaded times (a team run alone on the real engine would cost as much again)."""
    twin = run_panel(panel, workloads, policies, knobs=knobs, progress=progress)
    setups = [WorkloadSetup.of(w, block_size=panel.scenario.block_size) for w in workloads]
    real = run_real(
        panel,
        setups,
        policies,
        knobs=knobs,
        deadline_s=DEADLINE_S if deadline_s is None else deadline_s,
        progress=progress,
    )
    real.unloaded_s = dict(twin.unloaded_s)
    return CpuPanelRuns(real=real, twin=twin)


def cpu_figures(
    runs: CpuPanelRuns,
    rates: Sequence[float],
    seeds: Sequence[int],
    policies: Sequence[str],
    window_s: float | Mapping[float, float],
    *,
    what: str = "",
) -> Iterator[Measurement]:
    """The CPU panel's figures (see the module docstring); the headline ratios at the
    highest rate of ``rates``."""
    real = PanelFigures(
        runs.real, rates, seeds, policies, window_s, "cpu", what=what, label=_MEASURED
    )
    for m in real.measurements():
        if m.metric.startswith("goodput"):
            m = dataclasses.replace(m, note=f"{m.note}; each job's unloaded time is the twin's")
        yield m
    yield from _headline(real, max(rates), what)
    twin = PanelFigures(runs.twin, rates, seeds, policies, window_s, "cpu_twin", what=what)
    yield from twin.measurements()
    agreement = Agreement.of(runs.real, runs.twin, policies)
    yield from agreement.measurements(note=f"{runs.real.panel.title}; {what}")
    lower = Direction.LOWER_IS_BETTER
    for side, ran in (("real", runs.real), ("twin", runs.twin)):
        yield Measurement(
            _BENCH,
            f"cpu_{side}_wall_s",
            ran.wall_s,
            "s",
            None,
            lower,
            note=f"host seconds the {side} runs took, every policy, constrained and not",
        )


def _headline(figures: PanelFigures, rate: float, what: str) -> Iterator[Measurement]:
    """kvgov against the best tuned baseline by mean job time, recomputed tokens against
    paged's, and the jobs each policy failed, on the real engine."""
    lower = Direction.LOWER_IS_BETTER
    policies = figures.policies
    at = f"at {rate:g} teams/min"
    if "kvgov" in policies and len(policies) > 1:
        best = figures.best_baseline(rate, "jct_mean", lower_is_better=True)
        ratio = stats.paired_ratio(
            figures.per_seed("kvgov", rate, "jct_mean"), figures.per_seed(best, rate, "jct_mean")
        )
        yield Measurement(
            _BENCH,
            "jct_mean_kvgov_over_best_cpu",
            ratio.value,
            "ratio",
            1.05,
            lower,
            note=f"{_MEASURED}; kvgov's mean job time over {best}'s (the best tuned baseline "
            f"by its median), seed by seed, {at}: {ratio}; parity within 0.95-1.05, kvgov "
            f"ahead below; {what}",
        )
        for bound, value in (("lower95", ratio.low), ("upper95", ratio.high)):
            yield Measurement(
                _BENCH,
                f"jct_mean_kvgov_over_best_cpu_{bound}",
                value,
                "ratio",
                None,
                lower,
                note=f"the paired 95% interval's {bound[:5]} bound: {ratio}",
            )
    if {"kvgov", "paged"} <= set(policies):
        yield _recomputed(figures, rate, at)
    for policy in policies:
        failed = sum(
            len(result.failed)
            for cell, result in figures.runs.results.items()
            if cell.policy == policy
        )
        yield Measurement(
            _BENCH,
            f"jobs_failed[{policy}]_cpu",
            float(failed),
            "jobs",
            0.0,
            lower,
            note=f"{_MEASURED}; every rate and seed, constrained and unconstrained runs",
        )


def _recomputed(figures: PanelFigures, rate: float, at: str) -> Measurement:
    kvgov = figures.per_seed("kvgov", rate, "recomputed")
    paged = figures.per_seed("paged", rate, "recomputed")
    name, lower = "recomputed_tokens_kvgov_over_paged_cpu", Direction.LOWER_IS_BETTER
    counts = ", ".join(f"seed {s}: {kvgov[s]:,.0f} / {paged[s]:,.0f}" for s in sorted(paged))
    none = [s for s, v in paged.items() if v <= 0]
    if none:
        return Measurement(
            _BENCH,
            name,
            math.nan,
            "ratio",
            0.25,
            lower,
            note=f"{_MEASURED}; no ratio: paged recomputed nothing on seeds {none} {at} "
            f"(kvgov / paged: {counts})",
        )
    share = stats.paired_ratio(kvgov, paged)
    return Measurement(
        _BENCH,
        name,
        share.value,
        "ratio",
        0.25,
        lower,
        note=f"{_MEASURED}; the engine's recomputed prefill tokens, kvgov over paged, seed by "
        f"seed, {at}: {share} (kvgov / paged: {counts})",
    )


def measure(
    seeds: Sequence[int] | None = None,
    *,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    profile: Path | None = None,
    fit_now: bool = False,
) -> Iterator[Measurement]:
    """The CPU panel on ``seeds`` (None: ``QUICK_SEEDS`` with ``quick``, else ``SEEDS``):
    ``QUICK`` (three minutes of real runs on a busy 2-core host) or ``SHORT``; the
    twin on the ``cpu-here`` profile read from ``profile`` (None: where ``kvgov twin fit``
    writes it), or fitted now with ``fit_now`` (``kvgov twin fit``, written to that path:
    a profile fitted minutes before the real runs predicts them best). The real runs are
    timed on the wall clock: run nothing else beside them."""
    from kvgov.twin import default_profile_path

    progress = progress or _progress
    seeds = (QUICK_SEEDS if quick else SEEDS) if seeds is None else tuple(seeds)
    if TUNING_SEED in seeds:
        raise CpuPanelError(
            f"seed {TUNING_SEED} is the tuning seed: no reported figure comes from it; "
            f"evaluate on other seeds, such as {', '.join(map(str, SEEDS))}"
        )
    if len(set(seeds)) < 2:
        raise CpuPanelError(
            f"seeds {list(seeds)}: a paired interval needs at least two evaluation seeds, "
            f"such as {', '.join(map(str, QUICK_SEEDS))}"
        )
    how = "read from"
    if fit_now:
        from kvgov.twin import FitOptions, fit_twin

        progress("fitting cpu-here here (kvgov twin fit) ...")
        fit = fit_twin(FitOptions(quick=quick, out=profile))
        profile, how = fit.out, f"fitted now ({fit.report.median_error:.3f} median error), at"
    base = QUICK if quick else SHORT
    panel = cpu_here(profile=profile, kv_blocks=kv_blocks_for(base))
    workloads = [dataclasses.replace(base, seed=seed) for seed in seeds]
    runs = run_cpu_panel(panel, workloads, POLICIES, knobs=TUNED, progress=progress)
    progress(f"real runs {runs.real.wall_s:.0f} s, twin runs {runs.twin.wall_s:.0f} s")
    where = profile if profile is not None else default_profile_path("cpu-here")
    what = (
        f"{openloop.describe(workloads[0]).replace(f', seed {seeds[0]}', '')}; cpu-here "
        f"profile {how} {where}; each policy with its knobs tuned on seed {TUNING_SEED} "
        "on the reference card's twin (openloop/tuned.py)"
    )
    rate = base.rate_per_min
    yield from cpu_figures(runs, (rate,), seeds, POLICIES, base.duration_s, what=what)


def _progress(line: str) -> None:
    print(f"[openloop cpu] {line}", file=sys.stderr, flush=True)
