"""The swarm benchmark's runs on the hardware twin: the same engine, runners, policies and
governor as the real runs, on a modelled device and in virtual time.

``run_twin_policy`` takes an engine built as the real benchmark builds it, attaches a twin
for the run (``engine.twin.attach_twin``) and takes it off after, so a real run may follow
on the same engine. The three research baselines run through ``SwarmRunner`` on the twin's
clock (each step moves it by the step's modelled time; a wait for the next tool moves it
to the tool's return); kvgov runs ``kvgov_program`` on a virtual-time event loop over a
``TwinEngineLoop``, the governor on that loop's clock. The research policies price their
choices with ``Costs`` measured on the twin, in its time, as the real runs measure theirs
on the real engine. Every figure is the same ``RunResult`` the real runs give, in virtual
seconds; with ``forward=True`` every token is the model's, as in the real run. With
``noise`` each step's modelled time is scattered as a real device's (``StepNoise``, drawn
anew from its seed in each run), and with ``tool_lateness_s`` each of kvgov's tool waits
returns late by one of those seconds (drawn with the same seed), as a real runtime's
busy event loop returns them; both for runs compared with real rounds as a distribution.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from backends import LocalBackend
from engine import Engine
from engine.twin import (
    DeviceProfile,
    Direction,
    HostLink,
    ModelShape,
    StepNoise,
    VirtualClock,
)
from engine.twin.event_loop import ThreadClock, VirtualTimeLoop, run_virtual
from engine.twin.twin_engine import TwinEngine, attach_twin
from engine.twin.twin_loop import TwinEngineLoop
from governor import GovernorConfig
from kvgov.benchmarks.baselines import Costs, make_baseline, measure_costs
from kvgov.benchmarks.swarm.breakdown import job_times
from kvgov.benchmarks.swarm.kvgov import KVGOV_CONFIG, kvgov_program
from kvgov.benchmarks.swarm.result import EngineCounters, EngineTap, RunResult
from kvgov.benchmarks.swarm.runner import SwarmRunner
from kvgov.benchmarks.swarm.workload import AgentScript, SwarmWorkload

__all__ = ["TwinDevice", "TwinRun", "measure_twin_costs", "run_twin_policy"]


@dataclass(frozen=True, slots=True)
class TwinDevice:
    """What the twin models: the device, and the model it runs there."""

    profile: DeviceProfile
    model_shape: ModelShape
    forward: bool = True  # run the engine's model for every token (False: bookkeeping only)


@dataclass(slots=True)
class TwinRun:
    """One policy's run on the twin: the benchmark's figures, and the twin's own."""

    result: RunResult
    num_steps: int
    compute_s: float  # modelled compute of every step
    stall_s: float  # what steps waited for KV copies beyond their compute
    link_bytes: int  # host-link traffic, both ways
    peak_running: int  # sequences in one step, at most


_NO_EVENT_S = 0.02  # how far an idle runner looks ahead with no event in sight


class _TwinClock:
    """``SwarmRunner``'s clock on a twin: engine steps move it; a wait jumps to the next
    event (nothing can happen before it: the runner's own events and the policy's are
    all it waits for); the engine's decode-only steps before the next event are taken
    in one call."""

    def __init__(self, twin: TwinEngine) -> None:
        self._twin = twin
        self._clock = twin.clock

    def now(self) -> float:
        return self._clock.now()

    def wait(self, seconds: float) -> None:
        # No event ahead, or a policy that looks at every step: look again a little later.
        self._clock.advance(seconds if 0 < seconds < math.inf else _NO_EVENT_S)

    def next_event(self, at: float) -> None:
        self._twin.fold_until = at

    def steps_ended(self) -> Sequence[float]:
        return self._twin.steps_ended


def _attach(
    engine: Engine, device: TwinDevice, *, advance: bool, noise: StepNoise | None = None
) -> TwinEngine:
    return attach_twin(
        engine,
        profile=device.profile,
        model_shape=device.model_shape,
        clock=VirtualClock(),
        link=HostLink(profile=device.profile),
        advance=advance,
        forward=device.forward,
        noise=noise,
    )


