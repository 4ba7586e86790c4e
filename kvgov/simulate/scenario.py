"""Capacity planning on the hardware twin (``kvgov plan --simulate``, and the demo's
second act): a swarm of agents on a modelled card, run three ways, in virtual time.

The schemes are what a user runs today and what kvgov adds:

- ``reserve``: reserve-for-max, as a server with contiguous per-slot KV does (llama.cpp's
  ``-np``): as many requests run at once as the model's full context fits in the KV
  memory; the rest queue. Tool outputs go in raw and nothing compacts the history, so a
  context that outgrows the model's fails its agent;
- ``paged``: the paged engine alone (vLLM's policy: blocks on demand, first come first
  served, recompute on preemption), with the same raw context handling;
- ``kvgov``: the same engine under the governor, as ``kvgov bench swarm`` configures it:
  tool outputs reduced to ``tool_output_tokens``, the history compacted at each agent's
  ceiling, overcommitted admission, parking, offload and fan-out limits.

Each runs the real engine (the ``tiny-random`` model's engine without its forward pass:
decisions are the engine's and the governor's, tokens are a fixed one) on the twin of
``scenario.profile`` with the target model's step times, KV bytes and weights; the KV
memory is what the card holds after the weights and ``overhead_bytes``, the host swap
space ``host_bytes``. The workload is the swarm benchmark's (teams of a planner and
workers; tool outputs from its corpus, tool latencies lognormal), scaled by the
scenario: ``tool_scale`` times its latencies, ``turns`` tool calls a worker,
``reply_tokens`` a call. Or it is a recorded run's (``Scenario.trace``, read by
``kvgov.simulate.trace``): every scheme replays the trace's agents, calls, contexts, tool
times and fan-outs as recorded (``kvgov.simulate._replay``). Every figure is modelled.

Bad input raises ``ScenarioError`` (a card too small for the weights, a count that is
not one) before anything runs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from engine.benchmarks import Direction, Measurement
from engine.twin import DeviceProfile
from engine.twin.targets import TargetModel
from kvgov.benchmarks.swarm.result import percentile
from kvgov.benchmarks.swarm.workload import SwarmWorkload
from kvgov.simulate.errors import ScenarioError

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from engine import Engine
    from kvgov.benchmarks.swarm.twin import TwinRun
    from kvgov.simulate._prompts import PromptBook
    from kvgov.simulate._replay import AgentReplay, Replay
    from kvgov.simulate.trace import TraceWorkload

__all__ = [
    "SCHEMES",
    "TITLES",
    "Scenario",
    "ScenarioError",
    "SchemeRun",
    "Simulation",
    "simulate",
    "simulation_table",
    "stand_in_engine",
]

SCHEMES = ("reserve", "paged", "kvgov")
TITLES = {"reserve": "reserve-for-max", "paged": "paged engine alone", "kvgov": "kvgov"}
_STANDIN = "tiny-random"  # the engine whose decisions the twin times at the target's size
# What the twin's figures have been checked against (``kvgov twin check``, docs/twin.md).
VALIDATION = (
    "the twin against the real engine on a 2-core CPU (`kvgov twin check`, 2026-12-06, "
    "two full checks, real medians of 5 rounds against twin medians of 20): mean job time "
    "within 10% for all four policies (0.075 and 0.094 at worst), prefill tokens within 2%, "
    "offloads within one (docs/twin.md); the GPU profiles' efficiencies are assumed until a GPU "
    "run refits them"
)
_DEADLINE_S = 6 * 3600.0  # virtual: a run past it is a livelock, not a slow swarm


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    profile: DeviceProfile
    target: TargetModel
    num_agents: int = 8
    ceiling_tokens: int = 16_000  # kvgov's per-agent ceiling, where it compacts
    tool_output_tokens: int = 2_048  # kvgov's reducer: each tool output at most this
    turns: int = 8  # tool calls a worker makes
    reply_tokens: int = 256  # tokens each model call generates
    tool_scale: float = 20.0  # x the swarm benchmark's tool latencies (median 3-10 s)
    overhead_bytes: int = 500_000_000  # activations, runtime, fragmentation
    host_bytes: int = 16 * 2**30  # host memory for offloaded KV
    block_size: int = 16
    seed: int = 1  # the workload's; the swarm benchmark tunes kvgov on seed 0
    # A recorded run to replay instead of the swarm (the swarm's own settings unused).
    trace: TraceWorkload | None = None

    def __post_init__(self) -> None:
        for name in (
            "num_agents",
            "ceiling_tokens",
            "tool_output_tokens",
            "turns",
            "reply_tokens",
            "block_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ScenarioError(f"{name} must be an int >= 1, got {value!r}")
        if not (math.isfinite(self.tool_scale) and self.tool_scale > 0):
            raise ScenarioError(f"tool_scale must be > 0, got {self.tool_scale!r}")
        if self.num_agents < 2 and self.trace is None:
            raise ScenarioError("a swarm is a planner and at least one worker: --agents 2 or more")
        if self.kv_bytes <= 0:
            raise ScenarioError(
                f"{self.target.label}'s weights ({self.target.weights_bytes / 1e9:.1f} GB) and "
                f"{self.overhead_bytes / 1e9:.1f} GB of overhead leave no KV memory on "
                f"{self.profile.name} ({self.profile.memory_bytes / 1e9:.1f} GB): pick a "
                "larger card or --quantize int4"
            )
        if self.ceiling_tokens > self.target.context_tokens and self.trace is None:
            raise ScenarioError(
                f"the ceiling {self.ceiling_tokens:,} is past {self.target.label}'s context "
                f"of {self.target.context_tokens:,} tokens: set --ceiling at most that"
            )

    @property
    def num_workload_agents(self) -> int:
        """The agents the workload runs: the trace's, or ``num_agents`` of the swarm."""
        return self.num_agents if self.trace is None else self.trace.num_agents

    @property
    def kv_bytes(self) -> int:
        return self.profile.memory_bytes - self.target.weights_bytes - self.overhead_bytes

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.target.shape.kv_bytes_per_token

    @property
    def kv_blocks(self) -> int:
        return self.kv_bytes // self.block_bytes

    @property
    def host_blocks(self) -> int:
        return self.host_bytes // self.block_bytes

    @property
    def teams(self) -> tuple[int, int]:
        """(teams, workers each): teams of four where the agents split so, else of three,
        of two, or one team of all."""
        for size in (4, 3, 2):
            if self.num_agents % size == 0 and self.num_agents > size:
                return self.num_agents // size, size - 1
        return 1, self.num_agents - 1

    def workload(self, *, governed: bool) -> SwarmWorkload:
        teams, workers = self.teams
        return SwarmWorkload(
            num_teams=teams,
            workers_per_team=workers,
            turns=self.turns,
            reply_tokens=self.reply_tokens,
            tool_output_tokens=self.tool_output_tokens if governed else None,
            ceiling_tokens=self.ceiling_tokens if governed else None,
            tool_scale=self.tool_scale,
            team_gap_s=5.0 * self.tool_scale / 20.0,
            seed=self.seed,
        )

    def describe(self) -> str:
        teams, workers = self.teams
        workload = (
            f"{self.num_agents} agents ({teams} team{'s' if teams > 1 else ''} of a planner "
            f"and {workers} workers, {self.turns} tool calls a worker, {self.reply_tokens} "
            f"tokens a reply)"
            if self.trace is None
            else self.trace.describe()
        )
        seed = f"; seed {self.seed}" if self.trace is None else ""
        return (
            f"{workload}; {self.target.label} on {self.profile.name}: "
            f"{self.kv_bytes / 1e9:.1f} GB of KV ({self.kv_blocks:,} blocks) after "
            f"{self.target.weights_bytes / 1e9:.1f} GB of weights, "
            f"{self.host_bytes / 2**30:.0f} GiB of host memory for offloads{seed}"
        )


