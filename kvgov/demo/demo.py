"""``kvgov demo``: one swarm, run three ways on the same KV budget.

A planner fans out to worker agents whose contexts grow turn by turn with tool outputs
(``kvgov.demo.swarm``); every model call is a real generation on the bundled
engine (the ``tiny-random`` preset by default, or a local Hugging Face checkpoint). The
swarm runs three times, each time on a fresh engine with the same number of KV blocks,
the same engine settings (recompute on preemption, as vLLM) and the same content
policies (tool outputs summarized to the worker's ``tool_output_tokens``, the oldest
turns summarized at the ceiling), so the runs differ in memory governance alone:

1. reserve-for-max: what a contiguous KV cache does. Each agent's whole ceiling is its
   slot, set aside up front (guaranteed admission at a safety factor of 1), and its
   context stays resident in that slot between calls (held, never parked or offloaded);
   each agent carries its own copy of the system prompt. Workers that do not fit wait;
2. paged engine alone: what a user gets from a paged engine as vLLM runs it. Every
   worker starts at once (no fan-out cap), a context's KV is let go when its call ends
   (left to the prefix cache, evicted least recently used first), nothing is held,
   offloaded or pinned, and the system prompt is shared only through the prefix cache.
   The governor only carries the content policies and the traces: it parks a lease at
   once on each tool call and holds nothing (so it counts only agents in a model call),
   and admits on their live use with no headroom, as the engine itself admits a prompt
   when its blocks are free;
3. kvgov: paged blocks on demand (overcommit admission), the system prompt registered
   once as a shared prefix, the fan-out capped, idle agents parked and their KV held,
   offloaded under pressure and restored.

It prints a table of what each run admitted, reserved, used and lost, how long its jobs
took and how many prompt tokens the engine computed again (its own prefill counter),
writes each run's trace as JSON lines (``kvgov report`` reads them) and draws the memory
map from the engine's blocks at the instants they peaked: the kvgov run's, and the paged
engine alone's at its own peak.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from backends import LocalBackend
from engine import PreemptionMode
from governor import AdmissionMode, AgentSpec, ConfigError, Governor, GovernorConfig, Policies
from integrations.jsonl import JsonLinesSpanExporter
from integrations.otel import instrument
from kvgov.demo.stats import PeakSnapshot, RunStats
from kvgov.demo.swarm import SYSTEM_PROMPT, SwarmSpec, build_swarm
from kvgov.memory_map import AgentMemory, MemoryMap
from policies import ExtractiveSummarizer, SummarizeOldest

__all__ = ["DemoOptions", "DemoResult", "parse_size", "run_demo"]

MIB = 1 << 20
_NEVER_S = 86_400.0  # reserve-for-max: a slot is never parked, its context never dropped
SCHEMES = {"baseline": "reserve-for-max", "paged": "paged engine alone", "kvgov": "kvgov"}
SCRIPTED = (
    "The workers' control flow is scripted: the tiny random model cannot call tools, so a "
    "script picks each tool call a model would make. Every model call is a real "
    "generation on the engine, and every tool output a realistic one."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoOptions:
    agents: int = 8
    ceiling: int = 4_096
    kv_budget_bytes: int = 48 * MIB
    turns: int = 4  # the whole demo (three runs) well under a minute on 2 quiet cores
    model: str = "tiny-random"
    device: str = "auto"
    out: Path = Path("kvgov-demo")
    reply_tokens: int = 16
    tool_output_tokens: int = 768
    max_fanout: int | None = None  # kvgov's cap on workers at once; None: all of them

    def __post_init__(self) -> None:
        for name, minimum in (
            ("agents", 1),
            ("ceiling", 64),
            ("turns", 1),
            ("reply_tokens", 1),
            ("max_fanout", 1),
        ):
            value = getattr(self, name)
            if name == "max_fanout" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigError.below_minimum(name, value, minimum)
        if not 0 < self.tool_output_tokens < self.ceiling:
            raise ConfigError(
                f"tool_output_tokens must be between 1 and the ceiling ({self.ceiling:,}), "
                f"got {self.tool_output_tokens:,}",
                setting="tool_output_tokens",
            )


@dataclass(slots=True)
class DemoResult:
    options: DemoOptions
    baseline: RunStats
    kvgov: RunStats
    num_blocks: int
    bytes_per_block: int
    traces: dict[str, Path] = field(default_factory=dict)
    paged: RunStats | None = None  # the paged engine alone
    memory_map: tuple[Path, Path] | None = None
    memory_caption: str = ""


def parse_size(text: str) -> int:
    """``"48MiB"``, ``"50MB"``, ``"1.5GiB"`` or a bare number of MiB, as bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]i?b)?\s*", text.lower())
    if match is None:
        raise ConfigError(
            f"cannot read a size from {text!r}; write it like 48MiB, 50MB or 1.5GiB",
            setting="kv_budget",
        )
    number, unit = float(match.group(1)), match.group(2) or "mib"
    scale = {"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}.get(unit)
    if scale is None:
        scale = 1 << (10 * ("kmgt".index(unit[0]) + 1))
    return int(number * scale)


def run_demo(options: DemoOptions, *, console: Console | None = None) -> DemoResult:
    console = console or Console()
    console.print(
        "[bold]First act, real[/]: three runs on this machine's engine with the same KV "
        "budget, engine settings and content policies: they differ in memory governance alone."
    )
    console.print(f"[dim]{SCRIPTED}[/]")
    options.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, RunStats] = {}
    geometry: dict[str, int] = {}
    traces: dict[str, Path] = {}
    maps: dict[str, MemoryMap] = {}
    with Progress(
        TextColumn("{task.description:<26}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        for scheme, label in SCHEMES.items():
            calls = options.agents * (options.turns + 1) + 2
            task = progress.add_task(f"{label}: model calls", total=calls)
            trace = options.out / f"trace-{scheme}.jsonl"
            stats, geometry, maps[scheme] = _run(
                scheme, options, trace, functools.partial(progress.advance, task)
            )
            progress.update(task, completed=calls)
            runs[scheme], traces[scheme] = stats, trace
    result = DemoResult(
        options=options,
        baseline=runs["baseline"],
        kvgov=runs["kvgov"],
        num_blocks=geometry["num_blocks"],
        bytes_per_block=geometry["bytes_per_block"],
        traces=traces,
        paged=runs["paged"],
    )
    memory = replace(
        maps["kvgov"],
        paged_alone=maps["paged"].agents,
        paged_alone_shared_bytes=maps["paged"].shared_bytes,
    )
    memory.save(options.out / "memory.json")
    result.memory_map = memory.render(options.out / "memory-map")
    result.memory_caption = memory.caption()
    return result


def _run(
    scheme: str, options: DemoOptions, trace: Path, on_call: Callable[[], None]
) -> tuple[RunStats, dict[str, int], MemoryMap]:
    kvgov, paged = scheme == "kvgov", scheme != "baseline"
    backend = LocalBackend(
        config={
            "model": options.model,
            "device": options.device,
            "kv_cache_bytes": options.kv_budget_bytes,
            "block_size": 16,
            "preemption_mode": PreemptionMode.RECOMPUTE,
        }
    )
    try:
        cap = backend.capacity()
        # Reserve-for-max runs as many workers at once as whole ceilings fit (the rest
        # queue); kvgov caps the fan-out and admits on live use.
        whole = cap.num_available_blocks // -(-options.ceiling // cap.block_size)
        planner = AgentSpec(
            name="planner",
            ceiling_tokens=min(options.ceiling, 2_048),
            max_fanout={
                "kvgov": options.max_fanout or options.agents,
                "paged": options.agents,
                "baseline": max(1, min(options.agents, whole)),
            }[scheme],
        )
        worker = AgentSpec(
            name="worker",
            ceiling_tokens=options.ceiling,
            tool_output_tokens=options.tool_output_tokens,
            prefix="worker-system" if kvgov else None,
        )
        # The same content policies in every run: they differ in memory governance alone.
        policies = Policies(
            tool_output=ExtractiveSummarizer(backend.counter),
            ceiling=SummarizeOldest(summary_tokens=192),
        )
        if kvgov:
            config = GovernorConfig(mode=AdmissionMode.OVERCOMMIT, park_after_s=0.05)
        elif paged:  # the engine's own policy: see the module docstring
            config = GovernorConfig(
                mode=AdmissionMode.OVERCOMMIT,
                headroom_ratio=0.0,
                safety_factor=1.0,
                park_after_s=0.0,
                retain_s=0.0,
                pressure_watermark=1.0,
            )
        else:
            config = GovernorConfig(
                safety_factor=1.0,
                park_after_s=_NEVER_S,
                retain_s=_NEVER_S,
                pressure_watermark=1.0,
            )
        governor = Governor(backend, config=config, agents=[planner, worker], policies=policies)
        if kvgov:
            system = [{"role": "system", "content": SYSTEM_PROMPT}]
            governor.register_prefix("worker-system", system)
        spec = SwarmSpec(
            num_workers=options.agents,
            turns=options.turns,
            reply_tokens=options.reply_tokens,
            planner=planner,
            worker=worker,
            system_in_messages=not kvgov,
        )
        bytes_per_token = cap.bytes_per_block // cap.block_size
        stats = RunStats(bytes_per_token, cap.bytes_per_block, paged=paged)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(trace)))
        instrumentation = instrument(governor, tracer_provider=provider)
        watch = stats.watch(governor, backend)
        try:
            swarm = build_swarm(governor, spec, on_call=on_call)
            done = asyncio.run(swarm.graph.ainvoke(swarm.inputs()))
        finally:
            watch.stop()
            instrumentation.uninstrument()
            provider.shutdown()
        stats.failures = [f for f in done["failures"] if f.endswith("CeilingExceeded")]
        stats.oom_failures = len(done["failures"]) - len(stats.failures)
        assert stats.peak is not None, "the sampler reads the engine at least once a run"
        memory = memory_at(stats.peak, cap, options)
        return stats, {"num_blocks": cap.num_blocks, "bytes_per_block": cap.bytes_per_block}, memory
    finally:
        backend.close()


