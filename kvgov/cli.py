"""The ``kvgov`` command line.

    kvgov --version
    kvgov demo [--agents N] [--ceiling TOKENS] [--kv-budget SIZE] [--model PATH] [...]
    kvgov bench NAME [--json] [--quick] [--device DEVICE] [--model PRESET|PATH] [--plot DIR]
    kvgov plan (--preset NAME | --config PATH) --card-gb GB --weights-gb GB [...]
    kvgov plan --simulate --device PROFILE --model MODEL [--trace RUN.jsonl] [...]
    kvgov map [plan's options | --record RUN.json] [--out PATH]
    kvgov report RUN.jsonl
    kvgov serve [--model PRESET|PATH] [--host] [--port] [--api-key KEY ...] [...]
    kvgov twin fit [--device cpu|cuda] [--model PRESET|PATH] [--profile NAME|FILE]
                   [--grid PATH] [--save-grid PATH] [--out PATH] [--quick] [--json]
    kvgov twin check [--quick] [--rounds N] [--fraction F] [--policy NAME ...]
                     [--profile FILE] [--seed N] [--json]

A benchmark is a module with ``run(*, quick: bool = False) -> Iterator[Measurement]``.
``BENCHMARKS`` maps each name that ``kvgov bench`` accepts to that module's import
path; the module is imported only when its benchmark runs, so ``kvgov --version``
stays cheap.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from inspect import signature
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from governor import __version__
from kvgov.cli_output import fail, host_figures, measurement_table
from kvgov.serve_command import serve
from kvgov.tables import print_table
from kvgov.twin_command import twin

if TYPE_CHECKING:
    from engine.benchmarks import Measurement
    from governor.plan import Plan

__all__ = ["BENCHMARKS", "app"]

BENCHMARKS: Mapping[str, str] = MappingProxyType(
    {
        "allocator": "engine.benchmarks.allocator",
        "attention": "engine.benchmarks.attention",
        "engine": "engine.benchmarks.engine",
        "model": "engine.benchmarks.model_run",
        "quantization": "engine.benchmarks.quantization",
        "governor": "kvgov.benchmarks.governor",
        "policies": "kvgov.benchmarks.policies",
        "integrations": "integrations.benchmarks.integrations",
        "serve": "kvgov.benchmarks.serve",
        "replicas": "kvgov.benchmarks.replicas",
        "context": "kvgov.benchmarks.context",
        "reduce": "kvgov.benchmarks.reduce",
        "swarm": "kvgov.benchmarks.swarm.bench",
        "openloop": "kvgov.benchmarks.openloop.bench",
        "openloop-tune": "kvgov.benchmarks.openloop.tuning",
    }
)

# Not a benchmark of figures but a tuning run that writes a module to commit (and takes
# most of half an hour): run by name only.
_NOT_IN_ALL = frozenset({"openloop-tune"})

app = typer.Typer(
    name="kvgov",
    help="A memory governor for LLM agent swarms, with a bundled paged-KV engine.",
    add_completion=False,
    no_args_is_help=True,
)


app.command()(serve)

app.add_typer(twin, name="twin")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kvgov {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """A memory governor for LLM agent swarms, with a bundled paged-KV engine."""


@app.command()
def demo(
    agents: Annotated[int, typer.Option(help="Worker agents the planner fans out to.")] = 8,
    ceiling: Annotated[int, typer.Option(help="Each worker's ceiling, tokens.")] = 4_096,
    kv_budget: Annotated[
        str, typer.Option(help="KV cache for each of the three runs: 48MiB, 50MB, 1.5GiB.")
    ] = "48MiB",
    turns: Annotated[int, typer.Option(help="Tool-calling turns per worker.")] = 4,
    model: Annotated[
        str, typer.Option(help="tiny-random, or a local Hugging Face checkpoint folder.")
    ] = "tiny-random",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    max_fanout: Annotated[
        int | None, typer.Option(help="kvgov's cap on workers at once (default: all).")
    ] = None,
    out: Annotated[str, typer.Option(help="Folder for the traces and the memory map.")] = (
        "kvgov-demo"
    ),
    show_twin: Annotated[
        bool,
        typer.Option(
            "--twin/--no-twin",
            help="Then show the swarm at the reference user's scale on the hardware twin "
            "(modelled, about 15 s more).",
        ),
    ] = True,
) -> None:
    """A planner and its workers, run three ways on one KV budget: reserve-for-max, the paged
    engine alone, then kvgov."""
    from pathlib import Path

    from kvgov._extras import missing_for

    if (missing := missing_for("engine")) is not None:
        fail(missing)

    from governor.errors import GovernorError
    from kvgov.demo import DemoOptions, parse_size, result_table, run_demo

    console = Console()
    try:
        options = DemoOptions(
            agents=agents,
            ceiling=ceiling,
            kv_budget_bytes=parse_size(kv_budget),
            turns=turns,
            model=model,
            device=device,
            max_fanout=max_fanout,
            out=Path(out),
        )
        result = run_demo(options, console=console)
    except GovernorError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write to {out}: {exc}")
    print_table(console, result_table(result))
    for scheme, trace in result.traces.items():
        console.print(f"trace ({scheme}): {trace}   [dim]kvgov report {trace}[/]")
    if result.memory_map is not None:
        svg, png = result.memory_map
        console.print(f"memory map: {svg} and {png}")
        console.print(f"[dim]{result.memory_caption}[/]")
    if show_twin:
        from kvgov.demo.twin import second_act

        second_act(console)


@app.command()
def bench(
    name: Annotated[
        str, typer.Argument(help=f"Which benchmark: {', '.join(BENCHMARKS)}.", show_default=False)
    ],
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per measurement, nothing else.")
    ] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="Smaller sizes and fewer repeats, for smoke tests.")
    ] = False,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="Where the engine's benchmarks run (cpu, cuda, cuda:N); default: their own.",
            show_default=False,
        ),
    ] = None,
    plot: Annotated[
        str | None,
        typer.Option(
            "--plot",
            help="Write the benchmark's figures (SVG and PNG) to this folder, where it has any.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="The engine's model where a benchmark takes one (swarm): a preset such as "
            "llama-8b-random, or a local model folder; default: tiny-random.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a benchmark and report each figure against its target."""
    if name != "all" and name not in BENCHMARKS:
        choices = ", ".join([*BENCHMARKS, "all"])
        typer.echo(f"Error: unknown benchmark {name!r}; choose one of: {choices}.", err=True)
        raise typer.Exit(code=2)
    names = [n for n in BENCHMARKS if n not in _NOT_IN_ALL] if name == "all" else [name]
    runs = {each: importlib.import_module(BENCHMARKS[each]).run for each in names}
    options: dict[str, Any] = {"quick": quick}
    if device is not None:
        from engine.device import resolve_device
        from engine.errors import InvalidRequestError

        try:
            options["device"] = str(resolve_device(device))
        except InvalidRequestError as exc:
            typer.echo(f"Error: {exc}", err=True)
            raise typer.Exit(code=2) from exc
        runs = _taking("device", runs, name, "it runs on the host")
    if model is not None:
        from kvgov.twin import TwinFitError, model_label

        try:
            model_label(model)  # a preset or a folder, before anything runs
        except TwinFitError as exc:
            fail(str(exc))
        options["model"] = model
        runs = _taking("model", runs, name, "it runs its own model")
    measurements = (
        _as_measurement(item)
        for fn in runs.values()
        for item in fn(**_with_plot(fn, options, plot))
    )
    if json_lines:
        for measurement in measurements:
            typer.echo(json.dumps({**measurement.to_json(), **host_figures()}))
    else:
        console, start = Console(), host_figures()
        print_table(console, measurement_table(measurements))
        end = host_figures()
        console.print(
            f"[dim]host: {end['cpus']} CPUs, 1-minute load average {start['load_1m']:.2f} at "
            f"the start, {end['load_1m']:.2f} at the end (ratios measured side by side hold "
            "best near a load of 1; far above it, other processes take the cores)[/]"
        )