@dataclass(slots=True)
class SchemeRun:
    scheme: str
    jct_s: list[float]
    failed: list[str]
    makespan_s: float
    peak_blocks: int
    peak_running: int  # requests in one step, at most
    link_bytes: int
    blocks_copied: int  # blocks the engine moved to host memory and back
    compute_s: float
    stall_s: float
    preemptions: int
    num_slots: int | None  # reserve-for-max: requests that fit at once
    wall_s: float  # host seconds the run took
    # A replayed trace's agents: what each did (its calls' tokens as the engine counted
    # them, its tools' times, when it started); empty for the swarm workload.
    agents: dict[str, AgentReplay] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        scheme: str,
        run: TwinRun | Replay,
        *,
        num_slots: int | None,
        wall_s: float,
        agents: dict[str, AgentReplay] | None = None,
    ) -> SchemeRun:
        """The figures of one twin run, the swarm's or a replayed trace's."""
        result, counters = run.result, run.result.counters
        return cls(
            scheme=scheme,
            jct_s=list(result.jct_s.values()),
            failed=list(result.failed),
            makespan_s=result.makespan_s,
            peak_blocks=result.peak_blocks,
            peak_running=run.peak_running,
            link_bytes=run.link_bytes,
            blocks_copied=counters.blocks_swapped_out + counters.blocks_swapped_in,
            compute_s=run.compute_s,
            stall_s=run.stall_s,
            preemptions=counters.preemptions,
            num_slots=num_slots,
            wall_s=wall_s,
            agents=dict(agents or {}),
        )

    @property
    def limit(self) -> str:
        """Where the scheme first gives: context, budget, link, compute, or none."""
        contexts = sum("CeilingExceeded" in why or "length" in why for why in self.failed)
        if contexts:
            return f"context: {contexts} agents outgrew the model's context"
        if self.failed:
            return f"budget: {len(self.failed)} agents failed"
        if self.num_slots is not None and self.peak_running >= self.num_slots:
            return f"budget: {self.num_slots} contexts fit at once, the rest queued"
        if self.preemptions:
            return f"budget: {self.preemptions} preemptions"
        if self.makespan_s and self.stall_s / self.makespan_s >= 0.05:
            return f"link: steps waited {self.stall_s:.1f} s for copies"
        if self.makespan_s and self.compute_s / self.makespan_s >= 0.9:
            return "compute: the device was busy 90% of the run"
        return "none: headroom left"


