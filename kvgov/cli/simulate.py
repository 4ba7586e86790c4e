"""``kvgov plan --simulate``: the agents (the swarm workload, or a recorded trace) on the
hardware twin of a card, reserve-for-max against the paged engine alone and kvgov, in
virtual time (``kvgov.simulate``). Every figure is modelled, and says so.
"""

from __future__ import annotations

import json

import typer
from rich.console import Console

from kvgov.cli.output import fail, host_figures
from kvgov.tables import print_table

__all__ = ["plan_simulate"]


def plan_simulate(
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

    from kvgov.cli.extras import missing_for

    if device is None or model is None:
        fail("--simulate needs --device (a profile such as rx9070xt) and --model (qwen3-8b)")
    if (missing := missing_for("engine")) is not None:
        fail(missing)
    from engine.errors import EngineError
    from engine.twin.targets import target_model
    from integrations.jsonl import SpanFileError
    from integrations.report import ReportError
    from kvgov.simulate import Scenario, ScenarioError, simulate, simulation_table
    from kvgov.simulate.trace import read_trace
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
