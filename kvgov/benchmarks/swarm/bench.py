"""``kvgov bench swarm``: kvgov against the memory policies a user would pick instead.

One workload (the ``workload`` module: teams of coding agents whose contexts grow turn by
turn, tool latencies heavy-tailed, every prompt fixed up front), one engine (the bundled
one, ``tiny-random`` on the CPU unless ``--model``/``--device`` say otherwise, recompute
on preemption, prefix caching, a host swap space that holds every agent's peak context)
and one KV budget at a time: the blocks every agent's peak context needs at
once, times 1.0, 0.5, 0.33 and 0.25. At each budget one engine is built and the five
policies run on it in turn, each from a cold prefix cache (checked):

1. ``paged``: vLLM's policy; 2. ``paged+offload``: vLLM with CPU KV offloading;
   3. ``ttl-pin``: Continuum; 4. ``intercept``: InferCept (``baselines``, through
   ``runner``, without the governor);
5. ``kvgov``: ``Governor`` over ``LocalBackend`` as a user configures it (the ``kvgov`` module).

Per policy and budget: mean and p95 job completion time (an agent's job: a planner's
from its arrival, a worker's from its planner's fan-out, to its last call's end),
makespan, prefill tokens recomputed and preemptions (the engine's own counters), bytes
swapped each way, peak blocks in use and jobs failed. Headline figures at 0.33:
``jct_mean_paged_over_kvgov`` (>= 2), ``jct_mean_best_research_over_kvgov`` (>= 1.1,
the better of ttl-pin and intercept) and ``recomputed_tokens_kvgov_over_paged``
(<= 0.25); and, without targets, paged's, the better research policy's and kvgov's mean
job at 0.33 over the paged engine's at 1.0 (``*_over_unconstrained``: what a memory
policy could still win back). ``--plot DIR`` draws the figures (``plot``). Times are the wall
clock of a shared machine: the policies run side by side in one process, the ratios are
what to compare.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import statistics
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from engine import Engine, EngineConfig, PreemptionMode
from engine.benchmarks import Direction, Measurement
from engine.presets import PRESETS
from engine.tokenizer import load_tokenizer
from governor import TokenCounter
from kvgov.benchmarks.baselines import BASELINES, Costs, make_baseline, measure_costs
from kvgov.benchmarks.swarm.kvgov import KVGOV_CONFIG, run_kvgov
from kvgov.benchmarks.swarm.result import EngineCounters, EngineTap, RunResult
from kvgov.benchmarks.swarm.runner import SwarmRunner
from kvgov.benchmarks.swarm.workload import AgentScript, SwarmWorkload, build_scripts, peak_blocks

__all__ = [
    "DEADLINE_S",
    "DEFAULT",
    "FRACTIONS",
    "POLICIES",
    "QUICK",
    "Setup",
    "compare",
    "measurements",
    "on_own_thread",
    "run",
    "run_policy",
    "what_ran",
]

T = TypeVar("T")
_BENCH = "swarm"
FRACTIONS = (1.0, 0.5, 0.33, 0.25)
HEADLINE = 0.33
POLICIES = (*BASELINES, "kvgov")
DEFAULT = SwarmWorkload()
QUICK = SwarmWorkload(num_teams=2, workers_per_team=2, turns=3, system_repeats=2, tool_scale=0.5)
_MODEL = "tiny-random"
DEADLINE_S = {True: 240.0, False: 900.0}
_ROUNDS = {True: 1, False: 3}


def run(
    *, quick: bool = False, plot: Path | None = None, device: str = "cpu", model: str = _MODEL
) -> Iterator[Measurement]:
    workload = QUICK if quick else DEFAULT
    results = compare(
        workload,
        rounds=_ROUNDS[quick],
        deadline_s=DEADLINE_S[quick],
        progress=_progress,
        model=model,
        device=device,
    )
    what = what_ran(workload, model=model, device=device)
    if plot is not None:
        from kvgov.benchmarks.swarm.plot import plot as draw

        for path in draw(results, plot, fraction=HEADLINE, note=what):
            _progress(f"wrote {path}")
    yield from measurements(results, workload, what=what)


def _progress(line: str) -> None:
    print(f"[swarm] {line}", file=sys.stderr, flush=True)


def compare(
    workload: SwarmWorkload,
    *,
    fractions: Sequence[float] = FRACTIONS,
    policies: Sequence[str] = POLICIES,
    rounds: int = 1,
    deadline_s: float = 900.0,
    progress: Callable[[str], None] = lambda line: None,
    model: str = _MODEL,
    device: str = "cpu",
) -> list[RunResult]:
    """Every policy at every budget, side by side; one engine per budget. Each round runs
    every policy once, each round in another order (a rotation), so no policy always
    runs first on a fresh engine or last on a warm host. ``model`` is a preset or a local
    model folder, ``device`` where the engine runs. The host swap space holds every
    agent's peak context at once (in the model's blocks, whatever its size), so no
    policy that swaps or offloads ever finds it full."""
    setup = Setup.of(workload, model)
    results: list[RunResult] = []
    costs: Costs | None = None
    for fraction in fractions:
        engine = setup.engine(fraction, device=device)
        num_blocks = engine.capacity().num_blocks
        warm = on_own_thread(functools.partial(measure_costs, engine))  # and warms it up
        costs = costs or warm
        for round_ in range(rounds):
            order = [*policies[round_ % len(policies) :], *policies[: round_ % len(policies)]]
            for policy in order:
                progress(
                    f"budget {fraction:g} ({num_blocks} blocks), round {round_ + 1}: {policy} ..."
                )
                result = run_policy(
                    engine,
                    policy,
                    fraction,
                    setup.scripts,
                    setup.prompts,
                    workload,
                    costs,
                    deadline_s,
                )
                result.round = round_
                progress(
                    f"  {policy}: mean JCT {result.jct_mean_s:.1f} s, makespan "
                    f"{result.makespan_s:.1f} s, recomputed "
                    f"{result.counters.recomputed_tokens:,} tokens, "
                    f"{len(result.failed)} failed"
                )
                results.append(result)
        del engine  # before the next budget's is built: an 8B model's weights are 15 GB
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return results


@dataclass(frozen=True, slots=True)
class Setup:
    """What every run of one workload shares: its scripts, every prompt's token ids, and
    the blocks its agents' peak contexts take (all at once, and the largest one's)."""

    workload: SwarmWorkload
    model: str
    scripts: tuple[AgentScript, ...]
    prompts: dict[tuple[str, int], list[int]]
    full_blocks: int
    largest_blocks: int

    @classmethod
    def of(cls, workload: SwarmWorkload, model: str = _MODEL) -> Setup:
        tokenizer = load_tokenizer(PRESETS[model].tokenizer if model in PRESETS else model)
        counter = TokenCounter(tokenizer=tokenizer)
        scripts = build_scripts(workload, counter)
        prompts = {
            (s.name, i): tokenizer.encode_chat(list(t.messages))
            for s in scripts
            for i, t in enumerate(s.turns)
        }
        block_size = EngineConfig().block_size
        full = peak_blocks(
            scripts, counter, reply_tokens=workload.reply_tokens, block_size=block_size
        )
        largest = max(
            peak_blocks([s], counter, reply_tokens=workload.reply_tokens, block_size=block_size)
            for s in scripts
        )
        return cls(workload, model, scripts, prompts, full, largest)

    def engine(
        self, fraction: float, *, device: str = "cpu", adapt_cpu_threads: bool = True
    ) -> Engine:
        """The engine a run at ``fraction`` of every peak at once gets (at least twice the
        largest peak): recompute on preemption, a host swap space for every peak.
        ``adapt_cpu_threads=False`` keeps the caller's thread count (``EngineConfig``)."""
        num_blocks = max(math.ceil(self.full_blocks * fraction), 2 * self.largest_blocks)
        return Engine(
            EngineConfig(
                model=self.model,
                device=device,
                num_blocks=num_blocks,
                preemption_mode=PreemptionMode.RECOMPUTE,
                swap_space_blocks=self.full_blocks,
                adapt_cpu_threads=adapt_cpu_threads,
            )
        )