@dataclass(slots=True)
class Simulation:
    scenario: Scenario
    runs: list[SchemeRun] = field(default_factory=list)
    wall_s: float = 0.0
    num_rounded_calls: int = 0  # a trace's calls sent longer than recorded (see describe)

    def describe(self) -> str:
        rounded = (
            f"; {self.num_rounded_calls} calls shorter than the stand-in's chat template "
            "allows were sent at its least"
            if self.num_rounded_calls
            else ""
        )
        return self.scenario.describe() + rounded

    def measurements(self) -> Iterator[Measurement]:
        lower = Direction.LOWER_IS_BETTER
        note = f"modelled: {self.describe()}"
        for run in self.runs:
            title = TITLES[run.scheme]
            done = sorted(run.jct_s)
            p50 = statistics.median(done) if done else math.nan
            p99 = percentile(done, 99)
            figures = [
                (
                    "agents_failed",
                    float(len(run.failed)),
                    "agents",
                    f"{title}: " + ("; ".join(run.failed[:3]) or "every agent finished"),
                ),
                ("jct_p50", p50, "s", f"{title}: over the {len(done)} agents that finished"),
                ("jct_p99", p99, "s", f"{title}: nearest rank"),
                (
                    "peak_running",
                    float(run.peak_running),
                    "requests",
                    f"{title}: requests in one step, at most"
                    + (f" ({run.num_slots} slots of the full context)" if run.num_slots else ""),
                ),
                (
                    "peak_kv",
                    run.peak_blocks * self.scenario.block_bytes / 1e9,
                    "GB",
                    f"{title}: {run.peak_blocks:,} of {self.scenario.kv_blocks:,} blocks",
                ),
                ("host_link", run.link_bytes / 1e9, "GB", f"{title}: offloads and restores"),
                ("makespan", run.makespan_s, "s", f"{title}: where it gives: {run.limit}"),
            ]
            for name, value, unit, why in figures:
                yield Measurement(
                    "plan", f"{name}[{run.scheme}]", value, unit, None, lower, note=why
                )
        yield Measurement("plan", "simulated_wall_s", self.wall_s, "s", None, lower, note=note)