def memory_at(peak: PeakSnapshot, cap: Any, options: DemoOptions) -> MemoryMap:
    """The agents holding KV when the run's blocks in use peaked, from the engine's
    snapshot of that instant: each one's blocks on the device and offloaded, against the
    ceiling a contiguous cache would reserve for it. A block held by several agents (the
    pinned system prompt, a prefix-cache hit) is shared, held once on the paged bar."""
    kv, per_block = peak.kv, cap.bytes_per_block
    holders: dict[int, int] = {}
    for held in kv.budgets.values():
        for block in held.device_block_ids:
            holders[block] = holders.get(block, 0) + 1
    shared = {b for b, n in holders.items() if n > 1} | set(kv.pinned_block_ids)
    agents = []
    for budget, held in sorted(kv.budgets.items()):
        if not held.device_block_ids and not held.num_host_blocks:
            continue
        lease = peak.leases.get(budget)
        name = f"{lease.agent} {budget.removeprefix('lease-')}" if lease else budget
        ceiling = lease.ceiling if lease else options.ceiling
        agents.append(
            AgentMemory(
                name,
                live_bytes=len(held.device_block_ids) * per_block,
                reserved_bytes=ceiling * (per_block // cap.block_size),
                shared_bytes=len(held.device_block_ids & shared) * per_block,
                offloaded_bytes=held.num_host_blocks * per_block,
            )
        )
    budget_bytes = cap.num_blocks * per_block
    return MemoryMap(
        title=f"kvgov demo at its peak of blocks in use: {options.model}, {len(agents)} "
        f"agents holding KV, ceiling {options.ceiling:,} tokens, "
        f"{budget_bytes / MIB:.0f} MiB of KV",
        card_bytes=cap.weights_bytes + budget_bytes,
        weights_bytes=cap.weights_bytes,
        overhead_bytes=0,
        agents=tuple(agents),
        shared_bytes=len(shared) * per_block,
    )


def result_table(result: DemoResult) -> Table:
    """The runs side by side."""
    options, base, gov = result.options, result.baseline, result.kvgov
    runs = [base, *([result.paged] if result.paged is not None else []), gov]
    table = Table(
        title=f"{options.agents} workers + a planner on {result.num_blocks:,} KV blocks "
        f"({result.num_blocks * result.bytes_per_block / MIB:.0f} MiB), the same content "
        "policies in every run",
        caption="reserved: reserve-for-max, each admitted agent's ceiling; paged, the blocks "
        "in use. live: tokens on the device (reserve-for-max, the context resident in each "
        "agent's slot). job completion time: each worker's, from its lease's request to its "
        "release. "
        "recomputed: prompt tokens the engine computed again after their KV was dropped "
        "(its own prefill counter).",
        caption_justify="left",
    )
    table.add_column("")
    table.add_column("reserve-for-max", justify="right")
    if result.paged is not None:
        table.add_column("paged engine alone", justify="right")
    table.add_column("kvgov", justify="right")

    def mib(value: int) -> str:
        return f"{value / MIB:.1f} MiB"

    def waits(stats: RunStats) -> str:
        return f"{len(stats.waits)} ({sum(stats.waits):.1f} s)"

    rows = [
        ("agents active at once (peak)", lambda s: str(s.peak_active)),
        ("KV reserved (peak)", lambda s: mib(s.peak_reserved_bytes)),
        ("KV live (peak)", lambda s: mib(s.peak_live_bytes)),
        ("waste: reserved but unused (mean)", lambda s: f"{100 * s.waste:.1f}%"),
        ("peak blocks in use", lambda s: f"{s.peak_blocks:,}"),
        ("admission waits", waits),
        ("compactions (tokens removed)", lambda s: f"{s.compactions} ({s.tokens_compacted:,})"),
        ("tokens saved by summarization", lambda s: f"{s.tokens_summarized:,}"),
        ("KV offloads / engine preemptions", lambda s: f"{s.offloads} / {s.preemptions}"),
        ("model calls", lambda s: str(s.model_calls)),
        ("agents failed (context overflow)", lambda s: str(len(s.failures))),
        ("out-of-memory failures", lambda s: str(s.oom_failures)),
        ("wall time", lambda s: f"{s.wall_s:.1f} s"),
        ("job completion time (mean)", lambda s: f"{s.jct_mean_s:.1f} s"),
        ("prefill tokens recomputed", lambda s: f"{s.recomputed_tokens:,}"),
    ]
    for name, cell in rows:
        table.add_row(name, *(cell(run) for run in runs))
    return table