def run_policy(
    engine: Engine,
    policy: str,
    fraction: float,
    scripts: Sequence[AgentScript],
    prompts: dict[tuple[str, int], list[int]],
    workload: SwarmWorkload,
    costs: Costs,
    deadline_s: float,
    *,
    knobs: Mapping[str, Any] | None = None,
) -> RunResult:
    """``policy`` on ``engine`` in real time from a cold prefix cache: the baselines
    through ``SwarmRunner`` on an engine thread of its own, kvgov through the governor
    over the engine's loop; ``knobs`` replace the policy's settings (a baseline's
    ``KNOBS``, or ``KVGOV_CONFIG``'s fields), as the open-loop CPU panel tunes them."""
    knobs = knobs or {}
    cold = engine.reset_prefix_cache()
    assert cold, "a run starts from a cold prefix cache, with nothing held or pinned"
    capacity = engine.capacity()
    result = RunResult(
        policy, fraction, capacity.num_blocks, capacity.bytes_per_block, capacity.num_host_blocks
    )
    before = EngineCounters.of(engine.metrics())
    if policy == "kvgov":
        config = dataclasses.replace(KVGOV_CONFIG, **knobs)
        run_kvgov(engine, scripts, workload, result, deadline_s=deadline_s, config=config)
    else:
        runner = SwarmRunner(
            engine,
            scripts,
            prompts,
            make_baseline(policy, costs, **knobs),
            reply_tokens=workload.reply_tokens,
        )
        tap = EngineTap(engine, result, lambda budget: budget.removeprefix("agent-"))
        try:
            on_own_thread(lambda: runner.drive(result, deadline_s=deadline_s))
        finally:
            tap.close()
    result.counters = EngineCounters.of(engine.metrics()) - before
    return result