def simulation_table(simulation: Simulation) -> Table:
    """One row per scheme: what the user sees first."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("scheme", "left"),
        ("agents failed", "right"),
        ("job p50", "right"),
        ("job p99", "right"),
        ("running at once", "right"),
        ("peak KV", "right"),
        ("host link", "right"),
        ("where it gives", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name != "where it gives")
    block_bytes = simulation.scenario.block_bytes
    for run in simulation.runs:
        done = sorted(run.jct_s)
        p50 = _seconds(statistics.median(done)) if done else "-"
        p99 = _seconds(percentile(done, 99)) if done else "-"
        running = str(run.peak_running) + (f" of {run.num_slots} slots" if run.num_slots else "")
        table.add_row(
            TITLES[run.scheme],
            f"{len(run.failed)} of {simulation.scenario.num_workload_agents}",
            p50,
            p99,
            running,
            f"{run.peak_blocks * block_bytes / 1e9:.1f} GB",
            f"{run.link_bytes / 1e9:.1f} GB",
            run.limit,
        )
    table.caption = f"modelled ({simulation.wall_s:.0f} s here); {VALIDATION}"
    trace = simulation.scenario.trace
    if trace is not None:
        what = (
            "kvgov's reduced tool outputs"
            if trace.num_summarized or trace.num_compacted
            else "tool outputs as they came"
        )
        table.caption = (
            f"every scheme replayed {trace.source}'s recorded contexts ({what}), "
            f"{trace.num_calls} calls of {trace.num_agents} agents; " + table.caption
        )
    return table


def _seconds(value: float) -> str:
    """Whole seconds for a swarm's jobs; a replayed CPU trace's may take a fraction of one."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.2g} s"


def simulate(
    scenario: Scenario,
    schemes: Sequence[str] = SCHEMES,
    *,
    progress: Callable[[str], None] = lambda line: None,
) -> Simulation:
    """Run each scheme of ``schemes`` on the twin; see the module docstring."""
    unknown = sorted(set(schemes) - set(SCHEMES))
    if unknown or not schemes:
        raise ScenarioError(f"unknown schemes {unknown}; pick from {', '.join(SCHEMES)}")
    from kvgov.benchmarks.swarm.bench import Setup

    began = time.perf_counter()
    simulation = Simulation(scenario)
    book = None
    if scenario.trace is not None:
        progress("sizing the trace's prompts ...")
        book = _prompt_book(scenario.trace)
        simulation.num_rounded_calls = book.num_rounded
    setups: dict[bool, Setup] = {}
    for scheme in schemes:
        governed = scheme == "kvgov"
        if book is not None:
            progress(f"{TITLES[scheme]} ...")
            simulation.runs.append(_replay(scenario, scheme, book))
            continue
        if governed not in setups:
            progress(f"building the {'governed' if governed else 'raw'} workload ...")
            setups[governed] = Setup.of(scenario.workload(governed=governed), _STANDIN)
        progress(f"{TITLES[scheme]} ...")
        simulation.runs.append(_run(scenario, scheme, setups[governed]))
    simulation.wall_s = time.perf_counter() - began
    return simulation