def _taking(option: str, runs: dict[str, Any], name: str, why: str) -> dict[str, Any]:
    """The benchmarks of ``runs`` whose ``run`` takes ``option``: for ``all``, the others
    are left out; a benchmark named alone that does not take it is an error."""
    if name != "all" and option not in signature(runs[name]).parameters:
        fail(f"kvgov bench {name} takes no --{option}: {why}.")
    return {each: fn for each, fn in runs.items() if option in signature(fn).parameters}


def _with_plot(fn: Any, options: dict[str, Any], plot: str | None) -> dict[str, Any]:
    """``options``, and ``plot`` for a benchmark whose ``run`` draws figures."""
    if plot is None or "plot" not in signature(fn).parameters:
        return options
    from pathlib import Path

    return {**options, "plot": Path(plot)}


def _as_measurement(item: Measurement | Mapping[str, Any]) -> Measurement:
    """Engine benchmarks yield ``Measurement``; the governor's and the policies', which may
    not import the engine, yield mappings with the same fields."""
    from engine.benchmarks import Direction, Measurement

    if isinstance(item, Measurement):
        return item
    fields = dict(item)
    fields["direction"] = Direction(fields.get("direction", "higher"))
    return Measurement(**fields)


@app.command()
def plan(
    ctx: typer.Context,
    preset: Annotated[
        str | None, typer.Option(help="A named model: qwen3.5-9b, or a bundled preset.")
    ] = None,
    config: Annotated[
        str | None, typer.Option(help="A Hugging Face config.json, or the folder holding it.")
    ] = None,
    card_gb: Annotated[float, typer.Option(help="The card's memory, GB.")] = 16.0,
    weights_gb: Annotated[
        float | None,
        typer.Option(help="Memory the weights take, GB [default: 5.5, or counted: --quantize]."),
    ] = None,
    quantize: Annotated[
        str | None,
        typer.Option(help="int8 or int4: count the weights from --config, quantized."),
    ] = None,
    overhead_gb: Annotated[
        float, typer.Option(help="Activations, runtime and fragmentation, GB.")
    ] = 0.5,
    kv_dtype: Annotated[
        str | None, typer.Option(help="KV cache dtype: fp16, bf16, fp8 or fp32.")
    ] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    ceiling: Annotated[int, typer.Option(help="Each agent's ceiling, tokens.")] = 16_000,
    cap: Annotated[
        int | None, typer.Option(help="The lower contiguous cap, tokens (half the ceiling).")
    ] = None,
    agents: Annotated[int, typer.Option(help="How many agents run at once.")] = 8,
    average: Annotated[int, typer.Option(help="Their average context, tokens.")] = 3_000,
    safety: Annotated[float, typer.Option(help="Admission's safety factor, (0, 1].")] = 0.9,
    json_lines: Annotated[
        bool, typer.Option("--json", help="Print one JSON object per row, nothing else.")
    ] = False,
    simulate: Annotated[
        bool,
        typer.Option(
            "--simulate",
            help="Run the agents on the hardware twin of --device with --model: "
            "reserve-for-max, the paged engine alone and kvgov, in virtual time.",
        ),
    ] = False,
    device: Annotated[
        str | None,
        typer.Option(help="--simulate: a device profile (rx9070xt, h100-sxm, ...) or file."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="--simulate: qwen3-8b, an engine preset, or a config.json."),
    ] = None,
    host_gb: Annotated[
        float, typer.Option(help="--simulate: host memory for offloaded KV, GiB.")
    ] = 16.0,
    turns: Annotated[int, typer.Option(help="--simulate: tool calls each worker makes.")] = 8,
    reply_tokens: Annotated[
        int, typer.Option(help="--simulate: tokens each model call generates.")
    ] = 256,
    tool_scale: Annotated[
        float,
        typer.Option(help="--simulate: x the swarm benchmark's tool latencies (20: 3-10 s)."),
    ] = 20.0,
    seed: Annotated[int, typer.Option(help="--simulate: the workload's seed.")] = 1,
    trace: Annotated[
        str | None,
        typer.Option(
            help="--simulate: replay a recorded run (a `kvgov report` trace) instead of the "
            "swarm; --agents N then repeats its runs to N agents."
        ),
    ] = None,
) -> None:
    """Size a KV budget: contiguous reserve at the ceiling, at a lower cap, or paged; with
    --simulate, run the agents on the hardware twin of a card and compare the schemes."""
    from governor.plan import plan_rows, render_plan

    def given(name: str) -> bool:
        # By name: typer carries its own copy of click, and so of ParameterSource.
        source = ctx.get_parameter_source(name)
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    if trace is not None and not simulate:
        fail("--trace is replayed on the hardware twin: add --simulate with --device and --model")
    if simulate:
        if preset is not None or config is not None or weights_gb is not None:
            fail(
                "with --simulate, name the model with --model (its weights are counted) "
                "and the card with --device; --preset, --config and --weights-gb are the "
                "calculator's"
            )
        swarm_only = ["turns", "reply_tokens", "tool_scale", "seed", "ceiling"]
        if trace is not None and (shaped := [name for name in swarm_only if given(name)]):
            options = ", ".join("--" + name.replace("_", "-") for name in shaped)
            fail(
                f"{options} shape the swarm workload; a trace is replayed as recorded (its "
                "calls, contexts and tool times): leave them out, or leave out --trace"
            )
        _plan_simulate(
            device=device,
            model=model,
            quantize=quantize,
            agents=agents,
            ceiling=ceiling,
            overhead_gb=overhead_gb,
            host_gb=host_gb,
            turns=turns,
            reply_tokens=reply_tokens,
            tool_scale=tool_scale,
            block_size=block_size,
            seed=seed,
            json_lines=json_lines,
            trace=trace,
            trace_agents=agents if given("agents") else None,
        )
        return
    if quantize is not None:
        weights_gb = _quantized_weights_gb(config, quantize, weights_gb)
    made = _make_plan(
        preset=preset,
        config=config,
        card_gb=card_gb,
        weights_gb=5.5 if weights_gb is None else weights_gb,
        overhead_gb=overhead_gb,
        kv_dtype=kv_dtype,
        block_size=block_size,
        ceiling=ceiling,
        cap=cap,
        agents=agents,
        average=average,
        safety=safety,
    )
    if json_lines:
        for row in plan_rows(made):
            typer.echo(json.dumps(row))
        return
    headline, table = render_plan(made)
    console = Console()
    console.print(headline)
    print_table(console, table)