def measure_twin_costs(engine: Engine, device: TwinDevice) -> Costs:
    """``measure_costs`` on the twin: a prefill's and a swap's modelled seconds."""
    twin = _attach(engine, device, advance=True)

    def wait_for_copies(_: Engine) -> None:
        twin.clock.advance_to(twin.link.free_at)

    try:
        return measure_costs(engine, now=twin.clock.now, wait_for_copies=wait_for_copies)
    finally:
        twin.detach()


def run_twin_policy(
    engine: Engine,
    device: TwinDevice,
    policy: str,
    fraction: float,
    scripts: Sequence[AgentScript],
    prompts: dict[tuple[str, int], list[int]],
    workload: SwarmWorkload,
    costs: Costs | None,
    *,
    deadline_s: float,
    noise: StepNoise | None = None,
    tool_lateness_s: Sequence[float] = (),
    knobs: Mapping[str, Any] | None = None,
) -> TwinRun:
    """``policy`` on ``engine``'s twin, from a cold prefix cache; ``deadline_s`` is virtual.
    ``costs`` prices the research policies' choices (paged and kvgov take none); ``noise``
    scatters the steps' times and ``tool_lateness_s`` kvgov's tool returns, drawn from
    the noise's seed (the same seed, the same run). ``knobs`` set the policy's tunable
    settings: a baseline's keyword arguments (``make_baseline``), kvgov's
    ``GovernorConfig`` fields over ``KVGOV_CONFIG``."""
    knobs = dict(knobs or {})
    cold = engine.reset_prefix_cache()
    assert cold, "a run starts from a cold prefix cache, with nothing held or pinned"
    capacity = engine.capacity()
    result = RunResult(
        policy, fraction, capacity.num_blocks, capacity.bytes_per_block, capacity.num_host_blocks
    )
    before = EngineCounters.of(engine.metrics())
    fresh = None if noise is None else noise.fresh(noise.seed)
    twin = _attach(engine, device, advance=policy != "kvgov", noise=fresh)
    try:
        if policy == "kvgov":
            names: dict[str, str] = {}
            tap = EngineTap(engine, result, lambda budget: names.get(budget, budget))
            try:
                late = _draws(tool_lateness_s, 0 if noise is None else noise.seed)
                run_virtual(
                    _kvgov(
                        twin,
                        scripts,
                        workload,
                        result,
                        names,
                        deadline_s,
                        late,
                        replace(KVGOV_CONFIG, **knobs),
                    ),
                    clock=twin.clock,
                )
            finally:
                tap.close()
        else:
            runner = SwarmRunner(
                engine,
                scripts,
                prompts,
                make_baseline(
                    policy, costs, copies_overlap=device.profile.copies_overlap_compute, **knobs
                ),
                reply_tokens=workload.reply_tokens,
                clock=_TwinClock(twin),
            )
            tap = EngineTap(engine, result, lambda budget: budget.removeprefix("agent-"))
            try:
                runner.drive(result, deadline_s=deadline_s)
            finally:
                tap.close()
    finally:
        twin.detach()
    result.counters = EngineCounters.of(engine.metrics()) - before
    result.breakdown = job_times(
        scripts, result.jct_s, result.calls, twin.times, twin.ledger.splits
    )
    link_bytes = sum(twin.link.totals(d).num_bytes for d in Direction)
    return TwinRun(
        result, twin.num_steps, twin.compute_s, twin.stall_s, link_bytes, twin.peak_sequences
    )


async def _kvgov(
    twin: TwinEngine,
    scripts: Sequence[AgentScript],
    workload: SwarmWorkload,
    result: RunResult,
    names: dict[str, str],
    deadline_s: float,
    tool_delay: Callable[[], float],
    config: GovernorConfig,
) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    backend = LocalBackend(TwinEngineLoop(twin))
    try:
        await kvgov_program(
            backend,
            scripts,
            workload,
            result,
            names=names,
            deadline_s=deadline_s,
            clock=ThreadClock(loop),  # deadlines on a thread, as under SystemClock
            tool_delay=tool_delay,
            config=config,
        )
    finally:
        backend.close()


def _draws(samples: Sequence[float], seed: int) -> Callable[[], float]:
    """Draws from ``samples`` (none below zero: a loop may wake a hair early), seeded."""
    if not samples:
        return lambda: 0.0
    rng, pool = random.Random(seed), [max(0.0, s) for s in samples]
    return lambda: rng.choice(pool)