def _engine(scenario: Scenario, scheme: str) -> tuple[Engine, int | None]:
    """The stand-in engine a scheme runs on, and reserve-for-max's slots (None: paged)."""
    context_blocks = math.ceil(scenario.target.context_tokens / scenario.block_size)
    slots = max(1, scenario.kv_blocks // context_blocks) if scheme == "reserve" else None
    return stand_in_engine(scenario, max_num_seqs=slots), slots


def stand_in_engine(
    scenario: Scenario,
    *,
    num_blocks: int | None = None,
    host_blocks: int | None = None,
    max_num_seqs: int | None = None,
) -> Engine:
    """The engine whose decisions the twin times at ``scenario``'s target size: the
    stand-in model's, with the card's KV blocks and host blocks (or ``num_blocks`` and
    ``host_blocks``), recompute on preemption and prefix caching, as a user of the paged
    engine runs it; ``max_num_seqs`` caps the requests in one step (reserve-for-max's
    slots)."""
    return scenario_engine(
        scenario,
        _STANDIN,
        num_blocks=num_blocks,
        host_blocks=host_blocks,
        max_num_seqs=max_num_seqs,
    )


def scenario_engine(
    scenario: Scenario,
    model: str,
    *,
    num_blocks: int | None = None,
    host_blocks: int | None = None,
    max_num_seqs: int | None = None,
    adapt_cpu_threads: bool = True,
) -> Engine:
    """``model`` on the CPU as ``scenario`` configures an engine: its KV and host blocks
    (or ``num_blocks`` and ``host_blocks``), block size, recompute on preemption and
    context length; the stand-in's (``stand_in_engine``) or the target's own, where the
    target runs here (the CPU panel's real engine)."""
    from engine import Engine, EngineConfig, PreemptionMode

    config = EngineConfig(
        model=model,
        device="cpu",
        num_blocks=scenario.kv_blocks if num_blocks is None else num_blocks,
        block_size=scenario.block_size,
        swap_space_blocks=scenario.host_blocks if host_blocks is None else host_blocks,
        preemption_mode=PreemptionMode.RECOMPUTE,
        max_model_len=scenario.target.context_tokens,
        adapt_cpu_threads=adapt_cpu_threads,
    )
    if max_num_seqs is not None:  # else EngineConfig's default
        config = replace(config, max_num_seqs=max_num_seqs)
    return Engine(config)


def _run(scenario: Scenario, scheme: str, setup: object) -> SchemeRun:
    from kvgov.benchmarks.swarm.bench import Setup
    from kvgov.benchmarks.swarm.twin import TwinDevice, run_twin_policy

    assert isinstance(setup, Setup)
    engine, slots = _engine(scenario, scheme)
    device = TwinDevice(scenario.profile, scenario.target.shape, forward=False)
    began = time.perf_counter()
    run = run_twin_policy(
        engine,
        device,
        "kvgov" if scheme == "kvgov" else "paged",
        1.0,
        setup.scripts,
        setup.prompts,
        setup.workload,
        None,
        deadline_s=_DEADLINE_S,
    )
    return SchemeRun.of(scheme, run, num_slots=slots, wall_s=time.perf_counter() - began)


def _prompt_book(trace: TraceWorkload) -> PromptBook:
    from engine.presets import PRESETS
    from engine.tokenizer import load_tokenizer
    from kvgov.simulate._prompts import PromptBook

    return PromptBook.of(trace, load_tokenizer(PRESETS[_STANDIN].tokenizer))


def _replay(scenario: Scenario, scheme: str, book: PromptBook) -> SchemeRun:
    from kvgov.simulate._replay import replay

    assert scenario.trace is not None
    engine, slots = _engine(scenario, scheme)
    run = replay(
        engine,
        scheme,
        scenario.trace,
        book,
        profile=scenario.profile,
        model_shape=scenario.target.shape,
        deadline_s=_DEADLINE_S,
    )
    return SchemeRun.of(scheme, run, num_slots=slots, wall_s=run.wall_s, agents=run.agents)