def _plan_simulate(
    *,
    device: str | None,
    model: str | None,
    quantize: str | None,
    agents: int,
    ceiling: int,
    overhead_gb: float,
    host_gb: float,
    turns: int,
    reply_tokens: int,
    tool_scale: float,
    block_size: int,
    seed: int,
    json_lines: bool,
    trace: str | None,
    trace_agents: int | None,
) -> None:
    import sys

    from kvgov._extras import missing_for

    if device is None or model is None:
        fail("--simulate needs --device (a profile such as rx9070xt) and --model (qwen3-8b)")
    if (missing := missing_for("engine")) is not None:
        fail(missing)
    from engine.errors import EngineError
    from engine.twin.targets import target_model
    from integrations.jsonl import SpanFileError
    from integrations.report import ReportError
    from kvgov.simulate import Scenario, ScenarioError, simulate, simulation_table
    from kvgov.simulate_trace import read_trace
    from kvgov.twin import profile_named

    try:
        workload = None
        if trace is not None:
            workload = read_trace(trace)
            if trace_agents is not None:
                workload = workload.cycled(trace_agents)
        scenario = Scenario(
            profile=profile_named(device),
            target=target_model(model, quantize=quantize),
            num_agents=agents,
            ceiling_tokens=ceiling,
            overhead_bytes=int(overhead_gb * 1e9),
            host_bytes=int(host_gb * 2**30),
            turns=turns,
            reply_tokens=reply_tokens,
            tool_scale=tool_scale,
            block_size=block_size,
            seed=seed,
            trace=workload,
        )
        progress = (
            (lambda line: None)
            if json_lines
            else (lambda line: print(f"[plan --simulate] {line}", file=sys.stderr))
        )
        result = simulate(scenario, progress=progress)
    except (EngineError, ScenarioError, ReportError, SpanFileError) as exc:
        fail(" ".join(str(exc).split()))  # one line, whatever the message held
    if json_lines:
        for measurement in result.measurements():
            typer.echo(json.dumps({**measurement.to_json(), **host_figures()}))
        return
    console = Console()
    console.print(f"Modelled on the hardware twin: {result.describe()}")
    print_table(console, simulation_table(result))