def on_own_thread(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread of its own, as kvgov's engine loop steps the engine: torch runs
    an engine driven from the main thread several times slower on a loaded 2-core host
    (its OpenMP team there spins against the other processes), which would charge the
    baselines for where they were called from."""
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # handed to the caller, who re-raises it
            errors.append(exc)

    thread = threading.Thread(target=target, name="swarm-engine")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return box[0]


def what_ran(workload: SwarmWorkload, *, model: str = _MODEL, device: str = "cpu") -> str:
    return (
        f"{model} on {device}, {workload.num_teams} teams x (planner + "
        f"{workload.workers_per_team} workers), {workload.turns} tool turns each, "
        f"{workload.reply_tokens} output tokens a call, tool outputs reduced to "
        f"{workload.tool_output_tokens:,} tokens, ceiling {workload.ceiling_tokens:,}; "
        "recompute on preemption, prefix caching, host swap space for every peak context, "
        "cold cache at each run's start"
    )


def measurements(
    results: Sequence[RunResult], workload: SwarmWorkload, *, what: str | None = None
) -> Iterator[Measurement]:
    """Per policy and budget, each figure's median over the rounds (failures summed, the
    peak the highest); the headline ratios are the medians of each round's ratio. ``what``
    names what ran (``what_ran``: the model, the device, the workload)."""
    what = what or what_ran(workload)
    lower = Direction.LOWER_IS_BETTER
    runs: dict[tuple[str, float], list[RunResult]] = {}
    for r in results:
        runs.setdefault((r.policy, r.fraction), []).append(r)
    for (policy, fraction), group in runs.items():
        key = f"{policy}@{fraction:g}"
        rounds = f"median of {len(group)} rounds" if len(group) > 1 else ""
        figures = [
            ("jct_mean", _median(r.jct_mean_s for r in group), "s", rounds),
            ("jct_p95", _median(r.jct_p95_s for r in group), "s", rounds),
            ("makespan", _median(r.makespan_s for r in group), "s", rounds),
            (
                "recomputed_tokens",
                _median(r.counters.recomputed_tokens for r in group),
                "tokens",
                "the engine's prefill counter; " + rounds,
            ),
            (
                "prefill_tokens",
                _median(r.counters.prefill_tokens for r in group),
                "tokens",
                "every prompt token the engine computed, the recomputed ones included; " + rounds,
            ),
            (
                "recomputed_share",
                _median(r.recomputed_share for r in group),
                "%",
                "of the prefill tokens, recomputed (a share of tokens, not of time); " + rounds,
            ),
            ("preemptions", _median(r.counters.preemptions for r in group), "count", rounds),
            (
                "swapped_out",
                _median(r.bytes_swapped_out for r in group) / 2**20,
                "MiB",
                f"host swap space {group[0].host_blocks:,} blocks; " + rounds,
            ),
            ("swapped_in", _median(r.bytes_swapped_in for r in group) / 2**20, "MiB", rounds),
            (
                "peak_blocks",
                float(max(r.peak_blocks for r in group)),
                "blocks",
                f"of {group[0].num_blocks} blocks",
            ),
            (
                "jobs_failed",
                float(sum(len(r.failed) for r in group)),
                "jobs",
                "; ".join(f for r in group for f in r.failed[:4]),
            ),
        ]
        for name, value, unit, note in figures:
            target = 0.0 if name == "jobs_failed" and policy == "kvgov" else None
            yield Measurement(_BENCH, f"{name}[{key}]", value, unit, target, lower, note)
    by_round: dict[int, dict[str, RunResult]] = {}
    for r in results:
        if r.fraction == HEADLINE:
            by_round.setdefault(r.round, {})[r.policy] = r
    rounds_at = [at for at in by_round.values() if {"paged", "kvgov"} <= set(at)]
    if not rounds_at:
        return
    n = f"{len(rounds_at)} round{'s' if len(rounds_at) > 1 else ''}"
    jct = {p: _median(at[p].jct_mean_s for at in rounds_at if p in at) for p in POLICIES}
    ratios = [at["paged"].jct_mean_s / at["kvgov"].jct_mean_s for at in rounds_at]
    yield Measurement(
        _BENCH,
        "jct_mean_paged_over_kvgov",
        _median(ratios),
        "x",
        2.0,
        note=f"at {HEADLINE:g}, {n}{_each(ratios)}: {jct['paged']:.2f} s paged, "
        f"{jct['kvgov']:.2f} s kvgov (medians); {what}",
    )
    research = [p for p in ("ttl-pin", "intercept") if all(p in at for at in rounds_at)]
    if research:
        ratios = [
            min(at[p].jct_mean_s for p in research) / at["kvgov"].jct_mean_s for at in rounds_at
        ]
        yield Measurement(
            _BENCH,
            "jct_mean_best_research_over_kvgov",
            _median(ratios),
            "x",
            1.1,
            note=f"at {HEADLINE:g}, {n}{_each(ratios)}: the better of "
            + ", ".join(f"{p} {jct[p]:.2f} s" for p in research)
            + f" in each round, against kvgov {jct['kvgov']:.2f} s (medians)",
        )
    yield from _against_unconstrained(runs, jct, research)
    recomputed = [
        (at["kvgov"].counters.recomputed_tokens, at["paged"].counters.recomputed_tokens)
        for at in rounds_at
    ]
    yield Measurement(
        _BENCH,
        "recomputed_tokens_kvgov_over_paged",
        _median(g / p if p else float("nan") for g, p in recomputed),
        "x",
        0.25,
        lower,
        note=f"at {HEADLINE:g}, {n}: the engine's prefill counters, "
        + ", ".join(f"{g:,} kvgov / {p:,} paged" for g, p in recomputed),
    )


def _against_unconstrained(
    runs: dict[tuple[str, float], list[RunResult]], jct: dict[str, float], research: list[str]
) -> Iterator[Measurement]:
    """Mean jobs at the headline budget over the paged engine's at 1.0, where every
    agent's peak fits at once: how much of the time a memory policy could still win back.
    ``jct_mean_X_over_kvgov`` can pass X's figure here only if kvgov at the headline
    budget runs faster than that unconstrained engine."""
    unconstrained = runs.get(("paged", 1.0))
    if not unconstrained:
        return
    floor = _median(r.jct_mean_s for r in unconstrained)
    n = len(unconstrained)
    rounds = f"medians of {n} round{'s' if n > 1 else ''}, the two budgets minutes apart"
    named = [("paged", "paged")]
    if research:
        named.append(("best_research", min(research, key=jct.__getitem__)))
    for name, policy in [*named, ("kvgov", "kvgov")]:
        yield Measurement(
            _BENCH,
            f"jct_mean_{name}_over_unconstrained",
            jct[policy] / floor,
            "x",
            None,
            Direction.LOWER_IS_BETTER,
            note=f"{policy} at {HEADLINE:g} {jct[policy]:.2f} s "
            f"over paged at 1.0 {floor:.2f} s (room for every peak at once); {rounds}",
        )


def _each(ratios: Sequence[float]) -> str:
    """Each round's ratio, where there is more than one: the spread behind the median."""
    return f" (each: {', '.join(f'{r:.2f}' for r in ratios)})" if len(ratios) > 1 else ""


def _median(values: Iterable[float]) -> float:
    finite = [float(v) for v in values]
    return statistics.median(finite) if finite else float("nan")