def _quantized_weights_gb(config: str | None, quantize: str, weights_gb: float | None) -> float:
    from governor.errors import GovernorError
    from governor.weights_size import weights_bytes_from_hf_config

    if config is None or weights_gb is not None:
        fail(
            "--quantize counts the weights from a config.json: pass --config PATH with it "
            "and leave out --weights-gb (or give --weights-gb alone)"
        )
    try:
        return weights_bytes_from_hf_config(config, quantize=quantize) / 1e9
    except GovernorError as exc:
        fail(str(exc))


@app.command("map")
def memory_map(
    preset: Annotated[str | None, typer.Option(help="As for kvgov plan.")] = None,
    config: Annotated[str | None, typer.Option(help="As for kvgov plan.")] = None,
    card_gb: Annotated[float, typer.Option(help="The card's memory, GB.")] = 16.0,
    weights_gb: Annotated[float, typer.Option(help="Memory the weights take, GB.")] = 5.5,
    overhead_gb: Annotated[float, typer.Option(help="Runtime overhead, GB.")] = 0.5,
    kv_dtype: Annotated[str | None, typer.Option(help="KV cache dtype.")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per KV block.")] = 16,
    ceiling: Annotated[int, typer.Option(help="Each agent's ceiling, tokens.")] = 16_000,
    agents: Annotated[int, typer.Option(help="How many agents run at once.")] = 8,
    average: Annotated[int, typer.Option(help="Their average context, tokens.")] = 3_000,
    record: Annotated[
        str | None,
        typer.Option(help="A memory record a run wrote (kvgov demo does), instead of a plan."),
    ] = None,
    out: Annotated[str, typer.Option(help="Where to write PATH.svg and PATH.png.")] = "kvgov-map",
) -> None:
    """Draw the memory map: contiguous reserve-for-max against paged, as SVG and PNG."""
    from governor.errors import GovernorError
    from kvgov.memory_map import MemoryMap

    if record is not None:
        try:
            memory = MemoryMap.load(record)
        except GovernorError as exc:
            fail(str(exc))
    else:
        plan = _make_plan(
            preset=preset or (None if config else "qwen3.5-9b"),
            config=config,
            card_gb=card_gb,
            weights_gb=weights_gb,
            overhead_gb=overhead_gb,
            kv_dtype=kv_dtype,
            block_size=block_size,
            ceiling=ceiling,
            cap=None,
            agents=agents,
            average=average,
            safety=0.9,
        )
        memory = MemoryMap.from_plan(plan)
    try:
        svg, png = memory.render(out)
    except OSError as exc:
        fail(f"cannot write the map to {out}: {exc}")
    typer.echo(memory.caption())
    typer.echo(f"wrote {svg} and {png}")


@app.command()
def report(
    path: Annotated[
        str, typer.Argument(help="A run's spans, as JSON lines (kvgov demo writes one).")
    ],
) -> None:
    """Read a run back: per-agent context, peaks, waits, compactions, and what to change."""
    from integrations.report import report_main

    raise typer.Exit(report_main(path))


def _make_plan(
    *,
    preset: str | None,
    config: str | None,
    card_gb: float,
    weights_gb: float,
    overhead_gb: float,
    kv_dtype: str | None,
    block_size: int,
    ceiling: int,
    cap: int | None,
    agents: int,
    average: int,
    safety: float,
) -> Plan:
    from governor.errors import GovernorError
    from governor.plan import kv_shape_for, make_plan

    try:
        model, shape = kv_shape_for(
            preset=preset, config=config, kv_dtype=kv_dtype, extra_presets=_engine_presets()
        )
        return make_plan(
            model=model,
            kv_shape=shape,
            card_gb=card_gb,
            weights_gb=weights_gb,
            overhead_gb=overhead_gb,
            num_agents=agents,
            ceiling_tokens=ceiling,
            lower_cap_tokens=cap,
            average_tokens=average,
            block_size=block_size,
            safety_factor=safety,
        )
    except GovernorError as exc:
        fail(str(exc))


def _engine_presets() -> dict[str, Any]:
    """The bundled engine's presets as KV shapes (fp16 KV, as on a GPU); none where the
    engine is not installed (they are its small test models; the real ones are sizing's)."""
    from kvgov._extras import missing_for

    if missing_for("engine") is not None:
        return {}
    from engine.presets import PRESETS
    from governor.sizing import KVShape

    return {
        name: KVShape(
            layers=p.config.num_layers,
            kv_heads=p.config.num_kv_heads,
            head_dim=p.config.head_dim,
            dtype_bytes=2,
        )
        for name, p in PRESETS.items()
    }
